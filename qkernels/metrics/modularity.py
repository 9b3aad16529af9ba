"""Modularity (Ridgeway & Mozer, 2018), as in disentanglement_lib."""

from __future__ import annotations

import numpy as np

from qkernels.metrics.mig import binned_mutual_info


def modularity(sources, latents, *, num_bins: int = 20) -> dict:
    """Mean over latents of 1 - delta_j, where for latent j with MI row m_j (over sources, binned
    as in ``mig``) and theta_j = max_i m_ji:
    delta_j = sum_{i != argmax} m_ji^2 / (theta_j^2 (n_s - 1)).

    A latent with no information (theta_j = 0) scores 0; with one source every informative latent
    scores 1. ``sources`` ``(N, n_s)`` int, ``latents`` ``(N, n_z)``. Returns
    ``{"modularity": float}`` in [0, 1].

    Examples:
        Each latent a copy of one of two independent sources: delta_j = 0.

        >>> import torch
        >>> from qkernels.metrics import modularity
        >>> s = torch.cartesian_prod(torch.arange(4), torch.arange(4))  # (16, 2) int64
        >>> modularity(s, s.flip(1).float())
        {'modularity': 1.0}
    """
    mi, _ = binned_mutual_info(sources, latents, num_bins)
    sq = mi.T**2  # (n_z, n_s)
    n_s = sq.shape[1]
    theta = sq.max(1)
    if n_s == 1:
        return {"modularity": float(np.mean(theta > 0))}
    delta = (sq.sum(1) - theta) / np.where(theta > 0, theta, 1.0) / (n_s - 1)
    score = np.where(theta > 0, 1.0 - delta, 0.0)
    return {"modularity": float(score.mean())}
