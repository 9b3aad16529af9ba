"""Reconstruction quality: MSE and PSNR."""

from __future__ import annotations

import math

import torch

from qkernels._validation import check_tensor


def _pair(x, x_hat) -> tuple[torch.Tensor, torch.Tensor]:
    check_tensor("x", x, min_ndim=1)
    check_tensor("x_hat", x_hat, min_ndim=1)
    if x.shape != x_hat.shape:
        raise ValueError(f"x_hat has shape {tuple(x_hat.shape)} but x has {tuple(x.shape)}")
    if x.device != x_hat.device:
        raise ValueError(f"x is on {x.device} but x_hat is on {x_hat.device}")
    return x.double(), x_hat.double()


def mse(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Mean squared error over all elements of ``x`` and ``x_hat`` (same shape, float); a Python float.

    Examples:
        >>> import torch
        >>> from qkernels.metrics import mse
        >>> x = torch.zeros(2, 3, 4, 4)
        >>> round(mse(x, x + 0.1), 6)  # 0.1^2
        0.01
    """
    x, x_hat = _pair(x, x_hat)
    return float(torch.mean((x - x_hat) ** 2))


def psnr(x: torch.Tensor, x_hat: torch.Tensor, *, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB, averaged over the batch.

    ``x``, ``x_hat`` ``(B, ...)`` float; per sample 10 log10(data_range^2 / MSE over its
    elements), then the mean over the B samples. A perfectly reconstructed sample has infinite
    PSNR (so then does the mean). Returns a Python float.

    Examples:
        >>> import torch
        >>> from qkernels.metrics import psnr
        >>> x = torch.zeros(2, 3, 4, 4)
        >>> round(psnr(x, x + 0.1), 4)  # 10 log10(1 / 0.01)
        20.0
        >>> psnr(x, x)
        inf
    """
    x, x_hat = _pair(x, x_hat)
    if not data_range > 0:
        raise ValueError(f"data_range must be > 0, got {data_range}")
    per = torch.mean((x - x_hat).reshape(x.shape[0], -1) ** 2, dim=1)
    db = 10.0 * (2.0 * math.log10(data_range) - torch.log10(per))
    return float(db.mean())


def psnr_uint8(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Tripod's PSNR in dB, as its authors compute it for their checkpoint filter: wrapped uint8 arithmetic.

    ``x``, ``x_hat`` ``(B, ...)`` images in [0, 1]. Each is mapped to uint8 by truncating 255 * clip(x, 0, 1)
    (tripod ``scripts/train_autoencoder.py`` lines 38-43, ``batched_x_to_image``); per image the error
    ``x_hat - x`` and its square are taken in uint8, i.e. modulo 256, then averaged (``disentangle/metrics/
    image.py`` lines 5-11: ``jnp.mean(jnp.square(x_pred - x_true))`` on uint8 arrays), and 20 log10(255) -
    10 log10(that mean) is averaged over the B images (``scripts/train_autoencoder.py`` lines 120-123, 133).
    An error of 16 levels or more wraps (its square modulo 256 is smaller), so this is never below
    :func:`psnr` on the same uint8 images and never below 10 log10(255) = 24.07 dB. A Python float.

    Examples:
        >>> import torch
        >>> from qkernels.metrics.image import psnr_uint8
        >>> x = torch.zeros(1, 3, 4, 4)
        >>> round(psnr_uint8(x, x + 2 / 255 + 1e-6), 2)  # 2 levels: 20 log10(255) - 10 log10(4)
        42.11
        >>> round(psnr_uint8(x, x + 16 / 255 + 1e-6), 2)  # 16 levels: 256 wraps to 0, an exact match
        inf
    """
    x, x_hat = _pair(x, x_hat)
    as_uint8 = [torch.floor(255.0 * v.clamp(0.0, 1.0)).to(torch.int64) for v in (x_hat, x)]
    err = (as_uint8[0] - as_uint8[1]) % 256
    per = ((err * err) % 256).reshape(x.shape[0], -1).double().mean(dim=1)
    db = 20.0 * math.log10(255.0) - 10.0 * torch.log10(per)
    return float(db.mean())
