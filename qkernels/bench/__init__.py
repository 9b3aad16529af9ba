"""Benchmark harness shared by ``qkernels bench`` and ``benchmarks/``.

A hot path contributes a module (``qkernels.bench.<hotpath>``) with ``cases()``: a list of
:class:`Case`, each a named input shape with one forward+backward callable per variant, and an
optional ``LEGEND`` (variant name -> what it means in that hot path).

Variant names (the legend after the tables of ``qkernels bench`` says the same):

- ``reference``: qkernels' reference backend, the op in plain PyTorch ops, eager (the tests' oracle);
- ``reference_compiled``: ``torch.compile`` (inductor, default mode) of the reference: what a user
  gets for free; the second baseline (column "vs compiled");
- ``cpu``, ``triton``, ``cuda``: qkernels' C++ CPU, Triton GPU and CUDA C++ kernels (Triton on the
  CPU would run in the interpreter: left out);
- ``materialized``: the formulation most code writes, with the whole intermediate tensor in memory
  (quantize: (n, d, n_v) distances; Cliff: (d, d, M, K, n) products; KLM: (n, n, d) differences);
  ``materialized compiled``: ``torch.compile`` of it;
- Hessian penalty (``hessian``): ``sequential`` is the authors' formulation (one decoder call per
  perturbation, 1 + 4k calls on n rows; the baseline); ``reference`` / ``cpu`` / ... are qkernels'
  batched penalty (one decoder call on the 4k n stacked rows) with the curvature reduction on
  that backend. The training-step benchmarks (benchmarks/test_hessian.py) add ``none`` (the step
  without a penalty; their baseline), ``stacked`` (the step plus one forward + backward of the
  regularized layers on the 4k n stacked rows: the unavoidable work of any batched penalty),
  ``fused`` (the step plus qkernels' penalty, backend ``auto``) and ``sequential`` (the step plus
  the authors' penalty);
- end-to-end training step (``step``, :mod:`qkernels.bench.step`; not in the default run): ``auto``, the
  ``reference`` backend eager (the baseline), ``reference_compiled`` (torch.compile of the model's loss),
  ``auto_compiled`` (``auto`` under the same compile) and, on CUDA, ``reference_compiled_ro`` /
  ``auto_compiled_ro`` (mode "reduce-overhead") of one ``Trainer.train_step``;
- per-call overhead (``overhead``): ``<backend>`` is the public function on that backend,
  ``<backend> raw`` the backend's implementation called directly with prepared arguments, ``add``
  one ``torch.add`` forward + backward (the baseline: the cost of a single PyTorch op).

Timing (:func:`time_variants`): the variants of a case run interleaved in this process (round r
runs every variant once, so drift in machine load hits all alike): one first run each (lazy
initialisation, ``torch.compile``), interleaved warm-up rounds, then timed rounds — at least
``min_rounds``, more until ``min_time`` seconds per variant (up to ``max_rounds``), only 2 when
rounds take more than ``max_seconds``. Reported: min and median, the interquartile range (IQR) as a
% of the median, and ratios "baseline / variant" as the median of the per-round ratios (each
compares runs seconds apart), in words ("2.00x faster", "2.78x slower"; see
:mod:`qkernels.bench.report`). ``pytest benchmarks/`` cannot interleave: :func:`benchmark_case`
gives each variant the same first run and :data:`WARMUP_S` of warm-up runs, then a number of rounds
chosen from the warm runs' time (:func:`plan_rounds`; never from the first run, which may compile),
and benchmarks/conftest.py prints the same table from pytest-benchmark's statistics. Both warn when
other processes load the machine (:mod:`qkernels.bench.report`), say before a run what it will run and
roughly how long it takes (:func:`estimate_seconds`), and leave the slow cases (``Case.slow``) to
``qkernels bench --all`` / ``pytest benchmarks/ --bench-all``.

Results: ``qkernels bench --save DIR`` writes them as CSV and JSON (:mod:`qkernels.bench.results`),
``--plot DIR`` as one PNG per machine (:mod:`qkernels.bench.plot`); ``python benchmarks/summarize.py`` reads
saved CSVs back into plots and the summary table of benchmarks/RESULTS.md.

Peak memory: on a GPU, ``torch.cuda.max_memory_allocated`` growth during one run, in this process;
on the CPU, the growth of the peak resident set size (VmHWM, reset just before the run) while the
variant runs once in a fresh subprocess, after a warm-up: CPU tensors are invisible to
tracemalloc, and the resident set sees every page the process touches.
"""

