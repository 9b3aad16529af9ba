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
    max_iter: int = 300,
    tol: float = 1e-4,
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
        max_iter, tol: L-BFGS iteration cap and gradient tolerance per source for InfoE's
            logistic regression (see ``multinomial_log_loss``). InfoE uses every non-constant
            latent: pruning applies to InfoM/InfoC only, as in the paper.

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
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive int, got {max_iter!r}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
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
        design = _standardize(zf[:, ranges > 0])
        mi = np.zeros((n_s, z.shape[1]))  # a constant latent carries no information
        if design.shape[1]:
            mi[:, ranges > 0] = _knn_mutual_info(s_codes, design, k, seed)

    nmi = np.clip(mi / h_s[:, None], 0.0, 1.0)
    infom, infoc = _modularity_compactness(nmi[:, active])
    nmi_v = np.array(
        [_predictive_nmi(design, s_codes[:, i], s_sizes[i], max_iter, tol) for i in range(n_s)]
    )
    return {
        "infom": infom,
        "infoc": infoc,
        "infoe": float(nmi_v.mean()),
        "nmi": nmi,
        "active": active,
    }


def _standardize(z: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance per column (columns must not be constant)."""
    return (z - z.mean(0)) / z.std(0)


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


def multinomial_log_loss(
    x, y: np.ndarray, n_classes: int, *, max_iter: int = 300, tol: float = 1e-4
) -> float:
    """Minimal in-sample mean negative log-likelihood (nats) of unpenalized multinomial logistic
    regression ``softmax(x @ W + b)`` for labels ``y`` in ``0..n_classes-1``.

    ``x`` is a dense ``(N, d)`` array or a scipy sparse matrix (one-hot codes stay sparse). Columns
    are rescaled to unit RMS first (the unpenalized optimum is invariant to it; L-BFGS converges
    in far fewer iterations). L-BFGS starts at the null model (``W = 0``, ``b`` = log class
    frequencies), so the result never exceeds the class-frequency entropy. Stops after
    ``max_iter`` iterations or when the largest gradient component is <= ``tol`` (scikit-learn's
    default 1e-4: NMI_V within ~1e-3 of the exact optimum in our checks). Same optimum as
    scikit-learn's ``LogisticRegression(C=np.inf)``.
    """
    n, d = x.shape
    rms = np.sqrt(np.asarray(x.multiply(x).mean(0) if sp.issparse(x) else (x * x).mean(0)))
    rms = np.where(rms.ravel() > 0, rms.ravel(), 1.0)
    if sp.issparse(x):
        x = sp.csr_matrix(x @ sp.diags(1.0 / rms))
        xt = sp.csr_matrix(x.T)
    else:
        x = np.ascontiguousarray(x / rms)
        xt = np.ascontiguousarray(x.T)
    freq = np.bincount(y, minlength=n_classes) / n
    b0 = np.log(np.where(freq > 0, freq, 1e-300))
    target = np.arange(n) * n_classes + y  # flat index of each sample's label logit
    dk = d * n_classes

    def loss_grad(theta):
        logits = np.asarray(x @ theta[:dk].reshape(d, n_classes))
        logits += theta[dk:]
        top = logits[:, 0].copy()  # row max by a loop over the few classes: much faster
        for c in range(1, n_classes):  # than a reduction along the short axis
            np.maximum(top, logits[:, c], out=top)
        logits -= top[:, None]
        p = np.exp(logits)
        se = p.sum(1)
        loss = float(np.mean(np.log(se)) - np.mean(logits.ravel()[target]))
        p /= se[:, None]
        p.ravel()[target] -= 1.0
        p *= 1.0 / n
        return loss, np.concatenate([np.asarray(xt @ p).ravel(), p.sum(0)])

    theta0 = np.concatenate([np.zeros(dk), b0])
    h0 = loss_grad(theta0)[0]
    if d == 0:
        return h0
    res = minimize(
        loss_grad,
        theta0,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": max_iter, "ftol": 1e-10, "gtol": tol},
    )
    return float(min(res.fun, h0))


def _predictive_nmi(design, y: np.ndarray, n_classes: int, max_iter: int, tol: float) -> float:
    """NMI_V(z -> s) (eq. 13): relative log-loss reduction of the linear model vs the null model."""
    freq = np.bincount(y, minlength=n_classes) / y.size
    h0 = float(-np.sum(freq[freq > 0] * np.log(freq[freq > 0])))
    h1 = multinomial_log_loss(design, y, n_classes, max_iter=max_iter, tol=tol)
    return float(np.clip((h0 - h1) / h0, 0.0, 1.0))
