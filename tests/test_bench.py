"""The benchmark baselines (qkernels.bench) compute what they claim: each formulation a user would write
(materialized, sequential) against the float64 equations of the test oracles; the runner's table."""

import importlib.util
import io
import json
import os
import pathlib
import types

import numpy as np
import pytest
import torch
from test_hessian import _oracle_fd, _var
from test_kde import np_cliff, np_klm

from qkernels import bench
from qkernels.bench import hessian as bh
from qkernels.bench import kde as bk
from qkernels.bench import quantize as bq


def test_materialized_cliff_and_klm_match_the_equations():
    z, idx = bk.cliff_inputs(40, 3, 4, 30, seed=1)
    z = z.double()
    uni, biv, kl = np_cliff(z.numpy(), idx.numpy(), 0.1, (-5.0, 5.0, 30))
    assert float(bk.cliff_materialized(z, idx, 30)) == pytest.approx(0.5 * uni + biv + 0.7 * kl, rel=1e-9)
    want = np_klm(z.numpy(), z.numpy().std(0) + 1e-6)
    assert float(bk.klm_materialized(z)) == pytest.approx(want, rel=1e-9)


def test_sequential_nhp_is_the_authors_formulation():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 4, generator=g, dtype=torch.float64)

    def fn(x):
        h = torch.tanh(x @ w)
        return [h, (h * x[:, :1]).reshape(-1, 2, 2)]

    z = torch.randn(5, 3, generator=g, dtype=torch.float64)
    std = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    k, eps = 3, 0.1
    got = bh.sequential_nhp(fn, z, std, k=k, eps=eps, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)  # the same draws: signs (k, n, d), then normals (k, n, d)
    r = (2 * torch.randint(0, 2, (k, 5, 3), generator=g) - 1).double()
    gauss = torch.randn((k, 5, 3), generator=g, dtype=torch.float64)
    num_fd, den_fd = _oracle_fd(fn, z, eps * std * r, eps), _oracle_fd(fn, z, eps * std * gauss, eps)
    want = sum(
        float((_var([f[e] for f in num_fd], 0).mean(1) / (_var([f[e] for f in den_fd], 0).mean(1) + 1e-10)).mean())
        for e in range(2)
    )
    assert float(got) == pytest.approx(want, rel=1e-10)


def test_materialized_quantize_gradients_by_hand():
    z = torch.tensor([[0.1, -0.7], [0.45, 2.0]], dtype=torch.float64, requires_grad=True)
    values = torch.tensor([[-1.0, 0.0, 0.5], [-0.5, 0.5, 1.0]], dtype=torch.float64, requires_grad=True)
    up = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    loss = bq.materialized_loss(z, values, up)
    q = np.array([[0.0, -0.5], [0.5, 1.0]])  # nearest value per (sample, latent)
    zz = z.detach().numpy()
    want = (q * up.numpy()).sum() + 0.02 * ((zz - q) ** 2).mean()
    assert float(loss) == pytest.approx(want, rel=1e-12)
    loss.backward()
    # straight-through: d/dz = upstream + 0.01 * 2 (z - q) / N (commit); codebook: 0.01 * 2 (q - z) / N per hit
    np.testing.assert_allclose(z.grad.numpy(), up.numpy() + 0.01 * 2 * (zz - q) / 4, rtol=1e-12)
    gv = np.zeros((2, 3))
    for i, j, c in ((0, 0, 1), (0, 1, 0), (1, 0, 2), (1, 1, 2)):
        gv[j, c] += 0.01 * 2 * (q[i, j] - zz[i, j]) / 4
    np.testing.assert_allclose(values.grad.numpy(), gv, rtol=1e-12, atol=1e-15)


def test_timing_interleaves_variants_and_reports_failures():
    calls = []

    def run_as(name):
        def fn(x):
            calls.append(name)

        return fn

    def broken(x):
        raise RuntimeError("no kernel")

    case = bench.Case(
        "quantize",
        "toy",
        lambda scale: (torch.ones(3),),
        {"reference": run_as("reference"), "cpu": run_as("cpu"), "broken": broken},
    )
    times = bench.time_variants(case, ["reference", "cpu", "broken"], min_time=0.0, warmup=0.0, min_rounds=4)
    assert isinstance(times["broken"], RuntimeError)
    rounds = len(times["reference"])
    assert rounds == 4 and len(times["cpu"]) == rounds and all(t >= 0 for t in times["cpu"])
    # one first run each, one warm-up round, then round r runs every live variant once, in order
    assert calls == ["reference", "cpu"] * (2 + rounds)
    name = bench.cases("quantize")[0].name
    assert bench.find_case("quantize", name).name == name
    with pytest.raises(KeyError, match="no benchmark case"):
        bench.find_case("quantize", "no such case")