from __future__ import annotations

import ctypes
import dataclasses
import gc
import importlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from qkernels.bench.report import (  # noqa: F401 - re-exported
    DEFAULT_HOTPATHS,
    HOTPATHS,
    case_lines,
    cpu_clock,
    header,
    legend_lines,
    load_warning,
    memory_text,
    others_warning,
    plan_lines,
    quartiles,
    ratio_text,
    wrap,
)

WARMUP_S = 0.2  # seconds of warm-up runs per variant after its first run (both tools)
MIN_ROUNDS = 5  # timed rounds at least, per variant (:func:`time_variants`)


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
    # the inputs hold state that a run changes and that must be warm before a run is measured (the training
    # step's trainers: optimizer state, compiled code); ``make`` returns the same objects on every call
    stateful: bool = False
    memory: bool = True  # measure peak memory (False: tiny shapes, where it is ~0)
    # for the plan printed before a run (:func:`estimate_seconds`): rough wall seconds of one run and of one
    # torch.compile of a variant, where they dominate (the training step: seconds per run, a minute per compile)
    run_s: float = 0.0
    compile_s: float | None = None  # None: COMPILE_S


# rough wall seconds on a 2-core CPU, for the estimate printed before a run (:func:`estimate_seconds`)
COMPILE_S = 3.0  # torch.compile of one variant (forward + backward), inductor's on-disk cache warm (cold: about 2x)
PROBE_S = 4.0  # one peak-memory subprocess per case (start, import torch, warm-up)


def variant(loss: Callable[..., torch.Tensor], backend: str = "reference", *, compiled: bool = False):
    """A forward + backward callable: ``loss(*inputs).backward()`` on ``backend`` (``compiled``:
    ``torch.compile`` of ``loss``, inductor, default mode, static shapes), then the inputs'
    gradients (and those of any module among them) are cleared.

    Static shapes: a user compiles a training step for one batch shape; with the default
    (automatic dynamic) every case after the first of a hot path would time code compiled for any
    size, because the cases share ``loss``'s code object and its compile cache."""
    from qkernels import use_backend

    fn = torch.compile(loss, dynamic=False) if compiled else loss

    def forward_backward(*inputs):
        with use_backend(backend):
            fn(*inputs).backward()
        for t in inputs:
            if isinstance(t, torch.nn.Module):
                t.zero_grad(set_to_none=True)
            elif isinstance(t, torch.Tensor) and t.requires_grad:
                t.grad = None

    return forward_backward


def backend_variants(loss: Callable[..., torch.Tensor], device: str, op: str) -> dict[str, Callable[..., None]]:
    """One variant per backend that implements ``op`` (a name of :func:`qkernels._backend.implementations`) and
    runs on ``device`` (Triton on the CPU only runs in the interpreter: left out), plus ``reference_compiled``:
    torch.compile of the reference (the second baseline: what a user gets for free)."""
    import qkernels.ops  # noqa: F401 - registers the ops' implementations
    from qkernels._backend import kernels

    names = [b for b in kernels(op, device) if not (b == "triton" and device == "cpu")]
    out = {b: variant(loss, b) for b in names}
    out["reference_compiled"] = variant(loss, compiled=True)
    return out


def half_precision_case(case: Case, loss: Callable, plain: Callable, dtype=torch.bfloat16) -> Case:
    """``case``'s shape with ``dtype`` (bfloat16) inputs (:mod:`qkernels._precision`).

    Variants: ``float32`` (the baseline: ``loss``, backend ``auto``, on float32 inputs), ``bf16``
    (the same on bf16 inputs: cast to float32 for the kernel inside the op) and ``plain autocast``
    (``plain``: the reference's PyTorch code without qkernels' wrapper, on bf16 inputs under
    ``torch.autocast``: what plain PyTorch code gets). ``make`` returns the bf16 inputs, then the
    float32 ones; each variant takes its half."""

    def make(scale: int):
        full = case.make(scale)
        half = tuple(
            x.detach().to(dtype).requires_grad_(x.requires_grad)
            if isinstance(x, torch.Tensor) and x.is_floating_point()
            else x
            for x in full
        )
        return (*half, *full)

    def sliced(fn: Callable, first: bool) -> Callable:
        def run(*inputs):
            k = len(inputs) // 2
            return fn(*(inputs[:k] if first else inputs[k:]))

        return run

    def under_autocast(*inputs):
        kind = next(x.device.type for x in inputs if isinstance(x, torch.Tensor))
        with torch.autocast(kind, dtype=dtype):
            out = plain(*inputs)
        out.float().backward()
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.grad = None

    variants = {
        "float32": sliced(variant(loss, "auto"), False),
        "bf16": sliced(variant(loss, "auto"), True),
        "plain autocast": sliced(under_autocast, True),
    }
    name = f"{case.name} {str(dtype).replace('torch.', '').replace('bfloat16', 'bf16')}"
    return Case(case.hotpath, name, make, variants, baseline="float32", slow=case.slow)


