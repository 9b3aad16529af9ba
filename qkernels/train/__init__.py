"""Training: ``TrainConfig``, ``train``, evaluation of saved runs and the comparison table.

Each name is imported on first use (PEP 562): ``qkernels.train.files`` (a run directory's files and lock) and
``qkernels.train.config`` load without torch, so that ``qkernels train`` checks its run directory at once.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the names below resolve to (type checkers and documentation tools read these)
    from qkernels.train.config import TrainConfig
    from qkernels.train.evaluate import compare_runs, eval_run, evaluate_model, load_run
    from qkernels.train.loop import Trainer, train
    from qkernels.train.run import build

# public name -> the module that defines it
_LAZY = {
    "TrainConfig": "qkernels.train.config",
    "Trainer": "qkernels.train.loop",
    "build": "qkernels.train.run",
    "compare_runs": "qkernels.train.evaluate",
    "eval_run": "qkernels.train.evaluate",
    "evaluate_model": "qkernels.train.evaluate",
    "load_run": "qkernels.train.evaluate",
    "train": "qkernels.train.loop",
}


def __getattr__(name: str) -> object:
    import importlib

    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = ["TrainConfig", "Trainer", "build", "compare_runs", "eval_run", "evaluate_model", "load_run", "train"]
