"""Issue 47, item 5: ``pytest benchmarks/ --benchmark-only`` prints each comparison test's row as it finishes (and
``--bench-save DIR`` writes the finished rows after every test), every test carries its hot path's marker, and
``--quick`` selects one headline case per kernel hot path, eager variants only."""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from qkernels import bench

ROOT = Path(__file__).resolve().parents[1]


def _conftest():
    spec = importlib.util.spec_from_file_location("bench_conftest", ROOT / "benchmarks" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _item(case, variant, path="benchmarks/test_x.py"):
    return types.SimpleNamespace(
        callspec=types.SimpleNamespace(params={"case": case, "variant": variant}),
        path=Path(path),
        get_closest_marker=lambda name: None,
    )


def test_a_run_streams_its_rows_and_saves_them_as_it_goes(tmp_path):
    """One quick case's test in a pytest run of its own: its row is printed before pytest-benchmark's table (as
    the test finished), under the column header and the case's name, and the results file holds it."""
    cmd = [sys.executable, "-m", "pytest", "benchmarks/test_overhead.py", "--benchmark-only", "-q", "--quick",
           "-k", "cliff_loss and add", "--bench-save", str(tmp_path), "-p", "no:cacheprovider",
           "-p", "no:hypothesispytest"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}  # pytest-benchmark reads them:
    # a child of an xdist worker would disable benchmarks
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    lines = res.stdout.splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.startswith("  add ") and "1.00x" in ln)
    table = next(i for i, ln in enumerate(lines) if ln.startswith("-") and "benchmark" in ln)
    assert row < table  # streamed, not only in the summary at the end
    assert lines[row - 1].startswith("cliff_loss n=8 d=3, cpu  (baseline add)")
    assert lines[row - 2] == bench.report.header()
    assert any(ln.startswith("plan: 1 tests") for ln in lines[:row])
    (saved,) = tmp_path.glob("*/*.csv")
    with open(saved) as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["hotpath"], r["case"], r["variant"], r["baseline"]) for r in rows] == [
        ("overhead", "cliff_loss n=8 d=3, cpu", "add", "add")
    ]
    assert float(rows[0]["median_s"]) > 0 and float(rows[0]["vs_baseline"]) == 1.0
    assert "DeprecationWarning" not in res.stdout  # torch's 14 torch.jit.script_method warnings are filtered


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own
def test_markers_and_the_quick_selection():
    conf = _conftest()
    chosen = []
    assert set(conf.QUICK) == set(bench.HOTPATHS) - {"step"}  # the kernels' hot paths (step: minutes of compiles)
    for hotpath in conf.QUICK:
        for case in bench.cases(hotpath):
            assert conf.marker(_item(case, "reference")) == hotpath
            chosen += [(case, v) for v in case.variants if conf.is_quick(_item(case, v))]
    assert conf.marker(_item(None, None, "benchmarks/test_data.py")) == "data"
    names = {(c.hotpath, c.name) for c, _ in chosen}
    assert names == {(h, n) for h, cases in conf.QUICK.items() for n in cases if (h, n) in {
        (c.hotpath, c.name) for c in bench.cases(h)}}  # fmt: skip
    assert {"quantize", "kde", "hessian"} <= {h for h, _ in names}  # every kernel hot path (overhead: with _C)
    assert all("compiled" not in v for _, v in chosen)
    assert bench.estimate_seconds(chosen, memory=False, min_time=0.8) < 60  # the plan's own estimate


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own
def test_each_case_runs_its_baseline_first_so_every_streamed_row_has_its_ratio():
    """Issue 57, item 10: the hessian cases list ``reference``, ``cpu`` before their baseline ``sequential``; run in
    that order their rows were printed with "-" for the ratio. The conftest reorders each case's tests: baseline,
    then torch.compile, then the rest, so every row printed as it finishes shows "vs baseline"."""
    conf = _conftest()
    probe = bench.report._ROW.format("v", "1", "2", "3", "4", "VS_BASELINE", "VS_COMPILED", "5", "6")
    at = probe.index("VS_BASELINE")
    for hotpath in ("hessian", "kde"):
        cases = bench.cases(hotpath)
        items = [_item(c, v) for c in cases for v in c.variants]
        ordered = conf.baseline_first(items)
        assert sorted(map(id, ordered)) == sorted(map(id, items))  # the same tests, each case's kept together
        assert [i.callspec.params["case"].name for i in ordered] == [i.callspec.params["case"].name for i in items]
        conf._FINISHED.clear()
        for item in ordered:
            case, variant = item.callspec.params["case"], item.callspec.params["variant"]
            median = 2.0 if variant == case.baseline else 1.0
            stats = types.SimpleNamespace(min=median, median=median, q1=median, q3=median, rounds=5)
            meta = types.SimpleNamespace(
                stats=stats,
                extra_info={"hotpath": hotpath, "case": case.name, "variant": variant, "baseline": case.baseline},
            )
            row = conf.finished(meta)[-1]
            assert row.startswith(f"  {variant[:19]}") and row[at : at + 13].strip() not in ("", "-"), (case.name, row)
        conf._FINISHED.clear()
    hessian = bench.cases("hessian")[0]
    assert list(hessian.variants)[-1] == hessian.baseline  # the order that printed "-" before


def test_every_benchmark_marker_is_registered():
    """Issue 57, item 10: test_jax.py's cases carry the marker "jax", and every file's other tests its name (then
    test_jax_baselines.py's "jax_baselines"): all are registered (no PytestUnknownMarkWarning)."""
    conf = _conftest()
    sources = "".join(p.read_text() for p in (ROOT / "benchmarks").glob("*.py"))
    hotpaths = set(re.findall(r'\bCase\(\s*"(\w+)"', sources))
    files = {p.stem.removeprefix("test_") for p in (ROOT / "benchmarks").glob("test_*.py")}
    assert "jax" in conf.MARKERS
    assert hotpaths | set(bench.HOTPATHS) | files <= set(conf.MARKERS)