def test_timing_drops_a_variant_that_fails_later():
    n = [0]

    def flaky(x):
        n[0] += 1
        if n[0] == 4:
            raise ValueError("fourth call")

    case = bench.Case("quantize", "toy", lambda scale: (torch.ones(3),), {"reference": lambda x: None, "flaky": flaky})
    times = bench.time_variants(case, ["reference", "flaky"], min_time=0.0, warmup=0.0, min_rounds=5)
    assert isinstance(times["flaky"], ValueError) and len(times["reference"]) == 5
    rows = {r["variant"]: r for r in bench.summarize(case, times)}
    assert rows["flaky"]["error"] == "ValueError: fourth call" and rows["reference"]["vs_baseline"] == 1.0


def test_ratios_in_words():
    assert bench.ratio_text(2) == "2.00x faster"
    assert bench.ratio_text(0.36) == "2.78x slower"
    assert bench.ratio_text(1) == bench.ratio_text(1.004) == bench.ratio_text(0.996) == "1.00x"
    assert bench.ratio_text(548.45) == "548x faster" and bench.ratio_text(1 / 54.8) == "54.8x slower"
    assert bench.ratio_text(9.999) == "10.0x faster"
    assert bench.ratio_text(0.5, clear=False) == "2.00x slower?"
    assert bench.ratio_text(1, clear=False) == "1.00x"  # no "?" on a tie
    assert bench.ratio_text(None) == bench.ratio_text(0.0) == bench.ratio_text(float("nan")) == "-"
    assert bench.memory_text(0.25) == "4.00x less" and bench.memory_text(2) == "2.00x more"
    assert bench.memory_text(1) == "1.00x" and bench.memory_text(None) == bench.memory_text(0) == "-"


def test_ratios_are_per_round_medians_with_a_noise_mark():
    case = bench.Case("quantize", "toy", lambda scale: (), {}, baseline="reference")
    times = {
        "reference": [2.0, 2.0, 2.0, 2.0, 8.0],  # a burst of load in round 5 hits every variant
        "cpu": [1.0, 1.0, 1.0, 1.0, 4.0],
        "materialized": [4.0, 4.0, 4.0, 4.0, 16.0],
        "reference_compiled": [1.5, 2.5, 1.6, 2.4, 6.8],  # faster in 3 rounds of 5: not a clear win
        "broken": RuntimeError("no\nkernel"),
    }
    rows = {r["variant"]: r for r in bench.summarize(case, times)}
    assert rows["cpu"]["vs_baseline"] == 2.0 and rows["cpu"]["vs_baseline_clear"]
    assert rows["materialized"]["vs_baseline"] == 0.5 and rows["materialized"]["vs_baseline_clear"]
    assert not rows["reference_compiled"]["vs_baseline_clear"]
    assert rows["cpu"]["min_s"] == 1.0 and rows["cpu"]["median_s"] == 1.0 and rows["cpu"]["rounds"] == 5
    assert rows["reference_compiled"]["q1_s"] < rows["reference_compiled"]["q3_s"]
    assert rows["broken"]["error"] == "RuntimeError: no kernel"
    text = "\n".join(bench.report.case_lines("toy", list(rows.values()), baseline="reference", rounds=5))
    assert "toy  (baseline reference; 5 rounds)" in text
    assert "2.00x faster" in text and "2.00x slower" in text and "1.18x faster?" in text
    assert "broken               failed: RuntimeError: no kernel" in text


def test_round_plan_for_pytest_benchmark():
    assert bench.plan_rounds(1e-5) == 1000  # short runs: capped
    assert bench.plan_rounds(0.01) == 80  # 0.8 s of rounds
    assert bench.plan_rounds(0.3) == bench.plan_rounds(0.6) == 5  # at least 5 rounds below 1 s per run
    assert bench.plan_rounds(2.0) == 3 and bench.plan_rounds(30.0) == 2


