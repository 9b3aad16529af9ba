"""The authors' InfoE fit (qkernels/metrics/_authors_infoe.py), each branch against a transcription written here from
the authors' code (issue 58): tripod ``disentangle/metrics/infomec.py`` ``compute_infoe`` and ``logistic_regression``
(latent_quantization's are the same lines; FactorQVAE's the same with ``max_iter=500`` and a dense one-hot).

Per source (label-encoded), the design is either the one-hot of every latent's raw values (categories sorted, a
constant latent included as one all-ones column) or every latent standardized (population std; a constant latent:
scale 1, a zero column), never pruned; an unpenalized multinomial ``LogisticRegression(tol=1e-4,
class_weight='balanced', solver='lbfgs', max_iter)`` with an intercept, stopped where it stops; H(s|z) the unweighted
in-sample log loss (probabilities clipped to [eps, 1 - eps]); H(s) the same fit on zeros of the latents' shape; the
score (H(s) - H(s|z)) / H(s), unclipped, averaged over sources. The one-hot, the standardization and the log loss
are numpy here; the regression is scikit-learn's (its stopping point is what is transcribed, and only scikit-learn's
L-BFGS stops there).

A capped fit is not invariant to the scale of its columns (a converged unpenalized one would be): latents on
scales far from 1 tell a standardized design from a raw one, and a population std from a sample one.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import sklearn
from sklearn.linear_model import LogisticRegression

from qkernels.metrics import infomec
from qkernels.metrics._authors_infoe import authors_infoe

UNPENALIZED = {"C": np.inf} if tuple(map(int, sklearn.__version__.split(".")[:2])) >= (1, 8) else {"penalty": None}


def _labels(column: np.ndarray) -> np.ndarray:
    return np.unique(column, return_inverse=True)[1].reshape(-1)


def _one_hot(z: np.ndarray, dense: bool) -> np.ndarray | sp.csr_matrix:
    """Every latent's sorted distinct values, one column each (a constant latent: one column of ones)."""
    blocks = [(col[:, None] == np.unique(col)[None, :]).astype(np.float64) for col in z.T]
    x = np.concatenate(blocks, axis=1)
    return x if dense else sp.csr_matrix(x)


def _standardized(z: np.ndarray) -> np.ndarray:
    mean = z.mean(0)
    std = np.sqrt(((z - mean) ** 2).mean(0))
    return (z - mean) / np.where(std == 0, 1.0, std)


def _log_loss(y: np.ndarray, proba: np.ndarray) -> float:
    eps = np.finfo(proba.dtype).eps
    return float(-np.log(np.clip(proba[np.arange(len(y)), y], eps, 1 - eps)).mean())


def _fit(x, y: np.ndarray, max_iter: int) -> float:
    model = LogisticRegression(
        tol=1e-4, fit_intercept=True, class_weight="balanced", solver="lbfgs", max_iter=max_iter, **UNPENALIZED
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the capped fit does not converge: that is the point
        model.fit(x, y)
    return _log_loss(y, model.predict_proba(x))


def _score(s: np.ndarray, design, shape: tuple[int, int], max_iter: int) -> float:
    scores = []
    for column in s.T:
        y = _labels(column)
        h_z, h_0 = _fit(design, y, max_iter), _fit(np.zeros(shape), y, max_iter)
        scores.append((h_0 - h_z) / h_0)
    return float(np.mean(scores))


def transcribed_infoe(s: np.ndarray, z: np.ndarray, discrete: bool, max_iter: int, dense: bool = False) -> float:
    design = _one_hot(z, dense) if discrete else _standardized(z.astype(np.float64))
    return _score(s, design, z.shape, max_iter)


def _data(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two sources (5 and 4 values) and five latents entangled with them, on scales from 0.01 to 1000 with offsets,
    and a constant latent."""
    rng = np.random.default_rng(seed)
    s = np.stack([rng.integers(0, 5, n), rng.integers(0, 4, n)], 1)
    sf = (s - s.mean(0)) / s.std(0)
    h = np.tanh(sf @ rng.standard_normal((2, 5)) + 0.7 * rng.standard_normal((n, 5)))
    z = h * np.array([1000.0, 0.01, 3.0, 1.0, 50.0]) + np.array([40.0, -2.0, 0.0, 7.0, -300.0])
    return s, np.concatenate([z, np.full((n, 1), 2.5)], 1)


def test_continuous_branch_is_the_authors_standardized_capped_fit():
    s, z = _data()
    want = transcribed_infoe(s, z, discrete=False, max_iter=30)
    assert authors_infoe(z, s, discrete=False, max_iter=30) == pytest.approx(want, abs=1e-9)
    # through infomec under the papers' protocols' setting: every latent (the constant one and those the range rule
    # prunes) goes into the design
    got = infomec(s, z, discrete_latents=False, infoe_fit="sklearn", max_iter=30, degenerate="nan")
    assert got["infoe"] == pytest.approx(want, abs=1e-9)
    assert not got["active"].all()
    # what the tolerance tells apart: the raw latents, a sample std (ddof 1), the active latents only
    assert abs(_score(s, z, z.shape, 30) - want) > 1e-3
    sample_std = z.std(0, ddof=1)
    assert abs(_score(s, (z - z.mean(0)) / np.where(sample_std == 0, 1, sample_std), z.shape, 30) - want) > 1e-7
    active = got["active"]
    assert abs(_score(s, _standardized(z[:, active]), z.shape, 30) - want) > 1e-3


def test_discrete_branch_is_the_authors_one_hot_capped_fit():
    s, z = _data(seed=1)
    codes = np.round((np.tanh(z / z.std(0).clip(1e-12)) + 1) / 2 * 11) / 11 * 2 - 1  # FSQ-like values, 12 levels
    codes[:, -1] = 0.5  # a constant latent: one column of ones in the authors' one-hot
    want = transcribed_infoe(s, codes, discrete=True, max_iter=30)
    assert authors_infoe(codes, s, discrete=True, max_iter=30) == pytest.approx(want, abs=1e-9)
    got = infomec(s, codes, discrete_latents=True, infoe_fit="sklearn", max_iter=30, degenerate="nan")
    assert got["infoe"] == pytest.approx(want, abs=1e-9)
