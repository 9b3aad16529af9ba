"""Issue 30, item 5: safe run directories. Checkpoints hold only what ``torch.load(weights_only=True)`` reads
(tensors, numbers, strings, lists, dicts); loading one that holds a pickled object is refused with one line naming
the file, and the object is never unpickled (its code never runs), by the Python API, ``qkernels eval`` and
``--resume`` alike."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from qkernels.cli import main
from qkernels.train import checkpoint as ckpt
from qkernels.train.evaluate import load_run

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
    "--threads",
    "1",
]
MARKER = "pwned.txt"


def _touch(path):
    Path(path).write_text("code from a checkpoint ran")
    return 0


class Payload:
    """A pickled object whose unpickling runs code (writes a marker file)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (_touch, (self.marker,))


def _poison(path: Path, marker: Path) -> None:
    """Rewrite the checkpoint at ``path`` with a Payload added (what a malicious shared run directory holds)."""
    s = torch.load(path, weights_only=True)
    s["config"]["extra"] = Payload(marker)
    torch.save(s, path)


def _one_line_refusal(msg: str, path: Path) -> None:
    assert "\n" not in msg.strip()
    assert str(path) in msg and "refused to load" in msg and "weights_only=True" in msg
    assert "_touch)" in msg  # names what was refused (the function the pickle calls)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("safe") / "run"
    before = torch.get_num_threads()
    try:
        assert main([*TINY, "--steps", "2", "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(before)
    return out


def test_a_trainers_checkpoint_loads_with_weights_only(run_dir):
    s = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert s["step"] == 2 and isinstance(s["torch_rng"], torch.Tensor) and isinstance(s["config"], dict)
    assert set(s) >= {"model", "opt", "config", "torch_rng"}
    assert ckpt.load(run_dir / "checkpoint.pt")["step"] == 2


def test_a_pickled_object_is_refused_and_never_runs(tmp_path):
    marker, path = tmp_path / MARKER, tmp_path / "checkpoint.pt"
    torch.save({"step": 1, "x": Payload(marker)}, path)
    with pytest.raises(ckpt.UnsafeCheckpointError) as info:
        ckpt.load(path)
    assert isinstance(info.value, ValueError)
    _one_line_refusal(str(info.value), path)
    assert not marker.exists()
    # the check the test relies on: weights_only=False would run it
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_eval_and_resume_of_a_poisoned_run_directory_are_refused(run_dir, tmp_path, capsys):
    import shutil

    out, marker = tmp_path / "shared", tmp_path / MARKER
    shutil.copytree(run_dir, out)  # a copied run: --resume continues it where it is now, not in run_dir
    _poison(out / "checkpoint.pt", marker)
    with pytest.raises(ckpt.UnsafeCheckpointError):
        load_run(out)
    capsys.readouterr()
    assert main(["eval", str(out)]) == 1
    *said, err = capsys.readouterr().err.strip().splitlines()  # what eval was doing, then the one-line error
    assert all(line.startswith("qkernels eval: ") for line in said) and err.startswith("qkernels: error: ")
    _one_line_refusal(err, out / "checkpoint.pt")
    before = torch.get_num_threads()
    try:
        assert main([*TINY, "--resume", "--steps", "3", "--out", str(out)]) != 0
    finally:
        torch.set_num_threads(before)
    err = capsys.readouterr().err.strip().splitlines()
    _one_line_refusal(err[-1], out / "checkpoint.pt")
    assert not marker.exists()


def test_save_refuses_what_weights_only_cannot_load(tmp_path):
    path = tmp_path / "c.pt"
    with pytest.raises(TypeError, match=r"c\.pt\['config'\]\['extra'\]: a .*Payload cannot be stored"):
        ckpt.save_atomic({"step": 1, "config": {"extra": Payload(tmp_path / MARKER)}}, path)
    with pytest.raises(TypeError, match="key"):
        ckpt.save_atomic({("a", 1): 1}, path)
    assert not path.exists() and not os.path.exists(str(path) + ".tmp")
    ok = {
        "step": 3,
        "t": torch.ones(2),
        "p": torch.nn.Parameter(torch.zeros(1)),
        "l": [1, 2.5, "x", None, (1, 2)],
        "d": {0: {"m": torch.zeros(3)}},
        "dt": torch.float32,
        "size": torch.Size([2]),
    }
    ckpt.save_atomic(ok, path)
    back = torch.load(path, weights_only=True)
    assert back["l"] == ok["l"] and back["dt"] is torch.float32 and torch.equal(back["d"][0]["m"], torch.zeros(3))
