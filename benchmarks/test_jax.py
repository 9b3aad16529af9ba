"""qkernels.jax on the CPU against the JAX code it replaces (issue 45), forward + backward, both under ``jax.jit``.

Per op, at the papers' shapes and at 4x and 16x their batch (hot path "jax"):

- ``klm`` (Tripod, n = 64 x {1, 4, 16}, d = 12; and n = 4096, slow, with the peak RSS of each side);
- ``nhp`` (Tripod, k = 2, eps = 0.1, n = 64 x {1, 4, 16}, d = 12; fn a 3-layer GELU MLP, 256 wide, all 3 layers
  regularized);
- ``latent_quantize`` (QLAE, n = 128 x {1, 4, 16}, d = 12, n_v = 10), also per sample under ``jax.vmap`` (the op's
  batching rule: one kernel call for the batch), and ``fsq`` (Tripod, n = 64 x ..., L = 12);
- ``cliff`` (n = 64 x ..., d = 10, M = 10, K = 100) and ``kde_grid`` (its univariate derivative grid, K = 100).

The baseline ("authors") is the authors' own function when a checkout of their repository is named by
``QKERNELS_TRIPOD_REPO`` / ``QKERNELS_QLAE_REPO``, else ("plain jax") the formulation of benchmarks/jax_baselines.py
(the papers' equations in jax.numpy; tests/test_jax_baselines.py checks that both compute the op's values).
Cliff has no published code: its baseline is always the plain formulation. ``qkernels`` is the op.

With both checkouts, the authors' whole training step (python/jax_dropin_*.py: their train_step, original vs
with the drop-in) at the paper's batch and 4x: the small models by default, the paper's with ``--bench-all``.

    .venv/bin/python benchmarks/test_jax.py                           # interleaved rounds, one table (quiet machine)
    .venv/bin/python -m pytest benchmarks/test_jax.py --benchmark-only  # pytest-benchmark (+ --bench-all: slow)
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")
qj = pytest.importorskip("qkernels.jax")

import jax.numpy as jnp  # noqa: E402

from qkernels.bench import Case, benchmark_case, short_id  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import jax_baselines as jb  # noqa: E402

SCALES = (1, 4, 16)  # x the papers' batch
D_TRIPOD, D_QLAE, NV, LEVELS = 12, 12, 10, 12
CLIFF = (10, 10, 100)  # (d, M, K)
KLM_MEMORY_N = 4096
HIDDEN = 256


def run(fn):
    """A variant: ``fn(*inputs)`` (a jitted function), waited for."""
    return lambda *inputs: jax.block_until_ready(fn(*inputs))


@functools.cache
def authors(which: str):
    """The authors' functions (benchmarks/jax_baselines.py) or None when no checkout is named."""
    return jb.authors_tripod() if which == "tripod" else jb.authors_qlae()


def baseline_name(which: str) -> str:
    return "authors" if authors(which) else "plain jax"


def _normal(seed: int, shape) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(seed), shape)


# ----------------------------------------------------------------------------- per-op cases


def klm_case(n: int, slow: bool = False) -> Case:
    def make(scale):
        z = _normal(0, (n, D_TRIPOD) if scale else (8, 3))
        return z, jnp.std(z, 0) + 1e-6

    base = authors("tripod")["klm"] if authors("tripod") else jb.klm
    grad = functools.partial(jax.value_and_grad, argnums=(0, 1))
    variants = {
        baseline_name("tripod"): run(jax.jit(grad(base))),
        "qkernels": run(jax.jit(grad(lambda z, std: qj.klm_loss(z, std=std)))),
    }
    return Case("jax", f"klm n={n} d={D_TRIPOD}", make, variants, baseline=baseline_name("tripod"), slow=slow)


def mlp_params(d: int, seed: int = 0) -> list:
    """A 3-layer GELU MLP decoder's (weight, bias) pairs, d -> 256 -> 256 -> 256."""
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    sizes = [d, HIDDEN, HIDDEN, HIDDEN]
    return [
        (jax.random.normal(k, (a, b)) / math.sqrt(a), jnp.zeros(b))
        for k, a, b in zip(keys, sizes[:-1], sizes[1:], strict=True)
    ]


