"""Mutual information gap (Chen et al., 2018), as in disentanglement_lib."""

from __future__ import annotations

import numpy as np

from qkernels.metrics._common import (
    check_latents,
    check_sources,
    discrete_mutual_info,
    entropy,
    histogram_discretize,
    label_encode,
)


def binned_mutual_info(sources, latents, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Plug-in MI ``(n_s, n_z)`` between label-encoded sources and latents discretized into
    ``num_bins`` equal-width bins per latent (disentanglement_lib's ``_histogram_discretize``),
    and the sources' entropies ``(n_s,)``."""
    s = check_sources(sources)
    z = check_latents(latents, s.shape[0])
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 2:
        raise ValueError(f"num_bins must be an int >= 2, got {num_bins!r}")
    s_codes, s_sizes = label_encode(s)
    z_codes, z_sizes = histogram_discretize(z, int(num_bins))
    return discrete_mutual_info(s_codes, s_sizes, z_codes, z_sizes), entropy(s_codes, s_sizes)


def mig(sources, latents, *, num_bins: int = 20) -> dict:
    """MIG = mean over sources of (largest - second largest MI with a latent) / H(source).

    ``sources`` ``(N, n_s)`` int, ``latents`` ``(N, n_z)``, binned into ``num_bins`` (default 20,
    disentanglement_lib's). With a single latent the second largest MI is 0. A constant source is
    an error (its entropy is 0). Returns ``{"mig": float}`` in [0, 1].

    Examples:
        On a complete grid the two sources are independent, so each latent copy has MI H(s) with its
        source and 0 with the other: MIG = 1.

        >>> import torch
        >>> from qkernels.metrics import mig
        >>> s = torch.cartesian_prod(torch.arange(4), torch.arange(4))  # (16, 2) int64
        >>> mig(s, s.flip(1).float())
        {'mig': 1.0}
    """
    mi, h = binned_mutual_info(sources, latents, num_bins)
    if np.any(h <= 0):
        raise ValueError(f"sources columns {np.flatnonzero(h <= 0).tolist()} are constant: MIG divides by H(source)")
    top = -np.sort(-mi, axis=1)
    second = top[:, 1] if top.shape[1] > 1 else np.zeros(top.shape[0])
    return {"mig": float(np.mean((top[:, 0] - second) / h))}
