"""D-VAE and FactorDVAE (Friede et al., 2023): N latents x K categories over fixed values linspace(-1, 1, K).

Training sample y = softmax((logits + s * Gumbel) / tau), tau = 1, with the Gumbel scale s cosine-annealed from 0.5
up to 2.0 over training; z = y @ values. Loss = BCE (summed per image) + sum_n KL(softmax(logits_n) || U(K));
FactorDVAE adds gamma * TC with a 6 x 1000 discriminator (LeakyReLU 0.01) on the soft z, trained to tell the batch's
z from a per-latent shuffle of the same z (lddr). Evaluation: softmax(logits) @ values.

Defaults: the paper's hyper-parameter table (App. 5: batch size, latent dim., Adam's betas, learning rate, training
steps, number of categories, Gumbel scales, the discriminator's Adam, gamma) is blank in the paper text we have:
every value there was lost. The values here come from the authors' lddr code (seed-code notes) and, where it is
silent, from disentanglement_lib's unified setup, which App. 5 says the paper adopts (Adam 1e-4, batch 64).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from qkernels.models.base import Method, build_encoder_decoder, cosine
from qkernels.models.discriminator import Discriminator, discriminator_loss, tc_estimate
from qkernels.nn.quantize import CategoricalLatent


class DVAE(Method):
    """Categorical VAE with ordered scalar categories (disentanglement_lib conv backbone).

    Each latent is a :class:`qkernels.nn.CategoricalLatent` over ``num_values`` values linspace(-1, 1); loss =
    recon + beta * KL(softmax(logits) || U(K)); the Gumbel noise scale anneals from ``noise_start`` to ``noise_end``.

    Examples:
        >>> import torch
        >>> from qkernels.models import DVAE
        >>> model = DVAE((1, 16, 16), 3, num_values=8)
        >>> x = torch.rand(4, 1, 16, 16)
        >>> sorted(model.loss(x, step=0)), model.encode(x).shape
        (['kl', 'recon', 'total'], torch.Size([4, 3]))
    """

    def __init__(self, obs_shape, num_latents: int = 10, *, num_values: int = 64, beta: float = 1.0,
                 noise_start: float = 0.5, noise_end: float = 2.0, arch: str = "small", recon: str = "bce_sum") -> None:
        super().__init__()
        self.num_latents, self.num_values, self.beta, self.recon = num_latents, num_values, beta, recon
        self.noise_start, self.noise_end = noise_start, noise_end
        self.encoder, self.decoder = build_encoder_decoder(
            "dlib", arch, tuple(obs_shape), num_latents * num_values, num_latents)
        self.latent = CategoricalLatent(num_latents, num_values)

    def noise_scale(self, step: int) -> float:
        return cosine(step, self.total_steps, self.noise_start, self.noise_end)

    def schedules(self, step: int) -> dict[str, float]:
        return {"noise_scale": self.noise_scale(step)}

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x -> logits (n, N, K)."""
        return self.encoder(self.inputs(x)).view(x.shape[0], self.num_latents, self.num_values)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.latent(self.logits(x), 0.0).z

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.image(self.decoder(z))

    def latent_values(self, z: torch.Tensor, n: int = 9) -> list[torch.Tensor]:
        return [torch.linspace(-1, 1, n) for _ in range(self.num_latents)]

    def _sample(self, x: torch.Tensor, step: int):
        return self.latent(self.logits(x), self.noise_scale(step))

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        s = self._sample(x, step)
        rec = self.reconstruction(self.decoder(s.z), x)
        kl = s.kl.sum(-1).mean()
        return {"recon": rec, "kl": kl, "total": rec + self.beta * kl}


class FactorDVAE(DVAE):
    """D-VAE + gamma * TC (discriminator on the soft z (n, N); 6 x 1000, LeakyReLU 0.01 as lddr's).

    Examples:
        >>> import torch
        >>> from qkernels.models import FactorDVAE
        >>> model = FactorDVAE((1, 16, 16), 3, num_values=8, disc_width=16, disc_layers=2)
        >>> x = torch.rand(4, 1, 16, 16)
        >>> sorted(model.loss(x, step=0)), sorted(model.discriminator_loss(x, x, step=0))
        (['kl', 'recon', 'tc', 'total'], ['disc', 'total'])
    """

    def __init__(self, obs_shape, num_latents: int = 10, *, gamma: float = 10.0, disc_width: int = 1000,
                 disc_layers: int = 6, **kw) -> None:
        super().__init__(obs_shape, num_latents, **kw)
        self.gamma = gamma
        self.discriminator = Discriminator(num_latents, width=disc_width, layers=disc_layers, slope=0.01)

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        s = self._sample(x, step)
        rec = self.reconstruction(self.decoder(s.z), x)
        kl = s.kl.sum(-1).mean()
        tc = tc_estimate(self.discriminator, s.z)
        return {"recon": rec, "kl": kl, "tc": tc, "total": rec + self.beta * kl + self.gamma * tc}

    def discriminator_loss(self, x: torch.Tensor, x2: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            z = self._sample(x, step).z  # lddr: the same batch, shuffled per latent (x2 unused)
        d = discriminator_loss(self.discriminator, z, z)
        return {"total": d, "disc": d}


@torch.no_grad()
def straight_through_gap(model: DVAE, loader: Iterable) -> float:
    """D-VAE's unsupervised model-selection score |E[recon with hard one-hots] - E[recon with soft y]|, noise 0,
    averaged over the batches of ``loader`` (tensors x, or tuples whose first item is x). Smaller ~ better.

    Returns a float >= 0; raises ValueError when ``loader`` yields no samples.

    Examples:
        >>> import torch
        >>> from qkernels.models import DVAE, straight_through_gap
        >>> model = DVAE((1, 16, 16), 3, num_values=8)
        >>> straight_through_gap(model, [torch.rand(4, 1, 16, 16)]) >= 0
        True
    """
    was = model.training
    model.eval()
    hard_sum = soft_sum = 0.0
    count = 0
    try:
        for batch in loader:
            x = batch[0] if isinstance(batch, (tuple, list)) else batch
            logits = model.logits(x)
            soft = model.latent(logits, 0.0).z
            hard = model.latent(logits, 0.0, hard=True).z
            soft_sum += float(model.reconstruction(model.decoder(soft), x)) * len(x)
            hard_sum += float(model.reconstruction(model.decoder(hard), x)) * len(x)
            count += len(x)
    finally:
        model.train(was)
    if count == 0:
        raise ValueError("loader yielded no samples")
    return abs(hard_sum - soft_sum) / count
