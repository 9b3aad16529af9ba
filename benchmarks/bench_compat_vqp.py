"""qkernels.compat.vector_quantize_pytorch against vector-quantize-pytorch 1.32.0: one forward + backward
of ``FSQ`` / ``LatentQuantize`` (loss: sum(quantized * upstream), plus LatentQuantize's loss) at the
shapes its users run: sequences (B, N, D) / (B, D, N) and images (B, D, H, W), 65536 vectors of 6-8
latents with 5-8 levels, with and without projections, and 4096 vectors of 64 latents (5^64 codes:
the package materializes the product codebook and cannot build that; as 8 codebooks of 8 latents it
can). Variants: ``package`` (the baseline) and ``qkernels`` (backend auto).

    python benchmarks/bench_compat_vqp.py [--threads N] [--min-time S] [--no-memory] [-k NAME]
        variants interleaved round by round (as ``qkernels bench``): min, median, IQR, ratio
        "package / qkernels" per round, peak-RSS growth of one run in a fresh process
    pytest benchmarks/bench_compat_vqp.py --benchmark-only
        pytest-benchmark, one variant after the other (not interleaved); the summary table of
        benchmarks/conftest.py

Needs ``pip install vector-quantize-pytorch`` (the ``dev`` extra). The file is named bench_*.py so that
``pytest benchmarks/`` leaves it out unless named.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import torch

from qkernels import bench
from qkernels.bench import Case, _status_bytes, report
from qkernels.compat import vector_quantize_pytorch as ours

HOTPATH = "compat"
LEGEND = {
    "package": "vector-quantize-pytorch 1.32.0's class (the baseline)",
    "qkernels": "qkernels.compat.vector_quantize_pytorch's class, backend auto (LatentQuantize: the fused "
    "latent_quantize kernel)",
}

#: (name, class, levels, constructor keywords, input shape); B x N = 65536 vectors unless named otherwise
SHAPES = [
    ("FSQ seq (16,4096,6) L=888555", "FSQ", [8, 8, 8, 5, 5, 5], {}, (16, 4096, 6)),
    (
        "FSQ seq (16,128,4096) ch-first proj",
        "FSQ",
        [8, 8, 8, 5, 5, 5],
        {"dim": 128, "channel_first": True},
        (16, 128, 4096),
    ),
    ("FSQ img (16,8,64,64) L=88555555", "FSQ", [8, 8, 5, 5, 5, 5, 5, 5], {}, (16, 8, 64, 64)),
    ("FSQ img (16,64,64,64) proj", "FSQ", [8, 8, 5, 5, 5, 5, 5, 5], {"dim": 64}, (16, 64, 64, 64)),
    ("FSQ 4096 x 64 lat, no idx", "FSQ", [5] * 64, {"return_indices": False}, (1, 4096, 64)),
    ("FSQ 4096 x 8 cb x 8 lat", "FSQ", [5] * 8, {"num_codebooks": 8}, (1, 4096, 64)),
    ("LQ seq (16,6,4096) L=888555", "LatentQuantize", [8, 8, 8, 5, 5, 5], {"dim": 6}, (16, 6, 4096)),
    ("LQ seq (16,128,4096) proj", "LatentQuantize", [8, 8, 8, 5, 5, 5], {"dim": 128}, (16, 128, 4096)),
    ("LQ img (16,8,64,64) L=88555555", "LatentQuantize", [8, 8, 5, 5, 5, 5, 5, 5], {"dim": 8}, (16, 8, 64, 64)),
    ("LQ img (16,64,64,64) proj", "LatentQuantize", [8, 8, 5, 5, 5, 5, 5, 5], {"dim": 64}, (16, 64, 64, 64)),
    ("LQ 4096 x 64 lat (5^64 codes)", "LatentQuantize", 5, {"dim": 64, "codebook_dim": 64}, (4096, 64)),
    ("LQ 4096 x 8 cb x 8 lat", "LatentQuantize", [5] * 8, {"dim": 64, "num_codebooks": 8}, (4096, 64)),
]


def _package():
    try:
        import vector_quantize_pytorch
    except ImportError:
        return None
    return vector_quantize_pytorch


def _build(module, cls: str, levels, kwargs: dict) -> torch.nn.Module | BaseException:
    """The quantizer, or the exception its constructor raised (shown in the table). Ours gets
    ``return_indices=False`` where the codebook has more codes than int32 indices hold (it raises
    otherwise, naming that keyword; the package's LatentQuantize has no such keyword and fails to build)."""
    kw = dict(kwargs)
    if module is ours and cls == "LatentQuantize" and kw.get("codebook_dim") == 64:
        kw["return_indices"] = False
    try:
        torch.manual_seed(0)
        return getattr(module, cls)(levels, **kw)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        return exc


def _make_case(name: str, cls: str, levels, kwargs: dict, shape: tuple) -> Case:
    package = _package()
    feature_axis = 1 if cls == "LatentQuantize" or kwargs.get("channel_first") or len(shape) >= 4 else len(shape) - 1

    def make(scale: int):
        """(x, upstream, package module or its error, ours with the package's parameters); ``scale=0``:
        one sample of at most 4 positions per axis (warm-up)."""
        theirs = _build(package, cls, levels, kwargs) if package else ImportError("vector_quantize_pytorch")
        mine = _build(ours, cls, levels, kwargs)
        if isinstance(theirs, torch.nn.Module) and isinstance(mine, torch.nn.Module):
            mine.load_state_dict(theirs.state_dict())
        s = (
            shape
            if scale
            else tuple(n if i == feature_axis else 1 if i == 0 else min(n, 4) for i, n in enumerate(shape))
        )
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(s, generator=g) * (0.6 if cls == "LatentQuantize" else 1.5)).requires_grad_()
        return x, torch.randn(s, generator=g), theirs, mine

    def variant(which: int) -> Callable[..., None]:
        def forward_backward(x, upstream, theirs, mine):
            module = (theirs, mine)[which]
            if isinstance(module, BaseException):
                raise module
            out = module(x)
            loss = (out[0] * upstream).sum()
            if len(out) == 3:
                loss = loss + out[2]
            loss.backward()
            x.grad = None
            module.zero_grad(set_to_none=True)

        return forward_backward

    return Case(HOTPATH, name, make, {"package": variant(0), "qkernels": variant(1)}, baseline="package")


