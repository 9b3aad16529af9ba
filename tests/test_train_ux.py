"""Issue 31: training runs a person can trust on a shared machine. A run directory is never overwritten silently
(refused without --force; --force deletes only the run's files; --resume still continues), --threads reaches
torch in the training process (and the default picks the cores not busy), the ETA follows the recent speed (a
fake clock), every figure is titled and the loss curves are drawn (one run, or several with compare --curves),
and two quantizer messages say what is wrong."""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import qkernels
from qkernels.cli import main
from qkernels.nn import FSQ, CategoricalLatent, LatentQuantizer
from qkernels.train import TrainConfig, Trainer, compare_runs, loop, train
from qkernels.train import figures as F
from qkernels.train import threads as T
from qkernels.train.files import RunExistsError, clear_run, run_files

pytestmark = pytest.mark.slow  # a long file: scheduled first (tests/conftest.py)

_REAL_BUSY_CORES = T.busy_cores  # the autouse fixture stubs the module's (it sleeps half a second)
TINY = [
    "train",
    "--model",
    "qlae",
    "--dataset",
    "sprites",
    "--image-size",
    "16",
    "--batch-size",
    "8",
    "--eval-samples",
    "50",
]


@pytest.fixture(autouse=True)
def _keep_threads(monkeypatch):
    """Tests here set torch's thread count; the next test gets the count it had. busy_cores sleeps: stubbed."""
    before = torch.get_num_threads()
    monkeypatch.setattr(T, "busy_cores", lambda interval=0.5: 0.0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    yield
    torch.set_num_threads(before)


def _files(out):
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _log_steps(out):
    return [r["step"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if r["type"] == "train"]


# ------------------------------------------------------------------------------------- 1. no silent overwrite
def test_a_directory_holding_a_run_is_refused_and_force_replaces_only_its_files(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TINY, "--steps", "4", "--out", str(out)]) == 0
    before = _files(out)
    assert {"config.json", "log.jsonl", "checkpoint.pt", "metrics.json", "figures/loss.png"} <= set(before)
    capsys.readouterr()
    # a second run into it: one line naming --resume and --force, exit 2, not a byte changed
    assert main([*TINY, "--steps", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"qkernels: error: --out {out} already holds a run (config.json, log.jsonl")
    assert "--resume" in err[-1] and "--force" in err[-1] and "Traceback" not in "".join(err)
    assert _files(out) == before
    assert main([*TINY, "--resume", "--force", "--out", str(out)]) == 2  # contradictory flags
    assert "give one of them" in capsys.readouterr().err
    # --force: the old run's files go (no mix of two runs), a file of the user's stays
    (out / "notes.txt").write_text("mine")
    (out / "metrics.json.tmp").write_text("torn")
    assert main([*TINY, "--steps", "2", "--out", str(out), "--force"]) == 0
    assert f"deleted the 9 files of the run that was in {out}" in capsys.readouterr().err  # 4 figures, 1 .tmp
    assert (out / "notes.txt").read_text() == "mine" and not (out / "metrics.json.tmp").exists()
    assert _log_steps(out) == [2] and json.loads((out / "metrics.json").read_text())["step"] == 2  # log_every 10
    assert json.loads((out / "config.json").read_text())["steps"] == 2
    # --resume still continues the run in place
    assert main([*TINY, "--resume", "--steps", "3", "--out", str(out)]) == 0
    assert _log_steps(out) == [2, 3] and torch.load(out / "checkpoint.pt", weights_only=False)["step"] == 3


def test_clear_run_deletes_exactly_a_runs_files_and_the_python_api(tmp_path):
    out = tmp_path / "r"
    (out / "figures").mkdir(parents=True)
    ours = [
        "config.json",
        "log.jsonl",
        "checkpoint.pt",
        "metrics.json",
        "checkpoint.pt.tmp",
        "figures/nmi.png",
        "figures/loss.png",
    ]
    theirs = ["data.csv", "figures/sketch.png", "sub/config.json"]
    for name in ours + theirs:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("x")
    assert sorted(str(p.relative_to(out)) for p in run_files(out)) == sorted(ours)
    clear_run(out)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(theirs)
    clear_run(tmp_path / "none")  # nothing there: nothing to do
    # the Trainer: overwrite=False refuses before building or writing anything; the default (the Python API's
    # behaviour before) deletes the old run first, so its metrics and figures never sit beside the new run
    cfg = TrainConfig(model="ae", dataset="sprites", image_size=16, steps=1, batch_size=8, out=str(out), progress=False)
    for name in ours:
        (out / name).write_text("old")
    with pytest.raises(RunExistsError, match="already holds a run") as exc:
        Trainer(cfg, overwrite=False)
    assert "metrics.json" in exc.value.files and (out / "metrics.json").read_text() == "old"
    train(cfg, final_eval=False)
    assert not (out / "metrics.json").exists() and not (out / "figures" / "nmi.png").exists()
    assert _log_steps(out) == [1] and (out / "data.csv").is_file()


# ---------------------------------------------------------------------------------------------- 2. threads
def _spy_threads(monkeypatch):
    seen = []
    step = loop.Trainer.train_step

    def spy(self, s):
        seen.append(torch.get_num_threads())
        return step(self, s)

    monkeypatch.setattr(loop.Trainer, "train_step", spy)
    return seen


def test_threads_flag_reaches_torch_in_the_training_process_and_resume_keeps_it(tmp_path, monkeypatch, capsys):
    seen = _spy_threads(monkeypatch)
    before = torch.get_num_threads()
    want = 3 if before != 3 else 2
    out = tmp_path / "run"
    assert main([*TINY, "--steps", "2", "--out", str(out), "--threads", str(want)]) == 0
    assert seen == [want, want] and torch.get_num_threads() == before  # set back for the caller of main()
    first = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("training ")][0]
    assert first.startswith(f"training qlae on sprites with {want} threads:")
    assert json.loads((out / "config.json").read_text())["threads"] == want
    seen.clear()
    assert main([*TINY, "--resume", "--steps", "3", "--out", str(out)]) == 0  # the recorded count
    assert seen == [want] and f"with {want} threads (recorded in config.json):" in capsys.readouterr().err
    seen.clear()
    assert main([*TINY, "--resume", "--steps", "4", "--out", str(out), "--threads", "1"]) == 0
    assert seen == [1] and "with 1 thread:" in capsys.readouterr().err
    # the default: the cores not busy (busy_cores stubbed to 0 here), said in the first line, recorded
    seen.clear()
    assert main([*TINY, "--steps", "1", "--out", str(tmp_path / "auto")]) == 0
    auto = T.usable_cores()
    assert seen == [auto] and json.loads((tmp_path / "auto" / "config.json").read_text())["threads"] == auto
    assert f"with {auto} thread" in capsys.readouterr().err
    with pytest.raises(ValueError, match="threads must be an integer >= 1"):
        Trainer(TrainConfig(model="ae", dataset="sprites", image_size=16, out=str(tmp_path / "x"), threads=0))


def test_threads_flag_beats_omp_num_threads_in_a_fresh_process(tmp_path):
    # a training process of its own (as each torchrun rank is): torch started with OMP_NUM_THREADS=2
    script = f"""
import torch
from qkernels.cli import main
from qkernels.train import loop
seen, step = [], loop.Trainer.train_step
def spy(self, s):
    seen.append(torch.get_num_threads())
    return step(self, s)
loop.Trainer.train_step = spy
assert torch.get_num_threads() == 2
rc = main({[*TINY, "--steps", "1", "--out", str(tmp_path / "p"), "--threads", "1"]!r})
print("SEEN", rc, seen)
"""
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "SEEN 0 [1]" in r.stdout, r.stderr[-2000:]


def test_auto_threads_rule(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # set under `pytest -n` (tests/conftest.py)
    monkeypatch.setattr(T, "_affinity", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(T, "cpu_quota", lambda: None)
    # issue 57: decided at the start from what the machine shows: the usable cores less those other work keeps busy
    # (rounded; a run slow from its first step never sped up when the count ignored them)
    for busy, want in ((0.0, 4), (0.4, 4), (0.6, 3), (1.4, 3), (2.6, 1), (3.6, 1), (7.0, 1)):
        monkeypatch.setattr(T, "busy_cores", lambda interval=0.5, b=busy: b)
        n, why = T.auto_threads()
        assert n == want and why.startswith("auto: 4 usable cores"), (busy, n, why)
        if want < 4:
            assert (
                f"{busy:.1f} of them busy with other work at the start: a step waits for its slowest thread, so "
                f"{want} instead of 4; --threads N to choose" in why
            ), why
        else:
            assert why == "auto: 4 usable cores; --threads N to choose"
    monkeypatch.setattr(T, "busy_cores", lambda interval=0.5: 0.0)
    monkeypatch.setattr(T, "cpu_quota", lambda: 1.5)  # a cgroup quota of 1.5 CPUs: 2 threads
    assert T.auto_threads()[0] == 2 and T.usable_cores() == 2
    monkeypatch.setattr(T, "cpu_quota", lambda: None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two training processes on this machine share the cores
    assert T.auto_threads()[0] == 2
    monkeypatch.setattr(T, "busy_cores", lambda interval=0.5: 1.0)  # and one core is busy: 3 free, 1 each
    assert T.auto_threads()[0] == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # set by the user (or by torchrun): taken as it is
    assert T.auto_threads() == (3, "OMP_NUM_THREADS")


def test_a_run_started_on_a_busy_machine_takes_the_free_cores_unless_told(tmp_path, monkeypatch, capsys):
    """Issue 57, item 1: one of 2 cores busy when the run starts: the automatic count is 1, said in the run's first
    line and recorded in config.json; --threads 2 and OMP_NUM_THREADS=2 are kept as given."""
    monkeypatch.setattr(T, "usable_cores", lambda: 2)
    monkeypatch.setattr(T, "busy_cores", lambda interval=0.5: 1.0)
    run = loop.Trainer.run
    monkeypatch.setattr(loop.Trainer, "run", lambda self, **kw: run(self, stop_after=0, final_eval=False))
    tiny = ["train", "--model", "cliff_ae", "--dataset", "quantized_grid2d", "--batch-size", "50", "--steps", "2"]
    why = (
        "auto: 2 usable cores, 1.0 of them busy with other work at the start: a step waits for its slowest "
        "thread, so 1 instead of 2; --threads N to choose (the count changes the run's bits)"
    )
    for name, extra, omp, want, said in (
        ("auto", [], None, 1, f"1 thread ({why})"),
        ("given", ["--threads", "2"], None, 2, "2 threads:"),
        ("omp", [], "2", 2, "2 threads (OMP_NUM_THREADS):"),
    ):
        if omp:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)
        assert main([*tiny, "--out", str(tmp_path / name), *extra]) == 0
        line = next(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("training "))
        assert line.startswith(f"training cliff_ae on quantized_grid2d with {said}"), line
        assert json.loads((tmp_path / name / "config.json").read_text())["threads"] == want


def test_busy_cores_reads_proc_stat(monkeypatch):
    # two samples of /proc/stat: cpu0 busy 90 of 100 jiffies, cpu1 10 of 100 -> 1.0 core busy
    samples = iter([{0: (0, 0), 1: (0, 0)}, {0: (90, 100), 1: (10, 100)}])
    monkeypatch.setattr(T, "_cpu_times", lambda cpus: next(samples))
    monkeypatch.setattr(T.time, "sleep", lambda s: None)
    assert _REAL_BUSY_CORES(0.5) == pytest.approx(1.0)
    if os.path.exists("/proc/stat"):  # the real file: a number of cores between 0 and the usable ones
        monkeypatch.undo()
        assert 0.0 <= _REAL_BUSY_CORES(0.05) <= len(os.sched_getaffinity(0)) + 1e-9


# ----------------------------------------------------------------------------------------------- 3. the ETA
def test_eta_follows_the_recent_speed_on_a_fake_clock(capsys):
    # 200 steps: 50 at 1 s each, then 50 at 5 s each (another job started). At step 100 a whole-run average
    # says 3 s/step -> 5 min left; the moving average says ~5 s/step -> ~8 min 17 s, the truth is 8 min 20 s
    now = [0.0]
    bar = loop.Progress(200, 0, clock=lambda: now[0])
    for s in range(1, 101):
        now[0] += 1.0 if s <= 50 else 5.0
        bar.update(s, {"total": 1.0, "lr": 0.1})
    eta = bar.eta(100)
    assert 490 <= eta <= 500 and abs(eta - 500) < abs(300 - 500) / 10
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "step 1/200 | total 1 | - it/s | elapsed 0:01 | eta -"  # the warm-up step: no speed yet
    assert lines[1] == "step 20/200 | total 1 | 1.00 it/s | elapsed 0:20 | eta 3:00"
    assert lines[-1] == f"step 100/200 | total 1 | 0.20 it/s | elapsed 5:00 | eta {loop.hms(eta)}"
    assert loop.hms(eta) in ("8:10", "8:11", "8:12", "8:13", "8:14", "8:15", "8:16", "8:17", "8:18", "8:19", "8:20")
    # faster again: within ~20 steps the estimate follows
    for s in range(101, 131):
        now[0] += 1.0
        bar.update(s, {"total": 1.0})
    assert 70 <= bar.eta(130) <= 90  # 70 steps left at ~1 s (plus what is left of the slow ones)
    bar.close()
    # the closing line: steps and time of the whole run, speed after the first step (warm-up)
    closing = f"trained 130 steps in 5:30 ({129 / 329:.2f} it/s after the first step)"
    assert capsys.readouterr().err.splitlines()[-1] == closing


def test_an_evaluation_between_steps_is_not_step_time():
    # 1 s per step, a 60 s evaluation after step 20: the speed stays 1 it/s (it fell to ~0.25 it/s, and the ETA
    # quadrupled, after each of Tripod's periodic evaluations)
    now = [0.0]
    bar = loop.Progress(100, 0, clock=lambda: now[0], enabled=False)
    for s in range(1, 41):
        now[0] += 1.0
        bar.update(s, {"total": 1.0})
        if s == 20:
            with bar.paused():
                now[0] += 60.0
    assert bar.step_time == pytest.approx(1.0) and bar.eta(40) == pytest.approx(60.0)


def test_eta_of_a_resumed_run_and_time_format():
    # resumed at step 50 of 100; the first update 10 s later at step 60: 10 steps at 1 s each
    now = [0.0]
    bar = loop.Progress(100, 50, clock=lambda: now[0], enabled=False)
    now[0] = 10.0
    bar.update(60, {"total": 1.5})
    assert bar.eta(60) == pytest.approx(40.0)
    assert bar.line(60, {"total": 1.5}, 10.0) == "step 60/100 | total 1.5 | 1.00 it/s | elapsed 0:10 | eta 0:40"
    assert [loop.hms(t) for t in (0, 59.4, 61, 3599, 3600, 86399)] == [
        "0:00",
        "0:59",
        "1:01",
        "59:59",
        "1:00:00",
        "23:59:59",
    ]


# -------------------------------------------------------------------------------------------- 4. figures
@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    runs = []
    for name, model, steps in (("a", "qlae", 4), ("b", "ae", 3)):
        cfg = TrainConfig(
            model=model,
            dataset="sprites",
            image_size=16,
            steps=steps,
            batch_size=8,
            log_every=1,
            eval_samples=50,
            out=str(tmp / name),
            progress=False,
        )
        train(cfg)
        runs.append(tmp / name)
    return runs


def _has_colour(img, rgb) -> bool:
    return rgb in {c for _, c in img.getcolors(maxcolors=1 << 20)}


def test_every_figure_is_titled_and_the_loss_curves_are_drawn(two_runs, monkeypatch, tmp_path, capsys):
    from PIL import Image

    a = two_runs[0]
    titles = {}
    titled = F.titled

    def spy(img, title, note=None):
        out = titled(img, title, note)
        titles[id(out)] = title
        return out

    saved = []
    save = Image.Image.save
    monkeypatch.setattr(F, "titled", spy)
    monkeypatch.setattr(
        Image.Image,
        "save",
        lambda self, fp, *args, **kw: (saved.append((fp, id(self))), save(self, fp, *args, **kw))[1],
    )
    assert main(["eval", str(a)]) == 0  # redraws every figure of the run
    # issue 57, item 2: it says what it does, with an estimate after the first batch and the time of each part
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [
        "qkernels eval: loading torch, the run and its data ...",
        f"qkernels eval: {a} (qlae on sprites, step 4): qlae protocol, infomec, dci on 50 samples "
        "(reconstructions scored as they are encoded); then the figures",
    ]
    assert re.fullmatch(
        r"encoding 50 samples at \d+/s: about \d+:\d\d in all \(encoding \d+:\d\d, metrics "
        r"\d+:\d\d, figures \d+:\d\d\)",
        err[2],
    ), err[2]
    assert err[3].startswith("encoded 50 samples in ")
    assert [re.sub(r"^\[\d+:\d\d\] ", "", ln) for ln in err[4:7]] == [
        "infomec on 50 samples ...",
        "dci on 50 samples ...",
        "drawing the figures ...",
    ]
    assert err[7].startswith("evaluated in ") and len(err) == 8
    names = sorted(str(fp.relative_to(a)) for fp, _ in saved)
    assert names == ["figures/interventions.png", "figures/loss.png", "figures/nmi.png", "figures/reconstructions.png"]
    for fp, ident in saved:  # each one went through titled(), with model, dataset and step
        assert titles[ident].startswith("qlae on sprites, step 4: "), (fp, titles.get(ident))
    # the loss curves: a panel per term that varies; the quantize/commit losses span decades -> log axis
    recs = F.read_log(a / "log.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3, 4] and set(F._terms([("a", recs)])) >= {"total", "recon"}
    assert F._terms([("a", recs)])[0] == "total"
    img = Image.open(a / "figures" / "loss.png")
    assert img.width >= 600 and _has_colour(img.convert("RGB"), F.PALETTE[0])
    assert F.log_scale([1e-3, 0.5, 2.0]) and not F.log_scale([0.2, 0.5]) and not F.log_scale([-1.0, 100.0])
    assert F.nice_ticks(0.0, 1.0) == [0.0, 0.25, 0.5, 0.75, 1.0] and F.nice_ticks(3, 47) == [20, 40]
    assert F.nice_ticks(3, 47, 5) == [10, 20, 30, 40]


def test_compare_draws_the_curves_of_several_runs_on_one_figure(two_runs, tmp_path, capsys):
    from PIL import Image

    png = tmp_path / "cmp" / "curves.png"
    assert main(["compare", *map(str, two_runs), "--curves", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"loss curves: {png}" in out and "qlae" in out.splitlines()[2]
    img = Image.open(png).convert("RGB")
    assert _has_colour(img, F.PALETTE[0]) and _has_colour(img, F.PALETTE[1])  # one colour per run
    assert main(["compare", str(two_runs[0]), "--curves", str(tmp_path / "x.txt")]) == 2
    assert "--curves" in capsys.readouterr().err and not (tmp_path / "x.txt").exists()
    b = shutil.copytree(two_runs[1], tmp_path / "b")
    (b / "log.jsonl").unlink()
    assert main(["compare", str(two_runs[0]), str(b), "--curves", str(png)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"qkernels: error: {b}: no log.jsonl there; give a run directory written by `qkernels train --out DIR`"
    )


# ------------------------------------------------------------------------------------------- 5. messages
def test_fsq_levels_must_be_ints():
    with pytest.raises(
        TypeError,
        match=r"FSQ levels must be an int >= 2 .* or a sequence of ints >= 2, one per "
        r"latent .*got 5.0 \(float\); use FSQ\(5\)",
    ):
        FSQ(5.0)
    for bad in ("5", [5.0, 3], None, True):
        with pytest.raises(TypeError, match="FSQ levels must be"):
            FSQ(bad)
    import numpy as np

    assert FSQ(np.int64(5)).levels.tolist() == [5] and FSQ((3, 4)).levels.tolist() == [3, 4]
    with pytest.raises(ValueError, match=">= 2"):
        FSQ(1)


def test_channel_first_input_is_rejected_or_taken_with_dim():
    z = torch.randn(2, 12, 4, 4)
    for module, name in (
        (LatentQuantizer(12, 5), "LatentQuantizer"),
        (FSQ([5] * 12), "FSQ"),
        (LatentQuantizer(12, 5, global_codebook=True), "LatentQuantizer"),
    ):
        with pytest.raises(
            ValueError,
            match=rf"z has shape \(2, 12, 4, 4\): this {name} takes its 12 latents along "
            rf"the last axis, which has size 4; .*pass dim=1 to {name}",
        ):
            module(z)
    with pytest.raises(ValueError, match=r"give z as \(\.\.\., 12\) or pick the axis with dim="):
        LatentQuantizer(12, 5)(torch.randn(2, 7, 4, 4))
    with pytest.raises(ValueError, match=r"logits has shape \(2, 12, 4, 4, 5\): .*second-to-last axis"):
        CategoricalLatent(12, 5)(torch.randn(2, 12, 4, 4, 5))
    # dim=1: the same as moving the latents last, every output back in the input's layout, gradients through
    for module in (LatentQuantizer(12, 5, dim=1), FSQ([3, 5] * 6, dim=1)):
        last = type(module)(
            **({"num_latents": 12, "num_values": 5} if isinstance(module, LatentQuantizer) else {"levels": [3, 5] * 6})
        )
        last.load_state_dict(module.state_dict())
        zz = z.clone().requires_grad_()
        q, ref = module(zz), last(z.movedim(1, -1))
        assert torch.equal(q.z_q, ref.z_q.movedim(-1, 1)) and torch.equal(q.indices, ref.indices.movedim(-1, 1))
        assert torch.equal(module.indices_to_values(q.indices), q.z_q.detach())
        assert torch.equal(module.values_to_indices(q.z_q.detach()), q.indices)
        q.z_q.sum().backward()
        assert zz.grad is not None and zz.grad.shape == z.shape
    # (..., D) input: as before
    lq = LatentQuantizer(4, 10)
    x = torch.randn(3, 5, 4)
    assert torch.equal(lq(x).z_q, qkernels.latent_quantize(x, lq.values).z_q)
    assert torch.equal(FSQ(5)(z).z_q, qkernels.fsq(z, 5).z_q)  # one level count: elementwise, any layout
    with pytest.raises(TypeError, match="dim must be an int"):
        LatentQuantizer(4, 10, dim=1.0)


# ------------------------------------------------------------------ resume as each kind of user runs it (issue 40)
def _same_state(a, b):
    sa, sb = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (a, b))
    assert sa["step"] == sb["step"]
    for part in ("model", "opt"):
        assert repr(sa[part].keys()) == repr(sb[part].keys())
    for k, v in sa["model"].items():
        assert torch.equal(v, sb["model"][k]), k
    assert (a / "log.jsonl").read_text() == (b / "log.jsonl").read_text()


def test_python_api_resume_continues_and_the_refusal_only_guards_fresh_runs(tmp_path):
    """Trainer(cfg, resume=True) continues an existing run, with or without overwrite=False, and ends where the
    run left alone ends; overwrite=False refuses a FRESH run into that directory; the default overwrite=True
    replaces it."""

    def cfg(out, steps=6):
        return TrainConfig(
            model="cliff_ae",
            dataset="quantized_grid2d",
            dataset_kwargs={"n": 300},
            batch_size=50,
            steps=steps,
            checkpoint_every=2,
            log_every=1,
            out=str(out),
            progress=False,
            threads=1,
        )

    alone, part, part2 = tmp_path / "alone", tmp_path / "part", tmp_path / "part2"
    train(cfg(alone), final_eval=False)
    for out, kw in ((part, {}), (part2, {"overwrite": False})):
        assert Trainer(cfg(out)).run(stop_after=4, final_eval=False) is None  # a run left at step 4 (ckpt 4)
        with pytest.raises(RunExistsError):
            Trainer(cfg(out), overwrite=False)  # a fresh run there is refused
        Trainer(cfg(out), resume=True, **kw).run(final_eval=False)  # the Python user's resume goes on
        _same_state(alone, out)
    Trainer(cfg(part, steps=2)).run(final_eval=False)  # default overwrite=True: a new run replaces it
    assert torch.load(part / "checkpoint.pt", weights_only=True)["step"] == 2


def test_cli_run_killed_then_resumed_ends_as_the_run_left_alone(tmp_path, capsys):
    """`qkernels train` killed mid-run (SIGKILL, a real process), then `qkernels train --resume`: weights, log and
    metrics equal to the same command left alone; beside it, the refusal of a fresh run into the killed run's
    directory (--force on a run directory: test_a_directory_holding_a_run_is_refused_and_force_replaces_only_its_files
    and test_clear_run_deletes_exactly_a_runs_files_and_the_python_api)."""
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps({"dataset_kwargs": {"n": 300}, "batch_size": 50, "checkpoint_every": 5, "log_every": 1})
    )
    base = [
        sys.executable,
        "-m",
        "qkernels",
        "train",
        "--model",
        "cliff_ae",
        "--dataset",
        "quantized_grid2d",
        "--config",
        str(config),
        "--steps",
        "300",
        "--eval-samples",
        "300",
        "--threads",
        "1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    alone, killed = tmp_path / "alone", tmp_path / "killed"
    subprocess.run([*base, "--out", str(alone)], check=True, capture_output=True, env=env, timeout=600)
    proc = subprocess.Popen(
        [*base, "--out", str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    try:
        log = killed / "log.jsonl"
        t0 = time.monotonic()  # poll until a checkpoint and a few steps beyond it exist
        while proc.poll() is None and time.monotonic() - t0 < 300:
            if (killed / "checkpoint.pt").is_file() and log.is_file() and len(log.read_text().splitlines()) >= 12:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.kill()
    finally:
        proc.wait(timeout=60)
    step = torch.load(killed / "checkpoint.pt", weights_only=True)["step"]
    assert 5 <= step < 300 and not (killed / "metrics.json").exists()
    before = _files(killed)
    before.pop("run.lock")  # the killed process's: stale, taken over and released by the next command
    assert main([*base[3:], "--out", str(killed)]) == 2  # a fresh run into it (in this process): refused
    assert "already holds a run" in capsys.readouterr().err and _files(killed) == before  # nothing touched
    subprocess.run([*base, "--out", str(killed), "--resume"], check=True, capture_output=True, env=env, timeout=600)
    _same_state(alone, killed)
    assert json.loads((alone / "metrics.json").read_text()) == json.loads((killed / "metrics.json").read_text())


# --------------------------------------------------------------- issue 57, items 3-4: what compare puts side by side
def _metrics_json(name, **fields):
    path = Path(name)
    path.mkdir(parents=True, exist_ok=True)
    (path / "metrics.json").write_text(
        json.dumps(
            {
                "model": "tripod",
                "dataset": "shapes3d_procedural",
                "step": 600,
                "infomec.infom": 0.65,
                "recon.psnr": 19.5,
                **fields,
            }
        )
    )
    return path


def test_compare_shows_protocol_samples_both_psnrs_and_warns_when_runs_were_scored_differently(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    tripod = {"protocol": "tripod", "infomec.num_samples": 10_000, "dci.num_samples": 10_000}
    old = _metrics_json("old", **tripod, **{"recon.psnr_uint8": 28.1})  # written before the rename
    new = _metrics_json("new", **tripod, **{"recon.psnr_tripod": 27.9})
    fast = _metrics_json("fast", protocol="fast", **{"infomec.num_samples": 2000, "dci.num_samples": 2000})
    fqv = _metrics_json("fqv", protocol="factorqvae", **{"infomec.num_samples": 10_000, "dci.num_samples": 15_000})
    lines = compare_runs([old, new]).splitlines()
    assert lines[0].split() == [
        "run",
        "model",
        "dataset",
        "step",
        "protocol",
        "samples",
        "infomec.infom",
        "recon.psnr",
        "recon.psnr_tripod",
    ]
    assert lines[2].split()[4:] == ["tripod", "10,000", "0.650", "19.500", "28.100"]  # the old key, read
    assert lines[3].split()[4:] == ["tripod", "10,000", "0.650", "19.500", "27.900"] and len(lines) == 4
    assert main(["compare", str(old), str(fast), str(fqv)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [ln.split()[4:6] for ln in out[2:5]] == [
        ["tripod", "10,000"],
        ["fast", "2,000"],
        ["factorqvae", "10,000/15,000"],
    ]
    assert out[-1] == (
        f"warning: these runs were scored differently (tripod protocol on 10,000 samples: {old}; "
        f"fast protocol on 2,000 samples: {fast}; factorqvae protocol on 10,000/15,000 samples: "
        f"{fqv}): their metrics are not comparable. Score them alike with `qkernels eval RUN_DIR "
        "--protocol NAME --eval-samples N`"
    )
    # Tripod's checkpoint selection reads an old run's log under the new name too
    from qkernels.train.selection import eval_records

    (old / "log.jsonl").write_text(json.dumps({"type": "eval", "step": 600, "recon.psnr_uint8": 28.1}) + "\n")
    assert eval_records(old) == [{"type": "eval", "step": 600, "recon.psnr_tripod": 28.1}]


def test_an_evaluation_names_its_two_psnrs_and_the_readme_says_which_it_quotes(two_runs):
    m = json.loads((two_runs[0] / "metrics.json").read_text())
    assert "recon.psnr_uint8" not in m and m["recon.psnr_tripod"] >= 10 * math.log10(255) - 1e-9  # 24.07 dB
    assert m["recon.psnr_tripod"] > m["recon.psnr"]  # Tripod's wrapped uint8 arithmetic lifts the blurry ones
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    expect = readme[readme.index("What to expect after the default 600 steps") :][:600]
    assert "`recon.psnr`" in expect and "`recon.psnr_tripod`" in expect


# ------------------------------------------------------------------------ issue 57, item 2: eval says what it does
def test_eval_progress_estimates_from_the_first_batch_and_reports_every_quarter():
    from qkernels.metrics import get_protocol
    from qkernels.train.eval_progress import EvalProgress, metric_seconds

    out, now = io.StringIO(), [0.0]
    said = EvalProgress("qkernels eval: r (tripod on x, step 9)", clock=lambda: now[0], load=0.0, stream=out)
    said.begin(get_protocol("tripod"), {"infomec": 10_000, "dci": 10_000})
    for done in [*range(256, 10_000, 256), 10_000]:  # 40 batches of 2.56 s: 100 samples/s
        now[0] += 2.56
        said.encoded(done, 10_000)
    said.metric("infomec", 10_000)
    now[0] += 30
    said.close()
    metrics = metric_seconds(get_protocol("tripod"), {"infomec": 10_000, "dci": 10_000}, load=0.0)
    assert round(metrics) == 11  # 2.2 + 8.6 s on an idle core
    assert out.getvalue().splitlines() == [
        "qkernels eval: r (tripod on x, step 9): tripod protocol, infomec, dci on 10,000 samples (reconstructions "
        "scored as they are encoded); then the figures",
        # 100 s of encoding, 11 s of metrics, 1500 samples' worth (15 s) of figures
        "encoding 10,000 samples at 100/s: about 2:06 in all (encoding 1:40, metrics 0:11, figures 0:15)",
        "encoded 2,560/10,000 | eta 1:14",
        "encoded 5,120/10,000 | eta 0:49",
        "encoded 7,680/10,000 | eta 0:23",
        "encoded 10,000 samples in 1:42",
        "[1:42] infomec on 10,000 samples ...",
        "evaluated in 2:12",
    ]


# ------------------------------------------------- issue 57, items 7-8: the run directory, checked first and locked
def test_a_directory_holding_a_run_is_refused_before_torch_loads(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    code = f"""
import sys
from qkernels.cli import main
rc = main(["train", "--out", {str(tmp_path / "run")!r}])
print(rc, "torch" in sys.modules, "qkernels.train.loop" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False", "False"], r.stdout + r.stderr
    assert r.stderr.strip() == (
        f"qkernels: error: --out {tmp_path / 'run'} already holds a run (config.json): "
        "continue it with --resume, or delete those files and start over with --force"
    )


def test_a_directory_in_use_is_refused_and_a_stale_lock_is_taken_over(tmp_path, capsys, monkeypatch):
    from qkernels.train.files import LOCK, RunInUseError, RunLock

    tiny = [
        "train",
        "--model",
        "cliff_ae",
        "--dataset",
        "quantized_grid2d",
        "--batch-size",
        "50",
        "--steps",
        "2",
        "--eval-samples",
        "300",
        "--threads",
        "1",
    ]
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(["sleep", "120"])  # a live process of this machine holds the directory
    try:
        (out / LOCK).write_text(f"{holder.pid} {socket.gethostname()}\n")
        for argv in ([*tiny, "--out", str(out)], [*tiny, "--out", str(out), "--resume"], ["eval", str(out)]):
            if argv[0] == "eval":
                for name in ("config.json", "checkpoint.pt"):
                    (out / name).write_text("x")
            assert main(argv) == 2
            assert capsys.readouterr().err.strip() == (
                f"qkernels: error: {out} is in use by process {holder.pid} (qkernels train or eval): wait for it to "
                f"end, or stop it (kill {holder.pid}), then run this again"
            )
            assert (out / LOCK).read_text().split()[0] == str(holder.pid)  # not touched
    finally:
        holder.kill()
        holder.wait()
    for name in ("config.json", "checkpoint.pt"):
        (out / name).unlink()
    # its process has ended: the lock is stale, the run starts, holds the lock while it trains and drops it after
    held = []
    run = loop.Trainer.run
    monkeypatch.setattr(
        loop.Trainer, "run", lambda self, **kw: (held.append((out / LOCK).read_text()), run(self, **kw))[1]
    )
    assert main([*tiny, "--out", str(out)]) == 0
    assert held == [f"{os.getpid()} {socket.gethostname()}\n"] and not (out / LOCK).exists()
    (out / LOCK).write_text("1 elsewhere.example\n")  # another host's: respected, and the message says how to drop it
    where = re.escape(str(out / LOCK))
    with pytest.raises(RunInUseError, match=rf"in use by process 1 on elsewhere\.example .* delete {where}$"):
        RunLock(out).acquire()
    (out / LOCK).unlink()
    with RunLock(tmp_path / "new") as lock:  # a directory the lock made is removed with it when nothing was written
        assert lock.held and (tmp_path / "new").is_dir()
    assert not (tmp_path / "new").exists()
