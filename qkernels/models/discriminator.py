"""Total-correlation discriminator (FactorVAE density-ratio trick), shared by factorvae, factorqvae, factordvae."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from qkernels.models.architectures import init_normal_
from qkernels.models.base import permute_dims


class Discriminator(nn.Module):
    """MLP (n, in_dim) -> 2 logits: ``layers`` hidden layers of ``width`` units, LeakyReLU(``slope``).
    Logit 0: "sample of q(z)", logit 1: "sample of prod_j q(z_j)" (permuted). ``init_std``: N(0, init_std) weights
    and zero biases (FactorQVAE's ``weights_init``, 0.02); None keeps PyTorch's default initialisation.

    Examples:
        >>> import torch
        >>> from qkernels.models import Discriminator
        >>> disc = Discriminator(4, width=16, layers=2, init_std=0.02)
        >>> disc(torch.randn(8, 4)).shape  # (n, 2) logits
        torch.Size([8, 2])
    """

    def __init__(
        self, in_dim: int, *, width: int = 1000, layers: int = 6, slope: float = 0.2, init_std: float | None = None
    ) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        c = in_dim
        for _ in range(layers):
            mods += [nn.Linear(c, width), nn.LeakyReLU(slope)]
            c = width
        self.net = nn.Sequential(*mods, nn.Linear(c, 2))
        if init_std is not None:
            init_normal_(self.net, init_std)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z.flatten(1))


def tc_estimate(disc: Discriminator, z: torch.Tensor) -> torch.Tensor:
    """Density-ratio TC estimate mean(D_0(z) - D_1(z)); gradients flow to z (and to disc's parameters,
    which the model optimizer does not hold)."""
    logits = disc(z)
    return (logits[:, 0] - logits[:, 1]).mean()


def discriminator_loss(disc: Discriminator, z: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of ``disc`` telling z (class 0) from z2 with each latent permuted across the batch (class 1).
    z, z2: (n, d, ...) DETACHED latents, computed after the model step (z2 may be z itself: D-VAE's lddr)."""
    perm = permute_dims(z2)
    zeros = torch.zeros(z.shape[0], dtype=torch.long, device=z.device)
    ones = torch.ones(z2.shape[0], dtype=torch.long, device=z.device)
    return 0.5 * (F.cross_entropy(disc(z), zeros) + F.cross_entropy(disc(perm), ones))
