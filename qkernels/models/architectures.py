"""Encoders and decoders of the five papers, with width/depth as arguments.

* :class:`QLAEEncoder` / :class:`AdaINDecoder`: QLAE App. C.3 and latent_quantization's code (conv encoder with
  instance norm; StyleGAN-like decoder whose layers are modulated by AdaIN from w = MLP(z)). Used by ae, qlae.
* :class:`ResidualEncoder` / :class:`ResidualDecoder`: Tripod's code (residual conv nets, GELU, AdaIN-conditioned
  decoder blocks). Used by tripod.
* :class:`DLibEncoder` / :class:`DLibDecoder`: the disentanglement_lib conv VAE (Locatello et al. 2019). Family
  ``"dlib"``: disentanglement_lib's code, whose third and fourth convolutions are 2 x 2 (as D-VAE's lddr
  ``run.py`` lines 207-220): the VAE family and dvae/factordvae. Family ``"dlib_4x4"``: Locatello et al.'s table as
  Cliff App. G.3 prints it, every convolution 4 x 4: cliff_vae, and qvae/factorqvae at the small width.
* :class:`DalleEncoder` / :class:`DalleDecoder`: FactorQVAE's DALL-E-style residual nets (``--arch paper`` of
  qvae/factorqvae), initialized N(0, 0.02) by :func:`init_normal_`.
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


def _check_widths(widths: Sequence[int], image_size: int) -> None:
    if len(widths) != num_blocks(image_size):
        raise ValueError(f"{len(widths)} widths for image_size {image_size} (need {num_blocks(image_size)})")


def preset(family: str, size: str, image_size: int) -> dict:
    """Architecture kwargs: ``family`` "qlae", "tripod" or "dlib", ``size`` "paper" or "small".

    paper at 64x64: QLAE widths 32-64-128-256 (+ dense 256); Tripod encoder 32-64-128-256 (decoder 512-256-128-64,
    cond 256); disentanglement_lib 32-32-64-64 (+ dense 256). Smaller images drop the first stages' widths.
    small: a quarter of the QLAE / Tripod widths, half the dlib widths, dense 64, for CPU runs. The dlib families
    also give the encoder's kernel sizes (``"kernels"``, the same rule as the widths): 4-4-2-2 (``"dlib"``) or
    4-4-4-4 (``"dlib_4x4"``).

    Returns:
        A dict of keyword arguments (``widths``, and ``dense`` where the family has one) for the family's
        encoder / decoder.

    Raises:
        ValueError: an unknown family or size, or an image size that is not 4 * 2**k (k >= 1).

    Examples:
        >>> from qkernels.models import preset
        >>> preset("dlib", "paper", 64)
        {'widths': (32, 32, 64, 64), 'dense': 256, 'kernels': (4, 4, 2, 2)}
        >>> preset("qlae", "small", 32)  # 32 -> 4 in three stages: three widths
        {'widths': (8, 16, 32), 'dense': 64}
    """
    n = num_blocks(image_size)
    if size not in ("paper", "small"):
        raise ValueError(f"arch size must be 'paper' or 'small', got {size!r}")
    if family in ("qlae", "tripod"):
        base, dense = (32, 256) if size == "paper" else (8, 64)
        return {"widths": tuple(base * 2**i for i in range(n)), "dense": dense}
    if family in ("dlib", "dlib_4x4"):
        full = (32, 32, 64, 64) if size == "paper" else (16, 16, 32, 32)
        kernels = (4, 4, 2, 2) if family == "dlib" else (4, 4, 4, 4)

        def fit(t: tuple) -> tuple:
            return tuple(t[-n:]) if n <= 4 else t + (t[-1],) * (n - 4)

        return {"widths": fit(full), "dense": 256 if size == "paper" else 64, "kernels": fit(kernels)}
    raise ValueError(f"unknown architecture family {family!r}")


class QLAEEncoder(nn.Module):
    """(n, C, S, S) -> (n, out_dim). Per block of width w: 2 x conv3 s1 then conv4 s2, each conv (no bias) ->
    InstanceNorm (affine, eps 1e-6) -> LeakyReLU(0.2); flatten; 2 dense ReLU layers; affine output
    (latent_quantization ``configs/encoder_partial/image.yaml``, ``blocks/conv.py``, ``blocks/utils.py``).

    Examples:
        >>> import torch
        >>> from qkernels.models import QLAEEncoder
        >>> encoder = QLAEEncoder(3, 16, 6, widths=(8, 16), dense=32)  # (C, S, out_dim)
        >>> encoder(torch.rand(2, 3, 16, 16)).shape
        torch.Size([2, 6])
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int,
        out_dim: int,
        *,
        widths: Sequence[int] = (32, 64, 128, 256),
        dense: int = 256,
    ) -> None:
        super().__init__()
        _check_widths(widths, image_size)
        layers: list[nn.Module] = []
        c = in_channels
        for w in widths:
            for k, s, p in ((3, 1, 1), (3, 1, 1), (4, 2, 1)):
                layers += [
                    nn.Conv2d(c, w, k, s, p, bias=False),
                    nn.InstanceNorm2d(w, eps=1e-6, affine=True),
                    nn.LeakyReLU(0.2),
                ]
                c = w
        self.conv = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(c * 16, dense),
            nn.ReLU(),
            nn.Linear(dense, dense),
            nn.ReLU(),
            nn.Linear(dense, out_dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x))


