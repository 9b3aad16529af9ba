"""Training: ``TrainConfig``, ``train``, evaluation of saved runs and the comparison table."""

from qkernels.train.config import TrainConfig
from qkernels.train.evaluate import compare_runs, eval_run, evaluate_model, load_run
from qkernels.train.loop import Trainer, train
from qkernels.train.run import build

__all__ = ["TrainConfig", "Trainer", "build", "compare_runs", "eval_run", "evaluate_model", "load_run", "train"]
