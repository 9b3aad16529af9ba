"""Issue 28 item 6: the default benchmark runs leave the slow cases out (``qkernels bench --all``, ``pytest
benchmarks/ --bench-all``), say up front what will run and roughly how long, print one legend naming each
hot path's baselines, and keep pytest-benchmark's table within 120 columns. No timing here."""

import importlib.util
import io
import os
import pathlib
import types

import pytest
import torch

from qkernels import bench, cli
from qkernels.bench import report

ROOT = pathlib.Path(__file__).parents[1]


def _conftest():
    spec = importlib.util.spec_from_file_location("benchmarks_conftest", ROOT / "benchmarks" / "conftest.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    return conf


def _case(hotpath, name, baseline="reference", slow=False):
    variants = {v: (lambda x: None) for v in (baseline, "cpu", "reference_compiled")}
    return bench.Case(hotpath, name, lambda scale: (torch.ones(2),), variants, baseline=baseline, slow=slow)


def test_bench_all_option(monkeypatch):
    seen = {}
    monkeypatch.setattr(bench, "run", lambda hotpaths, **kw: seen.update(kw, hotpaths=hotpaths) or [])
    assert cli.main(["bench", "--no-memory"]) == 0
    assert seen["include_slow"] is False and seen["hotpaths"] == bench.DEFAULT_HOTPATHS
    assert cli.main(["bench", "--all", "--hotpath", "kde"]) == 0
    assert seen["include_slow"] is True and seen["hotpaths"] == ("kde",)


def test_default_cases_leave_the_slow_ones_out():
    from qkernels.bench import kde, quantize

    slow = [c.name for m in (kde, quantize) for c in m.cases("cpu") if c.slow]  # a CPU's slow cases, on any machine
    assert any(n.startswith("latent_quantize n=65536") for n in slow)  # GBs of memory, seconds per run on a CPU
    assert any(n.startswith("cliff n=4096") for n in slow)
    assert all(bench.cases(h) for h in bench.DEFAULT_HOTPATHS)
    assert not any(c.memory for c in bench.cases("overhead"))  # tiny shapes: no memory subprocesses


def test_plan_line_and_estimate():
    fast, slow = _case("kde", "klm n=64 d=12"), _case("kde", "klm n=4096 d=64", slow=True)
    plain = bench.estimate_seconds([(fast, "reference")], memory=False)
    assert bench.estimate_seconds([(fast, "reference_compiled")], memory=False) == plain + bench.COMPILE_S
    assert bench.estimate_seconds([(fast, "reference")]) == plain + bench.PROBE_S
    lines = report.plan_lines(
        {"kde": (3, 1), "overhead": (6, 2)},
        [slow.name],
        250.0,
        "--all",
        "not run: hot path step (--hotpath NAME)",
        load=0.0,
    )
    assert lines[0] == "plan: 9 variants of 3 cases (kde 3/1, overhead 6/2), roughly 4 min here"
    text = " ".join(lines)
    assert "left out: 1 slow cases (minutes each; --all runs them): klm n=4096 d=64" in text
    assert "not run: hot path step" in text and all(len(line) <= 100 for line in lines)
    assert [report.duration(s) for s in (3, 44, 250, 3900)] == ["10 s", "40 s", "4 min", "1 h 05 min"]


def test_run_prints_the_plan_first_and_the_legend_once(monkeypatch):
    fakes = {
        "kde": [_case("kde", "klm n=64 d=12"), _case("kde", "big", slow=True)],
        "hessian": [_case("hessian", "nhp mlp", baseline="sequential")],
        "overhead": [_case("overhead", "klm_loss n=8 d=3, cpu", baseline="add")],
    }
    monkeypatch.setattr(bench, "cases", lambda hotpath: fakes[hotpath])
    monkeypatch.setattr(bench, "load_warning", lambda: None)
    monkeypatch.setattr(bench, "time_variants", lambda case, names, **kw: {v: [1e-3] * 5 for v in names})
    out = io.StringIO()
    bench.run(list(fakes), memory=False, out=out, min_time=0.0)
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("plan: 9 variants of 3 cases (kde 3/1, hessian 3/1, overhead 3/1)")
    assert any(line.startswith("left out: 1 slow cases") and "--all" in line for line in lines)
    assert sum(line.startswith("legend:") for line in lines) == 1
    assert lines.index(next(x for x in lines if x.startswith("legend:"))) > max(
        i for i, x in enumerate(lines) if x.startswith("== ")
    )  # after the last table
    text = "\n".join(lines)
    assert "baselines: kde: reference; hessian: sequential; overhead: add" in text
    assert "nhp mlp  (baseline sequential;" in text and "klm_loss n=8 d=3, cpu  (baseline add;" in text
    # "cpu": the op's kernels in kde, the batched penalty in hessian, the public function in overhead
    assert any(x.startswith("  cpu (kde): qkernels' C++ CPU kernels") for x in lines)
    assert any(x.startswith("  cpu (overhead): the public function") for x in lines)
    assert any(x.startswith("  reference_compiled (kde, overhead): torch.compile (inductor") for x in lines)
    assert any(x.startswith("  sequential: the authors' penalty") for x in lines)  # one meaning: no hot path
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)


