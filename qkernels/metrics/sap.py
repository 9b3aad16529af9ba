"""SAP score (Kumar et al., 2018), as in disentanglement_lib."""

from __future__ import annotations

import warnings

import numpy as np

from qkernels._extras import optional, require
from qkernels.metrics._common import (
    check_latents,
    check_seed,
    check_sources,
    label_encode,
    split_indices,
)

NEEDS = ("sklearn",)  # the metrics extra: checked when sap runs, so that this module imports without it
with optional():
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.svm import LinearSVC


def sap(
    sources,
    latents,
    *,
    continuous_factors: bool = False,
    num_train: int = 10000,
    num_test: int = 5000,
    seed: int = 0,
) -> dict:
    """SAP = mean over sources of the gap between the two best single-latent scores.

    Score of (latent j, source i): ``continuous_factors=False`` (disentanglement_lib's default)
    -> held-out accuracy of ``LinearSVC(C=0.01, class_weight="balanced")`` on latent j alone
    (split as in ``dci``); ``True`` -> squared correlation (R^2) on all rows, 0 for a constant
    latent. ``sources`` ``(N, n_s)`` int, ``latents`` ``(N, n_z)``. Returns ``{"sap": float}``.

    Examples:
        R^2 is 1 with a source's copy and 0 with the other (independent) source: the gap is 1.

        >>> import torch
        >>> from qkernels.metrics import sap
        >>> s = torch.cartesian_prod(torch.arange(4), torch.arange(4))  # (16, 2) int64
        >>> round(sap(s, s.flip(1).float(), continuous_factors=True)["sap"], 6)
        1.0
    """
    require("qkernels.metrics.sap", "metrics", *NEEDS)
    s = check_sources(sources)
    n = s.shape[0]
    z = check_latents(latents, n).astype(np.float64)
    seed = check_seed(seed)
    if continuous_factors:
        score = _squared_correlation(s.astype(np.float64), z)
    else:
        s_codes, _ = label_encode(s)
        tr, te = split_indices(n, num_train, num_test, seed)
        score = np.zeros((s.shape[1], z.shape[1]))
        for i in range(s.shape[1]):
            for j in range(z.shape[1]):
                score[i, j] = _svc_accuracy(z[tr, j], s_codes[tr, i], z[te, j], s_codes[te, i], seed)
    top = -np.sort(-score, axis=1)
    second = top[:, 1] if top.shape[1] > 1 else np.zeros(top.shape[0])
    return {"sap": float(np.mean(top[:, 0] - second))}


def _squared_correlation(s: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``(n_s, n_z)`` squared Pearson correlation; 0 for a latent of variance <= 1e-12 or a
    constant source."""
    s = s - s.mean(0)
    z = z - z.mean(0)
    n = s.shape[0]
    var_s, var_z = (s * s).sum(0) / n, (z * z).sum(0) / n
    cov = s.T @ z / n
    ok = (var_s[:, None] > 0) & (var_z[None, :] > 1e-12)
    denom = np.where(ok, var_s[:, None] * var_z[None, :], 1.0)
    return np.where(ok, cov**2 / denom, 0.0)


def _svc_accuracy(x_tr, y_tr, x_te, y_te, seed) -> float:
    if np.unique(y_tr).size < 2:
        return float(np.mean(y_te == y_tr[0]))
    clf = LinearSVC(C=0.01, class_weight="balanced", random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x_tr[:, None], y_tr)
    return float(np.mean(clf.predict(x_te[:, None]) == y_te))
