"""Benchmarks share the case definitions of ``qkernels bench`` (qkernels/bench/<hotpath>.py).

pytest-benchmark times one test (one variant) at a time; it cannot interleave the variants of a
case as ``qkernels bench`` does. To keep its numbers steady all the same, every comparison test
goes through :func:`qkernels.bench.benchmark_case` / :func:`qkernels.bench.pedantic`: one untimed
first run (lazy initialisation, ``torch.compile``), warm-up rounds, and a number of rounds chosen
from the variant's time per run (:func:`qkernels.bench.plan_rounds`: ~0.8 s of rounds, at least 5;
3 from 1 s per run, 2 from 5 s). pytest-benchmark's own table shows min, median, IQR, max and
rounds (unless ``--benchmark-columns`` says otherwise); after it, this file prints each case as
``qkernels bench`` does (<= 100 columns, ratios as "Nx faster" / "Nx slower", a legend of the
variant names), and warns when the machine was loaded.
"""

import os
import time

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "0")

from qkernels import bench  # noqa: E402 - after TRITON_INTERPRET
from qkernels.bench import report  # noqa: E402

COLUMNS = ["min", "median", "iqr", "max", "rounds"]
_CLOCK: dict = {}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # before pytest-benchmark reads its options (its pytest_configure is trylast)
    if getattr(config.option, "benchmark_columns", False) is None:
        config.option.benchmark_columns = COLUMNS


def pytest_report_header(config):
    warning = report.load_warning()
    return report.wrap(f"qkernels bench machine: {bench.machine()}") + (report.wrap(warning) if warning else [])


def pytest_sessionstart(session):
    _CLOCK.update(cpu=report.cpu_clock(), wall=time.perf_counter())


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
        "variant": info["variant"], "min_s": s.min, "median_s": s.median, "q1_s": s.q1, "q3_s": s.q3,
        "rounds": s.rounds, "vs_baseline": vb, "vs_baseline_clear": vb_clear, "vs_compiled": vc,
        "vs_compiled_clear": vc_clear, "peak_bytes": None if peak is None else peak * 2**20,
        "memory_ratio": peak / base_peak if peak and base_peak else None,
    }


def summary_lines(benchmarks) -> list[str]:
    """The tables of the comparison tests among pytest-benchmark's results (``extra_info`` from
    :func:`qkernels.bench.benchmark_case`), one per hot path, each case as ``qkernels bench``
    prints it, with a legend."""
    tables: dict = {}
    for meta in benchmarks:
        info = getattr(meta, "extra_info", None) or {}
        if meta and "variant" in info and "case" in info:
            tables.setdefault(info.get("hotpath"), {}).setdefault(info["case"], {})[info["variant"]] = meta
    lines = []
    for hotpath, group in tables.items():
        lines += ["", f"== {hotpath}: median of each variant's own rounds (not interleaved) ==", report.header()]
        names = []
        for case, metas in group.items():
            base = metas.get(next(iter(metas.values())).extra_info.get("baseline"))
            rows = [_row(m, base, metas.get("reference_compiled")) for m in metas.values()]
            names += list(metas)
            rounds = sorted(r["rounds"] for r in rows)
            span = f"{rounds[0]}-{rounds[-1]}" if rounds[0] != rounds[-1] else f"{rounds[0]}"
            lines += report.case_lines(case, rows, baseline=base and base.extra_info["variant"],
                                       note=f"{span} rounds")
        lines += report.legend_lines(names, hotpath, report.PYTEST_COLUMNS)
    return lines


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config):
    session = getattr(config, "_benchmarksession", None)
    lines = summary_lines(session.benchmarks) if session is not None else []
    if not lines:
        return
    terminalreporter.section("qkernels: variants against their baseline")
    warning = report.others_warning(_CLOCK.get("cpu"), report.cpu_clock(), time.perf_counter() - _CLOCK.get("wall", 0),
                                    what="the benchmarks were")
    for line in lines + (report.wrap(warning) if warning else []):
        terminalreporter.write_line(line)