def _meta(hotpath, case, variant, baseline, median):
    stats = types.SimpleNamespace(min=median, median=median, q1=0.99 * median, q3=1.01 * median, rounds=9)
    info = {"hotpath": hotpath, "case": case, "variant": variant, "baseline": baseline, "peak_mib": None}
    return types.SimpleNamespace(stats=stats, extra_info=info)


def test_pytest_summary_names_each_baseline_and_one_legend():
    metas = [_meta("hessian", "nhp conv", v, "sequential", t) for v, t in (("sequential", 0.3), ("cpu", 0.05))]
    metas += [_meta("quantize", "lq bf16", v, "float32", t) for v, t in (("float32", 0.02), ("bf16", 0.04))]
    metas += [_meta("overhead", "klm, cpu", "cpu", "add", 1e-4)]  # its baseline was not run (e.g. -k)
    lines = _conftest().summary_lines(metas)
    assert sum(line.startswith("legend:") for line in lines) == 1
    assert "nhp conv  (baseline sequential; 9 rounds)" in lines
    assert "lq bf16  (baseline float32; 9 rounds)" in lines
    assert "klm, cpu  (baseline add; 9 rounds; baseline not run)" in lines
    assert next(x for x in lines if x.startswith("  cpu ")).split()[5:7] == ["6.00x", "faster"]  # 0.3 / 0.05
    assert next(x for x in lines if x.startswith("  bf16 ")).split()[5:7] == ["2.00x", "slower"]
    assert any(x.startswith("baselines: hessian: sequential; quantize: float32; overhead: add") for x in lines)
    assert all(len(line) <= 100 for line in lines)


def test_pytest_benchmark_table_fits_120_columns():
    """pytest-benchmark's table: name column 3 + len(test name + id), then for each of conftest's COLUMNS
    (median, iqr) 2 + 10 digits + 10 of padding, and rounds 8: every benchmark case id keeps it <= 120."""
    conf = _conftest()
    assert conf.COLUMNS == ["median", "iqr", "rounds"]
    width = 3 + 2 * (2 + 10 + 10) + 8
    funcs = {
        "quantize": "test_quantize",
        "kde": "test_kde",
        "hessian": "test_nhp",
        "overhead": "test_overhead",
        "step": "test_step",
    }
    for hotpath, func in funcs.items():
        for case in bench.cases(hotpath):
            for v in case.variants:
                name = f"{func}[{bench.short_id(case, v)}]"
                assert width + len(name) <= 120, name