def test_load_warnings():
    assert bench.report.load_warning(0.9, 2) is None
    assert "load average 3.0 on 2 CPUs" in bench.report.load_warning(3.0, 2)
    # (machine busy seconds, own seconds): others used 10 of 20 CPU-seconds -> warn
    assert "50% of the 2 CPUs" in bench.report.others_warning((100.0, 5.0), (120.0, 15.0), 10.0, 2)
    assert bench.report.others_warning((100.0, 5.0), (118.0, 20.0), 10.0, 2) is None  # it was us
    assert bench.report.others_warning(None, (1.0, 1.0), 10.0, 2) is None


def _fake_case(name, slow=False):
    def broken(x):
        raise RuntimeError("no kernel for this\nshape")

    def work(x):
        x.sum()

    variants = {
        "reference": work,
        "cpu": work,
        "reference_compiled": work,
        "materialized compiled": work,
        "broken": broken,
    }
    return bench.Case("quantize", name, lambda scale: (torch.ones(4),), variants, slow=slow)


def test_run_prints_a_table_that_fits_100_columns(monkeypatch):
    fakes = [_fake_case("latent_quantize n=65536 d=64 n_v=64 per-dim"), _fake_case("big", slow=True)]
    monkeypatch.setattr(bench, "cases", lambda hotpath: fakes)
    peaks = {"reference": 2**30, "cpu": 2**24, "reference_compiled": 2**31, "materialized compiled": 0}
    monkeypatch.setattr(bench, "peak_memory", lambda case, v, warm=True: peaks[v])
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0 * (os.cpu_count() or 1), 0.0, 0.0))
    out = io.StringIO()
    threads = torch.get_num_threads()
    rows = bench.run(["quantize"], out=out, min_time=0.01, threads=1)
    assert torch.get_num_threads() == threads  # restored
    text = out.getvalue()
    assert "1 thread," in text.splitlines()[0]  # not "1 threads" (issue 47)
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    assert "warning: load average" in text  # the machine looked loaded
    assert "OMP_NUM_THREADS=1" not in text  # already one thread: the warning does not advise it (issue 47)
    assert bench.report.header() in lines and "IQR %" in bench.report.header()
    head = next(line for line in lines if line.startswith("latent_quantize n=65536"))
    assert "baseline reference" in head and "rounds" in head
    assert "big  (slow case: run with --all)" in lines
    assert any(
        line.startswith("  broken") and "failed: RuntimeError: no kernel for this shape" in line for line in lines
    )
    cpu = next(line for line in lines if line.startswith("  cpu "))
    assert "64.0x less" in cpu and ("faster" in cpu or "slower" in cpu or "1.00x" in cpu)
    assert "0.36x" not in text
    legend = lines[next(i for i, line in enumerate(lines) if line.startswith("legend:")) :]
    for name in ("reference", "cpu", "reference_compiled", "materialized compiled"):
        assert any(line.startswith(f"  {name}: ") for line in legend), name
    by = {r["variant"]: r for r in rows}
    assert by["broken"]["error"].startswith("RuntimeError") and by["cpu"]["memory_ratio"] == 2**24 / 2**30
    # launches: one aten op (the sum) per run; none counted for torch.compile on a CPU
    assert by["cpu"]["launches"] == 1 and by["reference_compiled"]["launches"] is None
    assert by["reference"]["vs_baseline"] == 1.0 and by["cpu"]["rounds"] >= 5


def test_run_only_named_cases_and_rows_after_every_case(monkeypatch):
    fakes = [_fake_case("cliff n=64 d=2"), _fake_case("cliff n=640 d=2", slow=True), _fake_case("klm n=64 d=2")]
    monkeypatch.setattr(bench, "cases", lambda hotpath: fakes)
    seen = []
    out = io.StringIO()
    rows = bench.run(
        ["quantize"],
        out=out,
        min_time=0.01,
        memory=False,
        only=("n=64 ",),
        on_case=lambda rows: seen.append([r["case"] for r in rows]),
    )
    # re.search on the name; the cases not named are not run, nor listed as slow
    assert list(dict.fromkeys(r["case"] for r in rows)) == ["cliff n=64 d=2", "klm n=64 d=2"]
    assert "n=640" not in out.getvalue()
    assert [list(dict.fromkeys(s)) for s in seen] == [["cliff n=64 d=2"], ["cliff n=64 d=2", "klm n=64 d=2"]]
    assert seen[-1] == [r["case"] for r in rows]  # the rows so far, after every case
    rows = bench.run(["quantize"], out=io.StringIO(), min_time=0.01, memory=False, only=("^cliff n=640",))
    assert {r["case"] for r in rows} == {"cliff n=640 d=2"}  # a slow case named runs without --all
    with pytest.raises(ValueError, match="--case: no case of quantize matches 'lq'"):
        bench.run(["quantize"], out=io.StringIO(), only=("lq",))


