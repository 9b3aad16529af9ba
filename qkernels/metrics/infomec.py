"""InfoMEC (Hsu et al., QLAE, NeurIPS 2023, Section 4): InfoM, InfoE, InfoC.

NMI[i, j] = I(s_i; z_j) / H(s_i)                                  (eq. 7)
InfoM = (mean_j max_i NMI_ij / sum_i NMI_ij - 1/n_s) / (1 - 1/n_s)  over active latents (eq. 8)
InfoC = (mean_i max_j NMI_ij / sum_j NMI_ij - 1/n_z) / (1 - 1/n_z)  over active latents (eq. 9)
InfoE = mean_i (H_V(s_i | 0) - H_V(s_i | z)) / H_V(s_i | 0)                            (eqs. 10-14)
with V = unpenalized multinomial logistic regression, in-sample log loss.

Defaults follow the authors' published code (latent_quantization's ``disentangle/metrics/infomec.py``),
which produced the paper's numbers: ``n_neighbors=10`` for the kNN MI (the paper's text says k = 3), and
InfoE's regression fitted with ``class_weight='balanced'``, ``max_iter=100``.
"""

from __future__ import annotations

import warnings

import numpy as np

from qkernels._extras import optional, require
from qkernels.metrics._common import (
    check_latents,
    check_seed,
    check_sources,
    discrete_mutual_info,
    entropy,
    is_discrete,
    label_encode,
)

NEEDS = ("scipy", "sklearn")  # the metrics extra: checked when infomec runs, so that this module imports without it
with optional():
    import scipy.sparse as sp
    from scipy.optimize import minimize
    from sklearn.feature_selection import mutual_info_classif

    from qkernels.metrics._authors_infoe import authors_infoe

CLASS_WEIGHTS = ("balanced", None)
PRUNE_RULES = ("range", "iqr")
INFOE_FITS = ("converged", "sklearn")  # our converged L-BFGS fit, or the authors' capped scikit-learn one
DEGENERATE_RULES = ("finite", "nan")  # 0/0 in InfoM / InfoC: a finite convention, or NaN as the authors' code
IQR_DISCRETE = 0.1  # Tripod's rule: a discrete latent is active iff its IQR > 0.1 (in the latents' units)
IQR_CONTINUOUS = 10  # ... a continuous one iff its IQR > max IQR / 10 (divided, as the authors' code)


