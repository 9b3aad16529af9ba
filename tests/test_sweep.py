"""Issue 55, part 3: ``qkernels sweep``. A 2 methods x 2 seeds grid at tiny size (the sizes of tests/test_train.py's
tiny_cfg) run by 2 local workers, one of them SIGKILLed mid-run, and one of its cells through a local Ray cluster,
equal the same runs made one by one with the same thread count, bit for bit; a second invocation does nothing; the
table's numbers are those of ``qkernels eval`` of each run; failures are reported, not retried."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import signal
import statistics
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import require

from qkernels.train import TrainConfig, eval_run, train
from qkernels.train.sweep import Cell, Grid, cell_state, run_sweep, split_cores

pytestmark = pytest.mark.slow  # a long file: scheduled first (tests/conftest.py)

# tests/test_train.py's tiny_cfg sizes; 40 steps with a checkpoint every 10, so that a worker can be caught mid-run
TINY = {
    "image_size": 16,
    "steps": 40,
    "batch_size": 8,
    "checkpoint_every": 10,
    "log_every": 5,
    "eval_samples": 100,
    "metrics": ["infomec"],
}
MODELS, SEEDS = ("ae", "qlae"), (0, 1)


def _grid(out, **kw) -> Grid:
    return Grid(models=MODELS, datasets=("sprites",), seeds=SEEDS, out=str(out), base=dict(TINY), **kw)


@pytest.fixture(scope="module")
def one_by_one(tmp_path_factory):
    """The four cells trained one after another in this process, at 1 thread (as `qkernels train --threads 1`)."""
    out, threads = tmp_path_factory.mktemp("one_by_one"), torch.get_num_threads()
    try:
        for cell in _grid(out).cells():
            train(
                TrainConfig(
                    model=cell.model,
                    dataset=cell.dataset,
                    seed=cell.seed,
                    out=str(out / cell.path),
                    threads=1,
                    progress=False,
                    **TINY,
                )
            )
    finally:
        torch.set_num_threads(threads)
    return out


def _children_running(run_dir: Path) -> list[int]:
    """Processes whose parent is this one and whose command line names ``run_dir``."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (p / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and str(run_dir) in cmd:
            found.append(int(p.name))
    return found


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The grid run by `run_sweep` on 2 workers x 1 thread; the worker of the first cell to write a checkpoint is
    frozen there (SIGSTOP), checked to be mid-run, and SIGKILLed."""
    out = tmp_path_factory.mktemp("swept")
    grid = _grid(out)
    killed: dict = {}

    def killer():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not killed:
            for cell in grid.cells():
                d = out / cell.path
                if not (d / "checkpoint.pt").is_file():
                    continue
                for pid in _children_running(d):
                    os.kill(pid, signal.SIGSTOP)
                    step = torch.load(d / "checkpoint.pt", weights_only=True)["step"]
                    os.kill(pid, signal.SIGKILL)
                    killed.update(cell=cell, step=step)
                    return
            time.sleep(0.005)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    err = io.StringIO()
    res = run_sweep(grid, threads=2, workers=2, stream=err)
    t.join(timeout=1)
    return out, grid, res, killed, err.getvalue()


def _same_run(a: Path, b: Path) -> None:
    sa, sb = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (a, b))
    assert sa["step"] == sb["step"]
    for part in ("model", "opt"):
        flat_a, flat_b = _flat(sa[part]), _flat(sb[part])
        assert flat_a.keys() == flat_b.keys()
        for k in flat_a:
            if isinstance(flat_a[k], torch.Tensor):
                assert torch.equal(flat_a[k], flat_b[k]), (a, part, k)
            else:
                assert flat_a[k] == flat_b[k], (a, part, k)
    assert (a / "log.jsonl").read_text() == (b / "log.jsonl").read_text()
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    assert ma == mb


def _flat(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_two_workers_equal_the_runs_one_by_one_bitwise(swept, one_by_one):
    out, grid, res, _, said = swept
    assert not res.failed and sorted(map(str, res.ran)) == sorted(map(str, grid.cells()))
    for cell in grid.cells():
        _same_run(out / cell.path, one_by_one / cell.path)
    assert "4 cells (2 methods x 1 dataset x 2 seeds)" in said
    assert "2 workers x 1 thread (--threads: 2 split evenly between the workers" in said
    # progress: one line per finished cell and the overall bar with an estimate
    assert sum(ln.startswith("[") and "sprites seed" in ln for ln in said.splitlines()) == 4
    assert "sweep [########################] 4/4 cells done" in said and "| eta " in said


def test_a_sigkilled_worker_is_resumed_from_its_checkpoint_and_ends_unchanged(swept, one_by_one):
    out, grid, res, killed, said = swept
    assert killed, "no worker was caught mid-run"
    cell = killed["cell"]
    assert 0 < killed["step"] < TINY["steps"]  # frozen between checkpoints: mid-run
    r = res.results[cell]
    assert (r["status"], r["killed"], r["attempts"]) == ("done", 1, 2)
    assert "resumed 1x after a kill" in said
    log = (out / ".sweep" / f"{cell.slug}.log").read_text()
    assert "killed (exit -9); resuming from its checkpoint" in log and "--resume" in log
    _same_run(out / cell.path, one_by_one / cell.path)


def test_a_second_invocation_does_nothing_and_says_so(swept, capsys):
    # the same grid through the command line: every cell is done, nothing runs, the table is printed
    from qkernels.cli import main

    out, grid, _, _, _ = swept
    before = {c: (out / c.path / "checkpoint.pt").stat().st_mtime_ns for c in grid.cells()}
    sets = [a for k, v in TINY.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    assert (
        main(
            [
                "sweep",
                "--models",
                *MODELS,
                "--datasets",
                "sprites",
                "--seeds",
                "2",
                "--out",
                str(out),
                "--threads",
                "2",
                *sets,
            ]
        )
        == 0
    )
    said = capsys.readouterr()
    assert "4 done, 0 to resume, 0 to start" in said.err and "every cell is done: nothing to run" in said.err
    assert "0 ran, 4 were done" in said.err and "| sprites | qlae | 2 |" in said.out
    assert before == {c: (out / c.path / "checkpoint.pt").stat().st_mtime_ns for c in grid.cells()}
    assert {cell_state(grid, c)[0] for c in grid.cells()} == {"done"}


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_the_tables_numbers_are_qkernels_eval_of_each_run(swept):
    out, grid, _, _, _ = swept
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' count: the same bits
    try:
        evals = {c: eval_run(out / c.path) for c in grid.cells()}
    finally:
        torch.set_num_threads(threads)
    runs = list(csv.DictReader(open(out / "runs.csv")))
    assert len(runs) == 4
    for row in runs:
        cell = Cell(row["method"], row["dataset"], int(row["seed"]))
        for key in ("infomec.infom", "infomec.infoc", "infomec.infoe", "recon.psnr", "recon.mse"):
            assert _same(float(row[key]), evals[cell][key]), (cell, key)
    table = {r["method"]: r for r in csv.DictReader(open(out / "table.csv"))}
    md = (out / "table.md").read_text()
    for m in MODELS:
        vals = [evals[Cell(m, "sprites", s)]["recon.psnr"] for s in SEEDS]
        mean, sd = statistics.mean(vals), statistics.stdev(vals)
        assert float(table[m]["recon.psnr_mean"]) == pytest.approx(mean, rel=1e-6)
        assert float(table[m]["recon.psnr_std"]) == pytest.approx(sd, rel=1e-6)
        assert table[m]["seeds_reported"] == "2" and table[m]["checkpoint"] == "final"
        line = next(ln for ln in md.splitlines() if ln.startswith(f"| sprites | {m} | 2 |"))
        assert line.split(" | ")[9] == f"{mean:.1f} ± {sd:.1f}"  # the PSNR (dB) column
    assert (out / "table.png").stat().st_size > 0


def test_the_same_sweep_on_a_local_ray_cluster(tmp_path, one_by_one):
    ray = require("ray", "ray", "ray is not installed (pip install 'qkernels[ray]')")
    env, sigterm = dict(os.environ), signal.getsignal(signal.SIGTERM)  # ray.init sets both for the process
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "env_vars": {
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")])
                )
            }
        },
    )
    try:
        err = io.StringIO()
        grid = Grid(models=MODELS[1:], datasets=("sprites",), seeds=SEEDS[:1], out=str(tmp_path), base=dict(TINY))
        res = run_sweep(grid, ray="auto", ray_threads=1, stream=err)
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, sigterm)
        os.environ.clear()
        os.environ.update(env)
    assert not res.failed and len(res.ran) == 1, err.getvalue()
    assert "1 cell, each a Ray task of 1 CPU (torch threads" in err.getvalue()
    for cell in grid.cells():
        _same_run(tmp_path / cell.path, one_by_one / cell.path)


def test_a_cell_that_fails_for_a_reason_is_reported_once(tmp_path):
    grid = Grid(
        models=("ae",),
        datasets=("sprites",),
        seeds=(0,),
        out=str(tmp_path),
        base={**TINY, "model_kwargs": {"no_such_option": 1}},
    )
    err = io.StringIO()
    res = run_sweep(grid, threads=1, stream=err)
    ((cell, why),) = res.failed
    assert res.results[cell]["attempts"] == 1 and res.results[cell]["returncode"] == 2
    assert "no_such_option" in why and "FAILED" in err.getvalue() and "1 failed" in err.getvalue()


def test_grid_validation_conflicts_and_core_split(tmp_path):
    toml = tmp_path / "g.toml"
    toml.write_text(
        'models = ["qlae", "tripod"]\ndatasets = ["sprites"]\nseeds = 2\n[base]\nsteps = 5\n'
        "[settings.wd]\nweight_decay = 0.01\n[settings.plain]\n"
    )
    grid = Grid.from_dict(Grid.read_toml(toml), out=str(tmp_path / "s"))
    assert [c.path for c in grid.cells()][:2] == ["sprites/qlae@wd/seed0", "sprites/qlae@wd/seed1"]
    assert len(grid.cells()) == 8 and grid.config(grid.cells()[0]).weight_decay == 0.01
    assert grid.config(Cell("tripod", "sprites", 1, "plain")).eval_every == "tripod"  # Tripod's cadence by default
    for bad, says in [
        ({"models": ["nope"]}, "unknown 'nope'"),
        ({"seeds": [-1]}, "seeds"),
        ({"base": {"seed": 3}}, "seed is set by the grid"),
        ({"colour": 1}, "unknown sweep keys"),
        ({"base": {"steps": 0}}, "steps must be"),
    ]:
        with pytest.raises(ValueError, match=says):
            Grid.from_dict({"models": ["ae"], "datasets": ["sprites"], "seeds": 1, **bad})
    with pytest.raises(ValueError, match="t.toml"):
        Grid.read_toml(tmp_path / "t.toml")
    # a cell directory holding another run: refused without force
    g = Grid(models=("ae",), datasets=("sprites",), seeds=(0,), out=str(tmp_path / "c"), base=dict(TINY))
    other = g.config(g.cells()[0])
    other.steps = 7
    Path(other.out).mkdir(parents=True)
    other.save(Path(other.out) / "config.json")
    assert cell_state(g, g.cells()[0]) == ("conflict", "steps 7 where the sweep has 40")
    with pytest.raises(ValueError, match="--force"):
        run_sweep(g, threads=1, stream=io.StringIO())
    # --data-root reaches the file datasets only, and is not part of what a cell computes
    g = Grid(models=("ae",), datasets=("sprites", "shapes3d"), seeds=(0,), out=str(tmp_path / "r"), data_root="R")
    assert g.config(Cell("ae", "shapes3d", 0)).dataset_kwargs == {"root": "R"}
    assert "root" not in g.config(Cell("ae", "sprites", 0)).dataset_kwargs
    w, per, how = split_cores(4, 2, 10)
    assert (w, per) == (2, 2) and "2 workers x 2 threads" in how
    assert split_cores(3, None, 2)[:2] == (2, 1)  # one worker per cell at most; 3 // 2 threads each
    with pytest.raises(ValueError, match="oversubscription"):
        split_cores(2, 3, 4)


def _run(model, seed, d, setting="", **m):
    from qkernels.train.table import Run

    return Run(f"r/{model}{seed}{setting}", model, "shapes3d", setting, seed, 10, {"rule": "final"}, m)


def test_cliffs_seed_rule_and_qlaes_recon_filter():
    # Cliff App. F.4: per set of hyperparameters the best of its seeds by D picks the set; its mean is reported
    from qkernels.train.table import build_rows

    runs = [
        _run("cliff_vae", 0, 0, "a", **{"dci.disentanglement": 0.5}),
        _run("cliff_vae", 1, 0, "a", **{"dci.disentanglement": 0.9}),
        _run("cliff_vae", 0, 0, "b", **{"dci.disentanglement": 0.8}),
        _run("cliff_vae", 1, 0, "b", **{"dci.disentanglement": 0.8}),
    ]
    (row,) = build_rows(runs)
    assert row.setting == "a" and "best seed by D: 1 (D 0.900) of 2 settings" in row.note
    assert row.stats("dci.disentanglement", 100.0)[0] == pytest.approx(70.0)  # mean of 50 and 90, not 90
    assert len(build_rows(runs, seed_rules={"cliff": "all"})) == 2
    # QLAE's filter (the project's reading): a row averages the seeds whose PSNR reaches the threshold
    runs = [
        _run("qlae", s, 0, **{"recon.psnr": p, "infomec.infom": i})
        for s, p, i in [(0, 31.0, 0.2), (1, 35.0, 0.6), (2, 36.0, 0.8)]
    ]
    (row,) = build_rows(runs, recon_filter_db=34.0)
    assert row.stats("infomec.infom")[0] == pytest.approx(0.7) and "2 of 3 seeds at >= 34 dB" in row.note
    (row,) = build_rows(runs)
    assert row.stats("infomec.infom")[0] == pytest.approx(1.6 / 3)
    assert math.isnan(build_rows(runs[:1])[0].stats("infomec.infom")[1])  # one seed: no spread


def test_published_numbers_are_the_papers():
    """Every published value stands in the cited table of the stored paper text (shared/papers)."""
    from qkernels.train.published import PUBLISHED

    root = next(
        (
            p
            for p in (Path(__file__).parents[1] / "shared", Path(__file__).parents[2] / "shared", Path("/work/shared"))
            if (p / "papers").is_dir()
        ),
        None,
    )
    if root is None:
        pytest.skip("the papers' text (shared/papers) is not beside this checkout")
    for (paper, method, dataset), entry in PUBLISHED.items():
        name, line = entry["source"].split("(")[1].split(")")[0].split(":")
        text = (root / "papers" / name).read_text().splitlines()
        region = "\n".join(text[max(int(line) - 40, 0) : int(line) + 20])
        for key, v in entry["values"].items():
            for x in v if isinstance(v, tuple) else (v,):
                assert f"{x:.2f}" in region or f"{x:.1f}" in region, (paper, method, dataset, key, x)
