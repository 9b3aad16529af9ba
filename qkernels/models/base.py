"""``Method``: the interface every model of :mod:`qkernels.models` implements, and shared helpers."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from qkernels.models.architectures import (
    AdaINDecoder,
    DalleDecoder,
    DalleEncoder,
    DLibDecoder,
    DLibEncoder,
    QLAEEncoder,
    ResidualDecoder,
    ResidualEncoder,
    init_normal_,
    preset,
)

RECON_KINDS = ("bce_mean", "bce_sum", "mse_mean")
# what the encoder sees of an image x in [0, 1], and its inverse: "unit" x (QLAE, the dlib family), "signed"
# 2x - 1 (Tripod's datasets: x in [-1, 1], BCE target (x + 1) / 2), "centered" x - 0.5 (FactorQVAE's
# data/shapes3d.py ``shift``, with an MSE loss against x - 0.5)
INPUT_MAPS = {
    "unit": (lambda x: x, lambda y: y),
    "signed": (lambda x: 2 * x - 1, lambda y: (y + 1) / 2),
    "centered": (lambda x: x - 0.5, lambda y: y + 0.5),
}


def recon_loss(out: torch.Tensor, x: torch.Tensor, kind: str) -> torch.Tensor:
    """Reconstruction loss of decoder output ``out`` (logits for BCE) against ``x`` (n, ...) in [0, 1].

    bce_mean: mean over all elements (QLAE/Tripod code); bce_sum: summed per sample, mean over the batch
    (disentanglement_lib, D-VAE); mse_mean: mean squared error over all elements (FactorQVAE code).

    Returns:
        A scalar tensor. Raises ValueError for another ``kind``.

    Examples:
        Zero logits predict 0.5 everywhere: BCE log 2 per element.

        >>> import torch
        >>> import math
        >>> from qkernels.models import recon_loss
        >>> out, x = torch.zeros(2, 4), torch.rand(2, 4).round()  # logits, binary targets
        >>> math.isclose(recon_loss(out, x, "bce_mean"), math.log(2), rel_tol=1e-6)
        True
        >>> math.isclose(recon_loss(out, x, "bce_sum"), 4 * math.log(2), rel_tol=1e-6)  # 4 elements per sample
        True
        >>> recon_loss(out, torch.full((2, 4), 0.5), "mse_mean")
        tensor(0.2500)
    """
    if kind == "bce_mean":
        return F.binary_cross_entropy_with_logits(out, x)
    if kind == "bce_sum":
        return F.binary_cross_entropy_with_logits(out, x, reduction="sum") / x.shape[0]
    if kind == "mse_mean":
        return F.mse_loss(out, x)
    raise ValueError(f"recon must be one of {RECON_KINDS}, got {kind!r}")


def to_image(out: torch.Tensor, kind: str, input_map: str = "unit") -> torch.Tensor:
    """Decoder output -> image in [0, 1] (an MSE decoder predicts the encoder's input convention)."""
    return torch.sigmoid(out) if kind.startswith("bce") else INPUT_MAPS[input_map][1](out).clamp(0, 1)


def cosine(step: int, total: int, start: float, end: float) -> float:
    """Cosine interpolation from ``start`` (step 0) to ``end`` (step >= total)."""
    t = min(max(step, 0), max(total, 1)) / max(total, 1)
    return end + (start - end) * 0.5 * (1 + math.cos(math.pi * t))


def permute_dims(z: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Permute each latent independently across the batch (FactorVAE): z (n, d, ...) -> same shape.

    Samples of the product of the marginals prod_j q(z_j) from samples of q(z); ``generator`` draws the
    permutations.

    Examples:
        >>> import torch
        >>> from qkernels.models import permute_dims
        >>> z = torch.arange(12.0).reshape(4, 3)
        >>> p = permute_dims(z, torch.Generator().manual_seed(0))
        >>> p.shape, torch.equal(p.sort(0).values, z)  # each column keeps its values
        (torch.Size([4, 3]), True)
    """
    n, d = z.shape[:2]
    idx = torch.argsort(torch.rand(n, d, generator=generator, device="cpu"), dim=0).to(z.device)
    idx = idx.view(n, d, *([1] * (z.dim() - 2))).expand_as(z)
    return torch.gather(z, 0, idx)


class Method(nn.Module):
    """Base of every method. Subclasses implement:

    * ``encode(x) -> (n, d)``: the representation used for evaluation (quantized values, means, ...);
    * ``decode(z) -> (n, ...)``: observations in data space ([0, 1] images);
    * ``loss(x, step) -> dict`` of named scalar terms including ``"total"``;
    * optionally ``discriminator_loss(x, x2, step) -> dict`` (has ``"total"``) for the TC discriminator, whose
      parameters live in ``self.discriminator`` (absent otherwise: use :func:`discriminator_of`) and get their
      own optimizer, stepped AFTER the model step.

    Data-parallel training (:mod:`qkernels.train.loop` under torchrun) sets ``dp_group`` (the ranks that share
    one global batch: random draws are made for the global batch, each rank keeping its rows) and ``kde_group``
    (the group the KDE losses gather the global batch over, or None for per-rank KDE).

    ``latent_values(z) -> list of d 1-D tensors``: the values each latent is swept over in intervention figures.
    ``no_decay(name, param) -> bool`` marks parameters excluded from weight decay: biases and codebooks (QLAE's
    code decays everything else, norm scales and the decoder's input map included).

    ``input_map`` (:data:`INPUT_MAPS`): the authors' input convention; images arrive in [0, 1] and
    ``inputs(x)`` is what the encoder sees; ``reconstruction(out, x)`` compares BCE logits with x and an
    MSE output with ``inputs(x)``; ``image(out)`` maps a decoder output back to [0, 1].

    Examples:
        A minimal method: a linear autoencoder of 2-D points.

        >>> import torch
        >>> from qkernels.models import Method
        >>> class Linear(Method):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.num_latents, self.enc, self.dec = 1, torch.nn.Linear(2, 1), torch.nn.Linear(1, 2)
        ...     def encode(self, x):
        ...         return self.enc(x)
        ...     def decode(self, z):
        ...         return self.dec(z)
        ...     def loss(self, x, step):
        ...         recon = ((self.decode(self.encode(x)) - x) ** 2).mean()
        ...         return {"recon": recon, "total": recon}
        >>> model = Linear()
        >>> sorted(model(torch.rand(8, 2), step=0))  # forward is the loss
        ['recon', 'total']
    """

    recon: str = "bce_mean"
    input_map: str = "unit"
    num_latents: int

    def __init__(self) -> None:
        super().__init__()
        self.total_steps = 1
        self.dp_group = self.kde_group = None

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] -> the encoder's input convention."""
        return INPUT_MAPS[self.input_map][0](x)

    def reconstruction(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction loss of decoder output ``out`` for images ``x`` in [0, 1]."""
        return recon_loss(out, x if self.recon.startswith("bce") else self.inputs(x), self.recon)

    def image(self, out: torch.Tensor) -> torch.Tensor:
        """Decoder output -> image in [0, 1]."""
        return to_image(out, self.recon, self.input_map)

    def forward(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        """The training loss (so that DistributedDataParallel, which calls ``forward``, can wrap a method)."""
        return self.loss(x, step)

    def set_total_steps(self, total: int) -> None:
        """Length of training, for schedules that anneal over it."""
        self.total_steps = int(total)

    def schedules(self, step: int) -> dict[str, float]:
        """Scheduled hyper-parameters at ``step`` (logged)."""
        return {}

    def latent_values(self, z: torch.Tensor, n: int = 9) -> list[torch.Tensor]:
        """Continuous default: ``n`` values evenly spaced between the 2nd and 98th percentile of each latent."""
        lo, hi = torch.quantile(z.float(), 0.02, dim=0), torch.quantile(z.float(), 0.98, dim=0)
        t = torch.linspace(0, 1, n)
        return [lo[j] + t * (hi[j] - lo[j]) for j in range(z.shape[1])]

    def codes(self, x: torch.Tensor) -> torch.Tensor | None:
        """Integer codes (n, d) of discrete latents for the metrics' discrete estimators; None if continuous."""
        return None

    def no_decay(self, name: str, param: nn.Parameter) -> bool:
        return name.endswith("bias") or name.startswith("quantizer.")

    def model_parameters(self):
        """Named parameters of the encoder/decoder/codebooks (everything but the discriminator)."""
        return [(n, p) for n, p in self.named_parameters() if not n.startswith("discriminator.")]


class QuantizedAutoencoder(Method):
    """Shared by QLAE and Tripod: ``encoder`` -> ``quantizer`` (returns :class:`~qkernels.Quantized`) ->
    ``decoder``; encode gives z_q, codes the integer indices."""

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.quantizer(self.encoder(self.inputs(x))).z_q

    def codes(self, x: torch.Tensor) -> torch.Tensor:
        return self.quantizer(self.encoder(self.inputs(x))).indices

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.image(self.decoder(z))


def discriminator_of(model: nn.Module) -> nn.Module | None:
    """The model's TC discriminator, or None."""
    return model._modules.get("discriminator")


def build_encoder_decoder(family: str, arch: str, obs_shape: tuple[int, ...], enc_out: int, dec_in: int):
    """(encoder, decoder) of ``family`` "qlae" (conv + AdaIN), "tripod" (residual), "dlib" (disentanglement_lib's
    code: 2 x 2 third and fourth convolutions), "dlib_4x4" (Cliff App. G.3's table: 4 x 4 throughout) or "dalle"
    (FactorQVAE's residual nets at the paper's width, initialized N(0, 0.02)) for images ``obs_shape``
    (C, S, S)."""
    if len(obs_shape) != 3 or obs_shape[1] != obs_shape[2]:
        raise ValueError(f"image models need observations (C, S, S), got {obs_shape}")
    c, s = obs_shape[0], obs_shape[1]
    if family == "dalle":
        return init_normal_(DalleEncoder(c, s, enc_out)), init_normal_(DalleDecoder(dec_in, c, s))
    kw = preset(family, arch, s)
    if family == "qlae":
        enc = QLAEEncoder(c, s, enc_out, **kw)
        dec = AdaINDecoder(dec_in, c, s, widths=tuple(kw["widths"])[::-1], dense=kw["dense"])
    elif family == "tripod":
        enc = ResidualEncoder(c, s, enc_out, widths=kw["widths"])
        dec = ResidualDecoder(dec_in, c, s, widths=tuple(2 * w for w in kw["widths"])[::-1], dense=kw["dense"])
    else:
        enc = DLibEncoder(c, s, enc_out, **kw)
        dec = DLibDecoder(dec_in, c, s, **kw)
    return enc, dec
