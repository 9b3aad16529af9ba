"""A run directory's file names, and building a run's (model, dataset) from its config: shared by the
training loop (:mod:`qkernels.train.loop`) and evaluation (:mod:`qkernels.train.evaluate`)."""

from __future__ import annotations

from pathlib import Path

import torch

from qkernels.data import load_dataset
from qkernels.models.registry import METHODS, build_model, default_num_latents, method_defaults
from qkernels.train.config import TrainConfig
from qkernels.train.data import derive_seed, num_sources, observation_shape

PROCEDURAL_IMAGES = ("sprites", "shapes3d_procedural", "balls")
CHECKPOINT, CONFIG, LOG, METRICS_FILE = "checkpoint.pt", "config.json", "log.jsonl", "metrics.json"
SELECTED = "selected.pt"  # the weights of the checkpoint a selection rule chose (qkernels.train.selection)
FIGURES = "figures"
# the files a run writes into its directory (and their ".tmp" siblings while written), and its figures
RUN_FILES = (CONFIG, LOG, CHECKPOINT, METRICS_FILE, SELECTED)
FIGURE_FILES = ("reconstructions.png", "interventions.png", "nmi.png", "latents.png", "loss.png")


class RunExistsError(FileExistsError):
    """A fresh run asked to write into a directory that holds another run; ``files``: that run's files there."""

    def __init__(self, message: str, files: list[str] = ()) -> None:
        super().__init__(message)
        self.files = list(files)


def run_files(out: str | Path) -> list[Path]:
    """The files of a run present in ``out``: config.json, log.jsonl, checkpoint.pt, metrics.json (and their
    ``.tmp`` siblings), figures/<a figure a run draws>. Nothing else in ``out`` belongs to a run."""
    out = Path(out)
    names = [*RUN_FILES, *(f + ".tmp" for f in RUN_FILES), *(f"{FIGURES}/{f}" for f in FIGURE_FILES)]
    return [out / n for n in names if (out / n).is_file()]


def clear_run(out: str | Path) -> list[Path]:
    """Delete the run files of ``out`` (:func:`run_files`) and figures/ when that leaves it empty; other files
    stay. Returns what was deleted."""
    gone = run_files(out)
    for p in gone:
        p.unlink(missing_ok=True)
    fig = Path(out) / FIGURES
    if fig.is_dir() and not any(fig.iterdir()):
        fig.rmdir()
    return gone


def load_data(cfg: TrainConfig):
    kw = dict(cfg.dataset_kwargs)
    if cfg.dataset != "quantized_grid2d":
        kw.setdefault("seed", cfg.seed)
    if cfg.dataset in PROCEDURAL_IMAGES and cfg.image_size is not None:
        kw.setdefault("image_size", cfg.image_size)
    return load_dataset(cfg.dataset, **kw)


def build(cfg: TrainConfig, ds=None):
    """(model, dataset) for ``cfg`` (model on cfg.device, in train mode); ``ds``: a dataset already loaded.

    Examples:
        >>> from qkernels.train import TrainConfig, build
        >>> model, ds = build(TrainConfig(model="qlae", dataset="sprites", image_size=16))
        >>> type(model).__name__, model.num_latents, ds.num_factors  # QLAE: twice the factors
        ('QLAE', 10, 5)
        >>> model.training, sum(p.numel() for p in model.parameters()) > 0
        (True, True)
    """
    if cfg.model not in METHODS:
        raise ValueError(f"unknown model {cfg.model!r}; known: {', '.join(METHODS)}")
    ds = load_data(cfg) if ds is None else ds
    d = cfg.num_latents or default_num_latents(cfg.model, num_sources(ds))
    kw = method_defaults(cfg.model, cfg.dataset)
    if cfg.model != "cliff_ae":
        kw["arch"] = cfg.arch
    kw.update(cfg.model_kwargs)
    torch.manual_seed(derive_seed(cfg.seed, 2**32 - 1))  # parameter initialization
    model = build_model(cfg.model, observation_shape(ds), d, **kw).to(cfg.device)
    model.set_total_steps(cfg.steps)
    return model, ds


#: metric keys renamed since a run could have written them (old -> new): such runs are still read (selection, compare)
RENAMED_KEYS = {"recon.psnr_uint8": "recon.psnr_tripod"}


def current_keys(record: dict) -> dict:
    """``record`` (a line of log.jsonl, a metrics.json) with the keys of :data:`RENAMED_KEYS` renamed."""
    return {RENAMED_KEYS.get(k, k): v for k, v in record.items()}


def scalars(res: dict) -> dict:
    return {k: v for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