def test_pytest_option_and_plan():
    conf = _conftest()

    class Item:
        def __init__(self, case=None, variant="cpu", marker=None, name="test_x"):
            self.callspec = types.SimpleNamespace(params={"case": case, "variant": variant}) if case else None
            self.marker, self.name, self.nodeid = marker, name, f"benchmarks/test_metrics.py::{name}"
            self.path = pathlib.Path("benchmarks/test_metrics.py")

        def get_closest_marker(self, name):
            return self.marker if name == self.marker else None

    fast, slow = _case("kde", "klm n=64 d=12"), _case("kde", "klm n=4096 d=64", slow=True)
    items = [
        Item(fast, "reference"),
        Item(fast, "cpu"),
        Item(slow),
        Item(marker="bench_all", name="test_dci"),
        Item(name="test_sap"),
    ]
    assert [conf.is_slow(i) for i in items] == [False, False, True, True, False]
    lines = conf.plan(items[:2] + items[4:], items[2:4])
    assert lines[0].startswith("plan: 3 tests of 2 cases (kde 2/1, metrics 1/1), roughly ")
    text = " ".join(line.strip() for line in lines)
    assert "left out: 2 slow cases (minutes each; --bench-all runs them): klm n=4096 d=64; test_metrics.py" in text


@pytest.mark.parametrize("args", [["--bench-all"], []])
def test_pytest_deselects_slow_tests_without_bench_all(args):
    """--bench-all keeps every item; without it the slow ones are deselected (reported to pytest)."""
    conf = _conftest()
    deselected = []
    config = types.SimpleNamespace(
        getoption=lambda name: name in args,
        option=types.SimpleNamespace(benchmark_disable=True),
        hook=types.SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)),
        pluginmanager=types.SimpleNamespace(get_plugin=lambda name: None),
    )
    fast, slow = _case("kde", "a"), _case("kde", "b", slow=True)
    items = [
        types.SimpleNamespace(
            callspec=types.SimpleNamespace(params={"case": c, "variant": "cpu"}), get_closest_marker=lambda name: None
        )
        for c in (fast, slow)
    ]
    kept = list(items)
    conf.pytest_collection_modifyitems(config, kept)
    assert kept == (items if args else items[:1]) and deselected == ([] if args else items[1:])


def test_estimate_counts_what_dominates_the_step_bench():
    """Issue 39: the step bench planned "roughly 50 s" and took 10:29: its estimate ignored the seconds per step
    and the minute per whole-model compile. Now each case carries them, and the estimate adds the timed rounds
    (at least 5 runs), warm-up and first runs, and a compile (and half one in the memory probe) per compiled
    variant. The step cases' own figures: at least a minute per Tripod compile on a 2-core CPU."""
    step = bench.Case(
        "step", "tripod", lambda scale: (), {"auto": None, "reference_compiled": None}, run_s=2.0, compile_s=60.0
    )
    eager = bench.estimate_seconds([(step, "auto")], memory=False, min_time=0.5)
    assert eager >= 5 * 2.0 + 2 * 2.0  # 5 timed rounds, a warm-up run and the first run of 2 s each
    assert bench.estimate_seconds([(step, "reference_compiled")], memory=False, min_time=0.5) == eager + 60.0
    assert (
        bench.estimate_seconds([(step, "reference_compiled")], min_time=0.5)
        == eager + 60.0 + 30.0 + 2.0 + bench.PROBE_S
    )  # the probe compiles again from the cache and runs once
    from qkernels.bench import step as step_cases

    tripod = next(c for c in step_cases.cases("cpu") if c.name.startswith("tripod"))
    assert tripod.compile_s >= 60 and tripod.run_s >= 0.3


def test_plan_says_what_to_expect_under_load():
    # the suite's plan said ~6 min and took 11:19 at load 3.5-4.8 on 2 cores
    assert report.duration(report.under_load(360.0, 4.0, 2)) == "12 min"
    line = " ".join(
        " ".join(report.plan_lines({"kde": (3, 1)}, [], 360.0, "--all", load=2.0 * (os.cpu_count() or 1))).split()
    )
    assert "roughly 6 min here on a quiet machine, about" in line and "at the load now (" in line
    quiet = " ".join(report.plan_lines({"kde": (3, 1)}, [], 360.0, "--all", load=0.0))
    assert "quiet" not in quiet and "roughly 6 min here" in quiet