def _worst_row(variant):
    return {
        "variant": variant,
        "min_s": 12345.678,
        "median_s": 23456.789,
        "q1_s": 0.0,
        "q3_s": 99999.0,
        "vs_baseline": 1 / 9876.5,
        "vs_baseline_clear": False,
        "vs_compiled": 1 / 9876.5,
        "vs_compiled_clear": False,
        "peak_bytes": 123456.7 * 2**20,
        "memory_ratio": 9876.5,
    }


def test_default_cases_and_legends_fit_100_columns():
    for hotpath in bench.HOTPATHS:
        names = []
        for case in bench.cases(hotpath):
            names += list(case.variants)
            lines = bench.report.case_lines(
                case.name,
                [_worst_row(v) for v in case.variants],
                baseline=case.baseline,
                rounds=1000,
                note="slow case: run with --all",
            )
            lines += bench.report.case_lines(case.name, [{"variant": v, "error": "E" * 300} for v in case.variants])
            assert all(len(line) <= 100 for line in lines), max(lines, key=len)
        legend = bench.report.legend_lines({hotpath: names})
        assert all(len(line) <= 100 for line in legend + [bench.report.header()])
        for name in dict.fromkeys(names):  # every variant of the default cases is explained
            assert any(line.startswith(f"  {name}: ") for line in legend), (hotpath, name)
    for hotpath in ("kde", "quantize"):
        assert any("materialized" in v for c in bench.cases(hotpath) for v in c.variants)
    train = bench.report.legend_lines({"hessian": ["none", "stacked", "fused", "sequential"]})
    assert all(any(line.startswith(f"  {n}: ") for line in train) for n in ("none", "stacked", "fused", "sequential"))


def test_pytest_benchmark_summary_table():
    """benchmarks/conftest.py turns pytest-benchmark's statistics into the same table."""
    path = pathlib.Path(__file__).parents[1] / "benchmarks" / "conftest.py"
    spec = importlib.util.spec_from_file_location("benchmarks_conftest", path)
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)

    class Meta:
        def __init__(self, variant, median, peak):
            self.stats = types.SimpleNamespace(
                min=0.9 * median, median=median, q1=0.95 * median, q3=1.05 * median, rounds=7
            )
            self.extra_info = {
                "hotpath": "kde",
                "case": "klm n=64 d=12",
                "variant": variant,
                "baseline": "reference",
                "peak_mib": peak,
            }

        def __bool__(self):
            return True

    metas = [Meta("reference", 0.002, 4.0), Meta("cpu", 0.004, 1.0), Meta("reference_compiled", 0.00201, None)]
    lines = conf.summary_lines(metas)
    assert all(len(line) <= 100 for line in lines)
    cpu = next(line for line in lines if line.startswith("  cpu "))
    assert "2.00x slower" in cpu and "4.00x less" in cpu
    compiled = next(line for line in lines if line.startswith("  reference_compiled "))
    assert "1.00x" in compiled  # 0.5% apart: a tie
    assert any(line.startswith("klm n=64 d=12  (baseline reference; 7 rounds)") for line in lines)
    assert any(line.startswith("legend:") for line in lines)


