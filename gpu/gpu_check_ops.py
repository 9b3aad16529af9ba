"""Issue 44's GPU measurements, one step at a time, each writing its rows to OUT as it goes (run by
gpu/gpu_check.sh; no network):

    python gpu/gpu_check_ops.py correct OUT/correct.jsonl   # every op and backend against float64
    python gpu/gpu_check_ops.py speed OUT/speed.jsonl       # the issue's speed table, compiled baseline
    python gpu/gpu_check_ops.py profile OUT/profiles.txt    # one torch.profiler table per slow case
    python gpu/gpu_check_ops.py keops OUT/keops.jsonl       # KLM 4096 x 64: triton against pykeops
    python gpu/gpu_check_ops.py warm OUT/warm.jsonl         # one call of every speed variant: fills the caches
    python gpu/gpu_check_ops.py STEP OUT --dry-run          # the same on the CPU at tiny shapes (rehearsal)
    python gpu/gpu_check_ops.py STEP OUT --cases "latent_quantize klm"   # only the cases naming one of these

Cases are the benchmark's (qkernels/bench/: its input makers and loss functions). ``correct``: the loss and the
input gradients of each backend, float32 and float64, against the reference run in float64 on the same inputs
(relative errors: |loss - loss64| / |loss64|, ||grad - grad64|| / ||grad64||); the float32 reference's own
error is the yardstick. The Hessian penalty draws its directions in the inputs' dtype: each dtype against the
reference in that dtype (same draws). ``speed``: forward + backward, float32, matmul precision "highest",
variants interleaved (qkernels.bench.time_variants), median ms; ``reference_compiled`` is torch.compile of the
reference; latent_quantize also has ``triton_4launch`` and KLM ``triton_symmetric``, the Triton kernels issue 53
replaced (gpu/experiments/latent_quantize_4launch.py, klm_symmetric.py: :data:`EXPERIMENTS`), beside ``triton`` (on
a CPU both need TRITON_INTERPRET=1).
``warm``: one forward + backward of every ``speed`` variant (and of pykeops' KLM), so that the compiles land in
the on-disk caches (inductor's FX graph and autograd caches, Triton's kernel cache, pykeops' build folder) while
the GPU tests run, and ``speed`` starts compiled. ``keops``: pykeops (its wheels carried: the GPU
machine has no network; built from the sdists with ``pip wheel --no-deps pykeops keopscore``) computes KLM's
log-sum-exps over the same pairs; skipped with a row saying why when not importable.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch

import qkernels
from qkernels._backend import kernels
from qkernels.bench import Case, time_variants, variant
from qkernels.bench import hessian as bh
from qkernels.bench import kde as bk
from qkernels.bench import quantize as bq
from qkernels.reference import kde as ref_kde

# (op of the registry, case name, input maker (scale -> inputs), loss) at the shapes
SPEED_CLIFF = [(64, 10, 10, 100), (1024, 12, 64, 100), (5000, 2, 100, 100), (4096, 32, 128, 128)]
SLOW = [
    "cliff n=4096 d=32 M=128 K=128",
    "cliff n=5000 d=2 M=100 K=100",
    "klm n=4096 d=64",
    "latent_quantize n=65536 d=64 n_v=64 per-dim",
    "nhp mlp n=64 d=12 k=2",
]


CASES: list[str] = []  # --cases: only the cases whose name contains one of these (all when empty)


def _cases(device: str) -> list[tuple[str, str, Callable[[int], tuple], Callable[..., torch.Tensor]]]:
    return [c for c in _all_cases(device) if not CASES or any(w in c[1] for w in CASES)]


def _all_cases(device: str) -> list[tuple[str, str, Callable[[int], tuple], Callable[..., torch.Tensor]]]:
    out = []
    for s in SPEED_CLIFF:
        out.append(
            ("cliff_loss", f"cliff n={s[0]} d={s[1]} M={s[2]} K={s[3]}", bk._cliff_case(s, device).make, bk._cliff_loss)
        )
    for s in ((1024, 32), (4096, 64)):
        out.append(("klm", f"klm n={s[0]} d={s[1]}", bk._klm_case(s, device).make, bk._klm_loss))
    for n, d, nv, glob in ((4096, 64, 64, True), (4096, 64, 64, False), (65536, 64, 64, False)):
        out.append(
            (
                "latent_quantize",
                f"latent_quantize n={n} d={d} n_v={nv} {'global' if glob else 'per-dim'}",
                bq._make(n, d, nv, glob, device),
                bq._loss,
            )
        )
    out.append(
        (
            "relaxed_categorical",
            "categorical_latent n=4096 d=10 K=64",
            bq._make_categorical(4096, 10, 64, device),
            bq._categorical_loss,
        )
    )
    out.append(
        ("kde_grid", "kde_grid n=4096 d=32 K=128", bk._kde_grid_case((4096, 32, 128), device).make, bk._kde_grid_loss)
    )
    for model in bh.DECODERS:
        out.append(
            (
                "finite_difference_curvature",
                f"nhp {model} n={bh.N} d={bh.D} k={bh.K}",
                bh._make(model, device),
                bh._nhp_loss,
            )
        )
    return out


def _emit(path: str, row: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def _cast(inputs: tuple, dtype: torch.dtype) -> tuple:
    out = []
    for x in inputs:
        if isinstance(x, torch.nn.Module):
            out.append(x.to(dtype))
        elif isinstance(x, torch.Tensor) and x.is_floating_point():
            out.append(x.detach().to(dtype).requires_grad_(x.requires_grad))
        else:
            out.append(x)
    return tuple(out)


def _loss_and_grads(loss, inputs, backend):
    with qkernels.use_backend(backend):
        torch.manual_seed(0)  # the penalties' directions: the same draws for every backend
        value = loss(*inputs)
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    leaves += [p for x in inputs if isinstance(x, torch.nn.Module) for p in x.parameters()]
    grads = torch.autograd.grad(value, leaves, allow_unused=True)  # (the decoders' output layers are unused)
    return value.detach().double(), [g.double() for g in grads if g is not None]


CORRECT_SKIP = {"klm n=4096 d=64"}  # the dense float64 reference holds d (n, n) tensors: ~20 GB; 1024 x 32 is checked


def correct(path: str, device: str, scale: int) -> None:
    for op, name, make, loss in _cases(device):
        if name in CORRECT_SKIP:
            continue
        inputs = make(scale)
        want, want_g = _loss_and_grads(loss, _cast(inputs, torch.float64), "reference")
        for backend in kernels(op, device):
            for dtype in (torch.float32, torch.float64):
                row = {"kind": "correct", "op": op, "case": name, "backend": backend, "dtype": str(dtype)[6:]}
                if op == "finite_difference_curvature":  # the penalty's draws differ by dtype: the reference in it
                    want, want_g = _loss_and_grads(loss, _cast(inputs, dtype), "reference")
                    row["against"] = f"reference {str(dtype)[6:]} (same draws)"
                try:
                    got, got_g = _loss_and_grads(loss, _cast(inputs, dtype), backend)
                    row["loss_rel"] = float((got - want).abs() / want.abs().clamp_min(1e-30))
                    row["grad_rel"] = max(
                        float((g - w).norm() / w.norm().clamp_min(1e-30)) for g, w in zip(got_g, want_g, strict=True)
                    )
                except Exception as exc:  # noqa: BLE001 - reported per row
                    row["error"] = repr(exc)[:300]
                _emit(path, row)


# op -> (variant, module of gpu/experiments/): the kernels an issue replaced, timed beside the package's ``triton``
EXPERIMENTS = {
    "latent_quantize": ("triton_4launch", "latent_quantize_4launch"),
    "klm": ("triton_symmetric", "klm_symmetric"),
}


def _replaced(loss, module: str) -> Callable[..., None]:
    """``loss`` on the Triton kernels gpu/experiments/``module``.py keeps (inside its ``patched()``: the same host
    path, the old kernels), for the A/B against the package's ``triton``."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "experiments"))
    patched = importlib.import_module(module).patched
    run = variant(loss, "triton")

    def forward_backward(*inputs):
        with patched():
            run(*inputs)

    return forward_backward


