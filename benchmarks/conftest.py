"""Benchmarks share the case definitions of ``qkernels bench`` (qkernels/bench/<hotpath>.py).

pytest-benchmark times one test (one variant) at a time; it cannot interleave the variants of a
case as ``qkernels bench`` does. To keep its numbers steady all the same, every comparison test
goes through :func:`qkernels.bench.benchmark_case` / :func:`qkernels.bench.pedantic`: one untimed
first run (lazy initialisation, ``torch.compile``), warm-up runs as ``qkernels bench`` has them, and a
number of rounds chosen from the variant's time per warm run (:func:`qkernels.bench.plan_rounds`: ~0.8 s
of rounds, at least 5; 3 from 1 s per run, 2 from 5 s). pytest-benchmark's own table shows median, IQR
and rounds (unless ``--benchmark-columns`` says otherwise; <= 120 columns); after it, this file prints
each case as ``qkernels bench`` does (<= 100 columns, ratios as "Nx faster" / "Nx slower", one legend of the
variant names and baselines), and warns when the machine was loaded.

The default run leaves out the slow cases (``Case.slow``) and the tests marked ``bench_all`` (the
training-step benchmarks, the slow metrics): ``--bench-all`` includes them. Before the tests run, a
plan line says what will run, what is left out and roughly how long it takes.

As it goes: each comparison test's row is printed as soon as it finishes (under its case's name, in the table's
columns), so a stopped run shows what it measured. Each case's baseline runs first and its torch.compile variant
second (:func:`baseline_first`), so every row printed has its ratios (a selection that leaves the baseline out
shows "-");
``--bench-save DIR`` also writes every finished row to ``DIR/<machine>/<date>.csv`` and ``.json`` after each
test (the format of ``qkernels bench --save``, :mod:`qkernels.bench.results`).

Selections: every test carries a marker naming its hot path (``-m quantize``, ``kde``, ``hessian``,
``overhead``, ``step``, ``jax``) or, outside the comparison cases, its file (``-m data``, ``metrics``, ``agreement``):
:data:`MARKERS`, registered with pytest;
``-k`` matches case names. ``--quick`` runs :data:`QUICK`: one headline case per kernel hot path, eager
variants only (a torch.compile variant compiles for seconds) and no peak-memory subprocesses, under a minute
on 2 cores.
"""

import dataclasses
import os
import time
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "0")

from qkernels import bench  # noqa: E402 - after TRITON_INTERPRET
from qkernels.bench import report  # noqa: E402

COLUMNS = ["median", "iqr", "rounds"]  # with the test ids of qkernels.bench.short_id: <= 120 columns
OTHER_S = 5.0  # rough seconds of a test that is not a benchmark case (data, metrics, training steps)
_CLOCK: dict = {}
# --quick: hot path -> its headline cases (the README's Performance table), eager variants only
QUICK = {
    "quantize": ("latent_quantize n=4096 d=64 n_v=64 per-dim",),
    "kde": ("cliff n=1024 d=12 M=64 K=100", "klm n=1024 d=32"),
    "hessian": ("nhp mlp n=64 d=12 k=2",),
    "overhead": ("cliff_loss n=8 d=3, cpu",),
}
# a marker per hot path (test_jax.py's cases: "jax"), and one per file for the tests that are not cases
FILES = sorted(p.stem.removeprefix("test_") for p in Path(__file__).parent.glob("test_*.py"))
MARKERS = tuple(dict.fromkeys((*bench.HOTPATHS, "jax", *FILES)))
# torch.compile's pre-grad passes import torch.fx.experimental.optimization -> torch.utils.mkldnn, whose 14
# @torch.jit.script_method decorators each warn (torch 2.13); nothing of qkernels uses TorchScript
TORCH_WARNINGS = ("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning",)