class StyleLayer(nn.Module):
    """Transposed conv (no bias) -> LeakyReLU(0.2) -> instance norm (eps 1e-6) -> h * ReLU(A w + a) + ReLU(B w + b)
    (latent_quantization ``blocks/style.py``: the conditioning is a dense block with its default ReLU). The
    transposed conv is initialized as equinox's (:func:`init_equinox_conv_transpose_`; ``blocks/conv_transpose.py``
    lines 12-14 build an ``eqx.nn.ConvTranspose2d`` with its default initialization)."""

    def __init__(self, c_in: int, c_out: int, w_dim: int, kernel: int, stride: int, padding: int) -> None:
        super().__init__()
        self.conv = init_equinox_conv_transpose_(nn.ConvTranspose2d(c_in, c_out, kernel, stride, padding, bias=False))
        self.act = nn.LeakyReLU(0.2)
        self.norm = nn.InstanceNorm2d(c_out, eps=1e-6, affine=False)
        self.style = nn.Sequential(nn.Linear(w_dim, 2 * c_out), nn.ReLU())

    def forward(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        scale, bias = self.style(w).chunk(2, dim=1)
        return self.norm(self.act(self.conv(h))) * scale[:, :, None, None] + bias[:, :, None, None]


class AdaINDecoder(nn.Module):
    """QLAE's decoder (latent_quantization ``decoders/style_image.py``, ``configs/decoder_partial/style_image.yaml``):
    (n, d) -> logits (n, C, S, S). w = 2 dense ReLU layers of z; a learned (widths[0], 4, 4) input map (init 0.1);
    per block: 2 resolution-preserving style layers (k3 s1) + 1 upsampling style layer (k4 s2); a 3x3 output conv
    without bias.

    Examples:
        >>> import torch
        >>> from qkernels.models import AdaINDecoder
        >>> decoder = AdaINDecoder(6, 3, 16, widths=(16, 8), dense=32)  # (d, C, S)
        >>> decoder(torch.randn(2, 6)).shape
        torch.Size([2, 3, 16, 16])
    """

    def __init__(
        self,
        latent_dim: int,
        out_channels: int,
        image_size: int,
        *,
        widths: Sequence[int] = (256, 128, 64, 32),
        dense: int = 256,
    ) -> None:
        super().__init__()
        _check_widths(widths, image_size)
        self.mapping = nn.Sequential(nn.Linear(latent_dim, dense), nn.ReLU(), nn.Linear(dense, dense), nn.ReLU())
        self.start = nn.Parameter(torch.full((widths[0], 4, 4), 0.1))
        layers: list[StyleLayer] = []
        c = widths[0]
        for w in widths:
            layers += [
                StyleLayer(c, w, dense, 3, 1, 1),
                StyleLayer(w, w, dense, 3, 1, 1),
                StyleLayer(w, w, dense, 4, 2, 1),
            ]
            c = w
        self.layers = nn.ModuleList(layers)
        self.out = nn.Conv2d(c, out_channels, 3, 1, 1, bias=False)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        w = self.mapping(z)
        h = self.start.expand(z.shape[0], *self.start.shape)
        for layer in self.layers:
            h = layer(h, w)
        return self.out(h)


def _gelu() -> nn.Module:
    return nn.GELU(approximate="tanh")  # jax.nn.gelu's default


def _linear_ln_gelu(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(c_in, c_out), nn.LayerNorm(c_out), _gelu())


class _ConvINGELU(nn.Sequential):
    """conv3 -> InstanceNorm (affine) -> GELU (Tripod ``nn/layers.py`` ConvINAct)."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__(nn.Conv2d(c_in, c_out, 3, 1, 1), nn.InstanceNorm2d(c_out, affine=True), _gelu())


class _ResBlock(nn.Module):
    """identity(x) + ConvINGELU(ConvINGELU(x)), identity a 1x1 conv when the width changes (Tripod ResConvBlock)."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.body = nn.Sequential(_ConvINGELU(c_in, c_out), _ConvINGELU(c_out, c_out))
        self.identity = nn.Identity() if c_in == c_out else nn.Conv2d(c_in, c_out, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.identity(x) + self.body(x)


class _ConvAdaINGELU(nn.Module):
    """conv3 -> instance norm -> h (1 + scale) + shift, (scale, shift) = Linear(cond) -> GELU (Tripod ConvAdaINAct)."""

    def __init__(self, cond: int, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)
        self.norm = nn.InstanceNorm2d(c, affine=False)
        self.proj = nn.Linear(cond, 2 * c)
        self.act = _gelu()

    def forward(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.proj(cond).chunk(2, dim=1)
        return self.act(self.norm(self.conv(h)) * (1 + scale[:, :, None, None]) + shift[:, :, None, None])


class _ResCondBlock(nn.Module):
    """h + ConvAdaINGELU(ConvAdaINGELU(h, cond), cond) (Tripod ResCondConvBlock)."""

    def __init__(self, cond: int, c: int) -> None:
        super().__init__()
        self.a, self.b = _ConvAdaINGELU(cond, c), _ConvAdaINGELU(cond, c)

    def forward(self, h: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        return h + self.b(self.a(h, cond), cond)


class ResidualEncoder(nn.Module):
    """Tripod's encoder (``nn/encoder.py``): (n, C, S, S) -> (n, out_dim). Per width w: 2 residual blocks (the
    first projects its input to w), then space-to-depth x2 + 1x1 conv to 2w channels; global mean pool;
    Linear-LayerNorm-GELU; affine output. GELU is the tanh approximation (jax's default).

    Examples:
        >>> import torch
        >>> from qkernels.models import ResidualEncoder
        >>> encoder = ResidualEncoder(3, 16, 6, widths=(8, 16))  # (C, S, out_dim)
        >>> encoder(torch.rand(2, 3, 16, 16)).shape
        torch.Size([2, 6])
    """

    def __init__(
        self, in_channels: int, image_size: int, out_dim: int, *, widths: Sequence[int] = (32, 64, 128, 256)
    ) -> None:
        super().__init__()
        _check_widths(widths, image_size)
        layers: list[nn.Module] = []
        c = in_channels
        for w in widths:
            layers += [_ResBlock(c, w), _ResBlock(w, w), nn.PixelUnshuffle(2), nn.Conv2d(4 * w, 2 * w, 1)]
            c = 2 * w
        self.conv = nn.Sequential(*layers)
        self.head = nn.Sequential(_linear_ln_gelu(c, c), nn.Linear(c, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).mean(dim=(2, 3)))


class ResidualDecoder(nn.Module):
    """Tripod's decoder (``nn/decoder.py``, ``normalize_outputs: False``): (n, d) -> logits (n, C, S, S).

    cond = 2 x Linear-LayerNorm-GELU of z (width ``dense``); a learned (widths[0], 4, 4) input (init 1); per block i:
    2 conditioned residual blocks at widths[i], then nearest x2 upsampling + 3x3 conv to widths[i + 1] (the last
    block: to C, the logits). ``forward(z, return_activations=True)`` also returns the activations the authors'
    NHP regularizes (``configs/train_autoencoder.yaml``): ``{"cond", "block0", ..., "block{n-2}"}`` -- every block
    output except the last (the logits).

    Examples:
        >>> import torch
        >>> from qkernels.models import ResidualDecoder
        >>> decoder = ResidualDecoder(6, 3, 16, widths=(16, 8), dense=32)  # (d, C, S)
        >>> decoder(torch.randn(2, 6)).shape
        torch.Size([2, 3, 16, 16])
        >>> logits, acts = decoder(torch.randn(2, 6), return_activations=True)
        >>> sorted(acts)
        ['block0', 'cond']
    """

    def __init__(
        self,
        latent_dim: int,
        out_channels: int,
        image_size: int,
        *,
        widths: Sequence[int] = (512, 256, 128, 64),
        dense: int = 256,
    ) -> None:
        super().__init__()
        _check_widths(widths, image_size)
        self.cond = nn.Sequential(_linear_ln_gelu(latent_dim, dense), _linear_ln_gelu(dense, dense))
        self.start = nn.Parameter(torch.ones(widths[0], 4, 4))
        outs = [*widths[1:], out_channels]
        self.blocks = nn.ModuleList(
            nn.ModuleList(
                [
                    _ResCondBlock(dense, w),
                    _ResCondBlock(dense, w),
                    nn.Upsample(scale_factor=2.0),
                    nn.Conv2d(w, o, 3, 1, 1),
                ]
            )
            for w, o in zip(widths, outs, strict=True)
        )

    def forward(self, z: torch.Tensor, return_activations: bool = False):
        cond = self.cond(z)
        acts = {"cond": cond}
        h = self.start.expand(z.shape[0], *self.start.shape)
        for i, (res_a, res_b, up, conv) in enumerate(self.blocks):
            h = conv(up(res_b(res_a(h, cond), cond)))
            if i < len(self.blocks) - 1:
                acts[f"block{i}"] = h
        return (h, acts) if return_activations else h


class DLibEncoder(nn.Module):
    """disentanglement_lib's encoder, (n, C, S, S) -> (n, out_dim): a stride-2 conv + ReLU per width (``kernels``:
    its sizes, 4 (padding 1) or 2 (padding 0), each halving the image), flatten, FC dense + ReLU, affine output.

    Examples:
        >>> import torch
        >>> from qkernels.models import DLibEncoder
        >>> encoder = DLibEncoder(1, 16, 6, widths=(8, 8), dense=32)  # (C, S, out_dim)
        >>> encoder(torch.rand(2, 1, 16, 16)).shape
        torch.Size([2, 6])
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int,
        out_dim: int,
        *,
        widths: Sequence[int] = (32, 32, 64, 64),
        dense: int = 256,
        kernels: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        _check_widths(widths, image_size)
        kernels = (4,) * len(widths) if kernels is None else tuple(kernels)
        if len(kernels) != len(widths) or any(k not in (2, 4) for k in kernels):
            raise ValueError(f"kernels must give 2 or 4 for each of the {len(widths)} convolutions, got {kernels}")
        layers: list[nn.Module] = []
        c = in_channels
        for w, k in zip(widths, kernels, strict=True):
            layers += [nn.Conv2d(c, w, k, 2, (k - 2) // 2), nn.ReLU()]
            c = w
        self.net = nn.Sequential(*layers, nn.Flatten(), nn.Linear(c * 16, dense), nn.ReLU(), nn.Linear(dense, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DLibDecoder(nn.Module):
    """disentanglement_lib's decoder, (n, d) -> logits (n, C, S, S): FC dense + ReLU, FC (widths[-1], 4, 4) + ReLU,
    upconv4 s2 + ReLU per width (reversed), last upconv to C channels without activation. ``kernels`` (the
    encoder's, from :func:`preset`) is accepted and unused.

    Examples:
        >>> import torch
        >>> from qkernels.models import DLibDecoder
        >>> decoder = DLibDecoder(6, 1, 16, widths=(8, 8), dense=32)  # (d, C, S)
        >>> decoder(torch.randn(2, 6)).shape
        torch.Size([2, 1, 16, 16])
    """

    def __init__(
        self,
        latent_dim: int,
        out_channels: int,
        image_size: int,
        *,
        widths: Sequence[int] = (32, 32, 64, 64),
        dense: int = 256,
        kernels: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        _check_widths(widths, image_size)
        del kernels  # the encoder's (one preset() dict builds both); every dlib family's upconvs are 4 x 4
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


def init_haiku_(module: nn.Module) -> nn.Module:
    """haiku's default initialization for every Linear / Conv2d / ConvTranspose2d in ``module`` (D-VAE's lddr is
    written in haiku): weights from a normal N(0, s^2) truncated to [-2 s, 2 s], s = 1 / sqrt(fan_in), biases zero.
    fan_in: a Linear's input size (``hk.Linear``), a conv's in_channels x k x k (``hk.ConvND``: the weight's shape
    but the output channels), a transposed conv's in_channels x k x k too (``hk.ConvNDTranspose``:
    ``kernel_shape + (input_channels,)``), where torch's default takes a transposed conv's out_channels."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            fan_in = m.in_features
        elif isinstance(m, nn.Conv2d):
            fan_in = m.in_channels // m.groups * m.kernel_size[0] * m.kernel_size[1]
        elif isinstance(m, nn.ConvTranspose2d):
            fan_in = m.in_channels * m.kernel_size[0] * m.kernel_size[1]
        else:
            continue
        s = fan_in**-0.5
        nn.init.trunc_normal_(m.weight, 0.0, s, -2 * s, 2 * s)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    return module


def init_equinox_conv_transpose_(conv: nn.ConvTranspose2d) -> nn.ConvTranspose2d:
    """equinox's ``ConvTranspose`` initialization (QLAE's latent_quantization is written in equinox): weight (and
    bias) uniform in +-1 / sqrt(in_channels x k x k); torch's default bound uses out_channels instead."""
    bound = (conv.in_channels // conv.groups * conv.kernel_size[0] * conv.kernel_size[1]) ** -0.5
    nn.init.uniform_(conv.weight, -bound, bound)
    if conv.bias is not None:
        nn.init.uniform_(conv.bias, -bound, bound)
    return conv


def init_normal_(module: nn.Module, std: float = 0.02) -> nn.Module:
    """N(0, std) weights and zero biases for every Conv2d / ConvTranspose2d / Linear in ``module``
    (FactorQVAE's ``weights_init``, applied to encoder and decoder in ``models/base.py`` and to the
    discriminator)."""
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return module


class _DalleBlock(nn.Module):
    """Residual block of DALL-E's dVAE as FactorQVAE builds it (``blocks/encoder_block.py``,
    ``decoder_block.py``): id(x) + post_gain * res(x), id a 1x1 conv when the width changes,
    res = 4 x (ReLU, conv) through c_out / 4 hidden channels (encoder: 3x3, 3x3, 3x3, 1x1; decoder:
    1x1, 3x3, 3x3, 3x3), post_gain = 1 / n_layers^2 (n_layers = groups x blocks per group)."""

    def __init__(self, c_in: int, c_out: int, n_layers: int, decoder: bool) -> None:
        super().__init__()
        h = c_out // 4
        kernels = (1, 3, 3, 3) if decoder else (3, 3, 3, 1)
        chans = (c_in, h, h, h, c_out)
        layers: list[nn.Module] = []
        for k, a, b in zip(kernels, chans[:-1], chans[1:], strict=True):
            layers += [nn.ReLU(), nn.Conv2d(a, b, k, padding=k // 2)]
        self.res = nn.Sequential(*layers)
        self.id = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()
        self.post_gain = 1.0 / n_layers**2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.id(x) + self.post_gain * self.res(x)


def _dalle_stack(c: int, widths: list[int], blocks: int, decoder: bool, between) -> tuple[list[nn.Module], int]:
    """``len(widths)`` groups of ``blocks`` residual blocks, ``between()`` after every group but the last;
    returns the layers and the output width."""
    n_layers, layers = len(widths) * blocks, []
    for g, w in enumerate(widths):
        for _ in range(blocks):
            layers.append(_DalleBlock(c, w, n_layers, decoder=decoder))
            c = w
        if g < len(widths) - 1:
            layers.append(between())
    return layers, c


class DalleEncoder(nn.Module):
    """(n, C, S, S) -> (n, out_dim): FactorQVAE's encoder (``encoders/base_encoder.py``,
    ``qvae_encoder.py``): conv3 to ``channel``, ``groups`` groups of ``blocks`` residual blocks at widths
    channel * 2^g, 2x2 max-pool after every group but the last; flatten, ReLU, Linear to ``hidden``,
    ReLU, Linear, ReLU, Linear to out_dim. Paper: channel 128, 3 groups x 2 blocks, hidden 128."""

    def __init__(
        self,
        in_channels: int,
        image_size: int,
        out_dim: int,
        *,
        channel: int = 128,
        groups: int = 3,
        blocks: int = 2,
        hidden: int = 128,
    ) -> None:
        super().__init__()
        if groups < 2 or image_size % 2 ** (groups - 1):
            raise ValueError(f"image_size {image_size} must be divisible by 2**(groups - 1) = {2 ** (groups - 1)}")
        widths = [channel * 2**g for g in range(groups)]
        layers, c = _dalle_stack(channel, widths, blocks, False, lambda: nn.MaxPool2d(2))
        side = image_size // 2 ** (groups - 1)
        head = [
            nn.Flatten(),
            nn.ReLU(),
            nn.Linear(c * side * side, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, out_dim),
        ]
        self.net = nn.Sequential(nn.Conv2d(in_channels, channel, 3, padding=1), *layers, *head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class DalleDecoder(nn.Module):
    """(n, d) -> (n, C, S, S): FactorQVAE's decoder (``decoders/base_decoder.py``, ``qvae_decoder.py``):
    Linear to (``input_channel``, S / 2^(groups-1), same), ``groups`` groups of ``blocks`` residual blocks at
    widths channel * 2^g from the widest down, nearest 2x upsampling after every group but the last, ReLU,
    1x1 conv to C. Paper: channel 128, 3 groups x 2 blocks, input_channel 64."""

    def __init__(
        self,
        latent_dim: int,
        out_channels: int,
        image_size: int,
        *,
        channel: int = 128,
        groups: int = 3,
        blocks: int = 2,
        input_channel: int = 64,
    ) -> None:
        super().__init__()
        if groups < 2 or image_size % 2 ** (groups - 1):
            raise ValueError(f"image_size {image_size} must be divisible by 2**(groups - 1) = {2 ** (groups - 1)}")
        widths = [channel * 2**g for g in range(groups)][::-1]
        self.side, self.c0 = image_size // 2 ** (groups - 1), input_channel
        self.fc = nn.Linear(latent_dim, input_channel * self.side**2)
        layers, c = _dalle_stack(
            input_channel, widths, blocks, True, lambda: nn.Upsample(scale_factor=2, mode="nearest")
        )
        self.net = nn.Sequential(*layers, nn.ReLU(), nn.Conv2d(c, out_channels, 1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(self.fc(z).view(z.shape[0], self.c0, self.side, self.side))


class MLP(nn.Module):
    """Fully connected net, tanh between layers (Cliff App. G.1: sizes (2, 50, 100, 50, 2)). (n, sizes[0]) ->
    (n, sizes[-1]).

    Examples:
        >>> import torch
        >>> from qkernels.models import MLP
        >>> net = MLP((2, 8, 3))
        >>> net(torch.randn(5, 2)).shape
        torch.Size([5, 3])
    """

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