def _captured(loss, backend: str) -> Callable[..., None]:
    """Forward + backward of ``loss`` on ``backend`` captured once in a CUDA graph (after 3 warm-up calls on a side
    stream; the inputs and the gradients' buffers static), then replayed per call: the penalty with the qkernels
    ops inside a graph, to compare with ``reference_compiled_ro``. The graph accumulates into the gradient buffers
    it captured (other variants clear ``.grad``; the graph's pool keeps its own)."""
    from qkernels import use_backend

    graph = []

    def forward_backward(*inputs):
        if not graph:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), use_backend(backend):
                for _ in range(3):
                    loss(*inputs).backward()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g), use_backend(backend):
                loss(*inputs).backward()
            graph.append(g)
        graph[0].replay()

    return forward_backward


def _compiled_ro(loss) -> Callable[..., None]:
    """``torch.compile(mode="reduce-overhead")`` (CUDA graphs) of the reference: the captured baseline."""
    from qkernels import use_backend

    fn = torch.compile(loss, dynamic=False, mode="reduce-overhead")

    def forward_backward(*inputs):
        with use_backend("reference"):
            fn(*inputs).backward()
        for t in inputs:
            if isinstance(t, torch.nn.Module):
                t.zero_grad(set_to_none=True)

    return forward_backward


