"""Tripod (Hsu et al., ICML 2024): FSQ latents + kernel latent multiinformation (KLM) + normalized Hessian
penalty (NHP) on the residual decoder's conditioning path and inner block outputs.

Loss (Alg. 1): BCE(dec(z_q), x) + lambda_KLM * KLM(z_q; std of tanh(z)) + lambda_NHP * NHP(dec layers at z_q),
as the authors' code runs it (``models/autoencoder.py``, ``configs/train_autoencoder.yaml``): BCE on logits
averaged over (c, h, w) per image, then over the batch; NHP summed over ``cond`` and every decoder block output but
the last (``block0``-``block2`` at 64x64).
The standard deviation is of the CONTINUOUS latents tanh(z) (ddof 0, + 1e-6, with gradient); KDE and finite
differences use the quantized latents (seed-code notes).
"""

from __future__ import annotations

import torch

from qkernels.distributed import gather_rows
from qkernels.models.base import QuantizedAutoencoder, build_encoder_decoder
from qkernels.nn.quantize import FSQ
from qkernels.ops.hessian import normalized_hessian_penalty
from qkernels.ops.kde import klm_loss

# (lambda_KLM, lambda_NHP) of the authors' runs; procedural stand-ins use their real dataset's values.
TRIPOD_LAMBDAS = {
    "shapes3d": (1e-4, 1e-2),
    "mpi3d": (1e-8, 1e-4),
    "falcor3d": (1e-10, 1e-2),
    "isaac3d": (1e-4, 1e-8),
}
TRIPOD_LAMBDAS["shapes3d_procedural"] = TRIPOD_LAMBDAS["shapes3d"]


def tripod_lambdas(dataset: str) -> tuple[float, float]:
    """(lambda_KLM, lambda_NHP) for ``dataset``; Shapes3D's for datasets the authors did not run."""
    return TRIPOD_LAMBDAS.get(dataset, TRIPOD_LAMBDAS["shapes3d"])


class Tripod(QuantizedAutoencoder):
    """FSQ (L levels) autoencoder with KLM and NHP on Tripod's residual encoder / decoder (GELU throughout).
    encode -> z_q (n, d) in [-1, 1]. Defaults are the authors' (Shapes3D lambdas; see :data:`TRIPOD_LAMBDAS`).
    The encoder sees images in [-1, 1] (the authors' datasets), the BCE target is the [0, 1] image.
    loss = BCE + lambda_klm * KLM(z_q; std of the continuous z) + lambda_nhp * NHP(decoder activations).

    Examples:
        >>> import torch
        >>> from qkernels.models import Tripod
        >>> model = Tripod((1, 16, 16), 3, levels=5)
        >>> x = torch.rand(4, 1, 16, 16)
        >>> sorted(model.loss(x, step=0))
        ['klm', 'nhp', 'recon', 'total']
        >>> z = model.encode(x)  # FSQ values: 2 i / (L - 1) - 1
        >>> z.shape, bool(((z + 1) * 2 == ((z + 1) * 2).round()).all())
        (torch.Size([4, 3]), True)
    """

    input_map = "signed"

    def __init__(
        self,
        obs_shape,
        num_latents: int,
        *,
        levels: int = 12,
        lambda_klm: float = 1e-4,
        lambda_nhp: float = 1e-2,
        num_perturbations: int = 2,
        eps: float = 0.1,
        arch: str = "small",
        recon: str = "bce_mean",
    ) -> None:
        super().__init__()
        self.num_latents, self.recon, self.levels = num_latents, recon, levels
        self.lambda_klm, self.lambda_nhp = lambda_klm, lambda_nhp
        self.num_perturbations, self.eps = num_perturbations, eps
        self.encoder, self.decoder = build_encoder_decoder("tripod", arch, tuple(obs_shape), num_latents, num_latents)
        self.quantizer = FSQ(levels)

    def latent_values(self, z: torch.Tensor, n: int = 9) -> list[torch.Tensor]:
        grid = torch.linspace(-1, 1, self.levels)
        return [grid.clone() for _ in range(self.num_latents)]

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        z = self.encoder(self.inputs(x))
        z_q = self.quantizer(z).z_q
        t = torch.tanh(z)  # the std of the global batch's continuous latents under data parallelism
        std = (t if self.kde_group is None else gather_rows(t, self.kde_group)).std(dim=0, unbiased=False) + 1e-6
        rec = self.reconstruction(self.decoder(z_q), x)
        terms = {"recon": rec}
        total = rec
        if self.lambda_klm > 0:
            terms["klm"] = klm_loss(z_q, std=std, group=self.kde_group)
            total = total + self.lambda_klm * terms["klm"]
        if self.lambda_nhp > 0:
            terms["nhp"] = normalized_hessian_penalty(
                lambda u: self.decoder(u, return_activations=True)[1],
                z_q,
                std,
                num_perturbations=self.num_perturbations,
                eps=self.eps,
                group=self.dp_group,
            )
            total = total + self.lambda_nhp * terms["nhp"]
        terms["total"] = total
        return terms