def test_compiled_baselines_use_static_shapes(monkeypatch):
    """Cases share a loss's code object, so with automatic dynamic shapes every case after the first
    would time code compiled for any size: not what a user compiling one training shape gets."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    bench.variant(bq.materialized_loss, compiled=True)
    bench.backend_variants(bq._loss, "cpu", "latent_quantize")
    assert seen and all(kw.get("dynamic") is False for kw in seen)


def test_table_row_columns_by_hand():
    """Audit 9 review: the numbers of a table row were checked only for width and ratio words. Each
    column of one row written by hand: times in ms at 3 significant digits below 1 ms, 3 / 2 / 1
    decimals below 10 / 100 / 1000 ms, none above; IQR in % of the median (1 decimal below 10 %);
    peak in MiB (2**20 bytes) with 1 decimal; launches ("-" when not counted); long variant names cut
    to 19 characters + "~"."""
    report = bench.report
    row = {
        "variant": "cpu",
        "min_s": 0.0004567,
        "median_s": 0.0123456,
        "q1_s": 0.010,
        "q3_s": 0.0135,
        "vs_baseline": 2.0,
        "vs_compiled": 0.8,
        "vs_compiled_clear": False,
        "peak_bytes": 3 * 2**20,
        "memory_ratio": 0.25,
    }
    # IQR: 100 * (13.5 - 10) / 12.3456 = 28.35 -> "28"
    want = ["cpu", "0.457", "12.35", "28", "-", "2.00x", "faster", "1.25x", "slower?", "3.0", "4.00x", "less"]
    lines = report.case_lines("toy", [row])
    assert lines[0] == "toy" and lines[1].split() == want
    assert lines[1].startswith("  cpu ")
    cases = [(0.0001234, "0.123"), (0.005, "5.000"), (0.0456789, "45.68"), (0.1234567, "123.5"), (4.5678, "4568")]
    for seconds, text in cases:
        r = {
            "variant": "v",
            "min_s": seconds,
            "median_s": seconds,
            "q1_s": 0.97 * seconds,
            "q3_s": 1.02 * seconds,
            "peak_bytes": 1.5 * 2**20,
        }
        # IQR 5 % of the median: one decimal below 10 %; 1.5 MiB
        assert report.case_lines("c", [r])[1].split()[1:4] == [text, text, "5.0"], seconds
        assert report.case_lines("c", [r])[1].split()[-2] == "1.5"
    long = {"variant": "materialized compiled x", "min_s": 1e-3, "median_s": 1e-3}
    assert report.case_lines("c", [long])[1][:23] == "  materialized compil~ "
    counted = {"variant": "v", "min_s": 1e-3, "median_s": 1e-3, "launches": 76}
    assert report.case_lines("c", [counted])[1].split()[1:5] == ["1.000", "1.000", "-", "76"]  # after the IQR
    assert report.case_lines("c", [{"variant": "skip", "note": "slow case"}])[1] == "  skip                 slow case"


def test_quartiles_are_the_inclusive_ones():
    """Audit 9 review: statistics' default (exclusive) quartiles survived. Inclusive method: linear
    interpolation at positions 1 + (n - 1) p: [1, 2, 3, 4, 5] -> (2, 4) (exclusive: (1.5, 4.5))."""
    assert bench.report.quartiles([5.0, 1.0, 3.0, 2.0, 4.0]) == (2.0, 4.0)
    assert bench.report.quartiles([1.0, 2.0]) == (1.25, 1.75)
    assert bench.report.quartiles([7.0]) == (7.0, 7.0)
    q = bench.report.quartiles([])
    assert q[0] != q[0] and q[1] != q[1]  # NaN


def test_factor_digits_and_load_threshold():
    """Audit 9 review: a factor with one decimal below 10 and a load warning from the CPU count (not half
    of it) survived. Factors keep 3 significant digits; the warning starts above 0.5 x the CPUs."""
    assert [bench.report.factor(x) for x in (1.234, 9.994, 12.34, 123.4, 1234.5)] == [
        "1.23",
        "9.99",
        "12.3",
        "123",
        "1234",
    ]
    assert bench.report.load_warning(1.0, 2) is None  # exactly half: no warning
    assert "load average 1.5 on 2 CPUs (over 50% of them)" in bench.report.load_warning(1.5, 2)
    assert bench.report.memory_text(0.5) == "2.00x less" and bench.report.memory_text(8) == "8.00x more"


def test_every_default_variant_runs_on_warm_up_inputs():
    """Every variant of every default case (torch.compile ones aside: minutes of compiling) runs one
    forward + backward on its case's tiny warm-up inputs (``make(0)``): a variant whose code went
    stale is an error here, not a 'failed' row in somebody's benchmark table."""
    for hotpath in bench.HOTPATHS:
        for case in bench.cases(hotpath):
            for name, fn in case.variants.items():
                if "compiled" not in name:
                    fn(*case.make(0))


def test_a_variant_has_one_colour_in_every_figure():
    """Issue 39: `reference` was blue in one figure and orange in another (colours followed each figure's variant
    list). A colour is now a function of the name alone; a raw call takes its backend's."""
    from qkernels.bench import plot

    names = ["reference", "cpu", "reference_compiled", "triton", "cuda", "auto", "auto_compiled", "materialized"]
    assert len({plot.colour(n) for n in names}) == len(names)  # told apart
    assert plot.colour("cpu raw") == plot.colour("cpu")
    assert plot.colour("some new variant") == plot.colour("some new variant")


