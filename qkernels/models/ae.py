"""Plain autoencoder and QLAE (Hsu et al., NeurIPS 2023): conv encoder + AdaIN decoder, BCE on logits."""

from __future__ import annotations

import torch

from qkernels.models.base import Method, QuantizedAutoencoder, build_encoder_decoder
from qkernels.nn.quantize import LatentQuantizer


class AE(Method):
    """Deterministic autoencoder: z = enc(x) (n, d); loss = BCE(dec(z), x) (mean over elements).

    ``obs_shape``: (C, S, S) images in [0, 1] with S = 4 * 2**k (k >= 1); ``arch``: "small" or "paper";
    ``family``: the backbone ("qlae", "tripod", "dlib").

    Examples:
        >>> import torch
        >>> from qkernels.models import AE
        >>> model = AE((1, 16, 16), 3)
        >>> x = torch.rand(4, 1, 16, 16)
        >>> model.encode(x).shape, model.decode(model.encode(x)).shape
        (torch.Size([4, 3]), torch.Size([4, 1, 16, 16]))
        >>> sorted(model.loss(x, step=0))
        ['recon', 'total']
    """

    def __init__(
        self, obs_shape, num_latents: int, *, arch: str = "small", family: str = "qlae", recon: str = "bce_mean"
    ) -> None:
        super().__init__()
        self.num_latents, self.recon = num_latents, recon
        self.encoder, self.decoder = build_encoder_decoder(family, arch, tuple(obs_shape), num_latents, num_latents)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.inputs(x))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.image(self.decoder(z))

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        rec = self.reconstruction(self.decoder(self.encoder(self.inputs(x))), x)
        return {"total": rec, "recon": rec}


class QLAE(QuantizedAutoencoder):
    """Latent-quantized autoencoder: per-latent learnable codebooks of ``num_values`` (init linspace(-0.5, 0.5)),
    straight-through nearest value; loss = BCE + w_q * quantize + w_c * commit (both 0.01).
    Weight decay (AdamW, 0.1 in the authors' runs) applies to weights only, not biases or codebook values.

    Examples:
        >>> import torch
        >>> from qkernels.models import QLAE
        >>> model = QLAE((1, 16, 16), 3, num_values=5)
        >>> x = torch.rand(4, 1, 16, 16)
        >>> sorted(model.loss(x, step=0))
        ['commit', 'quantize', 'recon', 'total']
        >>> z = model.encode(x)  # (n, d) codebook values
        >>> bool(torch.isin(z, model.quantizer.values).all())
        True
    """

    def __init__(
        self,
        obs_shape,
        num_latents: int,
        *,
        num_values: int = 10,
        arch: str = "small",
        weight_quantize: float = 0.01,
        weight_commit: float = 0.01,
        recon: str = "bce_mean",
    ) -> None:
        super().__init__()
        self.num_latents, self.recon = num_latents, recon
        self.weight_quantize, self.weight_commit = weight_quantize, weight_commit
        self.encoder, self.decoder = build_encoder_decoder("qlae", arch, tuple(obs_shape), num_latents, num_latents)
        self.quantizer = LatentQuantizer(num_latents, num_values)

    def latent_values(self, z: torch.Tensor, n: int = 9) -> list[torch.Tensor]:
        return [v.sort().values for v in self.quantizer.values.detach()]

    def loss(self, x: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        q = self.quantizer(self.encoder(self.inputs(x)))
        rec = self.reconstruction(self.decoder(q.z_q), x)
        total = rec + self.weight_quantize * q.loss_quantize + self.weight_commit * q.loss_commit
        return {"total": total, "recon": rec, "quantize": q.loss_quantize, "commit": q.loss_commit}
