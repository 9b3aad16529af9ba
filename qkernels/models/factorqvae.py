"""QVAE and FactorQVAE (Baykal et al., 2024): a global codebook of 64 scalars, Gumbel-softmax relaxation with
logits -(z - c)^2; KL of softmax(logits) to uniform; FactorQVAE adds a TC discriminator on the flattened soft
one-hots. MSE reconstruction against the centered image x - 0.5, which is also what the encoder sees (the authors'
``data/shapes3d.py`` ``shift``); evaluation uses the hard nearest value.

Steps. The authors' code (pytorch-lightning 2.0.0, ``train.py``) anneals tau = exp(-1e-5 * global_step) and
stops at ``max_steps: 100000`` global steps, and Lightning advances ``global_step`` once per
``optimizer.step()``: FactorQVAE steps two optimizers per iteration, so its run is 50,000 iterations and tau
is exp(-2e-5 * iteration) (ending at e^-1); its cosine learning rate (``CosineAnnealingLR(T_max=50000)``,
stepped once per iteration) is one half-cosine from 1e-3 to 1.25e-6 over the whole run. QVAE steps one
optimizer: 100,000 iterations, tau = exp(-1e-5 * iteration), and the cosine (T_max 50,000) rises again in
the second half. Our ``step`` counts iterations: :data:`TAU_RATE` and the registry's run lengths
(:mod:`qkernels.models.registry`) encode this mapping.

Architecture: ``arch="paper"`` is the authors' DALL-E-style residual encoder / decoder (3 groups x 2 blocks,
128 channels; :class:`~qkernels.models.architectures.DalleEncoder`), initialized N(0, 0.02) as their
``Base.__init__``; the default ``"small"`` is the CPU-sized disentanglement_lib conv net.
"""

from __future__ import annotations

import math

import torch

from qkernels.models.base import Method, build_encoder_decoder
from qkernels.models.discriminator import Discriminator, discriminator_loss, tc_estimate
from qkernels.nn.quantize import GumbelQuantizer

# tau = exp(-TAU_RATE * iteration): the authors' exp(-1e-5 * global_step) with global_step = optimizer steps
TAU_RATE = {"qvae": 1e-5, "factorqvae": 2e-5}


class QVAE(Method):
    """Scalar-quantized VAE with a global Gumbel codebook. loss = MSE + beta * KL(softmax(logits) || U(K)).

    The quantizer is a :class:`qkernels.nn.GumbelQuantizer` of ``num_values`` scalars; its temperature decays
    at ``tau_rate`` per step.

    Examples:
        >>> import torch
        >>> from qkernels.models import QVAE
        >>> model = QVAE((1, 16, 16), 3, num_values=8)
        >>> x = torch.rand(4, 1, 16, 16)
        >>> sorted(model.loss(x, step=0)), model.encode(x).shape
        (['kl', 'recon', 'total'], torch.Size([4, 3]))
    """

    recon = "mse_mean"
    input_map = "centered"

    def __init__(
        self,
        obs_shape,
        num_latents: int,
        *,
        num_values: int = 64,
        beta: float = 1e-3,
        tau_rate: float = TAU_RATE["qvae"],
        arch: str = "small",
        recon: str = "mse_mean",
    ) -> None:
        super().__init__()
        self.num_latents, self.beta, self.tau_rate, self.recon = num_latents, beta, tau_rate, recon
        family = "dalle" if arch == "paper" else "dlib_4x4"  # small: a CPU stand-in of ours, not the authors
        self.encoder, self.decoder = build_encoder_decoder(family, arch, tuple(obs_shape), num_latents, num_latents)
        self.quantizer = GumbelQuantizer(num_values)

    def tau(self, step: int) -> float:
        return math.exp(-self.tau_rate * step)

    def schedules(self, step: int) -> dict[str, float]:
        return {"tau": self.tau(step)}

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        was = self.quantizer.training
        self.quantizer.eval()
        try:
            return self.quantizer(self.encoder(self.inputs(x))).z_q
        finally:
            self.quantizer.train(was)

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        return self.quantizer.values_to_indices(self.encoder(self.inputs(x)))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.image(self.decoder(z))

    def latent_values(self, z: torch.Tensor, n: int = 9) -> list[torch.Tensor]:
        v = self.quantizer.values.detach().sort().values
        return [v.clone() for _ in range(self.num_latents)]

    def _quantize(self, x: torch.Tensor, step: int):
        return self.quantizer(self.encoder(self.inputs(x)), self.tau(step))

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        q = self._quantize(x, step)
        rec = self.reconstruction(self.decoder(q.z_q), x)
        kl = q.kl_uniform.mean(-1).mean()
        terms = {"recon": rec, "kl": kl, "total": rec + self.beta * kl}
        return terms


class FactorQVAE(QVAE):
    """QVAE + gamma * TC, the TC estimated by a discriminator (5 x 1000, LeakyReLU 0.2, N(0, 0.02) weights as the
    authors' ``weights_init``) on the flattened soft one-hot weights (n, d * K); each latent's one-hot is permuted
    across a second batch for the product of marginals (the authors split one batch of 512 into two halves).

    The discriminator's "real" samples are the soft weights of the model step's own forward (before the model
    update, with its Gumbel noise), as the authors' ``training_step`` reuses ``D_z``; its permuted samples come
    from a fresh forward of the second batch after the update (``models/factor_qvae.py``).

    Examples:
        >>> import torch
        >>> from qkernels.models import FactorQVAE
        >>> model = FactorQVAE((1, 16, 16), 3, num_values=8, disc_width=16, disc_layers=2)
        >>> x = torch.rand(4, 1, 16, 16)
        >>> sorted(model.loss(x, step=0)), sorted(model.discriminator_loss(x, x, step=0))
        (['kl', 'recon', 'tc', 'total'], ['disc', 'total'])
    """

    def __init__(
        self,
        obs_shape,
        num_latents: int,
        *,
        num_values: int = 64,
        beta: float = 1e-3,
        gamma: float = 1e-4,
        disc_width: int = 1000,
        disc_layers: int = 5,
        tau_rate: float = TAU_RATE["factorqvae"],
        **kw,
    ) -> None:
        super().__init__(obs_shape, num_latents, num_values=num_values, beta=beta, tau_rate=tau_rate, **kw)
        self.gamma = gamma
        self.discriminator = Discriminator(
            num_latents * num_values, width=disc_width, layers=disc_layers, init_std=0.02
        )
        self._real: torch.Tensor | None = None

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        q = self._quantize(x, step)
        rec = self.reconstruction(self.decoder(q.z_q), x)
        kl = q.kl_uniform.mean(-1).mean()
        tc = tc_estimate(self.discriminator, q.weights)
        self._real = q.weights.detach()
        return {"recon": rec, "kl": kl, "tc": tc, "total": rec + self.beta * kl + self.gamma * tc}

    def discriminator_loss(self, x: torch.Tensor, x2: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        """``x``'s weights from the preceding :meth:`loss` (recomputed if there was none), ``x2``'s fresh."""
        real, self._real = self._real, None
        with torch.no_grad():
            w1 = self._quantize(x, step).weights if real is None or real.shape[0] != x.shape[0] else real
            w2 = self._quantize(x2, step).weights
        d = discriminator_loss(self.discriminator, w1, w2)
        return {"total": d, "disc": d}
