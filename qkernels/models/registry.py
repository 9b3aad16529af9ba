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
    "cosine": torch's ``CosineAnnealingLR`` closed form with T_max = ``lr_decay_steps`` (the run length when 0), from
    ``lr`` down to ``lr_min`` and, past T_max, periodically back up (as FactorQVAE's 100k-step runs with T_max 50k)."""

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
    cls: type
    optim: OptimSpec
    batch_size: int
    latents: str  # "twice_sources" or "ten" or "two"
    disc_optim: OptimSpec | None = None
    defaults: dict = field(default_factory=dict)


# optax's AdamW defaults (b2 0.999); QLAE: decay 0.1 on all but biases and codebooks, clip the decayed group only
# (latent_quantization); Tripod: no decay, clip both groups (tripod configs/train_autoencoder.yaml)
_QLAE_OPT = OptimSpec("adamw", 1e-3, (0.9, 0.999), 0.1, "value", 1.0, clip_undecayed=False)
_TRIPOD_OPT = OptimSpec("adamw", 2e-4, (0.9, 0.999), 0.0, "value", 1.0)
# FactorQVAE configs/Shapes3D: Adam 1e-3 for the VAE and the discriminator, CosineAnnealingLR(T_max 50k, 1.25e-6)
_FQ_OPT = OptimSpec("adam", 1e-3, (0.9, 0.999), lr_schedule="cosine", lr_min=1.25e-6, lr_decay_steps=50_000)
_DLIB_OPT = OptimSpec("adam", 1e-4, (0.9, 0.999))
_DISC_OPT = OptimSpec("adam", 1e-4, (0.5, 0.9))  # FactorVAE (Kim & Mnih, 2018)

METHODS: dict[str, MethodSpec] = {
    "ae": MethodSpec(AE, OptimSpec("adamw", 1e-3, (0.9, 0.999), 0.0, "value", 1.0), 128, "twice_sources"),
    "qlae": MethodSpec(QLAE, _QLAE_OPT, 128, "twice_sources"),
    "tripod": MethodSpec(Tripod, _TRIPOD_OPT, 64, "twice_sources"),
    "qvae": MethodSpec(QVAE, _FQ_OPT, 256, "twice_sources"),
    "factorqvae": MethodSpec(FactorQVAE, _FQ_OPT, 256, "twice_sources", disc_optim=_FQ_OPT),
    "dvae": MethodSpec(DVAE, _DLIB_OPT, 64, "ten"),
    "factordvae": MethodSpec(FactorDVAE, _DLIB_OPT, 64, "ten", disc_optim=_DISC_OPT),
    "beta_vae": MethodSpec(BetaVAE, _DLIB_OPT, 64, "ten"),
    "beta_tcvae": MethodSpec(BetaTCVAE, _DLIB_OPT, 64, "ten"),
    "factorvae": MethodSpec(FactorVAE, _DLIB_OPT, 64, "ten", disc_optim=_DISC_OPT),
    "cliff_vae": MethodSpec(CliffVAE, _DLIB_OPT, 64, "ten"),
    "cliff_ae": MethodSpec(CliffAE, OptimSpec("adam", 2e-3), 5000, "two"),
}


def default_num_latents(name: str, num_factors: int) -> int:
    rule = METHODS[name].latents
    return {"twice_sources": 2 * num_factors, "ten": 10, "two": 2}[rule]


def method_defaults(name: str, dataset: str) -> dict:
    """Per-dataset model keyword defaults (Tripod's lambdas from the authors' runs)."""
    if name == "tripod":
        klm, nhp = tripod_lambdas(dataset)
        return {"lambda_klm": klm, "lambda_nhp": nhp}
    return dict(METHODS[name].defaults)


def build_model(name: str, obs_shape, num_latents: int, **kw):
    """Instantiate method ``name`` for observations of shape ``obs_shape``."""
    if name not in METHODS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name].cls(tuple(obs_shape), num_latents, **kw)
