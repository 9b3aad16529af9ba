"""Mean correlation coefficient (MCC) with the optimal one-to-one matching (Hungarian)."""

from __future__ import annotations

import numpy as np

from qkernels._extras import optional, require
from qkernels.metrics._common import to_numpy

NEEDS = ("scipy",)  # the metrics extra: checked when mcc runs, so that this module imports without it
with optional():
    from scipy.optimize import linear_sum_assignment
    from scipy.stats import rankdata


def mcc(z_true, z_pred, *, method: str = "pearson") -> dict:
    """MCC between ``z_true`` ``(N, d)`` and ``z_pred`` ``(N, d')``.

    |correlation| for every (true, predicted) pair (``"pearson"``, or ``"spearman"`` = Pearson
    on per-column ranks, invariant to monotone maps), then the one-to-one matching that
    maximizes the total (``scipy.optimize.linear_sum_assignment``); MCC = mean over the
    ``min(d, d')`` matched pairs. A constant column correlates 0 with everything.

    Returns ``{"mcc": float, "matching": int64 (d,)}``: ``matching[i]`` is the column of
    ``z_pred`` matched to ``z_true[:, i]``, or -1 when ``d > d'`` leaves it unmatched.

    Examples:
        >>> import torch
        >>> from qkernels.metrics import mcc
        >>> _ = torch.manual_seed(0)
        >>> z = torch.randn(100, 2)
        >>> r = mcc(z, -3 * z.flip(1))  # permuted and rescaled: |correlation| 1
        >>> round(r["mcc"], 6), r["matching"]
        (1.0, array([1, 0]))
    """
    require("qkernels.metrics.mcc", "metrics", *NEEDS)
    a = _check("z_true", z_true)
    b = _check("z_pred", z_pred)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"z_pred has N = {b.shape[0]} rows but z_true has N = {a.shape[0]}")
    if method not in ("pearson", "spearman"):
        raise ValueError(f"method must be 'pearson' or 'spearman', got {method!r}")
    if method == "spearman":
        a, b = rankdata(a, axis=0), rankdata(b, axis=0)
    corr = np.abs(_correlation(a, b))
    rows, cols = linear_sum_assignment(corr, maximize=True)
    matching = np.full(a.shape[1], -1, dtype=np.int64)
    matching[rows] = cols
    return {"mcc": float(corr[rows, cols].mean()), "matching": matching}


def _check(name: str, x) -> np.ndarray:
    x = to_numpy(name, x)
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
        raise TypeError(f"{name} must be numeric, got dtype {x.dtype}")
    if x.ndim != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        raise ValueError(f"{name} must have shape (N, d) with N >= 2, d >= 1, got {x.shape}")
    x = x.astype(np.float64)
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")
    return x


def _correlation(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(d, d')`` Pearson correlation of the columns; 0 where a column is constant."""
    a = a - a.mean(0)
    b = b - b.mean(0)
    na, nb = np.sqrt((a * a).sum(0)), np.sqrt((b * b).sum(0))
    ok = (na[:, None] > 0) & (nb[None, :] > 0)
    return np.where(ok, (a.T @ b) / np.where(ok, np.outer(na, nb), 1.0), 0.0)
