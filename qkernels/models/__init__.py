"""Models of the five papers (and baselines) on shared backbones; see :data:`METHODS` for the names.

Constants (plain data, no docstrings of their own):

- ``METHODS``: ``{name: MethodSpec}`` of every method :func:`build_model` and ``qkernels train`` know ("ae",
  "qlae", "tripod", "qvae", "factorqvae", "dvae", "factordvae", "beta_vae", "beta_tcvae", "factorvae",
  "cliff_vae", "cliff_ae"): its class, optimizer, batch size, latent-count rule and the authors' run length.
- ``TRIPOD_LAMBDAS``: ``{dataset: (lambda_KLM, lambda_NHP)}`` from the Tripod authors' runs (Shapes3D's are the
  default for other datasets).
"""

from qkernels.models.ae import AE, QLAE
from qkernels.models.architectures import (
    MLP,
    AdaINDecoder,
    DLibDecoder,
    DLibEncoder,
    QLAEEncoder,
    ResidualDecoder,
    ResidualEncoder,
    preset,
)
from qkernels.models.base import Method, permute_dims, recon_loss
from qkernels.models.cliff import CliffAE
from qkernels.models.discriminator import Discriminator
from qkernels.models.dvae import DVAE, FactorDVAE, straight_through_gap
from qkernels.models.factorqvae import QVAE, FactorQVAE
from qkernels.models.registry import METHODS, MethodSpec, OptimSpec, build_model, default_num_latents
from qkernels.models.tripod import TRIPOD_LAMBDAS, Tripod
from qkernels.models.vae import BetaTCVAE, BetaVAE, CliffVAE, FactorVAE

__all__ = [
    "AE",
    "QLAE",
    "MLP",
    "AdaINDecoder",
    "DLibDecoder",
    "DLibEncoder",
    "QLAEEncoder",
    "ResidualDecoder",
    "ResidualEncoder",
    "preset",
    "Method",
    "permute_dims",
    "recon_loss",
    "CliffAE",
    "Discriminator",
    "DVAE",
    "FactorDVAE",
    "straight_through_gap",
    "QVAE",
    "FactorQVAE",
    "METHODS",
    "MethodSpec",
    "OptimSpec",
    "build_model",
    "default_num_latents",
    "TRIPOD_LAMBDAS",
    "Tripod",
    "BetaTCVAE",
    "BetaVAE",
    "CliffVAE",
    "FactorVAE",
]
