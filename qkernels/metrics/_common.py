"""Shared input checks and count-based information helpers for the metrics.

Conventions: ``sources`` is ``(N, n_s)`` integer factor classes, ``latents`` is ``(N, n_z)``;
every matrix a metric returns is oriented ``(n_s, n_z)`` (sources x latents). Information is in
nats. Numbers are computed in float64 numpy.
"""

from __future__ import annotations

import numpy as np
import torch


def to_numpy(name: str, x: object) -> np.ndarray:
    """A numpy view of a tensor or array-like argument (detached, on CPU)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (list, tuple)):
        return np.asarray(x)
    raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}")


def check_sources(sources: object, name: str = "sources") -> np.ndarray:
    """``(N, n_s)`` integer classes -> int64 array; TypeError/ValueError naming ``name``."""
    s = to_numpy(name, sources)
    if s.dtype == bool or not np.issubdtype(s.dtype, np.integer):
        raise TypeError(f"{name} must hold integer factor classes, got dtype {s.dtype}")
    if s.ndim != 2:
        raise ValueError(f"{name} must have shape (N, n_s), got shape {s.shape}")
    if s.shape[0] < 2 or s.shape[1] < 1:
        raise ValueError(f"{name} needs N >= 2 samples and n_s >= 1 columns, got {s.shape}")
    return s.astype(np.int64, copy=False)


def check_latents(latents: object, n: int, name: str = "latents") -> np.ndarray:
    """``(N, n_z)`` real or integer codes, finite, N matching the sources; returned unchanged."""
    z = to_numpy(name, latents)
    if not (np.issubdtype(z.dtype, np.number) or z.dtype == bool):
        raise TypeError(f"{name} must be numeric, got dtype {z.dtype}")
    if z.ndim != 2:
        raise ValueError(f"{name} must have shape (N, n_z), got shape {z.shape}")
    if z.shape[1] < 1:
        raise ValueError(f"{name} must have at least one column, got shape {z.shape}")
    if z.shape[0] != n:
        raise ValueError(f"{name} has N = {z.shape[0]} rows but sources has N = {n}")
    if np.issubdtype(z.dtype, np.floating) and not np.isfinite(z).all():
        raise ValueError(f"{name} contains NaN or inf")
    return z


def is_discrete(z: np.ndarray, discrete_latents: bool | None) -> bool:
    """``discrete_latents=None`` means: discrete iff the latents have an integer (or bool) dtype."""
    if discrete_latents is None:
        return bool(z.dtype == bool or np.issubdtype(z.dtype, np.integer))
    if not isinstance(discrete_latents, bool):
        raise TypeError(f"discrete_latents must be None or a bool, got {discrete_latents!r}")
    return discrete_latents


def label_encode(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column, map values to ``0..size-1`` (sorted unique order).

    Returns ``codes`` int64 ``(N, d)`` and ``sizes`` int64 ``(d,)``.
    """
    codes = np.empty(x.shape, dtype=np.int64)
    sizes = np.empty(x.shape[1], dtype=np.int64)
    for j in range(x.shape[1]):
        uniq, codes[:, j] = np.unique(x[:, j], return_inverse=True)
        sizes[j] = uniq.size
    return codes, sizes


def histogram_discretize(z: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """disentanglement_lib's discretization: ``num_bins`` equal-width bins over each column's range
    (``np.histogram`` edges). Returns codes ``(N, d)`` in ``0..num_bins-1`` and sizes ``(d,)``."""
    z = z.astype(np.float64, copy=False)
    codes = np.empty(z.shape, dtype=np.int64)
    for j in range(z.shape[1]):
        edges = np.histogram_bin_edges(z[:, j], bins=num_bins)
        codes[:, j] = np.digitize(z[:, j], edges[:-1]) - 1
    return codes, np.full(z.shape[1], num_bins, dtype=np.int64)


def _sum_xlogx_blocks(counts: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Sum of ``c log c`` over each contiguous block of ``counts`` starting at ``starts``."""
    c = counts.astype(np.float64)
    terms = np.where(c > 0, c * np.log(np.where(c > 0, c, 1.0)), 0.0)
    return np.add.reduceat(terms, starts)


def entropy(codes: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Plug-in entropy (nats) of every column of ``codes`` ``(N, d)`` -> ``(d,)``; one bincount."""
    n = codes.shape[0]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    counts = np.bincount((codes + starts).ravel(), minlength=int(sizes.sum()))
    return np.log(n) - _sum_xlogx_blocks(counts, starts) / n


def discrete_mutual_info(a: np.ndarray, a_sizes: np.ndarray, b: np.ndarray, b_sizes: np.ndarray) -> np.ndarray:
    """Plug-in mutual information (nats) for all column pairs of two code matrices.

    ``a`` ``(N, p)`` with codes in ``0..a_sizes-1``, ``b`` ``(N, q)`` likewise -> ``(p, q)``.
    All ``p * q`` contingency tables come from ONE ``np.bincount`` over combined codes
    (pair offset + a * |b| + b); the entropies are block reductions of that count vector.
    """
    n = a.shape[0]
    block = np.outer(a_sizes, b_sizes).ravel()  # bins per (i, j) table
    starts = np.concatenate([[0], np.cumsum(block)[:-1]])
    combined = starts.reshape(len(a_sizes), len(b_sizes))[None] + (
        a[:, :, None] * b_sizes[None, None, :] + b[:, None, :]
    )
    counts = np.bincount(combined.ravel(), minlength=int(block.sum()))
    h_joint = np.log(n) - _sum_xlogx_blocks(counts, starts).reshape(len(a_sizes), -1) / n
    mi = entropy(a, a_sizes)[:, None] + entropy(b, b_sizes)[None, :] - h_joint
    return np.maximum(mi, 0.0)


def split_indices(n: int, num_train: int, num_test: int, seed: int) -> tuple[np.ndarray, ...]:
    """A seeded random train/test split of ``n`` rows.

    Uses ``num_train`` and ``num_test`` rows when ``n >= num_train + num_test``; otherwise all ``n``
    rows, divided in the ratio ``num_train : num_test`` (e.g. N = 10000 with the 10000/5000 defaults
    gives 6667/3333).
    """
    for name, v in (("num_train", num_train), ("num_test", num_test)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if n < num_train + num_test:
        n_train = int(round(n * num_train / (num_train + num_test)))
        n_train = min(max(n_train, 1), n - 1)
        n_test = n - n_train
    else:
        n_train, n_test = num_train, num_test
    perm = np.random.default_rng(seed).permutation(n)
    return perm[:n_train], perm[n_train : n_train + n_test]


def split_test_fraction(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded random split of all ``n`` rows with ``ceil(test_fraction * n)`` test rows (scikit-learn's
    ``train_test_split(test_size=test_fraction)`` sizes; at least one row on each side)."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
    n_test = min(max(int(np.ceil(test_fraction * n)), 1), n - 1)
    perm = np.random.default_rng(seed).permutation(n)
    return perm[: n - n_test], perm[n - n_test :]


def check_seed(seed: object) -> int:
    """A non-negative int seed."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return int(seed)
