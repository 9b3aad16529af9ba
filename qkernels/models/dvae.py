"""D-VAE and FactorDVAE (Friede et al., 2023): N latents x K categories over fixed values linspace(-1, 1, K).

Training sample y = softmax((logits + s * Gumbel) / tau), tau = 1, with the Gumbel scale s cosine-annealed from 0.5
up to 2.0 over the authors' 300,000 steps (lddr ``run.py`` lines 57 and 186-195, ``utils.py`` lines 42-52: a function
of the step, so a shorter run follows the first steps of it); z = y @ values. Loss = BCE (summed per image) +
sum_n KL(softmax(logits_n) || U(K)); FactorDVAE adds gamma * TC with a 6 x 1000 discriminator (LeakyReLU 0.01) on
the soft z, trained on the model step's own z (before the update, same noise) against a per-latent shuffle of it
(lddr ``run.py`` lines 394-433). Evaluation: softmax(logits) @ values.

Network: disentanglement_lib's, as lddr builds it (``run.py`` lines 207-252): 4 x 4 then 2 x 2 stride-2
convolutions in the encoder (family ``"dlib"``), and haiku's default initialization everywhere
(:func:`~qkernels.models.architectures.init_haiku_`: truncated normal, std 1 / sqrt(fan_in), zero biases), the
discriminator's too.

Defaults: the paper's hyper-parameter table (App. 5: batch size, latent dim., Adam's betas, learning rate, training
steps, number of categories, Gumbel scales, the discriminator's Adam, gamma) is blank in the paper text we have:
every value there was lost. The values here come from the authors' lddr code (seed-code notes) and, where it is
silent, from disentanglement_lib's unified setup, which App. 5 says the paper adopts (Adam 1e-4, batch 64).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from qkernels.models.architectures import init_haiku_
from qkernels.models.base import Method, build_encoder_decoder, cosine
from qkernels.models.discriminator import Discriminator, discriminator_loss, tc_estimate
from qkernels.nn.quantize import CategoricalLatent

#: lddr run.py line 57 (``num_train_steps: 300000``): the run length, and the horizon of the noise schedule
NOISE_STEPS = 300_000


class DVAE(Method):
    """Categorical VAE with ordered scalar categories (disentanglement_lib conv backbone).

    Each latent is a :class:`qkernels.nn.CategoricalLatent` over ``num_values`` values linspace(-1, 1); loss =
    recon + beta * KL(softmax(logits) || U(K)); the Gumbel noise scale anneals from ``noise_start`` to ``noise_end``
    over ``noise_steps`` steps (the authors' run length, whatever this run's).

    Examples:
        >>> import torch
        >>> from qkernels.models import DVAE
        >>> model = DVAE((1, 16, 16), 3, num_values=8)
        >>> x = torch.rand(4, 1, 16, 16)
        >>> sorted(model.loss(x, step=0)), model.encode(x).shape
        (['kl', 'recon', 'total'], torch.Size([4, 3]))
    """

    def __init__(
        self,
        obs_shape,
        num_latents: int = 10,
        *,
        num_values: int = 64,
        beta: float = 1.0,
        noise_start: float = 0.5,
        noise_end: float = 2.0,
        noise_steps: int = NOISE_STEPS,
        arch: str = "small",
        recon: str = "bce_sum",
    ) -> None:
        super().__init__()
        if isinstance(noise_steps, bool) or not isinstance(noise_steps, int) or noise_steps < 1:
            raise ValueError(f"noise_steps must be an integer >= 1, got {noise_steps!r}")
        self.num_latents, self.num_values, self.beta, self.recon = num_latents, num_values, beta, recon
        self.noise_start, self.noise_end, self.noise_steps = noise_start, noise_end, noise_steps
        self.encoder, self.decoder = build_encoder_decoder(
            "dlib", arch, tuple(obs_shape), num_latents * num_values, num_latents
        )
        init_haiku_(self.encoder), init_haiku_(self.decoder)
        self.latent = CategoricalLatent(num_latents, num_values)

    def noise_scale(self, step: int) -> float:
        """The Gumbel noise scale of ``step``: lddr's ``cosine_anneal(step, 0.5, 2.0, 0, 300000)``."""
        return cosine(step, self.noise_steps, self.noise_start, self.noise_end)

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

    def noiseless_total(self, x: torch.Tensor, hard: bool) -> torch.Tensor:
        """The training loss with noise scale 0 and soft (or hard one-hot) samples: what lddr's ``eval.py``
        (lines 291-300, 339-344) computes for the straight-through gap."""
        s = self.latent(self.logits(x), 0.0, hard=hard)
        return self.reconstruction(self.decoder(s.z), x) + self.beta * s.kl.sum(-1).mean()


