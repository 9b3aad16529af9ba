"""Text of the benchmark tables: ratios in words, the fixed-width table (<= 100 columns), the
legend of variant names and the warnings about a busy machine. Shared by ``qkernels bench``
(:func:`qkernels.bench.run`) and the summary of ``pytest benchmarks/ --benchmark-only``
(benchmarks/conftest.py).

Ratio convention: a speed ratio is r = baseline time / variant time, written "r x faster" when
r > 1 and "(1/r) x slower" when r < 1 ("2.78x slower", never "0.36x"); a memory ratio is
variant peak / baseline peak, written "(1/m) x less" when m < 1 and "m x more" when m > 1. A
factor that rounds to 1.00 is written "1.00x". A trailing "?" marks a speed difference that is
not clear from the runs (see :data:`COLUMNS`).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import textwrap

HOTPATHS = ("quantize", "kde", "hessian", "overhead", "step")  # the modules qkernels.bench.<hotpath>
DEFAULT_HOTPATHS = HOTPATHS[:4]  # what ``qkernels bench`` runs without --hotpath (step: minutes of torch.compile)

WIDTH = 100  # every line of a table, its legend, plan and warnings fits a 100-column terminal

#: what each variant name means (a hot path module's ``LEGEND`` overrides these for its table)
VARIANTS = {
    "reference": "qkernels' reference backend: the op written in plain PyTorch ops, run eagerly (the "
    "oracle the kernels are tested against)",
    "reference_compiled": "torch.compile (inductor, default mode) of the reference: what a user "
    "gets for free, without qkernels' kernels",
    "cpu": "qkernels' C++ CPU kernels (OpenMP threads; an AVX+FMA copy where the CPU has it)",
    "triton": "qkernels' Triton GPU kernels",
    "cuda": "qkernels' CUDA C++ kernels",
    "materialized": "the formulation most code writes, with the whole intermediate tensor in "
    "memory (quantize: (n, d, n_v) distances; Cliff: (d, d, M, K, n) products; KLM: (n, n, d) "
    "differences), eager",
    "materialized compiled": "torch.compile of materialized",
    "float32": "(bf16 cases) the public function, backend auto, on float32 inputs: the baseline",
    "bf16": "(bf16 cases) the public function, backend auto, on bfloat16 inputs (cast to float32 for the "
    "kernel inside the op)",
    "plain autocast": "(bf16 cases) the reference's PyTorch code without qkernels' wrapper, bfloat16 "
    "inputs, under torch.autocast: what plain PyTorch code gets",
    "raw": "(<backend> raw) that backend's implementation called directly with prepared arguments: "
    "no validation, backend selection or autograd wrapper",
}

#: the columns, for the legend
COLUMNS = (
    "times of one run, ms; IQR %: interquartile range of the runs, % of the median. "
    "vs baseline: time of the case's baseline (named on the case's line) / variant time; vs compiled: "
    "reference_compiled time / variant time ('-' where the case has none); both the median over "
    "interleaved rounds: 'Nx faster' = N times less time, 'Nx slower' = N times more, '?' = no "
    "clear winner (each won in 25-75% of the rounds). lnch: GPU kernel launches of one run (on a GPU: "
    "the kernels torch.profiler records; on a CPU: Triton launches + aten ops that would run a kernel, "
    "counted by qkernels.bench.launches, a C++ op counting 1; '-': not counted, e.g. torch.compile on a "
    "CPU). peak MiB: peak memory growth of one run; mem vs base: 'Nx less' / 'Nx more' memory than the "
    "baseline ('-': not measured, or 0)."
)

#: the columns of the summary of ``pytest benchmarks/`` (variants timed one after another)
PYTEST_COLUMNS = (
    "times of one run, ms; IQR %: interquartile range of the rounds, % of the median. vs baseline: "
    "median time of the case's baseline (named on the case's line) / the variant's; vs compiled: the same "
    "with reference_compiled ('-' where the case has none); each variant timed in its own test (not "
    "interleaved): 'Nx faster' = N times less time, 'Nx slower' = N times more, "
    "'?' = their IQRs overlap. peak MiB: peak memory growth of one run; mem vs base: 'Nx less' / "
    "'Nx more' memory than the baseline ('-': not measured, or 0)."
)


def factor(x: float) -> str:
    """A factor >= 1 with 3 significant digits: 2.78, 54.8, 548."""
    for digits in (2, 1):
        s = f"{x:.{digits}f}"
        if len(s) <= 4:
            return s
    return f"{x:.0f}"


def ratio_text(r: float | None, more: str = "faster", less: str = "slower", *, clear: bool = True) -> str:
    """``r`` = baseline / variant in words: ``2.0`` -> "2.00x faster", ``0.36`` -> "2.78x slower",
    ``1.0`` (or anything that rounds to it either way) -> "1.00x"; ``clear=False`` appends "?"
    (the runs do not show a clear difference); None, 0, inf or NaN -> "-"."""
    if r is None or not math.isfinite(r) or r <= 0:
        return "-"
    s = factor(r if r >= 1 else 1 / r)
    if s == "1.00":
        return "1.00x"
    return f"{s}x {more if r > 1 else less}{'' if clear else '?'}"


def memory_text(m: float | None) -> str:
    """``m`` = variant peak / baseline peak in words: ``0.25`` -> "4.00x less", ``2`` -> "2.00x
    more", ``1`` -> "1.00x"; None or 0 -> "-"."""
    if m is None or not math.isfinite(m) or m <= 0:
        return "-"
    return ratio_text(1 / m, "less", "more")