def pytest_addoption(parser):
    parser.addoption(
        "--bench-all",
        action="store_true",
        help="qkernels: also run the slow benchmark cases and tests marked bench_all (tens of minutes)",
    )
    parser.addoption(
        "--quick",
        action="store_true",
        help="qkernels: only the headline case of each kernel hot path, eager variants, no memory "
        "probes (under a minute)",
    )
    parser.addoption(
        "--bench-save",
        metavar="DIR",
        help="qkernels: write the finished rows to DIR/<machine>/<date>.csv and .json after every test",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.addinivalue_line("markers", "bench_all: a slow benchmark, run only with --bench-all")
    for name in MARKERS:
        config.addinivalue_line("markers", f"{name}: the {name} benchmarks (benchmarks/conftest.py)")
    for spec in TORCH_WARNINGS:
        config.addinivalue_line("filterwarnings", spec)
    # before pytest-benchmark reads its options (its pytest_configure is trylast)
    if getattr(config.option, "benchmark_columns", False) is None:
        config.option.benchmark_columns = COLUMNS


def _case(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params.get("case") if isinstance(params.get("case"), bench.Case) else None


def is_slow(item) -> bool:
    """Left out of the default run: a slow case's test, or a test marked ``bench_all``."""
    case = _case(item)
    return bool(case and case.slow) or item.get_closest_marker("bench_all") is not None


def is_quick(item) -> bool:
    """In the ``--quick`` run: a case of :data:`QUICK`, not a torch.compile variant."""
    case = _case(item)
    return bool(case and case.name in QUICK.get(case.hotpath, ()) and "compiled" not in item.callspec.params["variant"])


def marker(item) -> str:
    """The marker of ``item``: its case's hot path, else its file's name (test_data.py: data)."""
    case = _case(item)
    return case.hotpath if case else item.path.stem.removeprefix("test_")


def plan(items, skipped) -> list[str]:
    """The plan lines (:func:`qkernels.bench.report.plan_lines`) of the tests ``items`` that will run and
    the ``skipped`` ones: per hot path (others: per file) the tests and cases, a rough duration."""
    groups: dict = {}
    runs, others = [], 0
    for item in items:
        case = _case(item)
        key = marker(item)
        tests, names = groups.setdefault(key, (0, set()))
        groups[key] = (tests + 1, names | {case.name if case else item.name})
        if case:
            runs.append((case, item.callspec.params["variant"]))
        else:
            others += 1
    seconds = bench.estimate_seconds(runs, min_time=0.8) + others * OTHER_S  # one memory probe per case
    slow = sorted({_case(i).name if _case(i) else i.path.name for i in skipped})
    return report.plan_lines(
        {k: (t, len(n)) for k, (t, n) in groups.items()}, slow, seconds, "--bench-all", runs="tests"
    )


def _rank(item) -> int:
    """0 for a case's baseline variant, 1 for its torch.compile variant (the "vs compiled" column), 2 otherwise."""
    case, variant = _case(item), item.callspec.params["variant"]
    return 0 if variant == case.baseline else 1 if variant == "reference_compiled" else 2


def baseline_first(items) -> list:
    """``items`` with each run of consecutive tests of one case reordered: its baseline first, its torch.compile
    variant second, the others in their order. A row is printed as its test finishes, with its ratios only
    when the baseline has run: this way every row has them."""

    def group(item):
        case = _case(item)
        return case and (case.hotpath, case.name)

    out, i = [], 0
    while i < len(items):
        key, j = group(items[i]), i + 1
        while key and j < len(items) and group(items[j]) == key:
            j += 1
        out += sorted(items[i:j], key=_rank) if key else items[i:j]
        i = j
    return out


def pytest_itemcollected(item):
    item.add_marker(marker(item))  # before -m selects


@pytest.hookimpl(trylast=True)  # after -m and -k deselected theirs: the plan counts what runs
def pytest_collection_modifyitems(config, items):
    if config.getoption("--quick"):
        quick = [i for i in items if is_quick(i)]
        config.hook.pytest_deselected(items=[i for i in items if not is_quick(i)])
        items[:] = quick
        for item in quick:  # no peak-memory subprocess (seconds each)
            item.callspec.params["case"] = dataclasses.replace(_case(item), memory=False)
        skipped = []  # not "slow cases": a selection
    elif config.getoption("--bench-all"):
        skipped = []
    else:
        skipped = [i for i in items if is_slow(i)]
        if skipped:
            config.hook.pytest_deselected(items=skipped)
            items[:] = [i for i in items if not is_slow(i)]
    items[:] = baseline_first(items)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not getattr(config.option, "benchmark_disable", False) and items:
        reporter.write_line("")
        for line in plan(items, skipped):
            reporter.write_line(line)


def pytest_report_header(config):
    warning = report.load_warning()
    return report.wrap(f"qkernels bench machine: {bench.machine()}") + (report.wrap(warning) if warning else [])


def pytest_sessionstart(session):
    _CLOCK.update(cpu=report.cpu_clock(), wall=time.perf_counter())
    if session.config.getoption("--bench-save"):
        from qkernels.bench import results

        _CLOCK["info"] = results.machine_info()  # the load average before the benchmarks ran


_FINISHED: dict = {}  # (hot path, case) -> {variant: pytest-benchmark Metadata} of the finished comparison tests


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
    fixture = getattr(item, "funcargs", {}).get("benchmark") if call.when == "call" else None
    meta = getattr(fixture, "stats", None)
    info = getattr(meta, "extra_info", None) or {}
    if meta is None or "variant" not in info or "case" not in info:
        return
    lines = finished(meta)
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        if getattr(getattr(reporter, "_tw", None), "width_of_current_line", 0):  # after -q's progress dots
            reporter.write("\n")
        for line in lines:
            reporter.write_line(line)
    folder = item.config.getoption("--bench-save")
    if folder:
        from qkernels.bench import results

        _CLOCK["saved"] = results.save(finished_rows(), folder, _CLOCK["info"])


def finished(meta) -> list[str]:
    """Record a comparison test that just finished; its lines as it goes: the column header before the first
    row, the case's name before its first variant, then the variant's row (vs baseline: once the baseline ran)."""
    info = meta.extra_info
    metas = _FINISHED.setdefault((info.get("hotpath"), info["case"]), {})
    lines = [] if any(_FINISHED.values()) else ["", report.header()]
    metas[info["variant"]] = meta
    row = _row(meta, metas.get(info.get("baseline")), metas.get("reference_compiled"))
    case = report.case_lines(info["case"], [row], baseline=info.get("baseline"))
    return lines + (case if len(metas) == 1 else case[1:])


def finished_rows() -> list[dict]:
    """Every finished comparison test as a row of :func:`qkernels.bench.results.save` (ratios against the
    baselines finished so far)."""
    rows = []
    for (hotpath, case), metas in _FINISHED.items():
        for meta in metas.values():
            baseline = meta.extra_info.get("baseline")
            rows.append(
                {
                    "hotpath": hotpath,
                    "case": case,
                    "baseline": baseline,
                    **_row(meta, metas.get(baseline), metas.get("reference_compiled")),
                }
            )
    return rows


def _row(meta, base, compiled) -> dict:
    s, info = meta.stats, meta.extra_info

    def vs(ref):
        if ref is None or not s.median:
            return None, True
        r = ref.stats
        return r.median / s.median, r.q1 > s.q3 or r.q3 < s.q1

    vb, vb_clear = vs(base)
    vc, vc_clear = vs(compiled)
    peak, base_peak = info.get("peak_mib"), base.extra_info.get("peak_mib") if base else None
    return {
        "variant": info["variant"],
        "min_s": s.min,
        "median_s": s.median,
        "q1_s": s.q1,
        "q3_s": s.q3,
        "rounds": s.rounds,
        "vs_baseline": vb,
        "vs_baseline_clear": vb_clear,
        "vs_compiled": vc,
        "vs_compiled_clear": vc_clear,
        "peak_bytes": None if peak is None else peak * 2**20,
        "memory_ratio": peak / base_peak if peak and base_peak else None,
    }


def summary_lines(benchmarks) -> list[str]:
    """The tables of the comparison tests among pytest-benchmark's results (``extra_info`` from
    :func:`qkernels.bench.benchmark_case`), one per hot path, each case as ``qkernels bench``
    prints it, then one legend."""
    tables: dict = {}
    for meta in benchmarks:
        info = getattr(meta, "extra_info", None) or {}
        if meta and "variant" in info and "case" in info:
            tables.setdefault(info.get("hotpath"), {}).setdefault(info["case"], {})[info["variant"]] = meta
    lines, names, baselines = [], {}, {}
    for hotpath, group in tables.items():
        lines += ["", f"== {hotpath}: median of each variant's own rounds (not interleaved) ==", report.header()]
        for case, metas in group.items():
            baseline = next(iter(metas.values())).extra_info.get("baseline")
            base = metas.get(baseline)
            rows = [_row(m, base, metas.get("reference_compiled")) for m in metas.values()]
            names.setdefault(hotpath, []).extend(metas)
            baselines.setdefault(hotpath, []).append(baseline)
            rounds = sorted(r["rounds"] for r in rows)
            span = f"{rounds[0]}-{rounds[-1]}" if rounds[0] != rounds[-1] else f"{rounds[0]}"
            note = f"{span} rounds" + ("" if base else "; baseline not run")
            lines += report.case_lines(case, rows, baseline=baseline, note=note)
    if tables:
        lines += ["", *report.legend_lines(names, report.PYTEST_COLUMNS, baselines)]
    return lines


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
    session = getattr(config, "_benchmarksession", None)
    lines = summary_lines(session.benchmarks) if session is not None else []
    if not lines:
        return
    if _CLOCK.get("saved"):
        lines.append(f"saved {_CLOCK['saved']} and {_CLOCK['saved'].with_suffix('.json').name} (after every test)")
    terminalreporter.section("qkernels: variants against their baseline")
    warning = report.others_warning(
        _CLOCK.get("cpu"), report.cpu_clock(), time.perf_counter() - _CLOCK.get("wall", 0), what="the benchmarks were"
    )
    for line in lines + (report.wrap(warning) if warning else []):
        terminalreporter.write_line(line)