def estimate_seconds(runs: list[tuple[Case, str]], *, memory: bool = True, min_time: float = 0.5) -> float:
    """Rough wall seconds to benchmark ``runs`` ((case, variant) pairs) on a quiet machine: per variant its
    timed rounds (``min_time``, or :data:`MIN_ROUNDS` runs of ``case.run_s`` where longer), warm-up and first
    runs, and a compile (``case.compile_s``, default :data:`COMPILE_S`) for a torch.compile variant; with
    ``memory`` (and ``case.memory``), per case a peak-memory subprocess (:data:`PROBE_S` and a run per variant,
    and half a compile per compiled variant: it compiles again, from the on-disk cache)."""
    total, probed = 0.0, set()
    for case, name in runs:
        compile_s = (COMPILE_S if case.compile_s is None else case.compile_s) if "compiled" in name else 0.0
        total += max(min_time, MIN_ROUNDS * case.run_s) + max(WARMUP_S, case.run_s) + case.run_s + 0.3 + compile_s
        if memory and case.memory:
            total += compile_s / 2 + case.run_s + (PROBE_S if case.name not in probed else 0.0)
            probed.add(case.name)
    return total


def cases(hotpath: str) -> list[Case]:
    return importlib.import_module(f"qkernels.bench.{hotpath}").cases()


_SHORT = (
    ("latent_quantize", "lq"),
    ("categorical_latent", "cat"),
    ("finite_difference_curvature", "fdc"),
    ("per-dim", "pd"),
    ("materialized", "mat"),
    ("plain autocast", "autocast"),
    (",", ""),
)


def short_id(case: Case, variant: str) -> str:
    """A pytest id for ``variant`` of ``case``: "<case>-<variant>" with long words shortened (latent_quantize:
    lq, categorical_latent: cat, finite_difference_curvature: fdc, per-dim: pd, materialized: mat, plain
    autocast: autocast), so that pytest-benchmark's table (name column: test name + id; group: the full case
    name) fits 120 columns."""
    text = f"{case.name}-{variant}"
    for long, short in _SHORT:
        text = text.replace(long, short)
    return text


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
    case: Case,
    names: list[str],
    *,
    min_time: float = 0.5,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = 1000,
    max_seconds: float = 20.0,
    warmup: float = WARMUP_S,
) -> dict[str, list[float] | BaseException]:
    """Wall seconds of forward + backward runs of each variant, interleaved: round r runs every
    live variant once, in order, so drift in machine load hits all alike and ``times[v][r]`` of
    two variants are runs seconds apart (pairs for per-round ratios).

    First one run of each variant (lazy initialisation, ``torch.compile``; a variant that raises
    is reported as the exception instead of times), then untimed warm-up rounds — at least one,
    more while under ``warmup`` seconds per variant — then timed rounds: at least ``min_rounds``,
    more while under ``min_time`` seconds per variant, at most ``max_rounds``; only 2 once the
    rounds took ``max_seconds`` (variants of seconds per run). The garbage collector is off during
    the timed rounds. A variant that raises in a later round is reported as the exception too."""
    inputs = case.make(1)
    cuda = _on_cuda(inputs)
    out: dict[str, list[float] | BaseException] = {}
    live: list[str] = []

    def one(name: str) -> float | None:
        try:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            case.variants[name](*inputs)
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out[name] = exc
            live.remove(name)
            return None

    for name in names:
        out[name] = []
        live.append(name)
        one(name)
    start = time.perf_counter()
    while live:  # warm-up rounds
        for name in list(live):
            one(name)
        if time.perf_counter() - start >= warmup * max(1, len(live)):
            break
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for r in range(max_rounds):
            if not live:
                break
            elapsed = time.perf_counter() - start
            if (r >= min_rounds and elapsed >= min_time * max(1, len(live))) or (r >= 2 and elapsed >= max_seconds):
                break
            for name in list(live):
                t = one(name)
                if t is not None:
                    out[name].append(t)
    finally:
        if enabled:
            gc.enable()
    return out