def _variants(op: str, name: str, loss, device: str) -> dict[str, Callable[..., None]]:
    out = {"auto": variant(loss, "auto")}
    out |= {b: variant(loss, b) for b in kernels(op, device) if not (b == "triton" and device == "cpu")}
    if op in EXPERIMENTS and "triton" in kernels(op, device):  # the A/B (on a CPU: TRITON_INTERPRET=1)
        out["triton"] = variant(loss, "triton")
        replaced, module = EXPERIMENTS[op]
        out[replaced] = _replaced(loss, module)
    out["reference_compiled"] = variant(loss, compiled=True)
    if op == "finite_difference_curvature" and device == "cuda":  # captured against captured (issue 53)
        out["auto_graph"] = _captured(loss, "auto")
        out["reference_compiled_ro"] = _compiled_ro(loss)
    if op == "cliff_loss" and "triton" in out:
        out["triton high"] = bk._matmul_precision(out["triton"], "high")
    if name == "klm n=4096 d=64":  # the dense reference holds d (n, n) tensors (> 10 GB): as the bench, left out
        out = {v: f for v, f in out.items() if not v.startswith("reference")}
    return out


def speed(path: str, device: str, scale: int) -> None:
    from qkernels.bench import overhead

    torch.set_float32_matmul_precision("highest")
    todo = []
    for op, name, make, loss in _cases(device):
        variants = _variants(op, name, loss, device)
        todo.append(Case("speed", name, (lambda s, m=make: m(scale)), variants))
    # the host floor: tiny KLM against a bare add
    todo += [c for c in overhead.cases(device) if "klm" in c.name and (not CASES or any(w in c.name for w in CASES))]
    for case in todo:
        t0 = time.perf_counter()
        times = time_variants(case, list(case.variants), min_time=0.2, max_seconds=8.0, warmup=0.1)
        for name, t in times.items():
            row = {"kind": "speed", "case": case.name, "variant": name}
            row |= (
                {"error": repr(t)[:300]}
                if isinstance(t, BaseException)
                else {"ms": round(1e3 * statistics.median(t), 4), "rounds": len(t)}
            )
            _emit(path, row)
        _emit(path, {"kind": "speed_case_s", "case": case.name, "s": round(time.perf_counter() - t0, 1)})


def warm(path: str, device: str, scale: int) -> None:
    for op, name, make, loss in _cases(device):
        t0 = time.perf_counter()
        inputs = make(scale)
        for vname, run in _variants(op, name, loss, device).items():
            try:
                run(*inputs)
            except Exception as exc:  # noqa: BLE001 - speed reports it again
                _emit(path, {"kind": "warm", "case": name, "variant": vname, "error": repr(exc)[:300]})
        if device == "cuda":
            torch.cuda.synchronize()
        _emit(path, {"kind": "warm", "case": name, "s": round(time.perf_counter() - t0, 1)})
    try:
        t0 = time.perf_counter()
        _keops_klm(torch.randn(64, 3, device=device, requires_grad=True)).backward()
        _emit(path, {"kind": "warm", "case": "keops klm", "s": round(time.perf_counter() - t0, 1)})
    except Exception as exc:  # noqa: BLE001 - not installed: the keops step says so
        _emit(path, {"kind": "warm", "case": "keops klm", "error": repr(exc)[:300]})


