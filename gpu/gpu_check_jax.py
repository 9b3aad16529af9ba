"""qkernels.jax on a GPU (issue 56): the CUDA handlers (qkernels/jax/_kernels_cuda.abi3.so) against the CPU ones, and
their speed against plain JAX on the same GPU; rows written to OUT as they come (run by gpu/gpu_check.sh's "jax" step;
no network):

    python gpu/gpu_check_jax.py OUT/jax.jsonl             # on the GPU
    python gpu/gpu_check_jax.py OUT/jax.jsonl --dry-run   # rehearsal on the CPU: tiny shapes, the CPU as "the device"

Rows: ``setup`` (jax's devices, whether the CUDA handlers loaded and which targets they register, or why not);
``correct`` per op and dtype: the loss and its input gradients of the op on the device against the same op's CPU
handlers on the same inputs (max relative error; the CUDA kernels are the torch ops' and agree with the CPU ones to
rounding: float64 to 1e-10, float32 to 1e-4), with int32 indices (JAX's default) and int64 (x64) for the quantizer;
``vmap`` (latent_quantize per sample under jax.vmap, on the device); ``speed``: jitted forward + backward, median ms
of interleaved runs, of the op against its plain-JAX formulation (benchmarks/jax_baselines.py) at the papers' shapes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)  # float64 where asked; float32 inputs stay float32
import jax.numpy as jnp  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import jax_baselines as jb  # noqa: E402

import qkernels.jax as qj  # noqa: E402
from qkernels.jax import _ffi  # noqa: E402


def emit(out, row: dict) -> None:
    print(json.dumps(row))
    out.write(json.dumps(row) + "\n")
    out.flush()


def cases(n: int, d: int, dtype) -> dict:
    """op -> (loss of arrays, its inputs) at n samples of d latents."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((n, d)).astype(dtype)
    std = (z.std(0) + 1e-6).astype(dtype)
    values = np.sort(rng.standard_normal((d, 10)) * 0.5, -1).astype(dtype)
    up = rng.standard_normal((n, d)).astype(dtype)
    points = np.broadcast_to(np.linspace(-4, 4, 50), (d, 50)).astype(dtype)
    w = (rng.standard_normal((d, 64)) / np.sqrt(d)).astype(dtype)
    draws = rng.standard_normal((4, n, d)).astype(dtype)

    def lq(z, values, up):
        q = qj.latent_quantize(z, values)
        return jnp.sum(q.z_q * up) + 0.1 * (q.loss_quantize + q.loss_commit)

    return {
        "klm": (lambda z, s: qj.klm_loss(z, std=s), (z, std)),
        "klm default std": (qj.klm_loss, (z,)),
        "kde_grid": (lambda p, z: jnp.sum(qj.kde_grid(p, z, 0.3, derivative=True) ** 2), (points, z)),
        "latent_quantize": (lq, (z, values, up)),
        "hessian_penalty_terms": (
            lambda z, w, u: sum(jnp.mean(t) for t in qj.hessian_penalty_terms(lambda x: jnp.tanh(x @ w), z, draws=u)),
            (z, w, draws),
        ),
        "fsq": (lambda z, up: jnp.sum(qj.fsq(z, 8).z_q * up), (z, up)),
    }


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def correct(out, device, cpu, n: int, d: int) -> None:
    for dtype in ("float32", "float64"):
        for name, (loss, args) in cases(n, d, dtype).items():
            f = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(args)))))
            try:
                got = f(*(jax.device_put(a, device) for a in args))
                want = f(*(jax.device_put(a, cpu) for a in args))
                errors = [
                    rel(g, w)
                    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True)
                ]
                ok = max(errors) <= (1e-10 if dtype == "float64" else 1e-4)
                emit(out, {"correct": name, "dtype": dtype, "max_rel": max(errors), "ok": ok})
            except Exception as err:  # a row per failure: the other ops still run
                emit(out, {"correct": name, "dtype": dtype, "error": f"{type(err).__name__}: {str(err)[:300]}"})
    with jax.enable_x64(False):  # int32 indices
        z, values, up = cases(n, d, "float32")["latent_quantize"][1]
        q = [qj.latent_quantize(jax.device_put(z, dev), jax.device_put(values, dev)) for dev in (device, cpu)]
        emit(
            out,
            {
                "correct": "latent_quantize int32 indices",
                "dtype": str(q[0].indices.dtype),
                "equal": bool(np.array_equal(q[0].indices, q[1].indices)),
            },
        )
        per = jax.jit(jax.vmap(qj.latent_quantize, in_axes=(0, None)))
        v = per(jax.device_put(z, device), jax.device_put(values, device))
        emit(out, {"vmap": "latent_quantize per sample", "equal_to_batched": bool(np.array_equal(v.z_q, q[0].z_q))})


def timed(fn, args, rounds: int) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def speed(out, device, shapes, rounds: int) -> None:
    for n, d in shapes:
        rng = np.random.default_rng(1)
        z = jax.device_put(rng.standard_normal((n, d)).astype("float32"), device)
        std = jnp.std(z, 0) + 1e-6
        values = jax.device_put(np.sort(rng.standard_normal((d, 10)) * 0.5, -1).astype("float32"), device)
        up = jax.device_put(rng.standard_normal((n, d)).astype("float32"), device)

        def lq(quantize, up=up):
            def f(x, codebook):
                z_q, _, loss_q, loss_c = quantize(x, codebook)
                return jnp.sum(z_q * up) + 0.1 * (loss_q + loss_c)

            return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))

        pairs = {
            "klm": (
                jax.jit(jax.value_and_grad(lambda z, std=std: qj.klm_loss(z, std=std))),
                jax.jit(jax.value_and_grad(lambda z, std=std: jb.klm(z, std))),
                (z,),
            ),
            "latent_quantize": (lq(qj.latent_quantize), lq(jb.latent_quantize), (z, values)),
        }
        for name, (ours, plain, args) in pairs.items():
            try:
                a, b = timed(ours, args, rounds), timed(plain, args, rounds)
                emit(
                    out,
                    {
                        "speed": name,
                        "n": n,
                        "d": d,
                        "qkernels_ms": round(a, 4),
                        "plain_jax_ms": round(b, 4),
                        "speedup": round(b / a, 2),
                    },
                )
            except Exception as err:
                emit(out, {"speed": name, "n": n, "d": d, "error": f"{type(err).__name__}: {str(err)[:300]}"})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--dry-run", action="store_true", help="on the CPU, tiny shapes")
    a = p.parse_args()
    cpu = jax.devices("cpu")[0]
    gpus = [dev for dev in jax.devices() if dev.platform == "gpu"]
    with open(a.out, "w") as out:
        cuda = sorted(name for name, platforms in _ffi.PLATFORMS.items() if "CUDA" in platforms)
        emit(
            out,
            {
                "setup": {
                    "jax": jax.__version__,
                    "devices": [str(dev) for dev in jax.devices()],
                    "cuda_library": _ffi.CUDA_PATH,
                    "cuda_missing": _ffi.CUDA_MISSING,
                    "cuda_targets": cuda,
                }
            },
        )
        if not gpus and not a.dry_run:
            emit(out, {"error": "jax sees no GPU (jax[cuda12] installed?): nothing to check"})
            return 1
        device = cpu if a.dry_run else gpus[0]
        correct(out, device, cpu, *((8, 3) if a.dry_run else (256, 12)))
        shapes = [(16, 3)] if a.dry_run else [(64, 12), (1024, 12), (4096, 12)]
        speed(out, device, shapes, 3 if a.dry_run else 50)
    return 0


if __name__ == "__main__":
    sys.exit(main())