def summarize(case: Case, times: dict[str, list[float] | BaseException]) -> list[dict]:
    """One row per variant of ``times`` (from :func:`time_variants`): ``min_s``, ``median_s``,
    ``q1_s``, ``q3_s`` (quartiles of the runs), ``rounds``; ``vs_baseline`` and ``vs_compiled``:
    the median over rounds of baseline (``reference_compiled``) time / variant time, and
    ``vs_baseline_clear`` / ``vs_compiled_clear``: whether the interquartile range of those
    per-round ratios excludes 1 (one variant won in over 3/4 of the rounds). A failed variant:
    ``{"error": "Type: message"}``."""
    rows = []
    ok = {v: t for v, t in times.items() if not isinstance(t, BaseException) and t}

    def vs(ref: str, name: str) -> tuple[float | None, bool]:
        if ref not in ok or name not in ok:
            return None, True
        ratios = [a / b for a, b in zip(ok[ref], ok[name], strict=False) if b > 0]
        if not ratios:
            return None, True
        q1, q3 = quartiles(ratios)
        return statistics.median(ratios), not (q1 <= 1 <= q3)

    for name, t in times.items():
        row = {"hotpath": case.hotpath, "case": case.name, "variant": name, "baseline": case.baseline}
        if isinstance(t, BaseException) or not t:
            msg = f"{type(t).__name__}: {t}" if isinstance(t, BaseException) else "no timed run"
            rows.append({**row, "error": " ".join(msg.split())})
            continue
        q1, q3 = quartiles(t)
        vb, vb_clear = vs(case.baseline, name)
        vc, vc_clear = vs("reference_compiled", name)
        rows.append(
            {
                **row,
                "min_s": min(t),
                "median_s": statistics.median(t),
                "q1_s": q1,
                "q3_s": q3,
                "rounds": len(t),
                "vs_baseline": vb,
                "vs_baseline_clear": vb_clear,
                "vs_compiled": vc,
                "vs_compiled_clear": vc_clear,
            }
        )
    return rows


def plan_rounds(seconds: float, *, budget: float = 0.8, max_rounds: int = 1000) -> int:
    """Timed rounds for pytest-benchmark's ``pedantic`` of a callable taking ``seconds`` per warm run:
    enough to fill ``budget`` seconds, at least 5 (3 from 1 s per run, 2 from 5 s), at most ``max_rounds``."""
    seconds = max(seconds, 1e-6)
    least = 5 if seconds < 1 else 3 if seconds < 5 else 2
    return min(max(math.ceil(budget / seconds), least), max_rounds)


def warm_up(fn: Callable, args: tuple = (), seconds: float = WARMUP_S) -> list[float]:
    """Warm-up runs of ``fn(*args)`` (after its first run): at least one, more while under ``seconds`` in
    all; returns their times."""
    times: list[float] = []
    while not times or sum(times) < seconds:
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return times


def pedantic(benchmark, fn: Callable, args: tuple = (), *, budget: float = 0.8):
    """``benchmark.pedantic(fn, args)`` (pytest-benchmark) warmed up as :func:`time_variants` does: one
    first run (lazy initialisation, ``torch.compile``: neither timed nor used to plan), warm-up runs for
    :data:`WARMUP_S` (at least one), then the rounds of :func:`plan_rounds` for the warm runs' median time.
    The extra_info gets ``iqr_pct`` (interquartile range, % of the median). Returns ``fn``'s result."""
    if getattr(benchmark, "disabled", False):
        return benchmark.pedantic(fn, args=args)
    fn(*args)
    rounds = plan_rounds(statistics.median(warm_up(fn, args)), budget=budget)
    result = benchmark.pedantic(fn, args=args, rounds=rounds, iterations=1)
    stats = getattr(getattr(benchmark, "stats", None), "stats", None)
    if stats is not None and stats.median:
        benchmark.extra_info["iqr_pct"] = round(100 * stats.iqr / stats.median, 2)
    return result


