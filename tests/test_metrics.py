"""Correctness of qkernels.metrics: hand-computed cases, independent float64 oracles
(scikit-learn / scipy), disentanglement_lib-style range tests, determinism and bad input."""

from __future__ import annotations

import importlib
import inspect
import itertools
import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy
from scipy.stats import pearsonr, spearmanr
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, mutual_info_score
from sklearn.model_selection import train_test_split
from sklearn.tree import DecisionTreeClassifier

from qkernels.metrics import (
    METRICS,
    dci,
    disentanglement_completeness,
    evaluate,
    infomec,
    mcc,
    mig,
    modularity,
    mse,
    psnr,
    sap,
)
from qkernels.metrics._common import discrete_mutual_info, entropy, label_encode, split_test_fraction
from qkernels.metrics.dci import truncated_forest
from qkernels.metrics.infomec import (
    _modularity_compactness,
    multinomial_log_loss,
    multinomial_log_proba,
    predictive_nmi,
)

LOG2 = math.log(2.0)
dci_module = importlib.import_module("qkernels.metrics.dci")  # the package's ``dci`` is the function


def random_sources(n, sizes, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, a, n) for a in sizes], axis=1)


def full_grid(sizes, repeats):
    """Every factor combination ``repeats`` times: the sources are exactly independent, so the
    plug-in MI between different sources is exactly 0 (no finite-sample bias)."""
    grid = np.array(list(itertools.product(*[range(a) for a in sizes])))
    return np.repeat(grid, repeats, axis=0)


def balanced_binary_grid(repeats=50):
    """All 4 combinations of two binary sources, each ``repeats`` times (exact MI = log 2)."""
    return full_grid([2, 2], repeats)


# ----------------------------------------------------------------------------------------------
# counting helpers
# ----------------------------------------------------------------------------------------------


def test_discrete_mi_2x2_by_hand():
    # counts (a, b): (0,0)=1, (0,1)=1, (1,1)=2;  p(a) = (1/2, 1/2), p(b) = (1/4, 3/4)
    a = np.array([0, 0, 1, 1] * 5)[:, None]
    b = np.array([0, 1, 1, 1] * 5)[:, None]
    want = 0.25 * math.log(2.0) + 0.25 * math.log(2.0 / 3.0) + 0.5 * math.log(4.0 / 3.0)
    got = discrete_mutual_info(a, np.array([2]), b, np.array([2]))
    assert got.shape == (1, 1)
    assert got[0, 0] == pytest.approx(want, abs=1e-12)


