"""Benchmark harness shared by ``qkernels bench`` and ``benchmarks/``.

A hot path contributes a module (``qkernels.bench.<hotpath>``) with ``cases()``: a list of
:class:`Case`, each a named input shape with one forward+backward callable per variant (every
backend of the op, ``reference_compiled`` — ``torch.compile`` of the reference, what a user gets for free —
plus baseline formulations). Variants of a case are timed interleaved in this process (min and
median). Peak memory: on a GPU, ``torch.cuda.max_memory_allocated`` growth during one run, in this
process; on the CPU, the growth of the peak resident set size (VmHWM, reset just before the run)
while the variant runs once in a fresh subprocess, after a warm-up: CPU tensors are invisible to
tracemalloc, and the resident set sees every page the process touches.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

HOTPATHS = ("quantize", "kde", "hessian", "overhead")


@dataclasses.dataclass
class Case:
    """One benchmark shape. ``make(scale)`` builds the inputs (``scale=0``: tiny warm-up inputs);
    ``variants[name](*inputs)`` runs one forward + backward."""

    hotpath: str
    name: str
    make: Callable[[int], tuple]
    variants: dict[str, Callable[..., None]]
    baseline: str = "reference"
    slow: bool = False  # minutes per variant: ``qkernels bench`` runs it only with ``--all``


def variant(loss: Callable[..., torch.Tensor], backend: str = "reference", *, compiled: bool = False):
    """A forward + backward callable: ``loss(*inputs).backward()`` on ``backend`` (``compiled``:
    ``torch.compile`` of ``loss``, inductor, default mode), then the inputs' gradients (and those
    of any module among them) are cleared."""
    from qkernels import use_backend

    fn = torch.compile(loss) if compiled else loss

    def forward_backward(*inputs):
        with use_backend(backend):
            fn(*inputs).backward()
        for t in inputs:
            if isinstance(t, torch.nn.Module):
                t.zero_grad(set_to_none=True)
            elif isinstance(t, torch.Tensor) and t.requires_grad:
                t.grad = None

    return forward_backward


def backend_variants(loss: Callable[..., torch.Tensor], device: str) -> dict[str, Callable[..., None]]:
    """One variant per backend that runs on ``device`` (Triton on the CPU only runs in the
    interpreter: left out), plus ``reference_compiled``: torch.compile of the reference (the second
    baseline: what a user gets for free)."""
    from qkernels import available_backends

    names = [b for b in available_backends(device) if not (b == "triton" and device == "cpu")]
    out = {b: variant(loss, b) for b in names}
    out["reference_compiled"] = variant(loss, compiled=True)
    return out


def cases(hotpath: str) -> list[Case]:
    return importlib.import_module(f"qkernels.bench.{hotpath}").cases()


def find_case(hotpath: str, name: str) -> Case:
    for case in cases(hotpath):
        if case.name == name:
            return case
    raise KeyError(f"no benchmark case {name!r} in {hotpath}")


def _on_cuda(inputs: tuple) -> bool:
    for t in inputs:
        if isinstance(t, torch.Tensor):
            return t.is_cuda
        if isinstance(t, torch.nn.Module):
            return any(p.is_cuda for p in t.parameters())
    return False


def time_variants(
    case: Case, names: list[str], *, min_time: float = 0.5, max_rounds: int = 20, max_seconds: float = 20.0
) -> dict[str, list[float] | BaseException]:
    """Wall seconds of forward + backward runs of each variant, interleaved (round r runs every
    variant once, so drift in machine load hits all alike), after one warm-up run each; at least 3
    rounds, more while under ``min_time`` per variant; only 2 when the rounds already took
    ``max_seconds`` (variants of seconds per run). A variant that raises is reported as the
    exception instead of times."""
    inputs = case.make(1)
    cuda = _on_cuda(inputs)
    out: dict[str, list[float] | BaseException] = {}
    live = []
    for name in names:
        try:
            case.variants[name](*inputs)
            live.append(name)
            out[name] = []
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out[name] = exc
    start = time.perf_counter()
    for r in range(max_rounds):
        elapsed = time.perf_counter() - start
        if (r >= 3 and elapsed >= min_time * max(1, len(live))) or (r >= 2 and elapsed >= max_seconds):
            break
        for name in live:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            case.variants[name](*inputs)
            if cuda:
                torch.cuda.synchronize()
            out[name].append(time.perf_counter() - t0)
    return out


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _probe(hotpath: str, name: str, variant: str) -> int:
    """Peak-RSS growth (bytes) of one run, measured in this (fresh) process: the peak (VmHWM) is
    reset to the current RSS just before the run (Linux ``/proc/self/clear_refs``)."""
    case = find_case(hotpath, name)
    fn = case.variants[variant]
    # warm-up: loads code paths, thread pools, lazy initialisation (compiled variants: on the real
    # shapes, so that compilation is not measured)
    fn(*case.make(1 if "compiled" in variant else 0))
    inputs = case.make(1)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_bytes("VmRSS")
    fn(*inputs)
    return max(_status_bytes("VmHWM") - before, 0)


def _cuda_peak(case: Case, variant: str, warm: bool) -> int:
    """Growth of torch.cuda.max_memory_allocated over one run (this process), after a warm-up run
    unless ``warm`` is False (the variant already ran here)."""
    inputs = case.make(1)
    fn = case.variants[variant]
    if warm:
        fn(*inputs)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn(*inputs)
    torch.cuda.synchronize()
    return max(torch.cuda.max_memory_allocated() - before, 0)


def peak_memory(case: Case, variant: str, *, warm: bool = True) -> int | None:
    """Peak memory (bytes) of one forward + backward of ``variant``: GPU memory for CUDA cases
    (``warm=False``: the variant already ran in this process), else peak-RSS growth in a
    subprocess."""
    if _on_cuda(case.make(0)):
        return _cuda_peak(case, variant, warm)
    code = (
        "import json, sys; from qkernels.bench import _probe; "
        f"print(json.dumps(_probe({case.hotpath!r}, {case.name!r}, {variant!r})))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    if res.returncode != 0:
        return None
    return int(json.loads(res.stdout.strip().splitlines()[-1]))


def machine() -> str:
    """One line describing this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"
    return (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads{gpu}"
    )


