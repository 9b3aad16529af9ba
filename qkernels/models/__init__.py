"""Models of the five papers (and baselines) on shared backbones; see :data:`METHODS` for the names."""

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
    "AE", "QLAE", "MLP", "AdaINDecoder", "DLibDecoder", "DLibEncoder", "QLAEEncoder", "ResidualDecoder",
    "ResidualEncoder", "preset", "Method",
    "permute_dims", "recon_loss", "CliffAE", "Discriminator", "DVAE", "FactorDVAE", "straight_through_gap", "QVAE",
    "FactorQVAE", "METHODS", "MethodSpec", "OptimSpec", "build_model", "default_num_latents", "TRIPOD_LAMBDAS",
    "Tripod", "BetaTCVAE", "BetaVAE", "CliffVAE", "FactorVAE",
]
