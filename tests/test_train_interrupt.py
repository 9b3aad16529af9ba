"""Issue 47, items 1-2: a run stopped by Ctrl-C (SIGINT) or SIGTERM saves a checkpoint of its current step, says
how to continue, and continues from it bit-for-bit; a second signal quits at once. A run whose steps collapse
while other work takes its cores drops threads, unless the count was given."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import qkernels
from qkernels.cli import main, resume_command
from qkernels.train import TrainConfig, Trainer, loop, train
from qkernels.train import threads as T
from qkernels.train.interrupt import DeferredSignals
from qkernels.train.throughput import CollapseWatch, fewer_threads


@pytest.fixture(autouse=True)
def _keep_threads(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(T, "busy_cores", lambda interval=0.5: 0.0)  # sleeps half a second: stubbed
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    yield
    torch.set_num_threads(before)


def _state(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)


def _log(out):
    return [json.loads(ln) for ln in (out / "log.jsonl").read_text().splitlines()]


def _tiny(out, **kw):
    """A run of seconds: Cliff's autoencoder on 300 points, a line of log per step, no periodic checkpoint."""
    return TrainConfig(model="cliff_ae", dataset="quantized_grid2d", dataset_kwargs={"n": 300}, batch_size=50,
                       checkpoint_every=100, log_every=1, out=str(out), progress=False, **kw)  # fmt: skip


