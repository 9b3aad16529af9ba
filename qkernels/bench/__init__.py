"""Benchmark harness shared by ``qkernels bench`` and ``benchmarks/``.

A hot path contributes a module (``qkernels.bench.<hotpath>``) with ``cases()``: a list of
:class:`Case`, each a named input shape with one forward+backward callable per variant (every
backend of the op, plus baseline formulations). Times are medians of repeated runs in this process;
peak memory is measured in a fresh subprocess as the growth of the peak resident set size (VmHWM,
reset just before the run) while the variant runs once, after a warm-up on tiny inputs: CPU
tensors are invisible to tracemalloc, and the resident set sees every page the process touches.
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

HOTPATHS = ("quantize", "kde", "hessian")


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


def cases(hotpath: str) -> list[Case]:
    return importlib.import_module(f"qkernels.bench.{hotpath}").cases()


def find_case(hotpath: str, name: str) -> Case:
    for case in cases(hotpath):
        if case.name == name:
            return case
    raise KeyError(f"no benchmark case {name!r} in {hotpath}")


def time_variant(case: Case, variant: str, *, min_time: float = 0.5, max_repeat: int = 20) -> float:
    """Median wall seconds of one forward + backward (after one warm-up run)."""
    inputs = case.make(1)
    fn = case.variants[variant]
    fn(*inputs)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_repeat and (len(times) < 3 or time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        fn(*inputs)
        if inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


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
    fn(*case.make(0))  # warm-up: loads code paths, thread pools, lazy initialisation
    inputs = case.make(1)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_bytes("VmRSS")
    fn(*inputs)
    return max(_status_bytes("VmHWM") - before, 0)


def peak_memory(case: Case, variant: str) -> int | None:
    """Peak memory (bytes) of one forward + backward of ``variant``, from a subprocess."""
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


def run(hotpaths=HOTPATHS, *, memory: bool = True, include_slow: bool = False, out=sys.stdout) -> list[dict]:
    """Benchmark every case of every hot path; print a markdown table; return the rows."""
    rows = []
    print(f"machine: {machine()}", file=out)
    header = "| hot path | case | variant | time (ms) | vs baseline | peak MiB | vs baseline |"
    for hotpath in hotpaths:
        print(f"\n{header}\n|---|---|---|---:|---:|---:|---:|", file=out, flush=True)
        for case in cases(hotpath):
            if case.slow and not include_slow:
                print(f"| {hotpath} | {case.name} | (slow: run with --all) | | | | |", file=out)
                continue
            results = {}
            for variant in case.variants:
                secs = time_variant(case, variant)
                mem = peak_memory(case, variant) if memory else None
                results[variant] = (secs, mem)
            base_t, base_m = results[case.baseline]
            for variant, (secs, mem) in results.items():
                row = {
                    "hotpath": hotpath, "case": case.name, "variant": variant, "seconds": secs,
                    "speedup": base_t / secs, "peak_bytes": mem,
                    "memory_ratio": (mem / base_m) if mem and base_m else None,
                }
                rows.append(row)
                mem_s = "-" if mem is None else f"{mem / 2**20:.1f}"
                ratio = "-" if row["memory_ratio"] is None else f"{row['memory_ratio']:.3f}x"
                print(
                    f"| {hotpath} | {case.name} | {variant} | {secs * 1e3:.3f} | "
                    f"{base_t / secs:.2f}x faster | {mem_s} | {ratio} |",
                    file=out, flush=True,
                )
    return rows