def test_discrete_mi_matches_sklearn_for_all_pairs():
    rng = np.random.default_rng(1)
    s = random_sources(500, [2, 5, 7])
    z = np.concatenate([s[:, :2] * 3 + rng.integers(0, 2, (500, 2)), rng.integers(0, 4, (500, 2))], 1)
    sc, ss = label_encode(s)
    zc, zs = label_encode(z)
    got = discrete_mutual_info(sc, ss, zc, zs)
    want = np.array([[mutual_info_score(s[:, i], z[:, j]) for j in range(4)] for i in range(3)])
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_entropy_matches_scipy():
    s = random_sources(300, [3, 9, 1])
    codes, sizes = label_encode(s)
    want = [scipy_entropy(np.bincount(codes[:, j])) for j in range(3)]
    np.testing.assert_allclose(entropy(codes, sizes), want, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# InfoMEC
# ----------------------------------------------------------------------------------------------


def test_infom_infoc_formula_by_hand():
    nmi = np.array([[0.8, 0.2, 0.0], [0.0, 0.2, 0.6]])
    infom, infoc = _modularity_compactness(nmi)
    # columns: max/sum = 1, 1/2, 1 -> mean 5/6; (5/6 - 1/2) / (1 - 1/2)
    assert infom == pytest.approx((5 / 6 - 1 / 2) / (1 / 2))
    # rows: 0.8/1.0, 0.6/0.8 -> mean 0.775; (0.775 - 1/3) / (1 - 1/3)
    assert infoc == pytest.approx((0.775 - 1 / 3) / (2 / 3))


def test_infomec_balanced_grid_by_hand():
    # z0 = s0, z1 = s0 + 2 s1: NMI = [[1, 1], [0, 1]] exactly
    s = balanced_binary_grid()
    z = np.stack([s[:, 0], s[:, 0] + 2 * s[:, 1]], axis=1)
    r = infomec(s, z)
    np.testing.assert_allclose(r["nmi"], [[1.0, 1.0], [0.0, 1.0]], atol=1e-12)
    assert r["infom"] == pytest.approx(0.5)  # column ratios 1, 1/2
    assert r["infoc"] == pytest.approx(0.5)  # row ratios 1/2, 1
    assert r["infoe"] == pytest.approx(1.0, abs=1e-3)  # one-hot of z1 identifies both sources


def test_infomec_permuted_discrete_identity_is_perfect():
    s = full_grid([3, 5, 4, 6], 3)
    perm = [2, 0, 3, 1]
    z = s[:, perm] * 7 - 3  # relabelled values, permuted columns, integer dtype -> discrete
    r = infomec(s, z)
    assert r["infom"] == pytest.approx(1.0, abs=1e-9)
    assert r["infoc"] == pytest.approx(1.0, abs=1e-9)
    assert r["infoe"] > 0.999
    assert r["active"].all()
    np.testing.assert_allclose(r["nmi"][perm, np.arange(4)], 1.0, atol=1e-12)
    # sampled (not gridded) sources: only the plug-in bias of independent pairs is off-diagonal
    s = random_sources(3000, [3, 5, 4, 6])
    r = infomec(s, s[:, perm])
    assert r["infom"] > 0.98 and r["infoc"] > 0.98


def test_infomec_continuous_identity_and_linear_explicitness():
    rng = np.random.default_rng(3)
    s = random_sources(1500, [3, 4, 5])
    # each latent an increasing function of one source, jittered inside its cell
    z = (s + 0.4 * rng.random(s.shape))[:, [1, 2, 0]] * np.array([2.0, -0.5, 1.0])
    r = infomec(s, z, discrete_latents=False)
    assert r["infom"] > 0.95 and r["infoc"] > 0.95
    assert r["infoe"] > 0.99  # sources are (separably) linear in the latents
    assert np.all((r["nmi"] >= 0) & (r["nmi"] <= 1))
    # permuting the latents permutes the NMI columns and leaves the scores unchanged
    p = [2, 0, 1]
    rp = infomec(s, z[:, p], discrete_latents=False)
    np.testing.assert_allclose(rp["nmi"], r["nmi"][:, p], atol=1e-6)
    for key in ("infom", "infoc", "infoe"):
        assert rp[key] == pytest.approx(r[key], abs=1e-4)


def test_infomec_duplicated_latents_lower_compactness_only():
    s = full_grid([3, 4, 5], 5)
    r = infomec(s, np.concatenate([s, s], 1))
    assert r["infom"] == pytest.approx(1.0, abs=1e-9)
    # every source row has two equal maxima over 6 latents: ratio 1/2
    assert r["infoc"] == pytest.approx((0.5 - 1 / 6) / (1 - 1 / 6), abs=1e-9)


def test_infomec_constant_latents_are_pruned_without_nan():
    s = full_grid([3, 4], 60)  # N = 720
    z = np.concatenate([s, np.zeros((720, 2), dtype=np.int64)], 1)
    r = infomec(s, z)
    np.testing.assert_array_equal(r["active"], [True, True, False, False])
    assert r["infom"] == pytest.approx(1.0) and r["infoc"] == pytest.approx(1.0)
    assert np.isfinite(r["nmi"]).all()

    # continuous: a latent with range < 1/20 of the largest is inactive; threshold 0 keeps it
    rng = np.random.default_rng(0)
    zc = np.concatenate([s + 0.3 * rng.random(s.shape), 0.01 * rng.random((720, 1))], 1)
    assert infomec(s, zc)["active"].tolist() == [True, True, False]
    assert infomec(s, zc, prune_threshold=0.0)["active"].tolist() == [True, True, True]
    # the threshold is 1/20 of the LARGEST range (3 here): 0.16 is kept, 0.14 pruned
    t = np.linspace(0.0, 1.0, 720)
    zr = np.stack([s[:, 0].astype(float), s[:, 1].astype(float), 0.16 * t, 0.14 * t[::-1]], 1)
    assert infomec(s, zr)["active"].tolist() == [True, True, True, False]

    r = infomec(s, np.full((720, 3), 2.5))  # nothing active at all
    assert (r["infom"], r["infoc"], r["infoe"]) == (0.0, 0.0, 0.0)
    assert not r["active"].any() and np.isfinite(r["nmi"]).all()


@pytest.mark.parametrize("discrete", [True, False])
def test_infomec_noise_latents_carry_no_information(discrete):
    rng = np.random.default_rng(5)
    s = random_sources(3000, [3, 4])
    z = rng.integers(0, 5, (3000, 3)) if discrete else rng.standard_normal((3000, 3))
    r = infomec(s, z)
    assert r["nmi"].max() < 0.05  # kNN / plug-in estimates of a zero MI
    assert r["infoe"] < 0.02


def test_infomec_is_deterministic():
    rng = np.random.default_rng(6)
    s = random_sources(600, [3, 4])
    z = s + rng.standard_normal(s.shape)
    a, b = infomec(s, z, seed=3), infomec(s, z, seed=3)
    for key in ("infom", "infoc", "infoe"):
        assert a[key] == b[key]
    np.testing.assert_array_equal(a["nmi"], b["nmi"])


def test_infomec_accepts_tensors():
    s = random_sources(400, [3, 4])
    a = infomec(torch.from_numpy(s), torch.from_numpy(s[:, ::-1].copy()))
    b = infomec(s, s[:, ::-1])
    assert a["infom"] == b["infom"] and a["infoe"] == b["infoe"]


@pytest.mark.parametrize("sparse_one_hot", [False, True])
def test_multinomial_log_loss_matches_sklearn_unpenalized(sparse_one_hot):
    rng = np.random.default_rng(7)
    n = 400
    if sparse_one_hot:
        from qkernels.metrics.infomec import _one_hot

        zc = rng.integers(0, 4, (n, 2))
        x = _one_hot(zc, np.array([4, 4]))
        y = (zc[:, 0] + rng.integers(0, 3, n)) % 3  # noisy: not separable
        dense = x.toarray()
    else:
        x = dense = rng.standard_normal((n, 3))
        y = (x[:, 0] + rng.standard_normal(n) > 0).astype(int) + (x[:, 1] > 0.5)
    ref = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10000).fit(dense, y)
    want = log_loss(y, ref.predict_proba(dense))
    assert multinomial_log_loss(x, y, 3, tol=1e-8, max_iter=5000) == pytest.approx(want, abs=1e-8)
    assert multinomial_log_loss(x, y, 3) == pytest.approx(want, abs=1e-3)  # defaults: 100 iterations, tol 1e-4


def test_infomec_defaults_follow_the_authors_code():
    # latent_quantization's code: mutual_info_classif(n_neighbors=10);
    # LogisticRegression(class_weight='balanced', max_iter=100, tol=1e-4)
    params = inspect.signature(infomec).parameters
    assert params["k"].default == 10
    assert params["class_weight"].default == "balanced"
    assert params["max_iter"].default == 100
    assert params["tol"].default == 1e-4