# ------------------------------------------------------------------------------------------- 1. signals
def test_sigint_saves_the_current_step_prints_the_command_and_the_resumed_run_is_the_run_left_alone(tmp_path):
    """A real `qkernels train` process gets SIGINT mid-run: exit 130, a checkpoint of the step it was on (none of
    the periodic ones is due: checkpoint_every 1000), the log up to that step, the command that continues it on
    stderr; that command ends with the weights, log and metrics of the same run left alone (both here, in this
    process: the run left alone from the run's own config.json)."""
    out = tmp_path / "run"
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps({"dataset_kwargs": {"n": 300}, "batch_size": 50, "checkpoint_every": 1000, "log_every": 1})
    )
    # `python -m qkernels` (sys.argv[0] its __main__.py), with an exit handler that prints: an interpreter that ends
    # normally runs it, one that ends at once after the checkpoint (issue 57, item 8) does not
    main_py = str(Path(qkernels.__file__).with_name("__main__.py"))
    start = (
        "import atexit, sys; atexit.register(print, 'teardown ran', flush=True); from qkernels.cli import main; "
        f"sys.argv[0] = {main_py!r}; sys.exit(main())"
    )
    cmd = [
        sys.executable,
        "-c",
        start,
        "train",
        "--model",
        "cliff_ae",
        "--dataset",
        "quantized_grid2d",
        "--config",
        str(config),
        "--steps",
        "200",
        "--eval-samples",
        "100",
        "--threads",
        "1",
        "--out",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        log, t0 = out / "log.jsonl", time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 300:
            if log.is_file() and len(log.read_text().splitlines()) >= 12:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before the signal"
        assert (out / "run.lock").read_text().split()[0] == str(proc.pid)  # the directory is in use
        proc.send_signal(signal.SIGINT)
        stdout, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "teardown ran" not in stdout and not (out / "run.lock").exists()  # ended at once, the lock dropped
    step = _state(out)["step"]
    assert 12 <= step < 200 and not (out / "metrics.json").exists()
    assert [r["step"] for r in _log(out)] == list(range(1, step + 1))  # every step up to the checkpoint's
    assert "qkernels train: SIGINT: stopping at the end of this step" in err
    lines = err.splitlines()
    i = next(i for i, ln in enumerate(lines) if "continue with:" in ln)
    assert f"holds step {step} of 200" in lines[i]
    assert lines[-1] == "qkernels: interrupted"
    resume = shlex.split(lines[i + 1])
    assert resume == [sys.executable, "-m", "qkernels", "train", "--resume", "--out", str(out)]
    assert main(resume[3:]) == 0  # that command, in this process (an interpreter start less)

    cfg = TrainConfig.load(out / "config.json")  # the same run, left alone, in this process
    cfg.out, cfg.progress = str(tmp_path / "alone"), False
    res = train(cfg)
    a, b = _state(out), _state(tmp_path / "alone")
    assert a["step"] == b["step"] == 200
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert (out / "log.jsonl").read_text() == (tmp_path / "alone" / "log.jsonl").read_text()
    mine = json.loads((out / "metrics.json").read_text())
    assert {k: v for k, v in mine.items() if k in res} == {k: v for k, v in res.items() if k in mine}


def test_deferred_signals_defer_the_first_signal_and_a_second_quits_at_once(capfd):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with DeferredSignals(lambda: "stopping after this step") as sig:
        os.kill(os.getpid(), signal.SIGINT)
        assert sig.pending == signal.SIGINT  # recorded, nothing raised
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode: never reached
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # restored
    assert "qkernels train: SIGINT: stopping after this step; Ctrl-C again quits at once" in capfd.readouterr().err
    with DeferredSignals() as sig:  # after the training steps: at once
        sig.immediate()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    with DeferredSignals(enabled=False):  # e.g. under torchrun: nothing installed
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_signal_mid_run_stops_the_python_api_with_a_checkpoint(tmp_path, monkeypatch):
    """In-process (the Python API, a notebook's interrupt): the signal arrives during step 3; the run ends that
    step, saves it and raises TrainingInterrupted, a KeyboardInterrupt carrying the step and the signal."""
    trainer = Trainer(_tiny(tmp_path / "run", steps=6, threads=1))
    step, before = trainer.train_step, signal.getsignal(signal.SIGTERM)

    def step_then_signal(s):
        if s == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(s)

    monkeypatch.setattr(trainer, "train_step", step_then_signal)
    with pytest.raises(KeyboardInterrupt) as exc:
        trainer.run()
    assert (exc.value.step, exc.value.signum) == (3, signal.SIGTERM)
    assert _state(tmp_path / "run")["step"] == 3 and trainer.saved_step == 3
    assert signal.getsignal(signal.SIGTERM) == before  # restored


def test_resume_command_names_the_program_as_started(tmp_path):
    assert resume_command("runs/a b", os.path.join("x", "__main__.py")) == shlex.join(
        [sys.executable, "-m", "qkernels", "train", "--resume", "--out", "runs/a b"]
    )
    assert resume_command("r", "/opt/venv/bin/qkernels") == "/opt/venv/bin/qkernels train --resume --out r"
    assert resume_command("r", "/usr/bin/pytest") == "qkernels train --resume --out r"  # main() called by code


# ------------------------------------------------------------------------------- 2. throughput collapse
def test_collapse_watch_on_synthetic_step_times():
    w = CollapseWatch(window=5, skip=2, factor=3.0)
    assert not any(w.observe(t) for t in [9.0, 9.0] + [0.4] * 5)  # warm-up (ignored), then the reference
    assert w.reference == 0.4
    assert not any(w.observe(t) for t in [0.4, 5.0, 0.4, 6.0, 0.4])  # two slow steps: the median stays 0.4
    assert not any(w.observe(t) for t in [1.1] * 5)  # 2.75x slower: not a collapse
    assert [w.observe(t) for t in [1.3] * 3] == [False, False, True]  # the last 5: 1.1 1.1 1.3 1.3 1.3
    early, recent = w.rates()
    assert early == pytest.approx(2.5) and recent == pytest.approx(1 / 1.3)
    w.reset()  # a new reference after the drop
    assert w.reference is None and not any(w.observe(t) for t in [1.3] * 7)
    with pytest.raises(ValueError):
        CollapseWatch(factor=1.0)


@pytest.mark.parametrize(
    ("threads", "cores", "busy", "want"),
    [(2, 2, 1.0, 1), (2, 2, 2.0, 1), (8, 8, 2.6, 5), (8, 16, 2.0, 7), (4, 4, 0.3, None), (1, 2, 2.0, None)],
)
def test_fewer_threads(threads, cores, busy, want):
    assert fewer_threads(threads, cores, busy) == want


class _Fires:
    """A CollapseWatch that reports a collapse after the step ``at`` (0-based call count)."""

    def __init__(self, at):
        self.at, self.n = at, 0

    def observe(self, seconds):
        self.n += 1
        return self.n == self.at

    def rates(self):
        return 2.0, 0.1

    def reset(self):
        pass


@pytest.mark.parametrize("adapt", [True, False])
def test_a_collapse_drops_threads_only_when_the_count_was_chosen_for_the_run(tmp_path, monkeypatch, adapt):
    monkeypatch.setattr(loop, "CollapseWatch", lambda: _Fires(2))
    monkeypatch.setattr(T, "busy_cores", lambda interval=0.5: 1.0)  # another job keeps one core busy
    monkeypatch.setattr(T, "usable_cores", lambda: 2)
    out = tmp_path / "run"
    Trainer(_tiny(out, steps=4, threads=2, adapt_threads=adapt)).run(final_eval=False)
    drops = [r for r in _log(out) if r["type"] == "threads"]
    saved = TrainConfig.load(out / "config.json")
    if not adapt:  # a given count is never changed
        assert drops == [] and torch.get_num_threads() == 2 and saved.threads == 2
        return
    assert torch.get_num_threads() == 1 and saved.threads == 1 and saved.adapt_threads
    assert drops == [
        {"type": "threads", "step": 2, "threads": 1, "was": 2, "early_it_s": 2.0, "recent_it_s": 0.1, "busy_cores": 1.0}
    ]  # noticed after step 2, from step 3 on
    assert [r["step"] for r in _log(out) if r["type"] == "train"] == [1, 2, 3, 4]


def test_the_cli_adapts_only_its_own_thread_count(tmp_path, monkeypatch):
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
    ]
    monkeypatch.setattr(T, "auto_threads", lambda: (1, "auto: 1 usable cores"))
    seen = []
    monkeypatch.setattr(loop.Trainer, "run", lambda self, **kw: seen.append(self.cfg.adapt_threads))
    for extra, want in (([], True), (["--threads", "1"], False)):
        assert main([*tiny, "--out", str(tmp_path / str(want)), *extra]) == 0
        assert seen[-1] is want
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the user's count
    monkeypatch.setattr(T, "auto_threads", lambda: (1, "OMP_NUM_THREADS"))
    assert main([*tiny, "--out", str(tmp_path / "omp")]) == 0 and seen[-1] is False