def quartiles(xs: list[float]) -> tuple[float, float]:
    """(q1, q3) of ``xs`` (inclusive method; one value: that value twice)."""
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (math.nan, math.nan)
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q3


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    if ms < 1:
        return f"{ms:.3g}"
    for limit, fmt in ((10, "{:.3f}"), (100, "{:.2f}"), (1000, "{:.1f}")):
        if ms < limit:
            return fmt.format(ms)
    return f"{ms:.0f}"


def _pct(row: dict) -> str:
    q1, q3, med = row.get("q1_s"), row.get("q3_s"), row.get("median_s")
    if q1 is None or q3 is None or not med:
        return "-"
    p = 100 * (q3 - q1) / med
    return f"{p:.1f}" if p < 10 else f"{p:.0f}"


def _fit(line: str) -> str:
    line = line.rstrip()
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


_ROW = "  {:<20}{:>8}{:>10}{:>6}{:>5} {:<13} {:<13}{:>8}  {:<11}"


def header() -> str:
    """The column header of a table."""
    return _fit(
        _ROW.format(
            "variant", "min ms", "median ms", "IQR %", "lnch", "vs baseline", "vs compiled", "peak MiB", "mem vs base"
        )
    )


def case_lines(
    case: str, rows: list[dict], *, baseline: str | None = None, rounds: int | None = None, note: str | None = None
) -> list[str]:
    """The lines of one case: its name (with its baseline, number of rounds and ``note``) on a line
    of its own, then one line per variant. A row is a dict as :func:`qkernels.bench.run` returns
    it; ``{"variant", "error"}`` is a variant that failed, ``{"variant", "note"}`` one not run."""
    about = [f"baseline {baseline}"] if baseline else []
    if rounds:
        about.append(f"{rounds} rounds")
    if note:
        about.append(note)
    lines = [_fit(f"{case}" + (f"  ({'; '.join(about)})" if about else ""))]
    for row in rows:
        name = str(row["variant"])
        if "error" in row:
            lines.append(_fit(f"  {name:<20} failed: {row['error']}".replace("\n", " ")))
            continue
        if "note" in row:
            lines.append(_fit(f"  {name:<20} {row['note']}"))
            continue
        peak, launches = row.get("peak_bytes"), row.get("launches")
        lines.append(
            _fit(
                _ROW.format(
                    name if len(name) <= 20 else name[:19] + "~",
                    _ms(row.get("min_s")),
                    _ms(row.get("median_s")),
                    _pct(row),
                    "-" if launches is None else launches,
                    ratio_text(row.get("vs_baseline"), clear=row.get("vs_baseline_clear", True)),
                    ratio_text(row.get("vs_compiled"), clear=row.get("vs_compiled_clear", True)),
                    "-" if peak is None else f"{peak / 2**20:.1f}",
                    memory_text(row.get("memory_ratio")),
                )
            )
        )
    return lines


