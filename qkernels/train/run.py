"""Building a run's (model, dataset) from its config, shared by the training loop (:mod:`qkernels.train.loop`) and
evaluation (:mod:`qkernels.train.evaluate`)."""

from __future__ import annotations

import torch

from qkernels.data import load_dataset
from qkernels.models.registry import METHODS, build_model, default_num_latents, method_defaults
from qkernels.train.config import TrainConfig
from qkernels.train.data import derive_seed, num_sources, observation_shape

PROCEDURAL_IMAGES = ("sprites", "shapes3d_procedural", "balls")


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


def scalars(res: dict) -> dict:
    return {k: v for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
