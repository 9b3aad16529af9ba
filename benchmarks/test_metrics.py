"""Speed of the disentanglement metrics at evaluation size: N = 10000 samples, n_s = 9 sources
(Isaac3D's factor sizes), n_z = 18 latents, discrete and continuous.

Targets on the 2-core CPU dev machine: InfoMEC discrete < 2 s, continuous < 30 s, DCI < 60 s. The
continuous InfoMEC and DCI (tens of seconds each) run only with ``--bench-all``.
Run: ``pytest benchmarks/test_metrics.py --benchmark-only [--bench-all]``.
"""

from __future__ import annotations

import numpy as np
import pytest

from qkernels.metrics import dci, infomec, mig, modularity, sap

N = 10000
FACTOR_SIZES = (3, 8, 5, 4, 4, 4, 6, 4, 4)  # Isaac3D


@pytest.fixture(scope="module")
def data():
    """A partly disentangled representation: latent j < 9 encodes source j (with 10% errors /
    noise), latents 9..17 mix two sources each."""
    rng = np.random.default_rng(0)
    s = np.stack([rng.integers(0, k, N) for k in FACTOR_SIZES], axis=1)
    unit = s / (np.array(FACTOR_SIZES) - 1)  # sources scaled to [0, 1]
    mix = 0.5 * unit + 0.5 * np.roll(unit, 1, axis=1)
    continuous = np.concatenate(
        [unit + 0.05 * rng.standard_normal(s.shape), mix + 0.05 * rng.standard_normal(s.shape)], 1
    )
    discrete = np.clip(np.round(continuous * 9), -2, 11).astype(np.int64)  # 10-ish values each
    flip = rng.random(discrete.shape) < 0.1
    discrete[flip] = rng.integers(0, 10, flip.sum())
    return s, discrete, continuous


def test_infomec_discrete(benchmark, data):
    s, discrete, _ = data
    r = benchmark.pedantic(infomec, args=(s, discrete), rounds=3, iterations=1)
    assert 0 <= r["infom"] <= 1


@pytest.mark.bench_all
def test_infomec_continuous(benchmark, data):
    s, _, continuous = data
    r = benchmark.pedantic(infomec, args=(s, continuous), rounds=1, iterations=1)
    assert 0 <= r["infom"] <= 1


@pytest.mark.bench_all
@pytest.mark.parametrize("kind", ["discrete", "continuous"])
def test_dci_tripod_preset(benchmark, data, kind):
    """The default preset (Tripod's random forest, 100 trees, depth 10, 90/10 split); the "dlib" preset
    (gradient boosting) takes minutes here and is left out."""
    s, discrete, continuous = data
    z = discrete if kind == "discrete" else continuous
    r = benchmark.pedantic(dci, args=(s, z), rounds=1, iterations=1)
    assert r["preset"] == "tripod" and 0 <= r["disentanglement"] <= 1


def test_mig_modularity(benchmark, data):
    s, _, continuous = data
    r = benchmark.pedantic(lambda: (mig(s, continuous), modularity(s, continuous)), rounds=3, iterations=1)
    assert 0 <= r[0]["mig"] <= 1


def test_sap_discrete_factors(benchmark, data):
    s, _, continuous = data
    r = benchmark.pedantic(sap, args=(s, continuous), rounds=1, iterations=1)
    assert 0 <= r["sap"] <= 1