def mlp(params, z):
    """The decoder's regularized activations, by name, for z (d,) or (N, d)."""
    out, h = {}, z
    for i, (w, b) in enumerate(params):
        h = jax.nn.gelu(h @ w + b)
        out[f"h{i}"] = h
    return out


def nhp_case(n: int) -> Case:
    def make(scale):
        nn_, d = (n, D_TRIPOD) if scale else (4, 3)
        z = _normal(1, (nn_, d))
        return mlp_params(d), z, jnp.std(z, 0) + 1e-6, jax.random.PRNGKey(2)

    tripod = authors("tripod")

    def base(params, z, std, key):
        fn = functools.partial(mlp, params)
        if tripod:
            return tripod["nhp"](fn, z, std, jax.random.split(key, z.shape[0]))
        return jb.nhp(fn, z, std, jax.random.normal(key, (4, *z.shape)))

    def ours(params, z, std, key):
        return qj.normalized_hessian_penalty(functools.partial(mlp, params), z, key, std)

    grad = functools.partial(jax.value_and_grad, argnums=(0, 1, 2))
    variants = {baseline_name("tripod"): run(jax.jit(grad(base))), "qkernels": run(jax.jit(grad(ours)))}
    return Case("jax", f"nhp n={n} d={D_TRIPOD} k=2 mlp", make, variants, baseline=baseline_name("tripod"))


def quantize_case(n: int) -> Case:
    def make(scale):
        nn_, d, nv = (n, D_QLAE, NV) if scale else (4, 3, 5)
        values = jnp.broadcast_to(jnp.linspace(-0.5, 0.5, nv), (d, nv)) + 0.01 * _normal(3, (d, nv))
        return _normal(4, (nn_, d)), values, _normal(5, (nn_, d))

    qlae = authors("qlae")
    quantize = qlae["latent_quantize"] if qlae else jb.latent_quantize

    def loss(fn):
        def f(z, values, upstream):
            z_q, _, loss_q, loss_c = fn(z, values)
            return jnp.sum(z_q * upstream) + 0.01 * (loss_q + loss_c)

        return jax.jit(jax.value_and_grad(f, argnums=(0, 1)))

    variants = {baseline_name("qlae"): run(loss(quantize)), "qkernels": run(loss(qj.latent_quantize))}
    return Case("jax", f"latent_quantize n={n} d={D_QLAE} n_v={NV}", make, variants, baseline=baseline_name("qlae"))


def quantize_vmap_case(n: int) -> Case:
    """latent_quantize per sample under ``jax.vmap`` (as the authors' model calls its quantizer, and the QLAE drop-in
    ours) against the same op's batched call and the authors' per-sample quantizer, vmapped as their model does."""
    make = quantize_case(n).make
    qlae = authors("qlae")
    quantize = qlae["latent_quantize"] if qlae else jb.latent_quantize

    def loss(fn):
        def f(z, values, upstream):
            z_q, _, loss_q, loss_c = fn(z, values)
            return jnp.sum(z_q * upstream) + 0.01 * (jnp.mean(loss_q) + jnp.mean(loss_c))

        return run(jax.jit(jax.value_and_grad(f, argnums=(0, 1))))

    per_sample = jax.vmap(qj.latent_quantize, in_axes=(0, None))  # z (d,) per sample: one kernel call for the batch
    variants = {
        baseline_name("qlae"): loss(quantize),
        "qkernels": loss(qj.latent_quantize),
        "qkernels vmap": loss(per_sample),
    }
    return Case(
        "jax",
        f"latent_quantize per sample (vmap) n={n} d={D_QLAE} n_v={NV}",
        make,
        variants,
        baseline=baseline_name("qlae"),
    )