def infomec(
    sources,
    latents,
    *,
    discrete_latents: bool | None = None,
    k: int = 10,
    seed: int = 0,
    prune: str = "range",
    prune_threshold: float = 1 / 20,
    class_weight: str | None = "balanced",
    max_iter: int = 100,
    tol: float = 1e-4,
    infoe_fit: str = "converged",
    degenerate: str = "finite",
) -> dict:
    """InfoM, InfoE, InfoC of ``latents`` ``(N, n_z)`` w.r.t. ``sources`` ``(N, n_s)`` int.

    Defaults come from the authors' published code (latent_quantization's code: ``n_neighbors=10``;
    ``class_weight='balanced'``, ``max_iter=100``), not from the paper's text (k = 3). The previous
    defaults of this function were ``k=3, class_weight=None, max_iter=300`` (pass them to reproduce).

    Args:
        discrete_latents: ``True``: latents are codes (label-encoded; plug-in MI; one-hot inputs for
            InfoE). ``False``: continuous (standardized; Ross (2014) kNN MI via scikit-learn's
            ``mutual_info_classif`` with ``n_neighbors=k``; standardized inputs for InfoE).
            ``None``: discrete iff ``latents`` has an integer dtype.
        k: neighbours of the kNN estimator (continuous latents only). Default 10 as in the authors'
            code; the paper's text says 3 (InfoM/InfoC move by a few % between the two).
        seed: seeds the estimator's jitter (``random_state``), so results are deterministic.
        prune: the inactive-latent rule for InfoM/InfoC (InfoC is normalized by the number of
            active latents). ``"range"`` (QLAE's code, also FactorQVAE's): a discrete latent is
            inactive iff constant (zero range); a continuous one iff its range <= the largest latent
            range / (1 / ``prune_threshold``) (the authors' ``max / 20``). ``"iqr"`` (Tripod's
            ``disentangle/metrics/infomec.py``): a discrete latent is active iff its interquartile range
            > 0.1, in the latents' own units (Tripod passes FSQ values in [-1, 1], not codes); a continuous
            one iff its IQR > the largest IQR / 10 (quantiles with linear interpolation, as ``np.quantile``).
        prune_threshold: ``"range"`` only: the paper's 1/20; ``0`` keeps every non-constant latent.
        class_weight: InfoE's regression. ``"balanced"`` (the authors' code): the fit minimizes the
            class-weighted mean log loss, sample weight ``N / (n_present_classes * count(class))``
            (scikit-learn's rule). ``None``: unweighted fit. Either way the REPORTED log losses are
            unweighted in-sample means (scikit-learn's ``log_loss(y, predict_proba(x))``, as in the
            authors' code), and H_V(s | 0) is the same procedure on zero inputs (an intercept-only
            fit): with ``"balanced"`` it predicts uniform over the present classes, so
            H_V(s | 0) = log(n_present_classes); with ``None`` it predicts the class frequencies,
            so H_V(s | 0) = H(s). NMI_V = (H_V(s|0) - H_V(s|z)) / H_V(s|0) is clipped to [0, 1]:
            it is 1 for a perfect predictor (log loss 0) and ~0 for latents independent of the
            source (the fit stays at the null model). With ``"balanced"`` an imbalanced source's
            NMI_V is normalized by log(n_classes) >= H(s); on a balanced source both options agree.
        max_iter: the L-BFGS iteration cap per source for InfoE's logistic regression (see
            ``multinomial_log_proba``; the authors' 100).
        tol: the L-BFGS gradient tolerance per source (the authors' 1e-4). InfoE
            uses every non-constant latent: pruning applies to InfoM/InfoC only, as in the paper, unless no
            latent is active (then InfoE = 0).
        infoe_fit: ``"converged"`` (default): the fit above, on rescaled columns, run to convergence (the model's
            InfoE). ``"sklearn"``: the authors' fit (:mod:`qkernels.metrics._authors_infoe`; the papers'
            protocols): scikit-learn's ``LogisticRegression`` on the unscaled one-hot (or standardized) design of
            every latent, stopped at ``max_iter`` L-BFGS iterations, NMI_V not clipped. A capped fit scores less
            than the converged one where L-BFGS has not converged (an entangled code: 0.59 against 0.60 in
            tests/test_protocols.py).
        degenerate: ``"finite"`` (default): the conventions under Returns. ``"nan"``: the authors' arithmetic
            (latent_quantization ``disentangle/metrics/infomec.py`` lines 104-105, tripod lines 119-122,
            FactorQVAE lines 57-58): max / sum of an all-zero NMI column (row) is 0/0, so InfoM (InfoC) is NaN,
            as is InfoC with one active latent (1 - 1/1 = 0 in the denominator); a RuntimeWarning says so.

    Returns:
        ``{"infom", "infoc", "infoe"}`` floats in [0, 1] (NaN under ``degenerate="nan"``; an ``"sklearn"`` InfoE
        is not clipped), ``"nmi"`` ``(n_s, n_z)`` float64 in
        [0, 1] (all latents, before pruning), ``"active"`` ``(n_z,)`` bool. Degenerate cases: no
        active latent -> InfoM = InfoC = InfoE = 0 (Tripod's ``compute_infomec``; InfoE is not fitted on
        latents that all fall below the IQR rule); a latent (source) with an all-zero NMI column (row)
        counts as uninformative (ratio 1/n_s, resp. 1/n_active); one source -> InfoM = 1; one
        active latent -> InfoC = 1.

    Examples:
        Integer codes equal to the sources (swapped): modular and compact.

        >>> import torch
        >>> from qkernels.metrics import infomec
        >>> s = torch.cartesian_prod(torch.arange(4), torch.arange(4)).repeat(4, 1)  # (64, 2) int64
        >>> r = infomec(s, s.flip(1))
        >>> r["infom"], r["infoc"], r["nmi"].shape, r["active"]
        (1.0, 1.0, (2, 2), array([ True,  True]))
        >>> r["infoe"] > 0.99
        True
    """
    require("qkernels.metrics.infomec", "metrics", *NEEDS)
    s = check_sources(sources)
    n, n_s = s.shape
    z = check_latents(latents, n)
    seed = check_seed(seed)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    _check_fit_options(class_weight, max_iter, tol)
    if not isinstance(infoe_fit, str) or infoe_fit not in INFOE_FITS:
        raise ValueError(f"infoe_fit must be one of {INFOE_FITS}, got {infoe_fit!r}")
    if not isinstance(degenerate, str) or degenerate not in DEGENERATE_RULES:
        raise ValueError(f"degenerate must be one of {DEGENERATE_RULES}, got {degenerate!r}")
    if not 0.0 <= prune_threshold < 1.0:
        raise ValueError(f"prune_threshold must be in [0, 1), got {prune_threshold}")
    if not isinstance(prune, str) or prune not in PRUNE_RULES:
        raise ValueError(f"prune must be one of {PRUNE_RULES}, got {prune!r}")
    discrete = is_discrete(z, discrete_latents)
    if not discrete and n <= k:
        raise ValueError(f"k = {k} neighbours need N > k samples, got N = {n}")

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
        # the authors' comparison and arithmetic: range > max range / 20 (x / 20, x * (1 / 20) differ in the last bit)
        cut = ranges.max() / (1 / prune_threshold) if prune_threshold > 0 else 0.0
        active = ranges > cut
        design = _standardize(zf[:, ranges > 0])
        mi = np.zeros((n_s, z.shape[1]))  # a constant latent carries no information
        if design.shape[1]:
            mi[:, ranges > 0] = _knn_mutual_info(s_codes, design, k, seed)

    if prune == "iqr":
        q1, q3 = np.quantile(z.astype(np.float64), [0.25, 0.75], axis=0)
        iqr = q3 - q1
        active = iqr > (IQR_DISCRETE if discrete else iqr.max() / IQR_CONTINUOUS)
    nmi = np.clip(mi / h_s[:, None], 0.0, 1.0)
    infom, infoc = _modularity_compactness(nmi[:, active], degenerate)
    fit = dict(class_weight=class_weight, max_iter=max_iter, tol=tol)
    infoe = 0.0  # no active latent: 0, as Tripod's compute_infomec returns (the range rule: no latent varies)
    if active.any() and infoe_fit == "sklearn":
        infoe = authors_infoe(z, s_codes, discrete, **fit)
    elif active.any():
        infoe = float(np.mean([predictive_nmi(design, s_codes[:, i], s_sizes[i], **fit) for i in range(n_s)]))
    return {
        "infom": infom,
        "infoc": infoc,
        "infoe": infoe,
        "nmi": nmi,
        "active": active,
    }