def wrap(text: str, indent: str = "") -> list[str]:
    """``text`` wrapped to :data:`WIDTH` columns, continuation lines indented by ``indent`` + 2."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_long_words=True,
        break_on_hyphens=False,
    )


def describe(variant: str, hotpath: str | None = None) -> str | None:
    """What ``variant`` means: the hot path module's ``LEGEND`` first (the module is loaded: its cases made the
    variants; not imported here, which would close an import cycle through :mod:`qkernels.bench`), then
    :data:`VARIANTS`."""
    if hotpath in HOTPATHS:
        local = getattr(sys.modules.get(f"qkernels.bench.{hotpath}"), "LEGEND", {})
        if variant in local:
            return local[variant]
    if variant in VARIANTS:
        return VARIANTS[variant]
    if variant.endswith(" raw"):
        return VARIANTS["raw"]
    return None


def legend_lines(
    variants: dict[str, list[str]], columns: str = COLUMNS, baselines: dict[str, list[str]] | None = None
) -> list[str]:
    """The legend, printed once after the last table: ``columns``, the baselines of each hot path
    (``baselines``: hot path -> its cases' baselines), then what each variant of ``variants`` (hot path ->
    variant names) means, once; a name that means different things in different hot paths (a module's
    ``LEGEND``) gets a line per meaning, "name (hot paths): ..."."""
    lines = wrap("legend: " + columns)
    if baselines:
        lines += wrap("baselines: " + "; ".join(f"{h}: {', '.join(dict.fromkeys(b))}" for h, b in baselines.items()))
    meanings: dict[str, dict[str, list[str]]] = {}  # name -> text -> hot paths
    for hotpath, names in variants.items():
        for name in dict.fromkeys(names):
            text = describe(name, hotpath)
            if text:
                meanings.setdefault(name, {}).setdefault(text, []).append(hotpath)
    for name, texts in meanings.items():
        for text, hotpaths in texts.items():
            key = name if len(texts) == 1 else f"{name} ({', '.join(hotpaths)})"
            lines += wrap(f"{key}: {text}", "  ")
    return lines


def plan_lines(
    selected: dict[str, tuple[int, int]],
    skipped: list[str],
    seconds: float,
    include: str,
    others: str | None = None,
    runs: str = "variants",
    load: float | None = None,
) -> list[str]:
    """What a run will do, printed before it starts: ``selected`` (hot path -> (``runs``, cases)), a
    rough duration (``seconds``, on a quiet machine; when the 1-minute ``load`` average (default: now) is over
    :data:`LOAD_FRACTION` of the CPUs, also the longer duration to expect: :func:`under_load`), the ``skipped``
    slow cases with the option that includes them (``include``), and ``others`` (what else is left out, and how
    to run it)."""
    count, cases = (sum(x) for x in zip(*selected.values(), strict=True)) if selected else (0, 0)
    parts = ", ".join(f"{h} {n}/{c}" for h, (n, c) in selected.items())
    when = f"roughly {duration(seconds)} here"
    cpus = os.cpu_count() or 1
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):
            load = 0.0
    if load > LOAD_FRACTION * cpus:
        when += f" on a quiet machine, about {duration(under_load(seconds, load, cpus))} at the load now ({load:.1f})"
    lines = wrap(f"plan: {count} {runs} of {cases} cases ({parts}), {when}")
    if skipped:
        lines += wrap(f"left out: {len(skipped)} slow cases (minutes each; {include} runs them): " + "; ".join(skipped))
    if others:
        lines += wrap(others)
    return lines


def under_load(seconds: float, load: float, cpus: int) -> float:
    """``seconds`` of quiet-machine work at a 1-minute load average ``load`` on ``cpus`` CPUs: x (1 + load / 2
    cpus), a rough fit (the suite's 6-minute plan took 11:19 at load 3.5-4.8 on 2 cores: x 1.9-2.2)."""
    return seconds * (1 + load / (2 * cpus))


def duration(seconds: float) -> str:
    """A rough duration: "40 s", "3 min", "1 h 05 min"."""
    if seconds < 90:
        return f"{max(round(seconds, -1), 10):.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


DISTORTION = (
    "Times are inflated and ratios distorted (a multi-threaded op stalls on every thread the OS "
    "deschedules: the many small ops of the references most); rerun on a quiet machine"
)


def distortion() -> str:
    """:data:`DISTORTION`, and the advice to run on one thread unless this process already does (torch's
    thread count where torch is imported, else ``OMP_NUM_THREADS``)."""
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else os.environ.get("OMP_NUM_THREADS", "").strip()
    return DISTORTION + ("." if str(threads) == "1" else " or with OMP_NUM_THREADS=1.")


LOAD_FRACTION = 0.5  # warn when the 1-minute load average exceeds this fraction of the CPUs
OTHERS_FRACTION = 0.25  # warn when other processes kept this fraction of the CPUs busy


def load_warning(load: float | None = None, cpus: int | None = None) -> str | None:
    """A warning when the machine looks loaded: the 1-minute load average (``os.getloadavg``) above
    :data:`LOAD_FRACTION` of the CPUs; None when not (or when the platform has no load average)."""
    cpus = cpus or os.cpu_count() or 1
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):
            return None
    if load <= LOAD_FRACTION * cpus:
        return None
    return (
        f"warning: load average {load:.1f} on {cpus} CPUs (over {LOAD_FRACTION:.0%} of them): other "
        f"processes compete for the CPUs. {distortion()}"
    )


def cpu_clock() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine since boot, CPU seconds of this process and its
    finished children), from ``/proc/stat`` (Linux; steal time counts as busy: a hypervisor
    running another guest); None elsewhere."""
    try:
        import resource  # Unix only

        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (ImportError, OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    own = sum(
        getattr(resource.getrusage(who), f)
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        for f in ("ru_utime", "ru_stime")
    )
    return busy, own


def others_warning(
    before: tuple[float, float] | None,
    after: tuple[float, float] | None,
    seconds: float,
    cpus: int | None = None,
    *,
    what: str = "this table was",
) -> str | None:
    """A warning when processes other than this one kept more than :data:`OTHERS_FRACTION` of the
    CPUs busy between two :func:`cpu_clock` readings ``seconds`` apart (while ``what`` measured);
    None otherwise."""
    if before is None or after is None or seconds <= 0:
        return None
    cpus = cpus or os.cpu_count() or 1
    share = ((after[0] - before[0]) - (after[1] - before[1])) / (seconds * cpus)
    if share <= OTHERS_FRACTION:
        return None
    return f"warning: other processes kept {share:.0%} of the {cpus} CPUs busy while {what} measured. {distortion()}"