# ---------------------------------------------------------------------------------------------------------------
# Issue 40 (review): the results files and benchmarks/summarize.py, recomputed by hand from fabricated records

_INFO_A = {
    "date": "2026-03-01T10:00:00Z",
    "machine": "cpu-a",
    "cpu": "AMD EPYC",
    "cores": 2,
    "threads": 2,
    "gpu": "",
    "gpu_driver": "",
    "torch": "2.11.0",
    "triton": "",
    "qkernels_commit": "0123456789ab-dirty",
    "load_avg": 0.48,
}


def _bench_row(hotpath, case, variant, vb, vc, *, cb=True, cc=True, mem=None, baseline="reference", error=None):
    return {
        "hotpath": hotpath,
        "case": case,
        "variant": variant,
        "baseline": baseline,
        "min_s": 1e-3,
        "median_s": None if error else 2e-3,
        "q1_s": 1.5e-3,
        "q3_s": 3e-3,
        "rounds": 11,
        "vs_baseline": vb,
        "vs_baseline_clear": cb,
        "vs_compiled": vc,
        "vs_compiled_clear": cc,
        "peak_bytes": 4096,
        "memory_ratio": mem,
        "launches": None,
        "error": error,
    }


def test_results_saved_csv_and_json_read_back_as_measured(tmp_path):
    """qkernels bench --save: DIR/<machine>/<date without colons>.csv and .json; results.load (of the directory, or
    of the file) gives back every field as measured: numbers exact (floats written with repr), None as None,
    the *_clear flags as bools (False stays False), strings as written, an error's text; iqr_pct = 100 (q3 - q1) /
    median by hand; the JSON holds the machine and the rows. A CSV that is not a bench file is skipped."""
    from qkernels.bench import results

    rows = [
        {
            **_bench_row("quantize", "latent_quantize n=7", "cpu", 1.7512345678901234, 0.8, cb=True, cc=False, mem=0.5),
            "launches": 3,
            "peak_bytes": 123456789,
            "min_s": 1.2345678901234567e-05,
        },
        _bench_row("quantize", "latent_quantize n=7", "triton", None, None, error="RuntimeError: no GPU, said it"),
    ]
    path = results.save(rows, tmp_path, _INFO_A)
    assert path == tmp_path / "cpu-a" / "2026-03-01T100000Z.csv" and path.with_suffix(".json").is_file()
    (tmp_path / "notes.csv").write_text("a,b\n1,2\n")
    for loaded in (results.load([tmp_path]), results.load([path])):
        assert len(loaded) == 2
        for rec, row in zip(loaded, rows, strict=True):
            for k, v in {**_INFO_A, **row}.items():
                if k == "error":
                    assert rec[k] == (v or ""), k
                else:
                    assert rec[k] == v and type(rec[k]) in ((type(v), float) if v is not None else (type(None),)), k
        assert loaded[0]["iqr_pct"] == pytest.approx(100 * (3e-3 - 1.5e-3) / 2e-3) and loaded[1]["iqr_pct"] is None
        assert loaded[0]["vs_compiled_clear"] is False and loaded[0]["vs_baseline_clear"] is True
    saved = json.loads(path.with_suffix(".json").read_text())
    assert saved["machine"] == _INFO_A
    assert [{k: v for k, v in r.items() if k != "iqr_pct"} for r in saved["rows"]] == rows
    assert saved["rows"][0]["iqr_pct"] == pytest.approx(75.0)