def _cell(x: float | None, fmt: str) -> str:
    return "-" if x is None else fmt.format(x)


def run(hotpaths=HOTPATHS, *, memory: bool = True, include_slow: bool = False, out=sys.stdout) -> list[dict]:
    """Benchmark every case of every hot path; print a markdown table; return the rows.

    Ratios are of medians measured in the same run: "vs baseline" = baseline / variant and "vs
    compiled" = compiled reference / variant (> 1: the variant is faster)."""
    rows = []
    print(f"machine: {machine()}", file=out)
    header = (
        "| hot path | case | variant | min (ms) | median (ms) | vs baseline | vs compiled ref | peak MiB "
        "| memory vs baseline |"
    )
    for hotpath in hotpaths:
        print(f"\n{header}\n|---|---|---|---:|---:|---:|---:|---:|---:|", file=out, flush=True)
        for case in cases(hotpath):
            if case.slow and not include_slow:
                print(f"| {hotpath} | {case.name} | (slow: run with --all) | | | | | | |", file=out)
                continue
            times = time_variants(case, list(case.variants))
            med = {v: statistics.median(t) for v, t in times.items() if not isinstance(t, BaseException)}
            mems = {v: peak_memory(case, v, warm=False) if memory else None for v in med}
            for name, t in times.items():
                if isinstance(t, BaseException):
                    msg = f"{type(t).__name__}: {t}".replace("\n", " ").replace("|", "/")[:160]
                    print(f"| {hotpath} | {case.name} | {name} | failed: {msg} | | | | | |", file=out, flush=True)
                    rows.append({"hotpath": hotpath, "case": case.name, "variant": name, "error": repr(t)})
                    continue
                mem, base_m = mems[name], mems.get(case.baseline)
                row = {
                    "hotpath": hotpath, "case": case.name, "variant": name, "min_s": min(t), "median_s": med[name],
                    "vs_baseline": med[case.baseline] / med[name] if case.baseline in med else None,
                    "vs_compiled": med["reference_compiled"] / med[name] if "reference_compiled" in med else None,
                    "peak_bytes": mem, "memory_ratio": (mem / base_m) if mem and base_m else None,
                }
                rows.append(row)
                print(
                    f"| {hotpath} | {case.name} | {name} | {min(t) * 1e3:.3f} | {med[name] * 1e3:.3f} | "
                    f"{_cell(row['vs_baseline'], '{:.2f}x')} | {_cell(row['vs_compiled'], '{:.2f}x')} | "
                    f"{_cell(None if mem is None else mem / 2**20, '{:.1f}')} | "
                    f"{_cell(row['memory_ratio'], '{:.3f}x')} |",
                    file=out, flush=True,
                )
    return rows
