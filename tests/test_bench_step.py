"""``qkernels bench --hotpath step --save DIR --plot DIR`` end to end on tiny inputs (issue 28): the training-step
cases run, the CSV / JSON carry the machine, versions and per-variant statistics, the PNG opens as an image, and
benchmarks/summarize.py reads the CSV back into the summary table and plots."""

import csv
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest
from PIL import Image

from qkernels.bench import results

pytestmark = pytest.mark.slow  # a long file: scheduled first (tests/conftest.py)

PLOTS = importlib.util.find_spec("matplotlib") is not None  # optional (qkernels[plot]): without it, no PNGs

ROOT = pathlib.Path(__file__).parents[1]


def test_bench_step_save_and_plot(tmp_path, monkeypatch):
    # tiny: batch 16, one method, no torch.compile (a minute per method on a CPU)
    env = {
        "QKERNELS_BENCH_TINY": "1",
        "QKERNELS_BENCH_STEP_MODELS": "cliff_vae",
        "QKERNELS_BENCH_STEP_VARIANTS": "auto,reference",
        "OMP_NUM_THREADS": "1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "qkernels", "bench", "--hotpath", "step", "--min-time", "0.01", "--save", str(out)]
    res = subprocess.run(cmd + (["--plot", str(out)] if PLOTS else []), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "== step: one training step per run" in res.stdout
    (csv_path,) = out.glob("*/*.csv")
    assert csv_path.parent.name == results.machine_info()["machine"]
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == results.FIELDS
    assert {(r["case"].split()[0], r["variant"]) for r in rows} == {("cliff_vae", v) for v in ("auto", "reference")}
    for r in rows:
        assert r["hotpath"] == "step" and r["baseline"] == "reference" and not r["error"], r
        assert 0 < float(r["min_s"]) <= float(r["median_s"]) and float(r["rounds"]) >= 5
        assert float(r["peak_bytes"]) > 0 and r["torch"] and r["cpu"] and r["date"] and r["cores"]
        assert float(r["launches"]) > 0  # aten ops of a step, counted on the CPU
    assert all(float(r["vs_baseline"]) == 1.0 for r in rows if r["variant"] == "reference")
    saved = json.loads(csv_path.with_suffix(".json").read_text())
    assert saved["machine"]["machine"] == csv_path.parent.name and len(saved["rows"]) == len(rows)
    if PLOTS:
        (png,) = out.glob("*.png")
        with Image.open(png) as im:
            im.verify()
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size[0] >= 800 and im.size[1] >= 300

    # the summary script over the saved results
    spec = importlib.util.spec_from_file_location("summarize", ROOT / "benchmarks" / "summarize.py")
    summarize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summarize)
    lines = summarize.table(results.load([out]))
    assert lines[0].startswith("| op | device | best backend | vs eager | vs torch.compile |")
    assert {line.split("|")[1].strip() for line in lines[2:]} == {"cliff_vae step"}
    assert all(line.split("|")[3].strip() == "auto" for line in lines[2:])
    if PLOTS:
        plots = tmp_path / "plots"
        assert summarize.main([str(out), "--plot", str(plots)]) == 0
        assert {p.name for p in plots.glob("*.png")} == {csv_path.parent.name + ".png", "headline.png"}
        for png in plots.glob("*.png"):
            with Image.open(png) as im:
                assert im.format == "PNG"
        with Image.open(plots / "headline.png") as im:  # the README's figure: legible at page width
            assert im.size[0] <= 1000


def test_plot_needs_matplotlib_says_so(monkeypatch):
    from qkernels.bench import plot

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(ImportError, match=r"qkernels\[plot\]"):
        plot._matplotlib()
