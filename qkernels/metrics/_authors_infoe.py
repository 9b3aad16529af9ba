"""InfoE as the authors' code fits it: scikit-learn's ``LogisticRegression`` run as it stops.

latent_quantization ``disentangle/metrics/infomec.py`` lines 40-82, tripod ``disentangle/metrics/infomec.py`` lines
41-83 and FactorQVAE ``metrics/infomec.py`` lines 101-140 all do the same: the design is the one-hot of every latent
(``OneHotEncoder`` on the raw values, constant latents included) or every latent standardized (``StandardScaler``);
per source, an unpenalized multinomial ``LogisticRegression(class_weight='balanced', solver='lbfgs', tol=1e-4,
max_iter=100)`` (FactorQVAE: ``max_iter=500``) on the unscaled design, stopped where L-BFGS stops; H(s|z) is the
unweighted ``log_loss`` of its in-sample ``predict_proba``, H(s) the same fit on zeros of the latents' shape, and
NMI_V = (H(s) - H(s|z)) / H(s), not clipped. :func:`qkernels.metrics.infomec` uses it with ``infoe_fit="sklearn"``
(the papers' protocols); its default is a converged fit of the same model.
"""

from __future__ import annotations

import warnings

import numpy as np
import sklearn
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss
from sklearn.preprocessing import OneHotEncoder, StandardScaler

# scikit-learn 1.8 deprecated ``penalty=None`` for ``C=inf`` (the same unpenalized fit: tests/test_protocols.py)
_UNPENALIZED = (
    {"C": np.inf} if tuple(int(p) for p in sklearn.__version__.split(".")[:2]) >= (1, 8) else {"penalty": None}
)


def _fitted_log_loss(x, y: np.ndarray, class_weight: str | None, max_iter: int, tol: float) -> float:
    """Unweighted in-sample log loss of the authors' capped fit of labels ``y`` on design ``x``."""
    model = LogisticRegression(class_weight=class_weight, solver="lbfgs", max_iter=max_iter, tol=tol, **_UNPENALIZED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # the authors' fits stop at max_iter: that is the point
        model.fit(x, y)
    return float(log_loss(y, model.predict_proba(x), labels=model.classes_))


def authors_infoe(
    z: np.ndarray,
    s_codes: np.ndarray,
    discrete: bool,
    *,
    class_weight: str | None = "balanced",
    max_iter: int = 100,
    tol: float = 1e-4,
) -> float:
    """InfoE of latents ``z`` (N, n_z) for label-encoded sources ``s_codes`` (N, n_s), fitted as the authors' code
    fits it (module docstring): the mean over sources of (H(s) - H(s|z)) / H(s), not clipped to [0, 1].

    Examples:
        >>> import numpy as np
        >>> from qkernels.metrics._authors_infoe import authors_infoe
        >>> s = np.repeat(np.arange(4), 25)[:, None]
        >>> round(authors_infoe(s.astype(float), s, discrete=True), 3)  # one-hot of the source itself
        1.0
    """
    design = OneHotEncoder().fit_transform(z) if discrete else StandardScaler().fit_transform(z.astype(np.float64))
    null = np.zeros(z.shape)
    scores = []
    for i in range(s_codes.shape[1]):
        y = s_codes[:, i]
        h_z = _fitted_log_loss(design, y, class_weight, max_iter, tol)
        h_0 = _fitted_log_loss(null, y, class_weight, max_iter, tol)
        scores.append((h_0 - h_z) / h_0)
    return float(np.mean(scores))