def imbalanced_problem(n=600, seed=15):
    """Dense float64 inputs and 3 imbalanced, noisy (non-separable) classes."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    y = np.digitize(x[:, 0] + 0.8 * x[:, 1] + rng.standard_normal(n), [-1.6, 1.3])
    return x, y


@pytest.mark.parametrize("sparse_one_hot", [False, True])
def test_balanced_fit_matches_sklearn(sparse_one_hot):
    rng = np.random.default_rng(16)
    if sparse_one_hot:
        from qkernels.metrics.infomec import _one_hot

        n = 500
        zc = rng.integers(0, 4, (n, 2))
        x = _one_hot(zc, np.array([4, 4]))
        y = np.where(rng.random(n) < 0.7, zc[:, 0] // 2, rng.integers(0, 3, n))
        dense = x.toarray()
    else:
        x, y = imbalanced_problem()
        dense, n = x, len(y)
    counts = np.bincount(y)
    assert counts.max() > 2 * counts.min()  # imbalanced
    weight = (n / (3 * counts))[y]  # scikit-learn's 'balanced' rule
    ref = LogisticRegression(C=np.inf, class_weight="balanced", tol=1e-12, max_iter=10000).fit(dense, y)
    p_ref = ref.predict_proba(dense)
    log_p = multinomial_log_proba(x, y, 3, class_weight="balanced", tol=1e-9, max_iter=5000)
    np.testing.assert_allclose(np.exp(log_p).sum(1), 1.0, atol=1e-12)
    # the weighted mean log loss at the optimum (the fit objective) and the predictions agree
    got_weighted = -np.mean(weight * log_p[np.arange(n), y])
    assert got_weighted == pytest.approx(log_loss(y, p_ref, sample_weight=weight), abs=1e-6)
    np.testing.assert_allclose(np.exp(log_p), p_ref, atol=1e-4)
    # the reported loss is the unweighted log loss of the weighted fit (the authors' log_loss(y, p))
    reported = multinomial_log_loss(x, y, 3, class_weight="balanced", tol=1e-9, max_iter=5000)
    assert reported == pytest.approx(log_loss(y, p_ref), abs=1e-6)
    # weighting moves the fit: the unweighted fit has the lower unweighted loss
    assert multinomial_log_loss(x, y, 3, tol=1e-9, max_iter=5000) < reported - 1e-3
    # the defaults (max_iter 100, tol 1e-4) are close to the optimum
    assert multinomial_log_loss(x, y, 3, class_weight="balanced") == pytest.approx(reported, abs=1e-3)


def test_null_model_entropy_under_each_class_weight():
    y = np.array([0] * 60 + [1] * 30 + [3] * 10)  # class 2 absent
    no_inputs = np.zeros((100, 0))
    # balanced: the intercept-only fit predicts uniform over the 3 present classes
    assert multinomial_log_loss(no_inputs, y, 4, class_weight="balanced") == pytest.approx(math.log(3), abs=1e-12)
    # unweighted: it predicts the class frequencies -> the plug-in entropy
    want = scipy_entropy([0.6, 0.3, 0.1])
    assert multinomial_log_loss(no_inputs, y, 4, class_weight=None) == pytest.approx(want, abs=1e-12)
    # NMI_V: 1 for a perfect predictor, 0 without information, under both options
    perfect = np.eye(4)[y]
    for cw in ("balanced", None):
        assert predictive_nmi(perfect, y, 4, class_weight=cw, max_iter=1000) > 0.999
        assert predictive_nmi(np.ones((100, 1)), y, 4, class_weight=cw) == pytest.approx(0.0, abs=1e-9)


def test_infoe_class_weight_options():
    rng = np.random.default_rng(17)
    n = 2000
    # imbalanced source (class probabilities 0.7, 0.2, 0.1) and a balanced one; noisy latents
    s = np.stack([rng.choice(3, n, p=[0.7, 0.2, 0.1]), rng.integers(0, 3, n)], 1)
    z = s + 0.6 * rng.standard_normal(s.shape)
    fit = dict(max_iter=1000, tol=1e-8)
    balanced = [infomec(s[:, [i]], z, class_weight="balanced", **fit)["infoe"] for i in range(2)]
    unweighted = [infomec(s[:, [i]], z, class_weight=None, **fit)["infoe"] for i in range(2)]
    assert abs(balanced[0] - unweighted[0]) > 0.02
    assert balanced[1] == pytest.approx(unweighted[1], abs=0.01)
    # exactly balanced source (all class weights 1): the two options are the same computation
    grid = full_grid([3, 4], 40)
    zg = grid + 0.7 * np.random.default_rng(18).standard_normal(grid.shape)
    a = infomec(grid, zg, class_weight="balanced")["infoe"]
    b = infomec(grid, zg, class_weight=None, max_iter=100)["infoe"]
    assert a == pytest.approx(b, abs=1e-12) and 0.2 < a < 0.9
    # noise latents on the imbalanced source: ~0 under the balanced weighting too
    noise = infomec(s[:, [0]], rng.standard_normal((n, 3)))["infoe"]
    assert 0.0 <= noise < 0.02


# ----------------------------------------------------------------------------------------------
# DCI
# ----------------------------------------------------------------------------------------------


def test_dci_formula_by_hand():
    assert disentanglement_completeness(np.eye(3)) == pytest.approx((1.0, 1.0))
    assert disentanglement_completeness(np.ones((3, 4))) == pytest.approx((0.0, 0.0), abs=1e-9)
    # R (sources x latents) = [[1, 1], [0, 2]]
    h = -(1 / 3 * math.log2(1 / 3) + 2 / 3 * math.log2(2 / 3))
    d_want = 0.25 * 1.0 + 0.75 * (1.0 - h)  # latent 0: pure (weight 1/4), latent 1: (1/3, 2/3)
    c_want = 0.5 * 0.0 + 0.5 * 1.0  # source 0 uniform over 2 latents, source 1 pure
    d, c = disentanglement_completeness(np.array([[1.0, 1.0], [0.0, 2.0]]))
    assert d == pytest.approx(d_want, abs=1e-8)
    assert c == pytest.approx(c_want, abs=1e-8)
    # all-zero importances: D = C = 0, no NaN (disentanglement_lib's convention)
    assert disentanglement_completeness(np.zeros((2, 3))) == pytest.approx((0.0, 0.0), abs=1e-9)


def test_dci_formula_matches_scipy_entropies():
    r = np.random.default_rng(19).random((3, 5))  # sources x latents
    r[1, 2] = 0.0
    d_want = sum(r[:, j].sum() / r.sum() * (1 - scipy_entropy(r[:, j], base=3)) for j in range(5))
    c_want = sum(r[i].sum() / r.sum() * (1 - scipy_entropy(r[i], base=5)) for i in range(3))
    assert disentanglement_completeness(r) == pytest.approx((d_want, c_want), abs=1e-9)


def test_truncated_forest_equals_sklearn_forest():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((300, 4))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] + 0.5 * rng.standard_normal(300) > 0)
    x_te = rng.standard_normal((100, 4))
    full = RandomForestClassifier(10, criterion="entropy", random_state=0).fit(x, y)
    (proba,), (imp,) = truncated_forest(full, x_te, [10**9])
    np.testing.assert_allclose(proba, full.predict_proba(x_te), atol=1e-12)
    np.testing.assert_allclose(imp, full.feature_importances_, atol=1e-12)
    # a deterministic tree (no bootstrap, all features) cut at depth 2 == the tree grown to depth 2
    kw = dict(n_estimators=1, criterion="entropy", bootstrap=False, max_features=None)
    deep = RandomForestClassifier(**kw, random_state=0).fit(x, y)
    shallow = RandomForestClassifier(**kw, max_depth=2, random_state=0).fit(x, y)
    (proba,), (imp,) = truncated_forest(deep, x_te, [2])
    np.testing.assert_allclose(proba, shallow.predict_proba(x_te), atol=1e-12)
    np.testing.assert_allclose(imp, shallow.feature_importances_, atol=1e-12)


def test_dci_permuted_identity():
    rng = np.random.default_rng(9)
    s = random_sources(600, [3, 4, 5])
    z = (s + 0.3 * rng.random(s.shape))[:, [2, 0, 1]]
    # gradient boosting (disentanglement_lib's setting; every split sees every latent): D = C = 1
    gb = dci(s[:200], z[:200], preset="dlib")
    assert gb["disentanglement"] > 0.99 and gb["completeness"] > 0.99
    assert gb["informativeness"] == pytest.approx(1.0)
    assert gb["preset"] == "dlib"
    # random forest (Tripod's default): each split sees sqrt(n_z) random latents, so irrelevant
    # latents get some importance (D, C < 1), but the structure is found and beats a rotation
    r = dci(s, z)
    assert r["preset"] == "tripod"
    assert (r["disentanglement"], r["completeness"]) == disentanglement_completeness(r["importance"])
    assert r["informativeness"] > 0.99
    assert r["importance"].shape == (3, 3)
    assert np.argmax(r["importance"], axis=1).tolist() == [1, 2, 0]
    rotated = dci(s, z @ np.linalg.qr(rng.standard_normal((3, 3)))[0])
    assert r["disentanglement"] > 0.5 and r["completeness"] > 0.5
    assert rotated["disentanglement"] < r["disentanglement"] - 0.15
    assert rotated["completeness"] < r["completeness"] - 0.15
    r2 = dci(s, z)
    assert r2["disentanglement"] == r["disentanglement"]  # deterministic
    np.testing.assert_array_equal(r2["importance"], r["importance"])


def test_dci_duplicated_latents_lower_completeness():
    s = random_sources(600, [3, 4])
    z = np.concatenate([s, s], 1).astype(np.float64)
    r = dci(s, z, preset="depth_search", max_depths=(4,))
    assert r["disentanglement"] > 0.9
    assert r["completeness"] < 0.7


def test_dci_noise_latents():
    rng = np.random.default_rng(10)
    s = random_sources(600, [2, 3])
    r = dci(s, rng.standard_normal((600, 4)), preset="depth_search", max_depths=(2, 4))
    assert r["disentanglement"] < 0.2 and r["completeness"] < 0.2


def spy_on_classifier(monkeypatch, name):
    """Replace ``name`` in qkernels.metrics.dci by a recorder of its constructor kwargs that returns
    a fast stand-in (a depth-2 tree) recording the rows it is fitted on and predicts."""
    calls = []

    def make(**kwargs):
        rec = {"kwargs": kwargs}
        calls.append(rec)
        clf = DecisionTreeClassifier(max_depth=2, random_state=0)
        fit, predict = clf.fit, clf.predict

        def fit_spy(x, y):
            rec["train"] = len(x)
            return fit(x, y)

        def predict_spy(x):
            rec["test"] = len(x)
            return predict(x)

        clf.fit, clf.predict = fit_spy, predict_spy
        return clf

    monkeypatch.setattr(dci_module, name, make)
    return calls


@pytest.mark.parametrize(
    ("n", "train", "test"),
    [(205, 184, 21), (2000, 1800, 200), (20000, 18000, 2000)],  # ceil(0.1 N) test rows
)
def test_dci_tripod_preset_configuration(monkeypatch, n, train, test):
    # Tripod's code: RandomForestClassifier(n_estimators=100, criterion='entropy', max_depth=10),
    # train_test_split(test_size=0.1)
    calls = spy_on_classifier(monkeypatch, "RandomForestClassifier")
    s = random_sources(n, [3, 4])
    r = dci(s, s.astype(float), seed=7, n_jobs=2)
    assert [c["kwargs"] for c in calls] == [
        dict(n_estimators=100, criterion="entropy", max_depth=10, random_state=7 + i, n_jobs=2) for i in range(2)
    ]
    assert all((c["train"], c["test"]) == (train, test) for c in calls)
    assert r["preset"] == "tripod"


@pytest.mark.parametrize(("n", "train", "test"), [(300, 200, 100), (15500, 10000, 5000)])
def test_dci_dlib_preset_configuration(monkeypatch, n, train, test):
    # disentanglement_lib: GradientBoostingClassifier() defaults, 10000 train / 5000 test
    calls = spy_on_classifier(monkeypatch, "GradientBoostingClassifier")
    s = random_sources(n, [3, 4])
    r = dci(s, s.astype(float), preset="dlib", seed=3)
    assert [c["kwargs"] for c in calls] == [{"random_state": 3}, {"random_state": 4}]
    assert all((c["train"], c["test"]) == (train, test) for c in calls)
    assert r["preset"] == "dlib"


def test_dci_depth_search_preset_configuration(monkeypatch):
    seen = []
    real = dci_module.RandomForestClassifier
    monkeypatch.setattr(dci_module, "RandomForestClassifier", lambda **kw: seen.append(kw) or real(**kw))
    s = random_sources(300, [3])
    r = dci(s, s.astype(float), preset="depth_search", max_depths=(2, 5))
    # the search forest at the deepest candidate, then the refit at the chosen depth (perfect at 2: the shallowest)
    assert seen == [
        dict(n_estimators=100, criterion="entropy", max_depth=d, random_state=0, n_jobs=None) for d in (5, 2)
    ]
    assert r["preset"] == "depth_search" and r["informativeness"] == pytest.approx(1.0)


def test_split_test_fraction_sizes_match_sklearn():
    for n in (2, 3, 10, 11, 205, 999, 2000):
        tr, te = split_test_fraction(n, 0.1, seed=0)
        ref_tr, ref_te = train_test_split(np.arange(n), test_size=0.1, random_state=0)
        assert (len(tr), len(te)) == (len(ref_tr), len(ref_te)), n
        assert sorted(np.concatenate([tr, te]).tolist()) == list(range(n))


# ----------------------------------------------------------------------------------------------
# MIG, SAP, modularity (disentanglement_lib's definitions and range tests)
# ----------------------------------------------------------------------------------------------


def test_mig_and_modularity_balanced_grid_by_hand():
    s = balanced_binary_grid()
    z = np.stack([s[:, 0], s[:, 0] + 2 * s[:, 1]], axis=1).astype(np.float64)
    # MI = [[log2, log2], [0, log2]]: gaps 0 and 1
    assert mig(s, z)["mig"] == pytest.approx(0.5, abs=1e-12)
    # latent 0 informs one source (score 1), latent 1 two equally (delta = 1, score 0)
    assert modularity(s, z)["modularity"] == pytest.approx(0.5, abs=1e-12)


def test_mig_modularity_ranges():
    s = random_sources(3000, [4, 5, 6])
    identity = s.astype(np.float64)
    assert 0.9 <= mig(s, identity)["mig"] <= 1.0
    assert 0.0 <= mig(s, np.zeros_like(identity))["mig"] <= 0.2
    assert 0.0 <= mig(s, np.concatenate([identity, identity], 1))["mig"] <= 0.1
    noise = np.random.default_rng(0).standard_normal((3000, 3))
    assert mig(s, noise)["mig"] < 0.05
    assert modularity(s, identity)["modularity"] > 0.95
    assert modularity(s, np.concatenate([identity, identity], 1))["modularity"] > 0.95


def test_mig_matches_sklearn_on_binned_latents():
    rng = np.random.default_rng(11)
    s = random_sources(700, [3, 4])
    z = np.stack([s[:, 0] + rng.random(700), rng.random(700), s[:, 1] * rng.random(700)], 1)
    binned = [np.digitize(c, np.histogram(c, 20)[1][:-1]) for c in z.T]
    m = np.array([[mutual_info_score(si, b) for b in binned] for si in s.T])
    h = np.array([mutual_info_score(si, si) for si in s.T])
    top = -np.sort(-m, axis=1)
    assert mig(s, z)["mig"] == pytest.approx(np.mean((top[:, 0] - top[:, 1]) / h), abs=1e-12)


def test_sap_continuous_by_hand():
    # continuous_factors: score = squared Pearson correlation of each (source, latent); SAP = mean
    # over sources of (best - second best)
    g = np.random.default_rng(3)
    s = g.integers(0, 5, size=(400, 2))
    z = np.stack([s[:, 0] + 0.5 * g.normal(size=400), s[:, 1] + 2.0 * g.normal(size=400), g.normal(size=400)], 1)
    r2 = np.array([[pearsonr(s[:, i], z[:, j])[0] ** 2 for j in range(3)] for i in range(2)])
    top = -np.sort(-r2, axis=1)
    assert math.isclose(sap(s, z, continuous_factors=True)["sap"], float(np.mean(top[:, 0] - top[:, 1])), rel_tol=1e-9)


def test_sap_ranges():
    s = random_sources(2000, [5, 6, 7])
    identity = s.astype(np.float64)
    assert 0.9 <= sap(s, identity, continuous_factors=True)["sap"] <= 1.0
    assert sap(s, np.zeros_like(identity), continuous_factors=True)["sap"] <= 0.2
    dup = np.concatenate([identity, identity], 1)
    assert sap(s, dup, continuous_factors=True)["sap"] <= 0.2
    # discrete (SVC) mode on binary sources: matching latent accuracy 1, others ~ 1/2
    b = random_sources(600, [2, 2])
    assert 0.4 <= sap(b, b.astype(float))["sap"] <= 0.6
    noise = np.random.default_rng(0).standard_normal((600, 2))
    assert sap(b, noise)["sap"] < 0.1


# ----------------------------------------------------------------------------------------------
# MCC
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["pearson", "spearman"])
def test_mcc_permuted_sign_flipped_copy_is_one(method):
    z = np.random.default_rng(12).standard_normal((500, 4))
    perm = [3, 1, 0, 2]
    r = mcc(z, -2.0 * z[:, perm] + 1.0, method=method)
    assert r["mcc"] == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_array_equal(r["matching"][perm], np.arange(4))


def test_mcc_matches_brute_force_oracle():
    rng = np.random.default_rng(13)
    a = rng.standard_normal((200, 3))
    b = a @ rng.standard_normal((3, 3)) + 0.5 * rng.standard_normal((200, 3))
    b[:, 0] = np.exp(b[:, 0])  # monotone, changes Pearson but not Spearman
    for method, corr in (("pearson", pearsonr), ("spearman", spearmanr)):
        c = np.abs([[corr(a[:, i], b[:, j])[0] for j in range(3)] for i in range(3)])
        best = max(np.mean([c[i, p[i]] for i in range(3)]) for p in itertools.permutations(range(3)))
        assert mcc(a, b, method=method)["mcc"] == pytest.approx(best, abs=1e-12)


def test_mcc_rectangular_and_constant_columns():
    z = np.random.default_rng(14).standard_normal((100, 3))
    r = mcc(z, np.concatenate([z[:, [1]], np.ones((100, 1))], 1))
    assert r["matching"][1] == 0 and (r["matching"] == -1).sum() == 1
    assert r["mcc"] == pytest.approx(0.5)  # matched pairs: |corr| 1 and 0 (constant column)


# ----------------------------------------------------------------------------------------------
# PSNR / MSE
# ----------------------------------------------------------------------------------------------


def test_mse_and_psnr_by_hand():
    x = torch.zeros(2, 1, 2, 2)
    x_hat = torch.stack([torch.full((1, 2, 2), 0.1), torch.full((1, 2, 2), 0.01)])
    assert mse(x, x_hat) == pytest.approx((0.01 + 0.0001) / 2)
    assert psnr(x, x_hat) == pytest.approx((20.0 + 40.0) / 2)  # per-sample PSNR, then mean
    assert psnr(x, x_hat * 255, data_range=255.0) == pytest.approx(30.0)
    assert psnr(x, x) == math.inf
    with pytest.raises(ValueError, match="x_hat"):
        mse(x, x_hat[:1])


# ----------------------------------------------------------------------------------------------
# evaluate
# ----------------------------------------------------------------------------------------------


class TinyDataset:
    """Two factors rendered into a 1 x 2 x 2 image: pixel (0, 0) = f0 / 2, (0, 1) = f1 / 3."""

    factor_sizes = (3, 4)

    def sample_factors(self, n, generator):
        return torch.stack([torch.randint(0, k, (n,), generator=generator) for k in self.factor_sizes], dim=1)

    def observations_from_factors(self, factors):
        x = torch.zeros(len(factors), 1, 2, 2)
        x[:, 0, 0, 0] = factors[:, 0] / 2
        x[:, 0, 0, 1] = factors[:, 1] / 3
        return x


def encode_pixels(x):
    return x.flatten(1)[:, [1, 0]]  # permuted identity


def test_evaluate_keys_batch_size_independence_and_progress(capsys):
    calls = []
    kw = dict(metrics=("infomec", "dci", "mig", "sap", "modularity", "mcc"), num_samples=300)
    a = evaluate(encode_pixels, TinyDataset(), batch_size=7, progress=lambda d, t: calls.append((d, t)), **kw)
    b = evaluate(encode_pixels, TinyDataset(), batch_size=300, verbose=True, **kw)
    assert calls[-1] == (300, 300) and len(calls) == math.ceil(300 / 7)
    assert "encoded 300/300" in capsys.readouterr().err
    assert set(a) == {
        "infomec.infom", "infomec.infoc", "infomec.infoe", "infomec.nmi", "infomec.active",
        "dci.disentanglement", "dci.completeness", "dci.informativeness", "dci.importance", "dci.preset",
        "mig.mig", "sap.sap", "modularity.modularity", "mcc.mcc", "mcc.matching",
    }  # fmt: skip
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert a["infomec.infom"] == pytest.approx(1.0, abs=1e-6)
    assert a["dci.preset"] == "tripod"
    assert a["mig.mig"] > 0.9
    np.testing.assert_array_equal(a["mcc.matching"], [1, 0])


def test_evaluate_registry_and_options(monkeypatch):
    seen = {}

    def count_latents(sources, latents, *, seed, scale=1):
        seen["seed"] = seed
        return {"n_z": latents.shape[1] * scale}

    monkeypatch.setitem(METRICS, "count", count_latents)
    out = evaluate(
        encode_pixels,
        TinyDataset(),
        metrics=("count",),
        num_samples=20,
        seed=5,
        options={"count": {"scale": 10}},
    )
    assert out == {"count.n_z": 20} and seen["seed"] == 5
    with pytest.raises(ValueError, match="metrics"):
        evaluate(encode_pixels, TinyDataset(), metrics=("nope",), num_samples=20)
    with pytest.raises(ValueError, match="options"):
        evaluate(encode_pixels, TinyDataset(), metrics=("mig",), options={"dci": {}})


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [infomec, dci, mig, sap, modularity])
def test_bad_input_is_rejected_naming_the_argument(fn):
    s = random_sources(50, [3, 4])
    z = s.astype(np.float64)
    with pytest.raises(ValueError, match="latents"):
        fn(s, z[:40])  # mismatched N
    with pytest.raises(TypeError, match="sources"):
        fn(s.astype(np.float64), z)  # non-integer sources
    bad = z.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="latents.*NaN"):
        fn(s, bad)
    with pytest.raises(ValueError, match="latents"):
        fn(s, z[:, 0])  # wrong rank
    with pytest.raises(ValueError, match="sources"):
        fn(s[:, 0], z)


def test_bad_input_specific():
    s = random_sources(50, [3, 4])
    with pytest.raises(ValueError, match="k = 10"):
        infomec(s[:10], s[:10].astype(float))  # N too small for k (continuous latents)
    infomec(s[:10], s[:10])  # discrete latents do not use k
    with pytest.raises(ValueError, match="k must"):
        infomec(s, s, k=0)
    with pytest.raises(ValueError, match="class_weight"):
        infomec(s, s, class_weight="Balanced")
    with pytest.raises(ValueError, match="constant"):
        infomec(np.zeros((50, 1), dtype=np.int64), s)
    with pytest.raises(ValueError, match="preset"):
        dci(s, s, preset="svm")
    with pytest.raises(ValueError, match="max_depths"):
        dci(s, s, preset="depth_search", max_depths=(0,))
    with pytest.raises(ValueError, match="max_depths"):
        dci(s, s, max_depths=(4,))  # only for the depth search
    with pytest.raises(ValueError, match="num_bins"):
        mig(s, s, num_bins=1)
    with pytest.raises(ValueError, match="z_pred"):
        mcc(s, s[:10])
    with pytest.raises(ValueError, match="method"):
        mcc(s, s, method="kendall")
    with pytest.raises(TypeError, match="seed"):
        infomec(s, s, seed=1.5)


def test_sap_classifier_is_disentanglement_libs(monkeypatch):
    # disentanglement_lib's SAP (discrete factors): LinearSVC(C=0.01, class_weight="balanced") per
    # (source, latent) on the latent alone
    sap_module = importlib.import_module("qkernels.metrics.sap")  # (the package re-exports the function)
    made = []
    real = sap_module.LinearSVC

    def spy(**kw):
        made.append(kw)
        return real(**kw)

    monkeypatch.setattr(sap_module, "LinearSVC", spy)
    s = full_grid([3, 2], 20)
    sap(s, s.astype(float) + 0.1)
    assert len(made) == 4 and all(kw["C"] == 0.01 and kw["class_weight"] == "balanced" for kw in made)


def test_split_sizes_round_to_the_nearest_row():
    # fewer rows than requested: the ratio num_train : num_test, rounded (the docstring's example)
    from qkernels.metrics._common import split_indices

    train, test = split_indices(10000, 10000, 5000, seed=0)
    assert (len(train), len(test)) == (6667, 3333)
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(10000))


def test_dci_with_one_factor_by_hand():
    # one factor: every code's importance sits on it (disentanglement 1); completeness is 1 minus the
    # base-3 entropy of that factor's importance over the 3 codes
    d, c = disentanglement_completeness(np.array([[0.2, 0.5, 0.3]]))
    assert d == pytest.approx(1.0)
    assert c == pytest.approx(1.0 - scipy_entropy([0.2, 0.5, 0.3], base=3), abs=1e-9)


def test_info_ratio_counts_a_zero_column_as_uninformative():
    # InfoM / InfoC's ratio: max / sum per column rescaled from [1/n, 1] to [0, 1]; an all-zero column
    # counts as 1/n (uninformative), so [[0, .5], [0, .5]] scores ((1/2 + 1/2)/2 - 1/2) / (1 - 1/2) = 0
    from qkernels.metrics.infomec import _ratio_score

    assert _ratio_score(np.array([[0.0, 0.5], [0.0, 0.5]]), 2) == pytest.approx(0.0)
    assert _ratio_score(np.array([[0.0, 0.9], [0.0, 0.0], [0.0, 0.0]]), 3) == pytest.approx(0.5)


# ----------------------------------------------------------------------------------------------
# mutation audit 8: one-line bugs the tests above did not see
# ----------------------------------------------------------------------------------------------


def test_histogram_discretize_by_hand():
    # disentanglement_lib: num_bins equal-width bins over the column's range (np.histogram edges);
    # [0, 1] in 4 bins has edges 0, .25, .5, .75, 1: the maximum falls in the LAST bin (not past it),
    # a value on an inner edge in the upper bin. Guards edges vs edges[:-1], num_bins -/+ 1, per-column range.
    from qkernels.metrics._common import histogram_discretize

    z = np.array([[0.0, 10.0], [0.24, 10.0], [0.25, 11.0], [0.5, 13.0], [0.99, 15.9], [1.0, 18.0]])
    codes, sizes = histogram_discretize(z, 4)
    assert sizes.tolist() == [4, 4]
    assert codes[:, 0].tolist() == [0, 0, 1, 2, 3, 3]
    # the second column's own range [10, 18]: edges 10, 12, 14, 16, 18
    assert codes[:, 1].tolist() == [0, 0, 0, 1, 2, 3]


def test_mig_single_latent_and_constant_source():
    # one latent: the second largest MI is 0, so MIG = mean_i I(s_i; z) / H(s_i); z = s_0 on a balanced
    # binary grid: (1 + 0) / 2. A constant source has H = 0: an error, not a NaN.
    s = balanced_binary_grid()
    assert mig(s, s[:, :1].astype(float))["mig"] == pytest.approx(0.5, abs=1e-12)
    const = np.concatenate([s, np.zeros((len(s), 1), dtype=np.int64)], 1)
    with pytest.raises(ValueError, match="constant"):
        mig(const, s.astype(float))


def test_modularity_squares_the_mi_and_divides_by_n_s_minus_1():
    # three sources on a full grid (sizes 4, 2, 2: exactly independent). Latent 0 = 2 s0 + s1 has
    # MI (log 4, log 2, 0): delta = (log 2)^2 / ((log 4)^2 (3 - 1)) = 1/8, score 7/8. Latent 1 = s2: MI
    # (0, 0, log 2), score 1. Latent 2 constant: no information, score 0. Modularity = (7/8 + 1 + 0) / 3.
    # (Unsquared MI or no (n_s - 1) would give 3/4 for latent 0.)
    s = full_grid([4, 2, 2], 5)
    z = np.stack([2 * s[:, 0] + s[:, 1], s[:, 2], np.zeros(len(s))], 1).astype(np.float64)
    assert modularity(s, z)["modularity"] == pytest.approx((7 / 8 + 1 + 0) / 3, abs=1e-12)
    # one source: every informative latent scores 1, an uninformative one 0
    assert modularity(s[:, :1], z[:, [0, 2]])["modularity"] == pytest.approx(0.5, abs=1e-12)


def test_splits_are_seeded_disjoint_and_forward_the_seed():
    from qkernels.metrics._common import split_indices

    for split in (lambda seed: split_indices(100, 60, 40, seed), lambda seed: split_test_fraction(100, 0.1, seed)):
        tr, te = split(3)
        tr2, te2 = split(3)
        assert np.array_equal(tr, tr2) and np.array_equal(te, te2)
        assert not set(tr.tolist()) & set(te.tolist())
        other_tr, _ = split(4)
        assert not np.array_equal(tr, other_tr)  # the seed reaches the permutation
    # more rows than requested: exactly num_train / num_test rows, the rest unused
    tr, te = split_indices(200, 60, 40, seed=0)
    assert (len(tr), len(te)) == (60, 40) and len(set(tr.tolist()) | set(te.tolist())) == 100


def _row_recorder(records):
    """A fit/predict stand-in whose single feature is the row index: records which rows it saw."""

    class Recorder:
        def __init__(self, **kwargs):
            records.append({"kwargs": kwargs})

        def fit(self, x, y):
            records[-1]["fit_rows"] = np.asarray(x)[:, 0].astype(int).tolist()
            records[-1]["fit_y"] = np.asarray(y).tolist()
            self.y0 = np.asarray(y)[0]
            self.feature_importances_ = np.ones(x.shape[1]) / x.shape[1]
            return self

        def predict(self, x):
            records[-1]["test_rows"] = np.asarray(x)[:, 0].astype(int).tolist()
            return np.full(len(x), self.y0)

    return Recorder


def test_sap_and_dci_fit_on_train_rows_and_score_on_the_disjoint_test_rows(monkeypatch):
    # the latent is the row index, so the classifiers' inputs reveal the rows: fitted on one part of the split,
    # scored on the other (never the train rows), labels of the same rows, splits sized as documented
    sap_module = importlib.import_module("qkernels.metrics.sap")
    n = 300
    s = random_sources(n, [3, 2], seed=5)
    rows = np.arange(n, dtype=np.float64)[:, None]
    for module, name, call, sizes in (
        (sap_module, "LinearSVC", lambda seed: sap(s, rows, seed=seed), (200, 100)),
        (dci_module, "GradientBoostingClassifier", lambda seed: dci(s, rows, preset="dlib", seed=seed), (200, 100)),
        (dci_module, "RandomForestClassifier", lambda seed: dci(s, rows, seed=seed), (270, 30)),
    ):
        records = []
        monkeypatch.setattr(module, name, _row_recorder(records))
        call(3)
        call(2)
        assert len(records) == 4, name  # one per source and call
        assert set(records[0]["test_rows"]) != set(records[2]["test_rows"]), name  # the seed reaches the split
        records = records[2:]
        for i, rec in enumerate(records):
            fit_rows, test_rows = rec["fit_rows"], rec["test_rows"]
            assert (len(fit_rows), len(test_rows)) == sizes, name
            assert not set(fit_rows) & set(test_rows), name
            assert len(set(fit_rows) | set(test_rows)) == sum(sizes)
            assert rec["fit_y"] == s[fit_rows, i].tolist(), name  # source i of the same rows
        assert records[0]["fit_rows"] == records[1]["fit_rows"]  # one split for all sources


def test_infoe_matches_sklearn_logistic_regression_oracle():
    # InfoE (eqs. 10-14, the authors' code): per source, LogisticRegression(penalty=None,
    # class_weight='balanced') on the standardized latents; NMI_V = (log(n_classes) - log_loss) / log(n_classes)
    # (the balanced null model predicts uniform); InfoE = the mean over sources.
    rng = np.random.default_rng(21)
    s = random_sources(500, [3, 4], seed=21)
    z = s + 0.8 * rng.standard_normal(s.shape)
    zs = (z - z.mean(0)) / z.std(0)
    want = []
    for i, k in enumerate((3, 4)):
        ref = LogisticRegression(C=np.inf, class_weight="balanced", tol=1e-12, max_iter=10000).fit(zs, s[:, i])
        h1 = log_loss(s[:, i], ref.predict_proba(zs))
        want.append((math.log(k) - h1) / math.log(k))
    assert 0.1 < min(want) and max(want) < 0.9  # a non-trivial case
    got = infomec(s, z, discrete_latents=False, max_iter=5000, tol=1e-9)["infoe"]
    assert got == pytest.approx(np.mean(want), abs=1e-6)
    # the iteration cap reaches the fit: one L-BFGS step is far from the optimum
    assert infomec(s, z, max_iter=1)["infoe"] < np.mean(want) - 0.02


def test_infoe_uses_latents_pruned_from_infom_infoc():
    # pruning (range < 1/20 of the largest) applies to InfoM / InfoC only: a tiny-range latent that is
    # a copy of the source still makes InfoE ~1, while InfoM / InfoC see only the wide noise latent
    rng = np.random.default_rng(22)
    s = full_grid([3], 200)
    z = np.stack([100.0 * rng.random(len(s)), 0.01 * s[:, 0] + 0.001 * rng.random(len(s))], 1)
    r = infomec(s, z)
    assert r["active"].tolist() == [True, False]
    assert r["infoe"] > 0.9
    assert r["nmi"][0, 1] > 0.9 and r["nmi"][0, 0] < 0.05


def test_infomec_knn_estimator_configuration(monkeypatch):
    # continuous latents: Ross's kNN estimator (mutual_info_classif) on the standardized latents with
    # n_neighbors=k and continuous features, one call per source, seeded (deterministic)
    infomec_module = importlib.import_module("qkernels.metrics.infomec")
    calls = []
    real = infomec_module.mutual_info_classif

    def spy(x, y, **kw):
        calls.append((np.array(x), np.array(y), kw))
        return real(x, y, **kw)

    monkeypatch.setattr(infomec_module, "mutual_info_classif", spy)
    rng = np.random.default_rng(23)
    s = random_sources(200, [3, 2], seed=23)
    z = s * np.array([5.0, 0.5]) + rng.random(s.shape)
    infomec(s, z, k=7, seed=4)
    assert len(calls) == 2
    for i, (x, y, kw) in enumerate(calls):
        assert kw["n_neighbors"] == 7 and kw["discrete_features"] is False
        assert isinstance(kw["random_state"], int)
        np.testing.assert_allclose(x, (z - z.mean(0)) / z.std(0), atol=1e-12)
        assert y.tolist() == s[:, i].tolist()


def test_evaluate_draws_factors_from_the_seeded_generator_without_grad(monkeypatch):
    # all factors at once from torch.Generator().manual_seed(seed); latents = encode(observations of those
    # factors) in order; encode runs under no_grad
    seen = {}

    def record(sources, latents):
        seen["sources"], seen["latents"] = sources, latents
        return {}

    grad_flags = []

    def encode(x):
        grad_flags.append(torch.is_grad_enabled())
        return encode_pixels(x) * 6.0

    monkeypatch.setitem(METRICS, "record", record)
    evaluate(encode, TinyDataset(), metrics=("record",), num_samples=50, seed=11, batch_size=8)
    want = TinyDataset().sample_factors(50, torch.Generator().manual_seed(11))
    assert seen["sources"].dtype == np.int64
    np.testing.assert_array_equal(seen["sources"], want.numpy())
    # pixel (0, 1) = f1 / 3 and (0, 0) = f0 / 2, permuted, times 6
    np.testing.assert_allclose(seen["latents"], np.stack([2.0 * want[:, 1], 3.0 * want[:, 0]], 1), atol=1e-5)
    assert grad_flags and not any(grad_flags)


def test_depth_search_picks_accuracy_then_log_loss_then_the_shallowest(monkeypatch):
    # the documented selection among depth limits: highest validation accuracy; ties -> lower validation log loss;
    # then the shallowest. Hand-made predictions per limit (the forest itself is irrelevant here).
    y_te = np.array([0, 1, 1, 0])
    right, wrong = np.eye(2)[y_te], np.eye(2)[1 - y_te]
    sure_but_wrong_once = 0.95 * right + 0.05 * wrong
    sure_but_wrong_once[0] = [0.4, 0.6]
    cases = {  # predictions per limit -> the limit that must win
        "accuracy first": ([0.6 * right + 0.4 * wrong, sure_but_wrong_once, 0.7 * right + 0.3 * wrong], 2),
        "then log loss, then shallowest": (
            [0.6 * right + 0.4 * wrong, 0.9 * right + 0.1 * wrong, 0.9 * right + 0.1 * wrong],
            1,
        ),
    }
    x_tr, y_tr = np.array([[0.0], [1.0], [0.0], [1.0]]), np.array([0, 1, 0, 1])
    for name, (proba, want) in cases.items():
        monkeypatch.setattr(dci_module, "truncated_forest", lambda forest, x, limits, p=proba: (p, None))
        assert dci_module._best_depth(x_tr, y_tr, np.zeros((4, 1)), y_te, [1, 2, 3], 0, None) == [1, 2, 3][want], name


def test_depth_search_fits_the_deepest_candidate_including_unlimited(monkeypatch):
    seen = []
    real = dci_module.RandomForestClassifier
    monkeypatch.setattr(dci_module, "RandomForestClassifier", lambda **kw: seen.append(kw["max_depth"]) or real(**kw))
    s = random_sources(120, [2])
    for depths, deepest in (((None, 3), None), ((5, 2), 5)):
        seen.clear()
        dci(s, s.astype(float), preset="depth_search", max_depths=depths)
        assert seen[0] == deepest and seen[1] in depths and len(seen) == 2, depths  # search, then refit


def test_info_ratio_with_a_single_source_or_latent_is_one():
    # documented degenerate cases: one source -> InfoM = 1; one active latent -> InfoC = 1
    s = full_grid([3, 4], 5)
    one_source = infomec(s[:, :1], np.concatenate([s, s], 1))
    assert one_source["infom"] == 1.0
    one_latent = infomec(s, s[:, :1])
    assert one_latent["infoc"] == 1.0
    assert one_latent["infom"] == pytest.approx(1.0, abs=1e-12)  # that latent informs source 0 only


def test_sap_continuous_constant_source_scores_zero_gap():
    # R^2 with a constant source is 0 (not 0 / 0): sources (s0, s1, constant) on a balanced binary grid,
    # latents (s0, s1): gaps 1, 1, 0 -> SAP = 2 / 3
    s = balanced_binary_grid()
    s3 = np.concatenate([s, np.zeros((len(s), 1), dtype=np.int64)], 1)
    assert sap(s3, s.astype(float), continuous_factors=True)["sap"] == pytest.approx(2 / 3, abs=1e-12)