def cases() -> list[Case]:
    return [_make_case(*s) for s in SHAPES]


# ----------------------------------------------------------------------------- peak memory


def _probe(name: str, variant: str) -> int:
    """Peak-RSS growth (bytes) of one run in this fresh process, after a warm-up at small shapes. Only
    the variant's own module is kept (the package's constructor allocates, e.g. 32 MiB of implicit
    codebook for 10^6 codes: freed memory the run would reuse unseen), and freed memory goes back to
    the OS before the run (glibc ``malloc_trim``)."""
    import ctypes

    case = next(c for c in cases() if c.name == name)
    fn = case.variants[variant]
    keep = 2 if variant == "package" else 3
    x, up, *modules = case.make(0)
    fn(x, up, *modules)
    x, up, *modules = case.make(1)
    modules = [m if i + 2 == keep else None for i, m in enumerate(modules)]
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_bytes("VmRSS")
    fn(x, up, *modules)
    return max(_status_bytes("VmHWM") - before, 0)


def peak_memory(case: Case, variant: str) -> int | None:
    env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
    res = subprocess.run(
        [sys.executable, __file__, "--probe", case.name, variant], capture_output=True, text=True, env=env
    )
    if res.returncode != 0:
        return None
    return int(json.loads(res.stdout.strip().splitlines()[-1]))


# ----------------------------------------------------------------------------- pytest-benchmark

PARAMS = [(c, v) for c in cases() for v in c.variants] if _package() else []


@pytest.mark.skipif(_package() is None, reason="needs vector-quantize-pytorch")
@pytest.mark.parametrize(("case", "variant"), PARAMS, ids=[f"{c.name}-{v}" for c, v in PARAMS])
def test_compat_vqp(benchmark, case, variant):
    inputs = case.make(1)
    module = inputs[2] if variant == "package" else inputs[3]
    if isinstance(module, BaseException):
        pytest.skip(f"{variant} cannot build this shape: {type(module).__name__}: {module}")
    bench.benchmark_case(benchmark, case, variant, memory=False)


# ----------------------------------------------------------------------------- interleaved run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: as set)")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds of timed runs per variant")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    parser.add_argument("--probe", nargs=2, metavar=("CASE", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(_probe(*args.probe)))
        return 0
    if _package() is None:
        print("needs vector-quantize-pytorch: pip install vector-quantize-pytorch", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    say = lambda *lines: print(*lines, sep="\n", flush=True)  # noqa: E731
    say(*report.wrap(f"machine: {bench.machine()}; load average {os.getloadavg()}"))
    warning = report.load_warning()
    if warning:
        say(*report.wrap(warning))
    say("", "== vector-quantize-pytorch vs qkernels.compat: one forward + backward per run ==", report.header())
    clock, t0 = report.cpu_clock(), time.perf_counter()
    for case in cases():
        if args.k not in case.name:
            continue
        times = bench.time_variants(case, list(case.variants), min_time=args.min_time)
        rows = bench.summarize(case, times)
        if not args.no_memory:
            ok = [r for r in rows if "error" not in r]
            peaks = {r["variant"]: peak_memory(case, r["variant"]) for r in ok}
            for r in ok:
                r["peak_bytes"] = peaks[r["variant"]]
                base = peaks.get(case.baseline)
                r["memory_ratio"] = r["peak_bytes"] / base if r["peak_bytes"] and base else None
        rounds = max((r["rounds"] for r in rows if "rounds" in r), default=None)
        say(*report.case_lines(case.name, rows, baseline=case.baseline, rounds=rounds))
    warning = report.others_warning(clock, report.cpu_clock(), time.perf_counter() - t0)
    if warning:
        say(*report.wrap(warning))
    say(*report.wrap("legend: " + report.COLUMNS))
    for name, text in LEGEND.items():
        say(*report.wrap(f"{name}: {text}", "  "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