def profile(path: str, device: str, scale: int) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    for op, name, make, loss in _cases(device):
        if name not in SLOW:
            continue
        for backend in kernels(op, device):
            if backend == "triton" and device == "cpu":
                continue
            inputs = make(scale)
            run = variant(loss, backend)
            run(*inputs)  # compile / warm up
            if device == "cuda":
                torch.cuda.synchronize()
            with torch_profile(activities=activities) as prof:
                run(*inputs)
                if device == "cuda":
                    torch.cuda.synchronize()
            sort = "cuda_time_total" if device == "cuda" else "cpu_time_total"
            with open(path, "a") as f:
                f.write(f"\n===== {name} (backend {backend})\n")
                f.write(prof.key_averages().table(sort_by=sort, row_limit=25) + "\n")
            print(f"profiled {name} [{backend}]", flush=True)


def _keops_klm(z: torch.Tensor) -> torch.Tensor:
    """KLM (reference.kde.klm's value) with pykeops' log-sum-exp reductions over the (n, n) pairs."""
    from pykeops.torch import LazyTensor

    n, d = z.shape
    y = z / (ref_kde.population_std(z) + 1e-6)
    f = ref_kde.silverman_factor(n, d)
    yi, yj = LazyTensor(y[:, None, :]), LazyTensor(y[None, :, :])
    joint = (-((yi - yj) ** 2).sum(-1) / (2 * f * f)).logsumexp(dim=1).view(n)
    yt = y.t().contiguous()  # (d, n): one batched 1-D reduction per latent
    xi, xj = LazyTensor(yt[:, :, None, None]), LazyTensor(yt[:, None, :, None])
    marg = (-((xi - xj) ** 2) / 2).logsumexp(dim=2).view(d, n).sum(0)
    return (joint - marg).mean() + (d - 1) * math.log(n) - d * math.log(f)


def keops(path: str, device: str, scale: int) -> None:
    try:
        import pykeops  # noqa: F401
    except ImportError as exc:
        _emit(
            path,
            {
                "kind": "keops",
                "error": f"pykeops not importable ({exc}); carry its wheels: pip wheel --no-deps "
                "pykeops keopscore -w WHEELS, then pip install --no-index -f WHEELS",
            },
        )
        return
    for n, d in ((1024, 32), (4096, 64)) if scale else ((16, 3),):
        z = torch.randn(n, d, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()
        want = ref_kde.klm(z.detach().double(), None)[0]
        variants = {"keops": lambda x: _keops_klm(x).backward(), "triton": variant(bk._klm_loss, "triton")}
        case = Case("keops", f"klm n={n} d={d}", lambda s, z=z: (z,), variants)
        row = {
            "kind": "keops",
            "case": case.name,
            "keops_loss_rel": float(abs(_keops_klm(z.detach()).double() - want) / abs(want)),
        }
        times = time_variants(case, list(variants), min_time=0.2, max_seconds=8.0, warmup=0.1)
        for name, t in times.items():
            row[f"{name}_ms"] = repr(t)[:200] if isinstance(t, BaseException) else round(1e3 * statistics.median(t), 4)
        _emit(path, row)


STEPS = {"correct": correct, "speed": speed, "profile": profile, "keops": keops, "warm": warm}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("out")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes: rehearse the step's code paths")
    parser.add_argument("--cases", default="", help="only the cases whose name contains one of these words")
    args = parser.parse_args(argv)
    CASES[:] = args.cases.split()
    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    if device == "cpu" and not args.dry_run:
        sys.exit("no CUDA device: use --dry-run to rehearse on the CPU")
    STEPS[args.step](args.out, device, 0 if args.dry_run else 1)


if __name__ == "__main__":
    main()
