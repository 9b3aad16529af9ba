"""The trainer's newer pieces at the inputs that tell a right rule from a plausible wrong one (issue 58's review):
Tripod's checkpoint selection when a later evaluation displaces the held one (the final step chosen: the stale
``selected.pt`` goes), signals after the second one and outside the main thread, and what ``threads`` reads from
the machine (/proc/stat's columns, a cgroup quota in both versions, no time elapsed between two samples)."""

from __future__ import annotations

import io
import json
import signal
import threading

import pytest
import torch

from qkernels.train import TrainConfig
from qkernels.train import threads as T
from qkernels.train.interrupt import DeferredSignals
from qkernels.train.selection import CheckpointSelector

# ----------------------------------------------------------------------------- checkpoint selection


def _selector(out):
    cfg = TrainConfig(model="tripod", dataset="shapes3d", steps=5, eval_every=1, select="tripod", out=str(out))
    return CheckpointSelector(cfg, out)


def _evaluate(out, step, infom, psnr):
    with open(out / "log.jsonl", "a") as fh:
        fh.write(json.dumps({"type": "eval", "step": step, "infomec.infom": infom, "recon.psnr_uint8": psnr}) + "\n")


def test_a_later_evaluation_displaces_the_held_weights(tmp_path):
    model = torch.nn.Linear(2, 1)
    sel = _selector(tmp_path)
    _evaluate(tmp_path, 1, 0.5, 39.0)
    sel.observe(1, model)
    assert torch.load(tmp_path / "selected.pt", weights_only=True)["step"] == 1  # the best so far: held
    _evaluate(tmp_path, 2, 0.4, 40.0)
    sel.observe(2, model)  # not better: the held weights stay step 1's
    assert torch.load(tmp_path / "selected.pt", weights_only=True)["step"] == 1
    _evaluate(tmp_path, 3, 0.5, 41.0)  # a tie with step 1: the earlier one stays chosen
    sel.observe(3, model)
    assert torch.load(tmp_path / "selected.pt", weights_only=True)["step"] == 1
    _evaluate(tmp_path, 4, 0.9, 38.0)  # at the threshold (38 dB for Shapes3D): passes, and the best
    sel.observe(4, model)  # a periodic evaluation at the last step: held as the best
    assert torch.load(tmp_path / "selected.pt", weights_only=True)["step"] == 4
    res = sel.finish({"step": 4, "infomec.infom": 0.9})
    assert res["selection"]["step"] == 4 and res["selection"]["weights"] == "checkpoint.pt"
    assert not (tmp_path / "selected.pt").exists()  # the final step's weights are the checkpoint's: none held
    assert json.loads((tmp_path / "metrics.json").read_text())["selected"]["step"] == 4


# ----------------------------------------------------------------------------- signals


def test_after_the_second_signal_the_handlers_are_the_previous_ones():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with DeferredSignals() as sig:
        assert signal.getsignal(signal.SIGINT) == sig._handle
        sig._handle(signal.SIGTERM, None)
        assert sig.pending == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            sig._handle(signal.SIGINT, None)
        # a third signal gets what was there before (Ctrl-C: KeyboardInterrupt; SIGTERM: the default, termination)
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
        assert sig.pending == signal.SIGTERM  # the first one stays recorded


def test_outside_the_main_thread_nothing_is_installed():
    seen = []

    def run():
        try:
            with DeferredSignals() as sig:
                seen.append((sig.enabled, signal.getsignal(signal.SIGINT)))
        except Exception as err:  # noqa: BLE001 - signal.signal raises ValueError outside the main thread
            seen.append(err)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [(False, signal.getsignal(signal.SIGINT))]


# ----------------------------------------------------------------------------- what threads reads


def _files(monkeypatch, files: dict[str, str]):
    """open() in qkernels.train.threads reads ``files`` (path -> text); other paths do not exist."""

    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(path)
        return io.StringIO(files[path])

    monkeypatch.setattr(T, "open", fake_open, raising=False)


def test_cpu_times_columns(monkeypatch):
    # user nice system idle iowait irq softirq steal guest guest_nice: busy = all of the first 8 but idle and iowait
    stat = "cpu  9 9 9 9 9 9 9 9 9 9\ncpu0 1 2 3 40 50 6 7 8 100 100\ncpu1 10 0 0 5 0 0 0 0 0 0\ncpu2 1 1 1 1 1 1 1 1\n"
    _files(monkeypatch, {"/proc/stat": stat + "intr 5 6\n"})
    assert T._cpu_times({0, 1}) == {0: (1 + 2 + 3 + 6 + 7 + 8, 117), 1: (10, 15)}


def test_busy_cores_skips_a_cpu_without_elapsed_time(monkeypatch):
    samples = iter([{0: (10, 100), 1: (10, 100)}, {0: (60, 200), 1: (10, 100)}])  # cpu1: no jiffy between samples
    monkeypatch.setattr(T, "_affinity", lambda: [0, 1])
    monkeypatch.setattr(T, "_cpu_times", lambda cpus: next(samples))
    monkeypatch.setattr(T.time, "sleep", lambda s: None)
    assert T.busy_cores(0.5) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("files", "want"),
    [
        ({"/sys/fs/cgroup/cpu.max": "150000 100000\n"}, 1.5),
        ({"/sys/fs/cgroup/cpu.max": "max 100000\n"}, None),
        ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "50000\n", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"}, 0.5),
        ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n"}, None),
        ({}, None),
    ],
    ids=["v2", "v2 max", "v1", "v1 unlimited", "none"],
)
def test_cpu_quota_in_both_cgroup_versions(monkeypatch, files, want):
    _files(monkeypatch, files)
    assert T.cpu_quota() == want


def test_omp_num_threads_is_taken_as_given(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", " 3 ")
    assert T.auto_threads() == (3, "OMP_NUM_THREADS")