def fsq_case(n: int) -> Case:
    def make(scale):
        shape = (n, D_TRIPOD) if scale else (4, 3)
        return _normal(6, shape), _normal(7, shape)

    tripod = authors("tripod")

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda z, up: jnp.sum(fn(z) * up)))

    base = (lambda z: tripod["fsq"](z, LEVELS)) if tripod else (lambda z: jb.fsq(z, LEVELS)[0])
    variants = {baseline_name("tripod"): run(loss(base)), "qkernels": run(loss(lambda z: qj.fsq(z, LEVELS).z_q))}
    return Case("jax", f"fsq n={n} d={D_TRIPOD} L={LEVELS}", make, variants, baseline=baseline_name("tripod"))


def cond_rows(n: int, d: int, m: int, seed: int = 8) -> jax.Array:
    """(d, M) distinct rows per latent."""
    keys = jax.random.split(jax.random.PRNGKey(seed), d)
    return jnp.stack([jax.random.permutation(k, n)[:m] for k in keys]).astype(jnp.int32)


def cliff_case(n: int) -> Case:
    d, m, k = CLIFF

    def make(scale):
        nn_, dd, mm = (n, d, m) if scale else (8, 2, 2)
        return _normal(9, (nn_, dd)), cond_rows(nn_, dd, mm)

    grid = (-5.0, 5.0, k)
    variants = {
        "plain jax": run(jax.jit(jax.value_and_grad(lambda z, idx: jb.cliff_loss(z, idx, grid=grid)[0]))),
        "qkernels": run(jax.jit(jax.value_and_grad(lambda z, idx: qj.cliff_loss(z, cond_index=idx, grid=grid)))),
    }
    return Case("jax", f"cliff n={n} d={d} M={m} K={k}", make, variants, baseline="plain jax")


def kde_grid_case(n: int) -> Case:
    d, _, k = CLIFF

    def make(scale):
        nn_, dd, kk = (n, d, k) if scale else (8, 2, 5)
        points = jnp.broadcast_to(jnp.linspace(-5.0, 5.0, kk), (dd, kk))
        return points, _normal(10, (nn_, dd)), _normal(11, (dd, kk))

    def loss(fn):
        f = lambda p, s, up: jnp.sum(fn(p, s, 0.1, derivative=True) * up)  # noqa: E731
        return run(jax.jit(jax.value_and_grad(f, argnums=(0, 1))))

    variants = {"plain jax": loss(jb.kde_grid), "qkernels": loss(qj.kde_grid)}
    return Case("jax", f"kde_grid n={n} d={d} K={k} derivative", make, variants, baseline="plain jax")


def op_cases() -> list[Case]:
    out = []
    for s in SCALES:
        out += [
            klm_case(64 * s),
            nhp_case(64 * s),
            quantize_case(128 * s),
            quantize_vmap_case(128 * s),
            fsq_case(64 * s),
            cliff_case(64 * s),
            kde_grid_case(64 * s),
        ]
    return [*out, klm_case(KLM_MEMORY_N, slow=True)]


# ----------------------------------------------------------------------------- KLM memory


