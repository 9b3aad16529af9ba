"""Method registry: name -> class, the authors' optimizer / batch / latent-count defaults, their per-dataset
settings (:data:`DATASET_SETTINGS`), their run lengths, and ``build_model``."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from qkernels.models.ae import AE, QLAE
from qkernels.models.cliff import CliffAE
from qkernels.models.dvae import DVAE, FactorDVAE
from qkernels.models.factorqvae import QVAE, FactorQVAE
from qkernels.models.tripod import TRIPOD_LAMBDAS, Tripod
from qkernels.models.vae import BetaTCVAE, BetaVAE, CliffVAE, FactorVAE


@dataclass(frozen=True)
class OptimSpec:
    """Optimizer defaults. ``clip``: "value" (elementwise, QLAE/Tripod) or "norm" or None, applied to every model
    parameter, or only to the weight-decayed ones when ``clip_undecayed`` is False (QLAE). ``lr_schedule``: None or
    "cosine": torch's ``CosineAnnealingLR`` closed form with T_max = ``lr_decay_steps`` iterations (the run length
    when 0), from ``lr`` down to ``lr_min`` and, past T_max, periodically back up (QVAE: 100k iterations, T_max
    50k; FactorQVAE's paper run is T_max long: one half-cosine, :mod:`qkernels.models.factorqvae`).

    Examples:
        >>> from qkernels.models import METHODS, OptimSpec
        >>> OptimSpec(lr=1e-3).name, OptimSpec(lr=1e-3).clip
        ('adam', None)
        >>> spec = METHODS["qlae"].optim  # QLAE: AdamW, weight decay 0.1, elementwise clipping
        >>> spec.name, spec.weight_decay, spec.clip
        ('adamw', 0.1, 'value')
    """

    name: str = "adam"
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    clip: str | None = None
    clip_value: float = 1.0
    clip_undecayed: bool = True
    lr_schedule: str | None = None
    lr_min: float = 0.0
    lr_decay_steps: int = 0


@dataclass(frozen=True)
class MethodSpec:
    """``paper_steps``: the authors' run length in our iterations (one model step + one discriminator step),
    where their code says it (0: not stated); ``qkernels train --steps paper`` trains for it
    (:func:`paper_steps`). ``optim`` holds the authors' Shapes3D values; :func:`method_optim` and
    :func:`method_defaults` apply their per-dataset ones (:data:`DATASET_SETTINGS`). ``data_order``: how the
    authors read a dataset (:data:`qkernels.train.data.DATA_ORDERS`): "epochs" (Tripod's and QLAE's shuffled
    ``tf.data``), "split" (FactorQVAE: shuffled epochs over an 80% split), "iid" (disentanglement_lib's fresh
    samples).

    ``cls``: the model class; ``optim`` / ``disc_optim``: the model's and discriminator's :class:`OptimSpec`;
    ``latents``: the latent-count rule of :func:`default_num_latents`; ``defaults``: model keyword defaults.

    Examples:
        >>> from qkernels.models import METHODS, QLAE
        >>> spec = METHODS["qlae"]
        >>> spec.cls is QLAE, spec.batch_size, spec.latents, spec.data_order
        (True, 128, 'twice_sources', 'epochs')
    """

    cls: type
    optim: OptimSpec
    batch_size: int
    latents: str  # "twice_sources" or "ten" or "two"
    disc_optim: OptimSpec | None = None
    defaults: dict = field(default_factory=dict)
    paper_steps: int = 0
    data_order: str = "iid"


# optax's AdamW defaults (b2 0.999); QLAE: decay 0.1 (0.001 on MPI3D: DATASET_SETTINGS) on all but biases and
# codebooks, clip the decayed group only (latent_quantization); Tripod: no decay, clip both groups (tripod
# configs/train_autoencoder.yaml)
_QLAE_OPT = OptimSpec("adamw", 1e-3, (0.9, 0.999), 0.1, "value", 1.0, clip_undecayed=False)
_TRIPOD_OPT = OptimSpec("adamw", 2e-4, (0.9, 0.999), 0.0, "value", 1.0)
# FactorQVAE configs/Shapes3D: Adam 1e-3 for the VAE and the discriminator, CosineAnnealingLR(T_max 50k, 1.25e-6)
# stepped once per iteration; max_steps 100k Lightning global steps = 100k iterations for QVAE (one optimizer),
# 50k for FactorQVAE (two optimizers step per iteration: models/factor_qvae.py, train.py)
# (T_max is kept in iterations: a short run follows the first iterations of the authors' schedule)
_FQ_OPT = OptimSpec("adam", 1e-3, (0.9, 0.999), lr_schedule="cosine", lr_min=1.25e-6, lr_decay_steps=50_000)
_DLIB_OPT = OptimSpec("adam", 1e-4, (0.9, 0.999))
_DISC_OPT = OptimSpec("adam", 1e-4, (0.5, 0.9))  # FactorVAE (Kim & Mnih, 2018)

#: procedural stand-ins -> the real dataset whose settings they take
STAND_INS = {"shapes3d_procedural": "shapes3d"}

METHODS: dict[str, MethodSpec] = {
    # latent_quantization configs/params/ae/ae_shapes3d.yaml (l2: 0.001) and models/ae.py, as QLAE's optimizer: the
    # weight-decayed "regularized" group (every non-bias parameter) clipped elementwise at 1, the biases plain Adam,
    # unclipped; configs/train_ae.yaml trains it as QLAE: optim.num_steps 2e5
    "ae": MethodSpec(
        AE,
        OptimSpec("adamw", 1e-3, (0.9, 0.999), 0.001, "value", 1.0, clip_undecayed=False),
        128,
        "twice_sources",
        paper_steps=200_000,
        data_order="epochs",
    ),
    # latent_quantization configs/train_ae.yaml: optim.num_steps 2e5; tripod configs/train_autoencoder.yaml: 250000
    "qlae": MethodSpec(QLAE, _QLAE_OPT, 128, "twice_sources", paper_steps=200_000, data_order="epochs"),
    "tripod": MethodSpec(Tripod, _TRIPOD_OPT, 64, "twice_sources", paper_steps=250_000, data_order="epochs"),
    "qvae": MethodSpec(QVAE, _FQ_OPT, 256, "twice_sources", paper_steps=100_000, data_order="split"),
    "factorqvae": MethodSpec(
        FactorQVAE, _FQ_OPT, 256, "twice_sources", disc_optim=_FQ_OPT, paper_steps=50_000, data_order="split"
    ),
    # lddr run.py line 57: num_train_steps 300000 (both; the noise schedule's horizon, qkernels.models.dvae)
    "dvae": MethodSpec(DVAE, _DLIB_OPT, 64, "ten", paper_steps=300_000),
    "factordvae": MethodSpec(FactorDVAE, _DLIB_OPT, 64, "ten", disc_optim=_DISC_OPT, paper_steps=300_000),
    "beta_vae": MethodSpec(BetaVAE, _DLIB_OPT, 64, "ten"),
    "beta_tcvae": MethodSpec(BetaTCVAE, _DLIB_OPT, 64, "ten"),
    "factorvae": MethodSpec(FactorVAE, _DLIB_OPT, 64, "ten", disc_optim=_DISC_OPT),
    # Cliff App. F.4 (Shapes3D, the one dataset it trains cliff_vae on): 100 epochs at batch 64 = 100 x 480,000 / 64
    "cliff_vae": MethodSpec(CliffVAE, _DLIB_OPT, 64, "ten", paper_steps=750_000),
    # Cliff App. F.2 (synthetic): 1000 epochs of the 5000 samples at batch 5000 = 1000 steps
    "cliff_ae": MethodSpec(CliffAE, OptimSpec("adam", 2e-3), 5000, "two", paper_steps=1_000),
}


def default_num_latents(name: str, num_factors: int) -> int:
    """The number of latents method ``name`` uses for a dataset of ``num_factors`` factors.

    Rules (``MethodSpec.latents``): "twice_sources" (QLAE, Tripod: 2 n_s), "ten" (the VAEs), "two" (Cliff's 2-D
    unmixing). Raises KeyError for an unknown method.

    Examples:
        >>> from qkernels.models import default_num_latents
        >>> default_num_latents("qlae", 6), default_num_latents("beta_vae", 6), default_num_latents("cliff_ae", 2)
        (12, 10, 2)
    """
    rule = METHODS[name].latents
    return {"twice_sources": 2 * num_factors, "ten": 10, "two": 2}[rule]


# The authors' settings that differ by dataset: model keyword arguments, and OptimSpec fields ("weight_decay").
# A dataset the authors did not configure takes Shapes3D's; a procedural stand-in its real dataset's
# (:data:`STAND_INS`). Only the methods whose authors' configs vary by dataset are listed (every other setting of
# these methods is the same on every dataset in their configs: tests/test_fidelity.py's table).
DATASET_SETTINGS: dict[str, dict[str, dict]] = {
    # latent_quantization configs/params/ae/ae_shapes3d.yaml, ae_mpi3d.yaml (l2: 0.001)
    "ae": {"shapes3d": {"weight_decay": 0.001}, "mpi3d": {"weight_decay": 0.001}},
    # latent_quantization configs/params/quantized_ae/{shapes3d,mpi3d,falcor3d,isaac3d}.yaml (lambdas.l2)
    "qlae": {
        "shapes3d": {"weight_decay": 0.1},
        "mpi3d": {"weight_decay": 0.001},
        "falcor3d": {"weight_decay": 0.1},
        "isaac3d": {"weight_decay": 0.1},
    },
    # tripod configs/train_autoencoder.yaml (the sweep and its "good hyperparameters for other datasets")
    "tripod": {d: {"lambda_klm": k, "lambda_nhp": n} for d, (k, n) in TRIPOD_LAMBDAS.items() if d not in STAND_INS},
    # FactorQVAE configs/{Shapes3D,Isaac3D,MPI3DComplex}/qvae.yaml (quantizer.kl_weight)
    "qvae": {"shapes3d": {"beta": 1e-3}, "isaac3d": {"beta": 5e-5}, "mpi3d": {"beta": 5e-5}},
    # FactorQVAE configs/{Shapes3D,Isaac3D,MPI3DComplex}/factorqvae.yaml (kl_weight, discriminator.gamma)
    "factorqvae": {
        "shapes3d": {"beta": 1e-3, "gamma": 1e-4},
        "isaac3d": {"beta": 5e-5, "gamma": 5e-5},
        "mpi3d": {"beta": 5e-5, "gamma": 1e-6},
    },
}
_OPTIM_FIELDS = frozenset(f.name for f in fields(OptimSpec))


def _check_name(name: str) -> None:
    if name not in METHODS:
        raise ValueError(f"model must be one of {', '.join(METHODS)}, got {name!r}")


def dataset_settings(name: str, dataset: str) -> dict:
    """The authors' per-dataset settings of method ``name`` on ``dataset`` (:data:`DATASET_SETTINGS`; Shapes3D's
    for a dataset they did not configure, the real dataset's for a procedural stand-in; {} for a method without
    per-dataset settings). ValueError for an unknown method.

    Examples:
        >>> from qkernels.models.registry import dataset_settings
        >>> dataset_settings("factorqvae", "isaac3d"), dataset_settings("qlae", "mpi3d")
        ({'beta': 5e-05, 'gamma': 5e-05}, {'weight_decay': 0.001})
        >>> dataset_settings("qvae", "shapes3d_procedural"), dataset_settings("beta_vae", "mpi3d")
        ({'beta': 0.001}, {})
    """
    _check_name(name)
    table = DATASET_SETTINGS.get(name, {})
    if not table:
        return {}
    return dict(table.get(STAND_INS.get(dataset, dataset), table["shapes3d"]))


def method_defaults(name: str, dataset: str) -> dict:
    """Model keyword defaults of method ``name`` on ``dataset``: the method's, under the authors' per-dataset ones
    (:func:`dataset_settings`, e.g. Tripod's lambdas, FactorQVAE's beta and gamma)."""
    own = {k: v for k, v in dataset_settings(name, dataset).items() if k not in _OPTIM_FIELDS}
    return {**METHODS[name].defaults, **own}


def method_optim(name: str, dataset: str) -> OptimSpec:
    """The model optimizer of method ``name`` on ``dataset``: ``METHODS[name].optim`` with the authors'
    per-dataset fields (QLAE's weight decay 0.001 on MPI3D).

    Examples:
        >>> from qkernels.models.registry import method_optim
        >>> method_optim("qlae", "mpi3d").weight_decay, method_optim("qlae", "shapes3d").weight_decay
        (0.001, 0.1)
    """
    own = {k: v for k, v in dataset_settings(name, dataset).items() if k in _OPTIM_FIELDS}
    return replace(METHODS[name].optim, **own)


def paper_steps(name: str) -> int:
    """The authors' run length of method ``name`` in our iterations (``MethodSpec.paper_steps``: QLAE and ae 200k,
    Tripod 250k, QVAE 100k, FactorQVAE 50k, D-VAE and FactorDVAE 300k, Cliff-VAE 750k (100 epochs of Shapes3D at
    batch 64), Cliff's 2-D AE 1k). ValueError naming the method when its authors state none (the dlib baselines).

    Examples:
        >>> from qkernels.models.registry import paper_steps
        >>> paper_steps("tripod"), paper_steps("factorqvae"), paper_steps("dvae"), paper_steps("cliff_ae")
        (250000, 50000, 300000, 1000)
    """
    _check_name(name)
    steps = METHODS[name].paper_steps
    if not steps:
        known = ", ".join(f"{n} {s.paper_steps:,}" for n, s in METHODS.items() if s.paper_steps)
        raise ValueError(
            f"steps='paper': the authors of {name} state no run length; give a number of steps (stated: {known})"
        )
    return steps


def build_model(name: str, obs_shape, num_latents: int, **kw):
    """Instantiate method ``name`` (a key of ``METHODS``) for observations of shape ``obs_shape`` ((C, S, S), or
    (2,) for cliff_ae) with ``num_latents`` latents; ``kw`` overrides the model's keyword defaults.

    Examples:
        >>> import torch
        >>> from qkernels.models import Tripod, build_model
        >>> model = build_model("tripod", (3, 16, 16), 4, levels=5)
        >>> isinstance(model, Tripod), model.encode(torch.rand(2, 3, 16, 16)).shape
        (True, torch.Size([2, 4]))
    """
    if name not in METHODS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name].cls(tuple(obs_shape), num_latents, **kw)