def _summarize_module():
    spec = importlib.util.spec_from_file_location(
        "summarize", pathlib.Path(__file__).parents[1] / "benchmarks" / "summarize.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summary_table_by_hand(tmp_path, capsys):
    """benchmarks/summarize.py --markdown on saved fabricated runs, every cell worked out by hand: per op x device the
    best of qkernels' variants (the baseline, the reference and its compile, materialized formulations and failed
    runs are no candidates; bf16 cases and the per-call overhead left out) by the geometric mean over shapes of the
    speed-up over reference_compiled, ties and missing compiled ratios by the one over the baseline; geometric means
    with the range over shapes; '?' where no shape was a clear win or loss; memory as the geometric mean of peak
    ratios; the latest run per machine and hot path (an older run's hot path that the newer one did not measure
    still counts); rows in hot-path order."""
    from qkernels.bench import results

    r = _bench_row
    old = {**_INFO_A, "date": "2026-02-01T10:00:00Z"}
    results.save(
        [
            r("quantize", "latent_quantize n=1", "reference", 1.0, 0.5),
            r("quantize", "latent_quantize n=1", "auto", 100.0, 100.0),  # superseded by the newer run
            r("hessian", "hessian_penalty k=2", "sequential", 1.0, None, baseline="sequential"),
            r("hessian", "hessian_penalty k=2", "fused", 2.5, None, baseline="sequential"),
        ],
        tmp_path,
        old,
    )
    results.save(
        [
            r("quantize", "latent_quantize n=1", "reference", 1.0, 0.5),
            r("quantize", "latent_quantize n=1", "reference_compiled", 2.0, 1.0),
            r("quantize", "latent_quantize n=1", "cpu", 2.0, 1.0, mem=0.5),
            r("quantize", "latent_quantize n=1", "auto", 3.0, 0.5, mem=1.0),
            r("quantize", "latent_quantize n=1", "materialized", 50.0, 50.0),
            r("quantize", "latent_quantize n=1", "triton", 90.0, 90.0, error="RuntimeError: no GPU"),
            r("quantize", "latent_quantize n=2", "reference", 1.0, 0.5),
            r("quantize", "latent_quantize n=2", "cpu", 8.0, 4.0, mem=2.0),
            r("quantize", "latent_quantize n=2", "auto", 3.0, 0.5, mem=1.0),
            r("quantize", "latent_quantize bf16 n=1", "cpu", 100.0, 100.0, baseline="float32"),
            r("quantize", "fsq n=1", "reference", 1.0, None),
            r("quantize", "fsq n=1", "cpu", 1.5, None, cb=False),
            r("quantize", "fsq n=1", "auto", 3.0, None, cb=False),
            r("kde", "cliff n=64", "reference", 1.0, 0.8),
            r("kde", "cliff n=64", "cpu", 1.25, 0.8, cc=False),
            r("overhead", "add", "cpu", 5.0, 5.0),
            r("step", "cliff_vae batch=64", "reference", 1.0, 1.0),
            r("step", "cliff_vae batch=64", "auto", 1.6, 1.1, mem=0.25),
        ],
        tmp_path,
        _INFO_A,
    )
    gpu = {
        **_INFO_A,
        "date": "2026-03-02T11:00:00Z",
        "machine": "gpu-b",
        "cpu": "Xeon",
        "cores": 16,
        "gpu": "NVIDIA H200",
    }
    results.save(
        [
            r("quantize", "latent_quantize n=1", "reference", 1.0, 0.5),
            r("quantize", "latent_quantize n=1", "triton", 4.0, 2.0, mem=0.5),
            r("quantize", "latent_quantize n=1", "cuda", 6.0, 1.5),  # faster than eager, slower than triton vs compile
            r("quantize", "fsq n=1", "reference", 1.0, 1.0),
            r("quantize", "fsq n=1", "triton", 2.0, 1.5),
            r("quantize", "fsq n=1", "cuda", 3.0, 1.5),  # tie over the compiled reference: the one over eager decides
        ],
        tmp_path,
        gpu,
    )
    assert _summarize_module().main([str(tmp_path), "--markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == [
        "| latent_quantize | AMD EPYC (2 cores) | cpu | 4.00x faster (2-8x) | 2.00x faster (1-4x) | 1.00x | 2 | "
        "2026-03-01 |",
        "| latent_quantize | NVIDIA H200 | triton | 4.00x faster | 2.00x faster | 2.00x less | 1 | 2026-03-02 |",
        "| fsq | AMD EPYC (2 cores) | auto | 3.00x faster? | - | - | 1 | 2026-03-01 |",
        "| fsq | NVIDIA H200 | cuda | 3.00x faster | 1.50x faster | - | 1 | 2026-03-02 |",
        "| cliff | AMD EPYC (2 cores) | cpu | 1.25x faster | 1.25x slower? | - | 1 | 2026-03-01 |",
        "| hessian_penalty | AMD EPYC (2 cores) | fused | 2.50x faster | - | - | 1 | 2026-02-01 |",
        "| cliff_vae step | AMD EPYC (2 cores) | auto | 1.60x faster | 1.10x faster | 4.00x less | 1 | 2026-03-01 |",
    ]
    assert lines[0].startswith("| op | device | best backend | vs eager | vs torch.compile | memory vs eager |")