# --------------------------------------------------------- issue 57, item 9: the figures of a run stopped mid-log
def test_the_figures_of_a_stopped_run_name_the_step_of_its_checkpoint(tmp_path, monkeypatch):
    """Stopped during step 3 with a log line every 2 steps: the checkpoint (hence metrics.json and every figure of
    `qkernels eval`) is step 3, the last logged losses step 2; loss.png says step 3 and where its log ends."""
    from qkernels.train import eval_run
    from qkernels.train import figures as F

    cfg = TrainConfig(model="cliff_ae", dataset="quantized_grid2d", dataset_kwargs={"n": 300}, batch_size=50,
                      checkpoint_every=100, log_every=2, out=str(tmp_path / "run"), progress=False, steps=6,
                      threads=1)  # fmt: skip
    trainer = Trainer(cfg)
    step = trainer.train_step

    def step_then_signal(s):
        if s == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(s)

    monkeypatch.setattr(trainer, "train_step", step_then_signal)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    assert [r["step"] for r in _log(tmp_path / "run")] == [2] and _state(tmp_path / "run")["step"] == 3
    titles = []
    titled = F.titled
    monkeypatch.setattr(F, "titled", lambda img, title, note=None: (titles.append((title, note)),
                                                                    titled(img, title, note))[1])  # fmt: skip
    assert eval_run(tmp_path / "run", num_samples=100)["step"] == 3
    assert sorted(t for t, _ in titles) == ["cliff_ae on quantized_grid2d, step 3: latents",
                                            "cliff_ae on quantized_grid2d, step 3: training losses"]  # fmt: skip
    assert dict(titles)["cliff_ae on quantized_grid2d, step 3: training losses"].endswith(
        "; logged every 2 steps, the last at step 2"
    )