def benchmark_case(benchmark, case: Case, name: str, *, memory: bool | None = None, budget: float = 0.8):
    """One pytest-benchmark test of variant ``name`` of ``case``: group = the case, extra_info
    ``hotpath``, ``case``, ``variant``, ``baseline`` (for the summary table of
    benchmarks/conftest.py) and ``peak_mib`` (None when ``memory`` (default: ``case.memory``) is
    False, benchmarks are disabled, or it could not be measured), then :func:`pedantic`."""
    memory = case.memory if memory is None else memory
    benchmark.group = case.name
    benchmark.extra_info.update(hotpath=case.hotpath, case=case.name, variant=name, baseline=case.baseline)
    peak = peak_memory(case, name) if memory and not getattr(benchmark, "disabled", False) else None
    benchmark.extra_info["peak_mib"] = None if peak is None else peak / 2**20
    return pedantic(benchmark, case.variants[name], case.make(1), budget=budget)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _trim() -> None:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim``): what an earlier run freed
    is not reused unseen by the next one."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _probe(hotpath: str, name: str, variants: list[str]) -> dict[str, int | None]:
    """Peak-RSS growth (bytes) of one run of each of ``variants`` of a case, in this fresh process:
    every variant warmed up first (code paths, thread pools, lazy initialisation; compiled variants on
    the real shapes, so that compilation is not measured), then per variant: garbage collected, heap
    trimmed, the peak (VmHWM) reset to the current RSS (Linux ``/proc/self/clear_refs``), one run.
    None for a variant that raises."""
    case = find_case(hotpath, name)
    out: dict[str, int | None] = {}
    for v in variants:
        try:
            case.variants[v](*case.make(1 if "compiled" in v or case.stateful else 0))
        except Exception:  # noqa: BLE001 - reported as not measured
            out[v] = None
    for v in variants:
        if v in out:
            continue
        inputs = case.make(1)
        gc.collect()
        _trim()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_bytes("VmRSS")
        try:
            case.variants[v](*inputs)
            out[v] = max(_status_bytes("VmHWM") - before, 0)
        except Exception:  # noqa: BLE001
            out[v] = None
        del inputs
    return out


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


_PEAKS: dict[tuple, dict[str, int | None]] = {}  # (hotpath, case, variants) -> peak per variant


def peak_memory(case: Case, variant: str, *, warm: bool = True) -> int | None:
    """Peak memory (bytes) of one forward + backward of ``variant``: GPU memory for CUDA cases
    (``warm=False``: the variant already ran in this process), else peak-RSS growth measured by
    :func:`_probe` in a subprocess, one per case (its variants one after another; the first call
    for a case measures them all)."""
    if _on_cuda(case.make(0)):
        return _cuda_peak(case, variant, warm)
    key = (case.hotpath, case.name, tuple(case.variants))
    if key not in _PEAKS:
        code = (
            "import json, sys; from qkernels.bench import _probe; "
            f"print(json.dumps(_probe({case.hotpath!r}, {case.name!r}, {list(case.variants)!r})))"
        )
        env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}  # as many threads as the timing
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        ok = res.returncode == 0
        _PEAKS[key] = json.loads(res.stdout.strip().splitlines()[-1]) if ok else {}
    return _PEAKS[key].get(variant)


def variant_launches(case: Case, variant: str) -> int | None:
    """GPU kernel launches of one forward + backward of ``variant`` (:mod:`qkernels.bench.launches`):
    on a GPU the kernels torch.profiler records; elsewhere the dispatch-mode count (None for
    torch.compile variants: their generated kernels bypass it; a GPU profiler counts them)."""
    from qkernels.bench.launches import count_launches, profiler_kernels

    inputs = case.make(1)
    fn = case.variants[variant]
    if _on_cuda(inputs):
        return sum(profiler_kernels(lambda: fn(*inputs)).values())
    if "compiled" in variant:
        return None
    return count_launches(lambda: fn(*inputs)).total


