"""Cliff on 2-D data (Cliff App. F.2, G.1): an MLP encoder x (n, 2) -> z (n, 2) trained with the Cliff loss
alone (lambda_uni 0, lambda_biv 1, lambda_KL-uni 1, sigma 0.1) to recover the axis-aligned quantized latents.

A mirrored MLP decoder is fitted on the DETACHED latents with MSE, so ``decode`` exists without changing the
encoder's objective (the paper's setting is encoder-only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from qkernels.models.architectures import MLP
from qkernels.models.base import Method
from qkernels.ops.kde import cliff_loss


class CliffAE(Method):
    """Cliff's unmixing network (App. G.1): encode = MLP(2-50-100-50-2, tanh); loss = Cliff(z) [+ decoder MSE on
    sg(z), not reaching the encoder]. Observations (n, 2) float32 (:class:`qkernels.data.QuantizedGrid2D`).

    Examples:
        >>> import torch
        >>> from qkernels.models import CliffAE
        >>> model = CliffAE()
        >>> x = torch.randn(32, 2)
        >>> model.encode(x).shape
        torch.Size([32, 2])
        >>> sorted(model.loss(x, step=0))
        ['cliff', 'decoder_mse', 'total']
    """

    recon = "mse_mean"

    def __init__(
        self,
        obs_shape=(2,),
        num_latents: int = 2,
        *,
        hidden=(50, 100, 50),
        sigma: float = 0.1,
        lambda_uni: float = 0.0,
        lambda_biv: float = 1.0,
        lambda_kl: float = 1.0,
        num_cond: int = 10,
        fit_decoder: bool = True,
    ) -> None:
        super().__init__()
        if len(tuple(obs_shape)) != 1:
            raise ValueError(
                f"cliff_ae takes vector observations (dim,), e.g. --dataset quantized_grid2d, "
                f"not images: got {tuple(obs_shape)}"
            )
        (dim,) = tuple(obs_shape)
        self.num_latents, self.fit_decoder = num_latents, fit_decoder
        self.encoder = MLP((dim, *hidden, num_latents))
        self.decoder = MLP((num_latents, *hidden[::-1], dim))
        self.cliff_kw = {
            "sigma": sigma,
            "lambda_uni": lambda_uni,
            "lambda_biv": lambda_biv,
            "lambda_kl": lambda_kl,
            "num_cond": num_cond,
        }

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.inputs(x))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        z = self.encoder(self.inputs(x))
        cliff = cliff_loss(z, group=self.kde_group, **self.cliff_kw)
        terms = {"cliff": cliff}
        total = cliff
        if self.fit_decoder:
            terms["decoder_mse"] = F.mse_loss(self.decoder(z.detach()), x)
            total = total + terms["decoder_mse"]
        terms["total"] = total
        return terms