class FactorDVAE(DVAE):
    """D-VAE + gamma * TC (discriminator on the soft z (n, N); 6 x 1000, LeakyReLU 0.01 as lddr's). The
    discriminator learns from the model step's own z (:meth:`loss` keeps it): lddr ``run.py`` lines 413-426 train it
    on the ``sample`` the VAE's ``loss_fn`` returned, before the VAE's update and with its Gumbel noise.

    Examples:
        >>> import torch
        >>> from qkernels.models import FactorDVAE
        >>> model = FactorDVAE((1, 16, 16), 3, num_values=8, disc_width=16, disc_layers=2)
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
        super().__init__(obs_shape, num_latents, **kw)
        self.gamma = gamma
        self.discriminator = init_haiku_(Discriminator(num_latents, width=disc_width, layers=disc_layers, slope=0.01))
        self._real: torch.Tensor | None = None

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        s = self._sample(x, step)
        rec = self.reconstruction(self.decoder(s.z), x)
        kl = s.kl.sum(-1).mean()
        tc = tc_estimate(self.discriminator, s.z)
        self._real = s.z.detach()
        return {"recon": rec, "kl": kl, "tc": tc, "total": rec + self.beta * kl + self.gamma * tc}

    def noiseless_total(self, x: torch.Tensor, hard: bool) -> torch.Tensor:
        """As D-VAE's, with the TC term: lddr's ``loss_fn`` (``eval.py`` lines 249-269) includes gamma * TC."""
        s = self.latent(self.logits(x), 0.0, hard=hard)
        tc = tc_estimate(self.discriminator, s.z)
        return self.reconstruction(self.decoder(s.z), x) + self.beta * s.kl.sum(-1).mean() + self.gamma * tc

    def discriminator_loss(self, x: torch.Tensor, x2: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        """The z of the preceding :meth:`loss` (recomputed if there was none) against its per-latent shuffle
        (lddr: the same batch; ``x2`` unused)."""
        real, self._real = self._real, None
        if real is None or real.shape[0] != x.shape[0]:
            with torch.no_grad():
                real = self._sample(x, step).z
        d = discriminator_loss(self.discriminator, real, real)
        return {"total": d, "disc": d}


@torch.no_grad()
def straight_through_gap(model: DVAE, loader: Iterable) -> float:
    """D-VAE's unsupervised model-selection score |E[loss with hard one-hots] - E[loss with soft y]|, noise 0,
    averaged over the batches of ``loader`` (tensors x, or tuples whose first item is x). Smaller ~ better.

    The loss is the whole training loss (:meth:`DVAE.noiseless_total`: reconstruction + KL, + gamma * TC for
    FactorDVAE), as lddr's ``eval.py`` (lines 399-417) takes it, over 1,000 batches of 64 from the training stream
    there: pass such a loader to reproduce it.

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
            soft_sum += float(model.noiseless_total(x, hard=False)) * len(x)
            hard_sum += float(model.noiseless_total(x, hard=True)) * len(x)
            count += len(x)
    finally:
        model.train(was)
    if count == 0:
        raise ValueError("loader yielded no samples")
    return abs(hard_sum - soft_sum) / count
