"""QVAE and FactorQVAE (Baykal et al., 2024): a global codebook of 64 scalars, Gumbel-softmax relaxation with
logits -(z - c)^2, tau = exp(-1e-5 step); KL of softmax(logits) to uniform; FactorQVAE adds a TC discriminator
on the flattened soft one-hots. MSE reconstruction; evaluation uses the hard nearest value.

Architecture: the disentanglement_lib conv encoder/decoder (the paper uses a residual net; documented
simplification so every method here shares one CPU-sized backbone).
"""

from __future__ import annotations

import math

import torch

from qkernels.models.base import Method, build_encoder_decoder, recon_loss, to_image
from qkernels.models.discriminator import Discriminator, discriminator_loss, tc_estimate
from qkernels.nn.quantize import GumbelQuantizer


class QVAE(Method):
    """Scalar-quantized VAE with a global Gumbel codebook. loss = MSE + beta * KL(softmax(logits) || U(K))."""

    recon = "mse_mean"

    def __init__(self, obs_shape, num_latents: int, *, num_values: int = 64, beta: float = 1e-3,
                 tau_rate: float = 1e-5, arch: str = "small", recon: str = "mse_mean") -> None:
        super().__init__()
        self.num_latents, self.beta, self.tau_rate, self.recon = num_latents, beta, tau_rate, recon
        self.encoder, self.decoder = build_encoder_decoder("dlib", arch, tuple(obs_shape), num_latents, num_latents)
        self.quantizer = GumbelQuantizer(num_values)

    def tau(self, step: int) -> float:
        return math.exp(-self.tau_rate * step)

    def schedules(self, step: int) -> dict[str, float]:
        return {"tau": self.tau(step)}

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        was = self.quantizer.training
        self.quantizer.eval()
        try:
            return self.quantizer(self.encoder(x)).z_q
        finally:
            self.quantizer.train(was)

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        return self.quantizer.values_to_indices(self.encoder(x))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return to_image(self.decoder(z), self.recon)

    def latent_values(self, z: torch.Tensor, n: int = 9) -> list[torch.Tensor]:
        v = self.quantizer.values.detach().sort().values
        return [v.clone() for _ in range(self.num_latents)]

    def _quantize(self, x: torch.Tensor, step: int):
        return self.quantizer(self.encoder(x), self.tau(step))

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        q = self._quantize(x, step)
        rec = recon_loss(self.decoder(q.z_q), x, self.recon)
        kl = q.kl_uniform.mean(-1).mean()
        terms = {"recon": rec, "kl": kl, "total": rec + self.beta * kl}
        return terms


class FactorQVAE(QVAE):
    """QVAE + gamma * TC, the TC estimated by a discriminator (5 x 1000, LeakyReLU 0.2, N(0, 0.02) weights as the
    authors' ``weights_init``) on the flattened soft one-hot weights (n, d * K); each latent's one-hot is permuted
    across a second batch for the product of marginals (the authors split one batch of 512 into two halves)."""

    def __init__(self, obs_shape, num_latents: int, *, num_values: int = 64, beta: float = 1e-3, gamma: float = 1e-4,
                 disc_width: int = 1000, disc_layers: int = 5, **kw) -> None:
        super().__init__(obs_shape, num_latents, num_values=num_values, beta=beta, **kw)
        self.gamma = gamma
        self.discriminator = Discriminator(num_latents * num_values, width=disc_width, layers=disc_layers,
                                           init_std=0.02)

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        q = self._quantize(x, step)
        rec = recon_loss(self.decoder(q.z_q), x, self.recon)
        kl = q.kl_uniform.mean(-1).mean()
        tc = tc_estimate(self.discriminator, q.weights)
        return {"recon": rec, "kl": kl, "tc": tc, "total": rec + self.beta * kl + self.gamma * tc}

    def discriminator_loss(self, x: torch.Tensor, x2: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            w1 = self._quantize(x, step).weights
            w2 = self._quantize(x2, step).weights
        d = discriminator_loss(self.discriminator, w1, w2)
        return {"total": d, "disc": d}
