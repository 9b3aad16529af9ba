"""The benchmark baselines (qkernels.bench) compute what they claim: each formulation a user would write
(materialized, sequential) against the float64 equations of the test oracles; the runner's table."""

import numpy as np
import pytest
import torch
from test_hessian import _oracle_fd, _var
from test_kde import np_cliff, np_klm

from qkernels import bench
from qkernels.bench import hessian as bh
from qkernels.bench import kde as bk
from qkernels.bench import quantize as bq


def test_materialized_cliff_and_klm_match_the_equations():
    z, idx = bk.cliff_inputs(40, 3, 4, 30, seed=1)
    z = z.double()
    uni, biv, kl = np_cliff(z.numpy(), idx.numpy(), 0.1, (-5.0, 5.0, 30))
    assert float(bk.cliff_materialized(z, idx, 30)) == pytest.approx(0.5 * uni + biv + 0.7 * kl, rel=1e-9)
    want = np_klm(z.numpy(), z.numpy().std(0) + 1e-6)
    assert float(bk.klm_materialized(z)) == pytest.approx(want, rel=1e-9)


def test_sequential_nhp_is_the_authors_formulation():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(3, 4, generator=g, dtype=torch.float64)

    def fn(x):
        h = torch.tanh(x @ w)
        return [h, (h * x[:, :1]).reshape(-1, 2, 2)]

    z = torch.randn(5, 3, generator=g, dtype=torch.float64)
    std = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)
    k, eps = 3, 0.1
    got = bh.sequential_nhp(fn, z, std, k=k, eps=eps, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)  # the same draws: signs (k, n, d), then normals (k, n, d)
    r = (2 * torch.randint(0, 2, (k, 5, 3), generator=g) - 1).double()
    gauss = torch.randn((k, 5, 3), generator=g, dtype=torch.float64)
    num_fd, den_fd = _oracle_fd(fn, z, eps * std * r, eps), _oracle_fd(fn, z, eps * std * gauss, eps)
    want = sum(float((_var([f[e] for f in num_fd], 0).mean(1) / (_var([f[e] for f in den_fd], 0).mean(1) + 1e-10))
                     .mean()) for e in range(2))
    assert float(got) == pytest.approx(want, rel=1e-10)


def test_materialized_quantize_gradients_by_hand():
    z = torch.tensor([[0.1, -0.7], [0.45, 2.0]], dtype=torch.float64, requires_grad=True)
    values = torch.tensor([[-1.0, 0.0, 0.5], [-0.5, 0.5, 1.0]], dtype=torch.float64, requires_grad=True)
    up = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    loss = bq.materialized_loss(z, values, up)
    q = np.array([[0.0, -0.5], [0.5, 1.0]])  # nearest value per (sample, latent)
    zz = z.detach().numpy()
    want = (q * up.numpy()).sum() + 0.02 * ((zz - q) ** 2).mean()
    assert float(loss) == pytest.approx(want, rel=1e-12)
    loss.backward()
    # straight-through: d/dz = upstream + 0.01 * 2 (z - q) / N (commit); codebook: 0.01 * 2 (q - z) / N per hit
    np.testing.assert_allclose(z.grad.numpy(), up.numpy() + 0.01 * 2 * (zz - q) / 4, rtol=1e-12)
    gv = np.zeros((2, 3))
    for i, j, c in ((0, 0, 1), (0, 1, 0), (1, 0, 2), (1, 1, 2)):
        gv[j, c] += 0.01 * 2 * (q[i, j] - zz[i, j]) / 4
    np.testing.assert_allclose(values.grad.numpy(), gv, rtol=1e-12, atol=1e-15)


def test_timing_interleaves_variants_and_reports_failures():
    calls = []

    def run_as(name):
        def fn(x):
            calls.append(name)
        return fn

    def broken(x):
        raise RuntimeError("no kernel")

    case = bench.Case("quantize", "toy", lambda scale: (torch.ones(3),),
                      {"reference": run_as("reference"), "cpu": run_as("cpu"), "broken": broken})
    times = bench.time_variants(case, ["reference", "cpu", "broken"], min_time=0.0)
    assert isinstance(times["broken"], RuntimeError)
    rounds = len(times["reference"])
    assert rounds >= 3 and len(times["cpu"]) == rounds and all(t >= 0 for t in times["cpu"])
    # one warm-up each, then round r runs every live variant once, in order
    assert calls == ["reference", "cpu"] + ["reference", "cpu"] * rounds
    name = bench.cases("quantize")[0].name
    assert bench.find_case("quantize", name).name == name
    with pytest.raises(KeyError, match="no benchmark case"):
        bench.find_case("quantize", "no such case")
