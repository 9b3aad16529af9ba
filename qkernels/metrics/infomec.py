"""InfoMEC (Hsu et al., QLAE, NeurIPS 2023, Section 4): InfoM, InfoE, InfoC.

NMI[i, j] = I(s_i; z_j) / H(s_i)                                  (eq. 7)
InfoM = (mean_j max_i NMI_ij / sum_i NMI_ij - 1/n_s) / (1 - 1/n_s)  over active latents (eq. 8)
InfoC = (mean_i max_j NMI_ij / sum_j NMI_ij - 1/n_z) / (1 - 1/n_z)  over active latents (eq. 9)
InfoE = mean_i (H_V(s_i | 0) - H_V(s_i | z)) / H_V(s_i | 0)                            (eqs. 10-14)
with V = unpenalized multinomial logistic regression, in-sample log loss.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize
from sklearn.feature_selection import mutual_info_classif

from qkernels.metrics._common import (
    check_latents,
    check_seed,
    check_sources,
    discrete_mutual_info,
    entropy,
    is_discrete,
    label_encode,
)


def infomec(
    sources,
    latents,
    *,
    discrete_latents: bool | None = None,
    k: int = 3,
    seed: int = 0,
    prune_threshold: float = 1 / 20,
    max_iter: int = 500,
) -> dict:
    """InfoM, InfoE, InfoC of ``latents`` ``(N, n_z)`` w.r.t. ``sources`` ``(N, n_s)`` int.

    Args:
        discrete_latents: ``True``: latents are codes (label-encoded; plug-in MI; one-hot inputs for
            InfoE). ``False``: continuous (standardized; Ross (2014) kNN MI via scikit-learn's
            ``mutual_info_classif`` with ``n_neighbors=k``; standardized inputs for InfoE).
            ``None``: discrete iff ``latents`` has an integer dtype.
        k: neighbours of the kNN estimator (continuous latents only; the paper's k = 3).
        seed: seeds the estimator's jitter (``random_state``), so results are deterministic.
        prune_threshold: inactive-latent rule for InfoM/InfoC. Discrete latents: inactive iff
            constant (zero range). Continuous: inactive iff range < ``prune_threshold`` x the
            largest latent range (the paper's 1/20); ``0`` keeps every non-constant latent.
        max_iter: L-BFGS iterations per source for InfoE's logistic regression.

    Returns:
        ``{"infom", "infoc", "infoe"}`` floats in [0, 1], ``"nmi"`` ``(n_s, n_z)`` float64 in
        [0, 1] (all latents, before pruning), ``"active"`` ``(n_z,)`` bool. Degenerate cases: no
        active latent -> InfoM = InfoC = 0; a latent (source) with an all-zero NMI column (row)
        counts as uninformative (ratio 1/n_s, resp. 1/n_active); one source -> InfoM = 1; one
        active latent -> InfoC = 1.
    """
    s = check_sources(sources)
    n, n_s = s.shape
    z = check_latents(latents, n)
    seed = check_seed(seed)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if n <= k:
        raise ValueError(f"k = {k} neighbours need N > k samples, got N = {n}")
    if not 0.0 <= prune_threshold < 1.0:
        raise ValueError(f"prune_threshold must be in [0, 1), got {prune_threshold}")
    discrete = is_discrete(z, discrete_latents)

    s_codes, s_sizes = label_encode(s)
    h_s = entropy(s_codes, s_sizes)
    if np.any(s_sizes < 2):
        raise ValueError(
            f"sources columns {np.flatnonzero(s_sizes < 2).tolist()} are constant: "
            "NMI = I / H(source) is undefined for a zero-entropy source"
        )

    if discrete:
        z_codes, z_sizes = label_encode(z)
        mi = discrete_mutual_info(s_codes, s_sizes, z_codes, z_sizes)
        active = z_sizes > 1
        design = _one_hot(z_codes, z_sizes)
    else:
        zf = z.astype(np.float64)
        ranges = zf.max(0) - zf.min(0)
        active = (ranges > 0) & (ranges >= prune_threshold * ranges.max())
        zs = _standardize(zf)
        mi = _knn_mutual_info(s_codes, zs, k, seed)
        design = zs[:, ranges > 0]

    nmi = np.clip(mi / h_s[:, None], 0.0, 1.0)
    infom, infoc = _modularity_compactness(nmi[:, active])
    nmi_v = np.array(
        [_predictive_nmi(design, s_codes[:, i], s_sizes[i], max_iter) for i in range(n_s)]
    )
    return {
        "infom": infom,
        "infoc": infoc,
        "infoe": float(nmi_v.mean()),
        "nmi": nmi,
        "active": active,
    }


def _standardize(z: np.ndarray) -> np.ndarray:
    std = z.std(0)
    return np.where(std > 0, (z - z.mean(0)) / np.where(std > 0, std, 1.0), 0.0)


def _one_hot(codes: np.ndarray, sizes: np.ndarray) -> sp.csr_matrix:
    """Sparse ``(N, sum sizes)`` one-hot of every non-constant code column."""
    keep = sizes > 1
    codes, sizes = codes[:, keep], sizes[keep]
    n, d = codes.shape
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    cols = (codes + offsets).ravel()
    rows = np.repeat(np.arange(n), d)
    return sp.csr_matrix((np.ones(n * d), (rows, cols)), shape=(n, int(sizes.sum())))


def _knn_mutual_info(s_codes: np.ndarray, zs: np.ndarray, k: int, seed: int) -> np.ndarray:
    """``(n_s, n_z)`` Ross kNN MI between each discrete source and each continuous latent."""
    states = np.random.default_rng(seed).integers(0, 2**31 - 1, size=s_codes.shape[1])
    return np.stack(
        [
            mutual_info_classif(
                zs,
                s_codes[:, i],
                discrete_features=False,
                n_neighbors=k,
                random_state=int(states[i]),
            )
            for i in range(s_codes.shape[1])
        ]
    )


def _ratio_score(m: np.ndarray, n_other: int) -> float:
    """Mean over columns of (max / sum) renormalized from [1/n_other, 1] to [0, 1]; ``m`` has
    ``n_other`` rows. Zero columns count as uninformative (ratio 1/n_other)."""
    if n_other == 1:
        return 1.0
    total = m.sum(0)
    safe = np.where(total > 0, total, 1.0)
    ratio = np.where(total > 0, m.max(0) / safe, 1.0 / n_other)
    return float((ratio.mean() - 1.0 / n_other) / (1.0 - 1.0 / n_other))


def _modularity_compactness(nmi_active: np.ndarray) -> tuple[float, float]:
    """InfoM (eq. 8) and InfoC (eq. 9) of the pruned ``(n_s, n_active)`` NMI matrix."""
    n_s, n_active = nmi_active.shape
    if n_active == 0:
        return 0.0, 0.0
    return _ratio_score(nmi_active, n_s), _ratio_score(nmi_active.T, n_active)


def multinomial_log_loss(x, y: np.ndarray, n_classes: int, max_iter: int = 500) -> float:
    """Minimal in-sample mean negative log-likelihood (nats) of unpenalized multinomial logistic
    regression ``softmax(x @ W + b)`` for labels ``y`` in ``0..n_classes-1``.

    ``x`` is a dense ``(N, d)`` array or a sparse matrix. L-BFGS starts at the null model
    (``W = 0``, ``b`` = log class frequencies), so the result never exceeds the class-frequency
    entropy. Equivalent to scikit-learn's ``LogisticRegression(C=np.inf)`` log loss, but faster
    on sparse one-hot inputs.
    """
    n, d = x.shape
    freq = np.bincount(y, minlength=n_classes) / n
    b0 = np.log(np.where(freq > 0, freq, 1e-300))
    rows = np.arange(n)

    def loss_grad(theta):
        w = theta[: d * n_classes].reshape(d, n_classes)
        logits = np.asarray(x @ w) + theta[d * n_classes :]
        top = logits.max(1, keepdims=True)
        e = np.exp(logits - top)
        se = e.sum(1, keepdims=True)
        loss = float(np.mean(top[:, 0] + np.log(se[:, 0]) - logits[rows, y]))
        g = e / se
        g[rows, y] -= 1.0
        g /= n
        return loss, np.concatenate([np.asarray(x.T @ g).ravel(), g.sum(0)])

    theta0 = np.concatenate([np.zeros(d * n_classes), b0])
    h0 = loss_grad(theta0)[0]
    if d == 0:
        return h0
    res = minimize(
        loss_grad,
        theta0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "ftol": 1e-10, "gtol": 1e-7},
    )
    return float(min(res.fun, h0))


def _predictive_nmi(design, y: np.ndarray, n_classes: int, max_iter: int) -> float:
    """NMI_V(z -> s) (eq. 13): relative log-loss reduction of the linear model vs the null model."""
    freq = np.bincount(y, minlength=n_classes) / y.size
    h0 = float(-np.sum(freq[freq > 0] * np.log(freq[freq > 0])))
    h1 = multinomial_log_loss(design, y, n_classes, max_iter)
    return float(np.clip((h0 - h1) / h0, 0.0, 1.0))
