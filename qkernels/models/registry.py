"""Method registry: name -> class, the authors' optimizer / batch / latent-count defaults, and ``build_model``."""

from __future__ import annotations

from dataclasses import dataclass, field

from qkernels.models.ae import AE, QLAE
from qkernels.models.cliff import CliffAE
from qkernels.models.dvae import DVAE, FactorDVAE
from qkernels.models.factorqvae import QVAE, FactorQVAE
from qkernels.models.tripod import Tripod, tripod_lambdas
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
    where their code says it (0: not stated). ``data_order``: how the authors read a dataset
    (:data:`qkernels.train.data.DATA_ORDERS`): "epochs" (Tripod's and QLAE's shuffled ``tf.data``), "split"
    (FactorQVAE: shuffled epochs over an 80% split), "iid" (disentanglement_lib's fresh samples).

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


# optax's AdamW defaults (b2 0.999); QLAE: decay 0.1 on all but biases and codebooks, clip the decayed group only
# (latent_quantization); Tripod: no decay, clip both groups (tripod configs/train_autoencoder.yaml)
_QLAE_OPT = OptimSpec("adamw", 1e-3, (0.9, 0.999), 0.1, "value", 1.0, clip_undecayed=False)
_TRIPOD_OPT = OptimSpec("adamw", 2e-4, (0.9, 0.999), 0.0, "value", 1.0)
# FactorQVAE configs/Shapes3D: Adam 1e-3 for the VAE and the discriminator, CosineAnnealingLR(T_max 50k, 1.25e-6)
# stepped once per iteration; max_steps 100k Lightning global steps = 100k iterations for QVAE (one optimizer),
# 50k for FactorQVAE (two optimizers step per iteration: models/factor_qvae.py, train.py)
# (T_max is kept in iterations: a short run follows the first iterations of the authors' schedule)
_FQ_OPT = OptimSpec("adam", 1e-3, (0.9, 0.999), lr_schedule="cosine", lr_min=1.25e-6, lr_decay_steps=50_000)
_DLIB_OPT = OptimSpec("adam", 1e-4, (0.9, 0.999))
_DISC_OPT = OptimSpec("adam", 1e-4, (0.5, 0.9))  # FactorVAE (Kim & Mnih, 2018)

METHODS: dict[str, MethodSpec] = {
    # latent_quantization configs/params/ae/ae_shapes3d.yaml (l2: 0.001) and models/ae.py (clip and decay the
    # "regularized" group only; biases plain Adam, unclipped), as QLAE's optimizer
    "ae": MethodSpec(AE, OptimSpec("adamw", 1e-3, (0.9, 0.999), 0.001, "value", 1.0, clip_undecayed=False), 128,
                     "twice_sources", data_order="epochs"),
    # latent_quantization configs/train_ae.yaml: optim.num_steps 2e5; tripod configs/train_autoencoder.yaml: 250000
    "qlae": MethodSpec(QLAE, _QLAE_OPT, 128, "twice_sources", paper_steps=200_000, data_order="epochs"),
    "tripod": MethodSpec(Tripod, _TRIPOD_OPT, 64, "twice_sources", paper_steps=250_000, data_order="epochs"),
    "qvae": MethodSpec(QVAE, _FQ_OPT, 256, "twice_sources", paper_steps=100_000, data_order="split"),
    "factorqvae": MethodSpec(FactorQVAE, _FQ_OPT, 256, "twice_sources", disc_optim=_FQ_OPT, paper_steps=50_000,
                             data_order="split"),
    "dvae": MethodSpec(DVAE, _DLIB_OPT, 64, "ten"),
    "factordvae": MethodSpec(FactorDVAE, _DLIB_OPT, 64, "ten", disc_optim=_DISC_OPT),
    "beta_vae": MethodSpec(BetaVAE, _DLIB_OPT, 64, "ten"),
    "beta_tcvae": MethodSpec(BetaTCVAE, _DLIB_OPT, 64, "ten"),
    "factorvae": MethodSpec(FactorVAE, _DLIB_OPT, 64, "ten", disc_optim=_DISC_OPT),
    "cliff_vae": MethodSpec(CliffVAE, _DLIB_OPT, 64, "ten"),
    "cliff_ae": MethodSpec(CliffAE, OptimSpec("adam", 2e-3), 5000, "two"),
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


def method_defaults(name: str, dataset: str) -> dict:
    """Per-dataset model keyword defaults (Tripod's lambdas from the authors' runs)."""
    if name == "tripod":
        klm, nhp = tripod_lambdas(dataset)
        return {"lambda_klm": klm, "lambda_nhp": nhp}
    return dict(METHODS[name].defaults)


def build_model(name: str, obs_shape, num_latents: int, **kw):
    """Instantiate method ``name`` (a key of ``METHODS``) for observations of shape ``obs_shape`` ((C, S, S), or
    (2,) for cliff_ae) with ``num_latents`` latents; ``kw`` overrides the model's keyword defaults.

    Examples:
        >>> from qkernels.models import Tripod, build_model
        >>> model = build_model("tripod", (3, 16, 16), 4, levels=5)
        >>> isinstance(model, Tripod), model.encode(torch.rand(2, 3, 16, 16)).shape
        (True, torch.Size([2, 4]))
    """
    if name not in METHODS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name].cls(tuple(obs_shape), num_latents, **kw)
        >>> import torch