def _check_fit_options(class_weight, max_iter, tol) -> None:
    if not isinstance(class_weight, (str, type(None))) or class_weight not in CLASS_WEIGHTS:
        raise ValueError(f"class_weight must be 'balanced' or None, got {class_weight!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive int, got {max_iter!r}")
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")


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


def _ratio_score(m: np.ndarray, n_other: int, degenerate: str = "finite") -> float:
    """Mean over columns of (max / sum) renormalized from [1/n_other, 1] to [0, 1]; ``m`` has
    ``n_other`` rows. ``degenerate="finite"``: zero columns count as uninformative (ratio 1/n_other), one row
    scores 1; ``"nan"``: either is 0/0, NaN (the authors' arithmetic), with a RuntimeWarning."""
    total = m.sum(0)
    if degenerate == "nan" and (n_other == 1 or not (total > 0).all()):
        warnings.warn(
            "InfoMEC: an all-zero NMI column (or a single row) makes the authors' max / sum ratio 0/0: "
            "NaN (degenerate='nan', the papers' protocols); degenerate='finite' scores it as "
            "uninformative",
            RuntimeWarning,
            stacklevel=3,
        )
        return float("nan")
    if n_other == 1:
        return 1.0
    safe = np.where(total > 0, total, 1.0)
    ratio = np.where(total > 0, m.max(0) / safe, 1.0 / n_other)
    return float((ratio.mean() - 1.0 / n_other) / (1.0 - 1.0 / n_other))


def _modularity_compactness(nmi_active: np.ndarray, degenerate: str = "finite") -> tuple[float, float]:
    """InfoM (eq. 8) and InfoC (eq. 9) of the pruned ``(n_s, n_active)`` NMI matrix."""
    n_s, n_active = nmi_active.shape
    if n_active == 0:
        return 0.0, 0.0
    return _ratio_score(nmi_active, n_s, degenerate), _ratio_score(nmi_active.T, n_active, degenerate)