def machine() -> str:
    """One line describing this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"
    n = torch.get_num_threads()
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {n} thread{'' if n == 1 else 's'}{gpu}"


def run(
    hotpaths=DEFAULT_HOTPATHS,
    *,
    memory: bool = True,
    include_slow: bool = False,
    out=sys.stdout,
    min_time: float = 0.5,
    threads: int | None = None,
    only: tuple[str, ...] = (),
    on_case: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """Benchmark every case of every hot path (slow ones only with ``include_slow``); print the plan
    first (cases, variants, what is left out, a rough duration), then one fixed-width table per hot
    path (every line <= 100 columns: the case on a line of its own, a line per variant below it),
    then one legend; return the rows (:func:`summarize`'s, plus ``peak_bytes``,
    ``memory_ratio`` = variant peak / baseline peak and ``launches``: :func:`variant_launches`).

    Ratios are per-round medians measured in the same run: "vs baseline" = baseline / variant and
    "vs compiled" = compiled reference / variant, printed as "Nx faster" / "Nx slower". Warns when
    the machine looks loaded (load average before a table, other processes' CPU time during it).
    ``min_time``: seconds of timed runs per variant (:func:`time_variants`); ``threads``: torch's
    intra-op threads during the run (``torch.set_num_threads``; default: as set); ``only``: run just the
    cases whose name one of these regular expressions finds (``re.search``; slow ones too); ``on_case``:
    called with the rows so far after every case (a run cut short keeps what it measured)."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(hotpaths, memory, include_slow, out, min_time, only, on_case)
    finally:
        torch.set_num_threads(before)


def _run(hotpaths, memory: bool, include_slow: bool, out, min_time: float, only, on_case) -> list[dict]:
    rows: list[dict] = []

    def say(*lines: str) -> None:
        for line in lines:
            print(line, file=out, flush=True)

    say(*wrap(f"machine: {machine()}"))
    # the load average before anything ran (later it counts this process's own work); each table then
    # warns when OTHER processes took CPU time while it was measured
    warning = load_warning()
    if warning:
        say(*wrap(warning))
    every = {h: cases(h) for h in hotpaths}
    if only:
        every = {h: [c for c in cs if any(re.search(pattern, c.name) for pattern in only)] for h, cs in every.items()}
        include_slow = True  # a case named is a case wanted
        if not any(every.values()):
            raise ValueError(f"--case: no case of {', '.join(hotpaths)} matches {' or '.join(map(repr, only))}")
    chosen = {h: [c for c in cs if include_slow or not c.slow] for h, cs in every.items()}
    left = [h for h in HOTPATHS if h not in hotpaths]
    say(
        *plan_lines(
            {h: (sum(len(c.variants) for c in cs), len(cs)) for h, cs in chosen.items()},
            [c.name for cs in every.values() for c in cs if c.slow and not include_slow],
            estimate_seconds(
                [(c, v) for cs in chosen.values() for c in cs for v in c.variants], memory=memory, min_time=min_time
            ),
            "--all",
            left and f"not run: hot path {', '.join(left)} (--hotpath NAME)",
        )
    )
    names: dict[str, list[str]] = {}
    for hotpath in hotpaths:
        title = getattr(importlib.import_module(f"qkernels.bench.{hotpath}"), "TITLE", "one forward + backward per run")
        say("", *wrap(f"== {hotpath}: {title} =="))
        say(header())
        clock, t0 = cpu_clock(), time.perf_counter()
        for case in every[hotpath]:
            names.setdefault(hotpath, []).extend(case.variants)
            if case.slow and not include_slow:
                say(*case_lines(case.name, [], note="slow case: run with --all"))
                continue
            times = time_variants(case, list(case.variants), min_time=min_time)
            case_rows = summarize(case, times)
            peaks = {
                r["variant"]: peak_memory(case, r["variant"], warm=False) if memory and case.memory else None
                for r in case_rows
                if "error" not in r
            }
            base = peaks.get(case.baseline)
            for r in case_rows:
                if "error" not in r:
                    peak = peaks[r["variant"]]
                    r["peak_bytes"] = peak
                    r["memory_ratio"] = peak / base if peak and base else None
                    r["launches"] = variant_launches(case, r["variant"])
            rounds = max((r["rounds"] for r in case_rows if "rounds" in r), default=None)
            say(*case_lines(case.name, case_rows, baseline=case.baseline, rounds=rounds))
            rows += case_rows
            if on_case is not None:
                on_case(rows)
        warning = others_warning(clock, cpu_clock(), time.perf_counter() - t0)
        if warning:
            say(*wrap(warning))
    say("", *legend_lines(names, baselines={h: [c.baseline for c in cs] for h, cs in chosen.items() if cs}))
    return rows