def klm_peak(variant: str, n: int = KLM_MEMORY_N, d: int = D_TRIPOD) -> dict | None:
    """Peak-RSS growth and peak RSS (bytes) of one jitted KLM forward + backward in a fresh process
    (``python benchmarks/jax_baselines.py klm-peak``); None if it failed."""
    res = subprocess.run(
        [sys.executable, str(HERE / "jax_baselines.py"), "klm-peak", variant, str(n), str(d)],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    if res.returncode != 0:
        return None
    growth, peak = map(int, res.stdout.split()[-2:])
    return {"growth": growth, "peak": peak}


# ----------------------------------------------------------------------------- training steps


def step_case(method: str, size: str, scale: int) -> Case | None:
    """The authors' training step (their train_step, compiled ahead of time) without and with the drop-in, at
    ``scale`` x the paper's batch; None when the checkout is not named."""
    env = jb.TRIPOD_ENV if method == "tripod" else jb.QLAE_ENV
    if not os.environ.get(env):
        return None
    batch = (64 if method == "tripod" else 128) * scale

    @functools.cache
    def built():
        sys.path.insert(0, str(HERE.parent / "python"))
        try:
            module = __import__(f"jax_dropin_{method}")
        finally:
            sys.path.remove(str(HERE.parent / "python"))
        return module.setup(os.environ[env], size=size, batch=batch, steps=1, gradients=False)

    def make(scale_):
        run_ = built()
        return run_.state, run_.batches[0], run_.keys[0]

    def variant(which):
        return lambda state, batch_, key: jax.block_until_ready(getattr(built(), which)[0](state, batch_, key))

    return Case(
        "jax",
        f"{method} train step {size} batch={batch}",
        make,
        {"original": variant("original"), "qkernels": variant("dropin")},
        baseline="original",
        slow=size == "paper",
        memory=False,
    )


def step_cases() -> list[Case]:
    return [
        c
        for m in ("tripod", "qlae")
        for size in ("small", "paper")
        for s in (1, 4)
        if (c := step_case(m, size, s)) is not None
    ]


# ----------------------------------------------------------------------------- pytest-benchmark


OPS = op_cases()
STEPS = step_cases()
PARAMS = [(c, v) for c in OPS for v in c.variants]
STEP_PARAMS = [(c, v) for c in STEPS for v in c.variants]


@pytest.mark.parametrize(("case", "variant"), PARAMS, ids=[short_id(c, v) for c, v in PARAMS])
def test_jax_op(benchmark, case, variant):
    measure = case.name == f"klm n={KLM_MEMORY_N} d={D_TRIPOD}" and not getattr(benchmark, "disabled", False)
    peak = klm_peak("qkernels" if variant == "qkernels" else "original") if measure else None
    benchmark_case(benchmark, case, variant, memory=False)
    benchmark.extra_info["peak_mib"] = peak and peak["growth"] / 2**20  # the summary's memory columns


@pytest.mark.parametrize(("case", "variant"), STEP_PARAMS, ids=[short_id(c, v) for c, v in STEP_PARAMS])
def test_jax_step(benchmark, case, variant):
    benchmark_case(benchmark, case, variant, memory=False)


# ----------------------------------------------------------------------------- interleaved, one table


LEGEND = {
    "authors": "the authors' own function (QKERNELS_TRIPOD_REPO / QKERNELS_QLAE_REPO checkout), jitted",
    "plain jax": "the op's formulation in jax.numpy (benchmarks/jax_baselines.py), jitted",
    "qkernels": "qkernels.jax: the C++ CPU kernels as XLA FFI custom calls, jitted",
    "qkernels vmap": "qkernels.jax's op on one sample (d,), jax.vmap over the batch (its batching rule), jitted",
    "original": "the authors' train_step as published (their loss, jitted)",
}


def main(include_slow: bool = False) -> None:
    """Every case, its variants in interleaved rounds (:func:`qkernels.bench.time_variants`), one table; then the
    KLM peak memory at n = 4096."""
    from qkernels.bench import case_lines, header, load_warning, summarize, time_variants, wrap

    warning = load_warning()
    print(*wrap(f"jax {jax.__version__}, {os.cpu_count()} cores" + (f"; {warning}" if warning else "")), sep="\n")
    print(header())
    for case in OPS + STEPS:
        if case.slow and not include_slow:
            continue
        rows = summarize(case, time_variants(case, list(case.variants)))
        print(
            *case_lines(
                case.name, rows, baseline=case.baseline, rounds=max((r.get("rounds", 0) for r in rows), default=None)
            ),
            sep="\n",
        )
    peaks = {v: klm_peak(v) for v in ("original", "qkernels")}
    for v, p in peaks.items():
        text = "failed" if p is None else f"{p['growth'] / 2**20:.1f} MiB growth, {p['peak'] / 2**20:.1f} MiB peak RSS"
        print(f"klm n={KLM_MEMORY_N} d={D_TRIPOD} forward + backward, {v}: {text}")
    for name, text in LEGEND.items():
        print(*wrap(f"{name}: {text}", "  "), sep="\n")


if __name__ == "__main__":
    main(include_slow="--all" in sys.argv)
