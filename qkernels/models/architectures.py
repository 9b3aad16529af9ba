"""Encoders and decoders of the five papers, with width/depth as arguments.

* :class:`QLAEEncoder` / :class:`AdaINDecoder`: QLAE App. C.3 (conv encoder with instance norm; StyleGAN-like
  decoder whose style-decoding layers are modulated by AdaIN from w = MLP(z)). Used by ae, qlae, tripod.
* :class:`DLibEncoder` / :class:`DLibDecoder`: the disentanglement_lib conv VAE (Locatello et al. 2019; Cliff
  App. G.3). Used by the VAE family, qvae/factorqvae, dvae/factordvae, cliff_vae.
* :class:`MLP`: Cliff App. G.1 (2-50-100-50-2, tanh) for 2-D data.

Images are (n, C, S, S) with S = 4 * 2**len(widths); presets: :func:`preset` ("paper" or "small").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


def num_blocks(image_size: int) -> int:
    """Down/up-sampling stages from ``image_size`` to 4x4 (image_size must be 4 * 2**k, k >= 1)."""
    k = math.log2(image_size / 4)
    if image_size < 8 or k != int(k):
        raise ValueError(f"image_size must be 4 * 2**k with k >= 1 (8, 16, 32, 64, ...), got {image_size}")
    return int(k)


def preset(family: str, size: str, image_size: int) -> dict:
    """Architecture kwargs: ``family`` "qlae" or "dlib", ``size`` "paper" or "small".

    paper: QLAE widths 32-64-128-256 (+ dense 256), disentanglement_lib 32-32-64-64 (+ dense 256) at 64x64.
    small: a quarter of the QLAE widths / half the dlib widths and dense 64, for CPU runs.
    """
    n = num_blocks(image_size)
    if size not in ("paper", "small"):
        raise ValueError(f"arch size must be 'paper' or 'small', got {size!r}")
    if family == "qlae":
        base, dense = (32, 256) if size == "paper" else (8, 64)
        return {"widths": tuple(base * 2**i for i in range(n)), "dense": dense}
    if family == "dlib":
        full = (32, 32, 64, 64) if size == "paper" else (16, 16, 32, 32)
        widths = tuple(full[-n:]) if n <= 4 else full + (full[-1],) * (n - 4)
        return {"widths": widths, "dense": 256 if size == "paper" else 64}
    raise ValueError(f"unknown architecture family {family!r}")


class QLAEEncoder(nn.Module):
    """(n, C, S, S) -> (n, out_dim). Per block of width w: 2 x [conv3 s1, LeakyReLU(0.3), InstanceNorm]
    then [conv4 s2, LeakyReLU(0.3), InstanceNorm]; flatten; 2 dense ReLU layers; affine output."""

    def __init__(self, in_channels: int, image_size: int, out_dim: int, *, widths: Sequence[int] = (32, 64, 128, 256),
                 dense: int = 256) -> None:
        super().__init__()
        if len(widths) != num_blocks(image_size):
            raise ValueError(f"{len(widths)} widths for image_size {image_size} (need {num_blocks(image_size)})")
        layers: list[nn.Module] = []
        c = in_channels
        for w in widths:
            for k, s, p in ((3, 1, 1), (3, 1, 1), (4, 2, 1)):
                layers += [nn.Conv2d(c, w, k, s, p), nn.LeakyReLU(0.3), nn.InstanceNorm2d(w, affine=True)]
                c = w
        self.conv = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(c * 16, dense), nn.ReLU(), nn.Linear(dense, dense),
                                  nn.ReLU(), nn.Linear(dense, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x))


class StyleLayer(nn.Module):
    """Transposed conv -> LeakyReLU(0.3) -> AdaIN with per-channel scale/bias = affine(w)."""

    def __init__(self, c_in: int, c_out: int, w_dim: int, kernel: int, stride: int, padding: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose2d(c_in, c_out, kernel, stride, padding)
        self.act = nn.LeakyReLU(0.3)
        self.norm = nn.InstanceNorm2d(c_out, affine=False)
        self.style = nn.Linear(w_dim, 2 * c_out)
        nn.init.zeros_(self.style.bias)  # scale = 1 + affine(w): starts near plain instance norm

    def forward(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        scale, bias = self.style(w).chunk(2, dim=1)
        return self.norm(self.act(self.conv(h))) * (1 + scale[:, :, None, None]) + bias[:, :, None, None]


class AdaINDecoder(nn.Module):
    """(n, d) -> logits (n, C, S, S). w = 2 dense ReLU layers of z; a learned (widths[0], 4, 4) input map (init 0.1);
    per block: 2 resolution-preserving style layers (k3 s1) + 1 upsampling style layer (k4 s2); 1x1 conv out.

    ``forward(z, return_activations=True)`` also returns the block outputs, the activations Tripod's NHP
    regularizes (not the output logits).
    """

    def __init__(self, latent_dim: int, out_channels: int, image_size: int, *,
                 widths: Sequence[int] = (256, 128, 64, 32), dense: int = 256) -> None:
        super().__init__()
        if len(widths) != num_blocks(image_size):
            raise ValueError(f"{len(widths)} widths for image_size {image_size} (need {num_blocks(image_size)})")
        self.mapping = nn.Sequential(nn.Linear(latent_dim, dense), nn.ReLU(), nn.Linear(dense, dense), nn.ReLU())
        self.start = nn.Parameter(torch.full((widths[0], 4, 4), 0.1))
        self.blocks = nn.ModuleList()
        c = widths[0]
        for w in widths:
            self.blocks.append(nn.ModuleList([StyleLayer(c, w, dense, 3, 1, 1), StyleLayer(w, w, dense, 3, 1, 1),
                                              StyleLayer(w, w, dense, 4, 2, 1)]))
            c = w
        self.out = nn.Conv2d(c, out_channels, 1)

    def forward(self, z: torch.Tensor, return_activations: bool = False):
        w = self.mapping(z)
        h = self.start.expand(z.shape[0], *self.start.shape)
        acts = []
        for block in self.blocks:
            for layer in block:
                h = layer(h, w)
            acts.append(h)
        out = self.out(h)
        return (out, acts) if return_activations else out


class DLibEncoder(nn.Module):
    """(n, C, S, S) -> (n, out_dim): conv4 s2 + ReLU per width, flatten, FC dense + ReLU, affine output."""

    def __init__(self, in_channels: int, image_size: int, out_dim: int, *, widths: Sequence[int] = (32, 32, 64, 64),
                 dense: int = 256) -> None:
        super().__init__()
        if len(widths) != num_blocks(image_size):
            raise ValueError(f"{len(widths)} widths for image_size {image_size} (need {num_blocks(image_size)})")
        layers: list[nn.Module] = []
        c = in_channels
        for w in widths:
            layers += [nn.Conv2d(c, w, 4, 2, 1), nn.ReLU()]
            c = w
        self.net = nn.Sequential(*layers, nn.Flatten(), nn.Linear(c * 16, dense), nn.ReLU(), nn.Linear(dense, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DLibDecoder(nn.Module):
    """(n, d) -> logits (n, C, S, S): FC dense + ReLU, FC (widths[-1], 4, 4) + ReLU, upconv4 s2 + ReLU per width
    (reversed), last upconv to C channels without activation."""

    def __init__(self, latent_dim: int, out_channels: int, image_size: int, *,
                 widths: Sequence[int] = (32, 32, 64, 64), dense: int = 256) -> None:
        super().__init__()
        if len(widths) != num_blocks(image_size):
            raise ValueError(f"{len(widths)} widths for image_size {image_size} (need {num_blocks(image_size)})")
        rev = list(widths)[::-1]
        self.c0 = rev[0]
        self.fc = nn.Sequential(nn.Linear(latent_dim, dense), nn.ReLU(), nn.Linear(dense, rev[0] * 16), nn.ReLU())
        layers: list[nn.Module] = []
        outs = rev[1:] + [out_channels]
        for i, (ci, co) in enumerate(zip(rev, outs, strict=True)):
            layers.append(nn.ConvTranspose2d(ci, co, 4, 2, 1))
            if i < len(outs) - 1:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(self.fc(z).view(z.shape[0], self.c0, 4, 4))


class MLP(nn.Module):
    """Fully connected net, tanh between layers (Cliff App. G.1: sizes (2, 50, 100, 50, 2)). (n, sizes[0]) ->
    (n, sizes[-1])."""

    def __init__(self, sizes: Sequence[int] = (2, 50, 100, 50, 2), activation: type[nn.Module] = nn.Tanh) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(activation())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