def multinomial_log_proba(
    x,
    y: np.ndarray,
    n_classes: int,
    *,
    class_weight: str | None = None,
    max_iter: int = 100,
    tol: float = 1e-4,
) -> np.ndarray:
    """In-sample log-probabilities ``(N, n_classes)`` of unpenalized multinomial logistic regression
    ``softmax(x @ W + b)`` fitted to labels ``y`` in ``0..n_classes-1``.

    The fit minimizes the mean log loss, weighted per sample when ``class_weight="balanced"``:
    weight ``N / (n_present * count(y_i))`` for ``n_present`` classes present in ``y``
    (scikit-learn's ``'balanced'`` rule; the weights sum to N, so the objective is the mean over
    present classes of each class's mean log loss). ``None``: unit weights. Defaults as
    scikit-learn's ``LogisticRegression`` (``class_weight=None``, ``max_iter=100``, ``tol=1e-4``);
    at convergence the same optimum as ``LogisticRegression(penalty=None, class_weight=...)``.

    ``x`` is a dense ``(N, d)`` array or a scipy sparse matrix (one-hot codes stay sparse). Columns
    are rescaled to unit RMS first (the unpenalized optimum is invariant to it; L-BFGS converges
    in far fewer iterations; standardized columns are left unchanged). L-BFGS starts at the
    (weighted) null model (``W = 0``, ``b`` = log weighted class frequencies: uniform over present
    classes when balanced), and the final objective never exceeds the null model's. Stops after
    ``max_iter`` iterations or when the largest gradient component is <= ``tol``. A capped fit is
    not bit-identical to scikit-learn's (different column scaling and start when unweighted).
    Absent classes get log-probability ~ -690.
    """
    require("qkernels.metrics.infomec", "metrics", *NEEDS)
    _check_fit_options(class_weight, max_iter, tol)
    n, d = x.shape
    rms = np.sqrt(np.asarray(x.multiply(x).mean(0) if sp.issparse(x) else (x * x).mean(0)))
    rms = np.where(rms.ravel() > 0, rms.ravel(), 1.0)
    if sp.issparse(x):
        x = sp.csr_matrix(x @ sp.diags(1.0 / rms))
        xt = sp.csr_matrix(x.T)
    else:
        x = np.ascontiguousarray(x / rms)
        xt = np.ascontiguousarray(x.T)
    counts = np.bincount(y, minlength=n_classes)
    if class_weight == "balanced":
        per_class = np.where(counts > 0, n / (np.count_nonzero(counts) * np.maximum(counts, 1)), 0.0)
        scale = per_class[y] / n  # d objective / d (sample log loss)
    else:
        per_class = np.ones(n_classes)
        scale = None
    wfreq = per_class * counts / n  # weighted class frequencies (sum to 1)
    b0 = np.log(np.where(wfreq > 0, wfreq, 1e-300))
    target = np.arange(n) * n_classes + y  # flat index of each sample's label logit
    dk = d * n_classes

    def log_softmax(theta):
        logits = np.asarray(x @ theta[:dk].reshape(d, n_classes)) if d else np.zeros((n, n_classes))
        logits += theta[dk:]
        top = logits[:, 0].copy()  # row max by a loop over the few classes: much faster
        for c in range(1, n_classes):  # than a reduction along the short axis
            np.maximum(top, logits[:, c], out=top)
        logits -= top[:, None]
        p = np.exp(logits)
        se = p.sum(1)
        return logits, p, se

    def loss_grad(theta):
        logits, p, se = log_softmax(theta)
        sample_loss = np.log(se) - logits.ravel()[target]
        p /= se[:, None]
        p.ravel()[target] -= 1.0
        if scale is None:
            loss = float(np.mean(sample_loss))
            p *= 1.0 / n
        else:
            loss = float(scale @ sample_loss)
            p *= scale[:, None]
        return loss, np.concatenate([np.asarray(xt @ p).ravel(), p.sum(0)])

    theta = np.concatenate([np.zeros(dk), b0])
    if d:
        res = minimize(
            loss_grad,
            theta,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": max_iter, "ftol": 1e-10, "gtol": tol},
        )
        if res.fun < loss_grad(theta)[0]:
            theta = res.x
    logits, _, se = log_softmax(theta)
    return logits - np.log(se)[:, None]


def multinomial_log_loss(
    x,
    y: np.ndarray,
    n_classes: int,
    *,
    class_weight: str | None = None,
    max_iter: int = 100,
    tol: float = 1e-4,
) -> float:
    """Unweighted in-sample mean negative log-likelihood (nats) of ``multinomial_log_proba``'s fit
    (scikit-learn's ``log_loss(y, model.predict_proba(x))``). With ``class_weight=None`` this is
    the minimized objective; with ``"balanced"`` only the fit is weighted, not this mean.
    """
    log_p = multinomial_log_proba(x, y, n_classes, class_weight=class_weight, max_iter=max_iter, tol=tol)
    return float(-np.mean(log_p[np.arange(y.size), y]))


def predictive_nmi(
    design,
    y: np.ndarray,
    n_classes: int,
    *,
    class_weight: str | None = "balanced",
    max_iter: int = 100,
    tol: float = 1e-4,
) -> float:
    """NMI_V(z -> s) (eq. 13) = (H_V(s|0) - H_V(s|z)) / H_V(s|0), clipped to [0, 1].

    Both terms are ``multinomial_log_loss`` (unweighted in-sample log loss of a fit with
    ``class_weight``), H_V(s|0) on a design with no columns: log(n_present_classes) when balanced,
    the plug-in entropy H(s) when unweighted (see ``infomec``).
    """
    fit = dict(class_weight=class_weight, max_iter=max_iter, tol=tol)
    h0 = multinomial_log_loss(np.zeros((y.size, 0)), y, n_classes, **fit)
    h1 = multinomial_log_loss(design, y, n_classes, **fit)
    return float(np.clip((h0 - h1) / h0, 0.0, 1.0))
