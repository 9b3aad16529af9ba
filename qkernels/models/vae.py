"""Gaussian VAE baselines on the disentanglement_lib conv backbone: beta-VAE, beta-TCVAE (minibatch-weighted
sampling TC), FactorVAE (TC discriminator), and Cliff-VAE (beta-VAE + lambda_a * Cliff loss on the means,
Cliff App. F.4). BCE summed per image; KL summed over latents; encode -> the posterior means."""

from __future__ import annotations

import math

import torch

from qkernels.distributed import randn_rows
from qkernels.models.base import Method, build_encoder_decoder
from qkernels.models.discriminator import Discriminator, discriminator_loss, tc_estimate
from qkernels.ops.kde import cliff_loss


def gaussian_log_density(z: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """log N(z; mu, exp(logvar)) elementwise (broadcasting)."""
    return -0.5 * (math.log(2 * math.pi) + logvar + (z - mu) ** 2 * torch.exp(-logvar))


class BetaVAE(Method):
    """beta-VAE: loss = BCE + beta * KL(q(z|x) || N(0, I)); z = mu + exp(logvar / 2) * eps; encode gives mu.
    ``backbone``: disentanglement_lib's code (``"dlib"``: 2 x 2 third and fourth convolutions), Cliff-VAE Cliff
    App. G.3's table (``"dlib_4x4"``).

    Examples:
        >>> import torch
        >>> from qkernels.models import BetaVAE
        >>> model = BetaVAE((1, 16, 16), 3, beta=4.0)
        >>> x = torch.rand(4, 1, 16, 16)
        >>> sorted(model.loss(x, step=0)), model.encode(x).shape
        (['kl', 'recon', 'total'], torch.Size([4, 3]))
    """

    backbone = "dlib"

    def __init__(
        self, obs_shape, num_latents: int = 10, *, beta: float = 16.0, arch: str = "small", recon: str = "bce_sum"
    ) -> None:
        super().__init__()
        self.num_latents, self.beta, self.recon = num_latents, beta, recon
        self.encoder, self.decoder = build_encoder_decoder(
            self.backbone, arch, tuple(obs_shape), 2 * num_latents, num_latents
        )

    def posterior(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x -> (mu, logvar), each (n, d)."""
        mu, logvar = self.encoder(self.inputs(x)).chunk(2, dim=1)
        return mu, logvar

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.posterior(x)[0]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.image(self.decoder(z))

    def _forward(self, x: torch.Tensor):
        mu, logvar = self.posterior(x)
        z = mu + torch.exp(0.5 * logvar) * randn_rows(mu, self.dp_group)
        rec = self.reconstruction(self.decoder(z), x)
        kl = 0.5 * (mu**2 + logvar.exp() - 1 - logvar).sum(1).mean()
        return mu, logvar, z, rec, kl

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        _, _, _, rec, kl = self._forward(x)
        return {"recon": rec, "kl": kl, "total": rec + self.beta * kl}


class BetaTCVAE(BetaVAE):
    """beta-TCVAE: loss = BCE + KL + (beta - 1) * TC, TC by minibatch-weighted sampling (Chen et al., 2018).

    Examples:
        >>> import torch
        >>> from qkernels.models import BetaTCVAE
        >>> model = BetaTCVAE((1, 16, 16), 3)
        >>> sorted(model.loss(torch.rand(4, 1, 16, 16), step=0))
        ['kl', 'recon', 'tc', 'total']
    """

    def __init__(self, obs_shape, num_latents: int = 10, *, beta: float = 6.0, **kw) -> None:
        super().__init__(obs_shape, num_latents, beta=beta, **kw)

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        mu, logvar, z, rec, kl = self._forward(x)
        n = x.shape[0]
        log_qz_ij = gaussian_log_density(z[:, None], mu[None], logvar[None])  # (n, n, d)
        log_qz = torch.logsumexp(log_qz_ij.sum(2), dim=1) - math.log(n)
        log_prod = (torch.logsumexp(log_qz_ij, dim=1) - math.log(n)).sum(1)
        tc = (log_qz - log_prod).mean()
        return {"recon": rec, "kl": kl, "tc": tc, "total": rec + kl + (self.beta - 1) * tc}


class FactorVAE(BetaVAE):
    """FactorVAE: loss = BCE + KL + gamma * TC, TC from a 6 x 1000 discriminator on sampled z.

    Examples:
        >>> import torch
        >>> from qkernels.models import FactorVAE
        >>> model = FactorVAE((1, 16, 16), 3, disc_width=16, disc_layers=2)
        >>> x = torch.rand(4, 1, 16, 16)
        >>> sorted(model.loss(x, step=0)), sorted(model.discriminator_loss(x, x, step=0))
        (['kl', 'recon', 'tc', 'total'], ['disc', 'total'])
    """

    def __init__(
        self,
        obs_shape,
        num_latents: int = 10,
        *,
        gamma: float = 10.0,
        disc_width: int = 1000,
        disc_layers: int = 6,
        **kw,
    ) -> None:
        super().__init__(obs_shape, num_latents, beta=1.0, **kw)
        self.gamma = gamma
        self.discriminator = Discriminator(num_latents, width=disc_width, layers=disc_layers)

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        _, _, z, rec, kl = self._forward(x)
        tc = tc_estimate(self.discriminator, z)
        return {"recon": rec, "kl": kl, "tc": tc, "total": rec + kl + self.gamma * tc}

    def _sample(self, x: torch.Tensor) -> torch.Tensor:
        mu, logvar = self.posterior(x)
        return mu + torch.exp(0.5 * logvar) * randn_rows(mu, self.dp_group)

    def discriminator_loss(self, x: torch.Tensor, x2: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            z1, z2 = self._sample(x), self._sample(x2)
        d = discriminator_loss(self.discriminator, z1, z2)
        return {"total": d, "disc": d}


class CliffVAE(BetaVAE):
    """beta-VAE (beta 10) + lambda_a * Cliff loss of the posterior means (Cliff App. F.4: lambda_uni 0.5,
    lambda_biv 1, lambda_KL-uni 0.7, lambda_a 1, sigma 0.1). ``num_cond`` must not exceed the batch size.

    Examples:
        >>> import torch
        >>> from qkernels.models import CliffVAE
        >>> model = CliffVAE((1, 16, 16), 3, num_cond=4)
        >>> sorted(model.loss(torch.rand(8, 1, 16, 16), step=0))
        ['cliff', 'kl', 'recon', 'total']
    """

    backbone = "dlib_4x4"  # Cliff App. G.3: "4 x 4 conv" for all four convolutions

    def __init__(
        self,
        obs_shape,
        num_latents: int = 10,
        *,
        beta: float = 10.0,
        lambda_a: float = 1.0,
        sigma: float = 0.1,
        lambda_uni: float = 0.5,
        lambda_biv: float = 1.0,
        lambda_kl: float = 0.7,
        num_cond: int = 10,
        **kw,
    ) -> None:
        super().__init__(obs_shape, num_latents, beta=beta, **kw)
        self.lambda_a = lambda_a
        self.cliff_kw = {
            "sigma": sigma,
            "lambda_uni": lambda_uni,
            "lambda_biv": lambda_biv,
            "lambda_kl": lambda_kl,
            "num_cond": num_cond,
        }

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        mu, _, _, rec, kl = self._forward(x)
        cliff = cliff_loss(mu, group=self.kde_group, **self.cliff_kw)
        return {"recon": rec, "kl": kl, "cliff": cliff, "total": rec + self.beta * kl + self.lambda_a * cliff}
