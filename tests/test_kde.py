"""KDE hot path (Cliff loss, Tripod KLM, kde_grid): the reference against float64 recomputations
written from the papers' equations (numpy), every backend against the reference (values and
gradients), gradcheck, opcheck, the papers' properties and bad input."""

import importlib
import math
import os

import numpy as np
import pytest
import torch
from conftest import assert_graph_replays_match, require, unless_interpreted

import qkernels
from qkernels._backend import implementations, kernels
from qkernels.ops.kde import CliffTerms, cliff_loss, kde_grid, klm_loss
from qkernels.reference import kde as ref

pytestmark = pytest.mark.slow  # a long file: scheduled first (tests/conftest.py)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float64]
S3 = math.sqrt(3.0)


def backends_of(op, *, triton=True):
    return [b for b in kernels(op, DEVICE) if triton or b != "triton"]


def kernel_backends(op):
    return [b for b in backends_of(op) if b != "reference"]


def tols(dtype):
    return {"rtol": 2e-4, "atol": 2e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def latents(n, d, dtype=torch.float64, seed=0):
    """Non-Gaussian latents: mixtures of uniforms with density jumps, plus a shared component."""
    g = _gen(seed)
    u = torch.rand(n, d, generator=g, dtype=torch.float64)
    jump = (torch.rand(n, d, generator=g, dtype=torch.float64) < 0.3).double()
    z = u + jump + 0.3 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    return (z * torch.linspace(0.5, 2.0, d, dtype=torch.float64)).to(dtype).to(DEVICE)


def cond_rows(n, d, m, seed=1):
    g = _gen(seed)
    return torch.stack([torch.randperm(n, generator=g)[:m] for _ in range(d)]).to(DEVICE)


# ------------------------------------------------------------------ float64 recomputation (numpy)


def np_gauss(t, mu, s):
    return np.exp(-((t - mu) ** 2) / (2 * s * s)) / (s * math.sqrt(2 * math.pi))


def np_cliff(z, cond, sigma, grid):
    """Cliff's three terms from eqs. 1-7, 11-15, in float64 with explicit loops over pairs."""
    z = np.asarray(z, np.float64)
    cond = np.asarray(cond)
    n, d = z.shape
    x = (z - z.mean(0)) / np.maximum(z.std(0), 1e-6)
    a, b, k = grid
    t = np.linspace(a, b, k)
    h = (b - a) / k

    def H(p):  # differential entropy by eq. 15, 0 log 0 = 0
        nz = p > 0
        return -h * np.sum(p[nz] * np.log(p[nz]))

    def dens_deriv(tt, xs):  # (len(tt),): d/dt of 1/n sum N(t; xs, sigma^2)  (eq. 13)
        diff = tt[:, None] - xs[None, :]
        return np.mean(-diff / sigma**2 * np_gauss(tt[:, None], xs[None, :], sigma), axis=1)

    uni = kl = biv = 0.0
    v = np.linspace(-S3, S3, k)
    for i in range(d):
        u = np.abs(dens_deriv(t, x[:, i]))  # eq. 1
        uni += H(u / (h * u.sum()))  # eq. 2
        p = np.mean(np_gauss(v[:, None], x[None, :, i], sigma), axis=1)  # eq. 11
        kl += -math.log(2 * S3) - np.mean(np.log(p))  # eq. 7
    for i in range(d):
        for j in range(d):
            if i == j:
                continue
            pt = []
            for r in cond[j]:
                zeta = x[r, j]
                p_zeta = np.mean(np_gauss(zeta, x[:, j], sigma))  # marginal p(z_j = zeta)
                diff = t[:, None] - x[None, :, i]
                joint_d = np.mean(  # eq. 14: d/dz_i of the 2-D KDE at (t, zeta)
                    -diff
                    / sigma**2
                    * np_gauss(t[:, None], x[None, :, i], sigma)
                    * np_gauss(zeta, x[None, :, j], sigma),
                    axis=1,
                )
                u = np.abs(joint_d / p_zeta)  # eqs. 3-4
                pt.append(u / (h * u.sum()))  # eq. 5
            pt = np.array(pt)
            biv += H(pt.mean(0)) - np.mean([H(p) for p in pt])  # eq. 6
    return uni, biv, kl


def np_klm(z, std):
    """Tripod eqs. 11-14 in float64 with the normalized Gaussian densities written out."""
    z = np.asarray(z, np.float64)
    std = np.asarray(std, np.float64)
    n, d = z.shape
    s2 = (4.0 / ((d + 2) * n)) ** (2.0 / (d + 4)) * std**2  # eq. 12
    total = 0.0
    for b in range(n):
        diff = z[b][None, :] - z  # (n, d)
        kj = np.exp(-0.5 * np.sum(diff**2 / s2, 1)) / ((2 * math.pi) ** (d / 2) * math.sqrt(np.prod(s2)))
        log_q = math.log(np.mean(kj))  # eq. 11
        log_qj = 0.0
        for j in range(d):  # eq. 13
            log_qj += math.log(np.mean(np_gauss(z[b, j], z[:, j], std[j])))
        total += log_q - log_qj
    return total / n


# ------------------------------------------------------------------ reference vs float64


@pytest.mark.parametrize("shape", [(7, 3, 11, 5), (40, 2, 20, 6), (23, 4, 17, 3)])
def test_reference_cliff_matches_equations(shape):
    n, d, k, m = shape
    z = latents(n, d)
    idx = cond_rows(n, d, m)
    out = ref.cliff_loss(z, idx, 0.25, -3.0, 3.0, k, 0.5, 1.0, 0.7)
    uni, biv, kl = np_cliff(z.cpu(), idx.cpu(), 0.25, (-3.0, 3.0, k))
    np.testing.assert_allclose([t.item() for t in out[1:]], [uni, biv, kl], rtol=1e-11)
    assert math.isclose(out[0].item(), 0.5 * uni + biv + 0.7 * kl, rel_tol=1e-11)


@pytest.mark.parametrize("name", backends_of("cliff_loss"))
def test_public_cliff_loss_matches_equations(name):
    # the whole public path per backend, set-up included (standardization, integration grid,
    # KL-uni points, step, lambdas), against the numpy equations; the grid (-2, 2) is narrower
    # than the standardized data, so samples lie at and beyond its edges
    n, d, k, m = 40, 3, 23, 6
    z, idx = latents(n, d), cond_rows(n, d, m)
    x = (z - z.mean(0)) / z.std(0, unbiased=False)
    assert (x.abs() > 2.0).any() and (x.abs() > 1.8).sum() > 2
    with qkernels.use_backend(name):
        out = cliff_loss(
            z,
            cond_index=idx,
            sigma=0.25,
            grid=(-2.0, 2.0, k),
            lambda_uni=0.3,
            lambda_biv=1.7,
            lambda_kl=0.9,
            return_terms=True,
        )
    uni, biv, kl = np_cliff(z.cpu(), idx.cpu(), 0.25, (-2.0, 2.0, k))
    np.testing.assert_allclose([t.item() for t in out[1:]], [uni, biv, kl], rtol=1e-10)
    assert math.isclose(out.total.item(), 0.3 * uni + 1.7 * biv + 0.9 * kl, rel_tol=1e-10)


@pytest.mark.parametrize("name", backends_of("klm"))
def test_public_klm_loss_matches_equations(name):
    # default std: the population std of z plus 1e-6 (Tripod), through the public path
    z = latents(37, 4)
    with qkernels.use_backend(name):
        got = klm_loss(z).item()
    zn = z.cpu().numpy()
    assert math.isclose(got, np_klm(zn, zn.std(0) + 1e-6), rel_tol=1e-10, abs_tol=1e-12)


@pytest.mark.parametrize("shape", [(9, 1), (31, 3), (50, 5)])
def test_reference_klm_matches_equations(shape):
    n, d = shape
    z = latents(n, d)
    std = ref.population_std(z) + 1e-6
    loss, lse = ref.klm(z, std)
    assert lse.shape == (n, d + 1)
    assert math.isclose(loss.item(), np_klm(z.cpu(), std.cpu()), rel_tol=1e-11, abs_tol=1e-12)


def test_reference_kde_grid_matches_equations():
    z = latents(13, 3)
    pts = torch.randn(3, 9, generator=_gen(3), dtype=torch.float64).to(DEVICE)
    for deriv in (False, True):
        got = ref.kde_grid(pts, z, 0.3, derivative=deriv).cpu().numpy()
        zz, pp = z.cpu().numpy(), pts.cpu().numpy()
        for j in range(3):
            diff = pp[j][:, None] - zz[None, :, j]
            ker = np_gauss(pp[j][:, None], zz[None, :, j], 0.3)
            want = np.mean(-diff / 0.09 * ker if deriv else ker, axis=1)
            np.testing.assert_allclose(got[j], want, rtol=1e-12, atol=1e-15)


def test_public_kde_grid_matches_equations(backend):
    # the public function (argument handling included) on every backend: density, then d/dt
    z = latents(13, 3)
    pts = torch.randn(3, 9, generator=_gen(3), dtype=torch.float64).to(DEVICE)
    zz, pp = z.cpu().numpy(), pts.cpu().numpy()
    for deriv in (False, True):
        got = kde_grid(pts, z, 0.3, derivative=deriv).detach().cpu().numpy()
        for j in range(3):
            diff = pp[j][:, None] - zz[None, :, j]
            ker = np_gauss(pp[j][:, None], zz[None, :, j], 0.3)
            want = np.mean(-diff / 0.09 * ker if deriv else ker, axis=1)
            np.testing.assert_allclose(got[j], want, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ every backend vs reference

# (n, d, K, M): M = 9 and 1 pad the cpu kernel's vectors of conditioning values (8 floats / 4 doubles)
CLIFF_SHAPES = [(7, 3, 11, 5), (123, 5, 37, 9), (64, 1, 20, 4), (301, 2, 100, 10), (50, 3, 30, 1)]


def _cliff_all(z, idx, k, dtype, names=None):
    res = {}
    for name in names or backends_of("cliff_loss", triton=False):
        zz = z.clone().requires_grad_()
        with qkernels.use_backend(name):
            out = cliff_loss(zz, cond_index=idx, grid=(-5.0, 5.0, k), return_terms=True)
        w = torch.tensor([0.3, 1.3, 0.7], dtype=dtype, device=DEVICE)
        (w[0] * out.uni + w[1] * out.biv + w[2] * out.kl).backward()
        res[name] = (torch.stack(list(out)).detach(), zz.grad)
    return res


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", CLIFF_SHAPES)
def test_cliff_backends_match_reference(shape, dtype):
    n, d, k, m = shape
    z = latents(n, d, dtype)
    idx = cond_rows(n, d, m)
    res = _cliff_all(z, idx, k, dtype)
    want, gwant = res["reference"]
    assert torch.isfinite(want).all() and torch.isfinite(gwant).all()
    if d == 1:
        assert want[2].item() == 0.0
    for name, (got, _) in res.items():
        torch.testing.assert_close(got, want, **tols(dtype), msg=f"{name} values")
    scale = gwant.abs().max()
    if dtype == torch.float64:
        for name, (_, grad) in res.items():
            torch.testing.assert_close(grad / scale, gwant / scale, **tols(dtype), msg=f"{name} grad")
        return
    # float32: the gradient is ill-conditioned (at (301, 2, 100, 10) the reference's own float32
    # gradient is 5e-4 of its largest entry away from float64), so each backend is held to the float64
    # gradient within twice the float32 reference's own error (and 2e-5)
    truth = _cliff_all(z.double(), idx, k, torch.float64, names=["reference"])["reference"][1]
    own = ((gwant.double() - truth).abs().max() / scale).item()
    for name, (_, grad) in res.items():
        err = ((grad.double() - truth).abs().max() / scale).item()
        assert err <= max(2 * own, 2e-5), f"{name}: gradient error {err:.2e} vs the fp32 reference's {own:.2e}"


def test_cliff_fp32_underflow_gives_finite_gradients():
    # two far clusters: in fp32 the sigma=0.1 KDE is exactly 0 on most of the grid and between
    # the clusters at the KL-uni points
    g = _gen(5)
    z = torch.cat([torch.randn(40, 3, generator=g) * 0.05 - 1, torch.randn(40, 3, generator=g) * 0.05 + 1])
    idx = cond_rows(80, 3, 6)
    for name in backends_of("cliff_loss", triton=False):
        zz = z.clone().to(DEVICE).requires_grad_()
        with qkernels.use_backend(name):
            out = cliff_loss(zz, cond_index=idx, return_terms=True)
        out.total.backward()
        assert all(torch.isfinite(t) for t in out), name
        assert torch.isfinite(zz.grad).all(), name


def test_cliff_collapsed_latent_is_finite():
    z = latents(30, 3)
    z[:, 1] = 0.7  # a collapsed latent: std clamped to 1e-6, no NaN
    for name in backends_of("cliff_loss", triton=False):
        zz = z.clone().requires_grad_()
        with qkernels.use_backend(name):
            loss = cliff_loss(zz, cond_index=cond_rows(30, 3, 4))
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(zz.grad).all(), name


@pytest.mark.parametrize("dtype", DTYPES)
# the cpu kernel's symmetric tiles: n = 2 (one partial tile), 200 (4 tiles of 64, the last partial),
# 1100 (16 tiles of 72)
@pytest.mark.parametrize("shape", [(7, 3), (123, 5), (64, 1), (200, 9), (2, 3), (1100, 2)])
def test_klm_backends_match_reference(shape, dtype):
    n, d = shape
    z0 = latents(n, d, dtype)
    s0 = (ref.population_std(z0) * 1.3 + 0.1).detach()
    res = {}
    for name in backends_of("klm", triton=False):
        z, s = z0.clone().requires_grad_(), s0.clone().requires_grad_()
        with qkernels.use_backend(name):
            loss = klm_loss(z, std=s)
        loss.backward()
        res[name] = (loss.detach(), z.grad, s.grad)
    want = res["reference"]
    for name, got in res.items():
        for a, b, what in zip(got, want, ("loss", "grad z", "grad std"), strict=True):
            torch.testing.assert_close(a, b, **tols(dtype), msg=f"{name} {what}")
    # the default std (population std + 1e-6) is differentiable through z
    for name in backends_of("klm", triton=False):
        z = z0.clone().requires_grad_()
        with qkernels.use_backend(name):
            klm_loss(z).backward()
        assert torch.isfinite(z.grad).all()


@pytest.mark.skipif(DEVICE != "cpu" or "cpu" not in backends_of("klm"), reason="the cpu kernels")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_kernels_same_on_baseline_isa(monkeypatch, dtype):
    # the cpu KDE kernels are compiled twice (baseline x86-64 and AVX+FMA, csrc/cpu/isa.h) and picked
    # at run time: both copies match the reference (QKERNELS_CPU_ISA=baseline forces the first)
    z0, idx = latents(150, 3, dtype), cond_rows(150, 3, 9)
    results = {}
    for isa in ("baseline", "auto"):
        monkeypatch.setenv("QKERNELS_CPU_ISA", isa)
        z = z0.clone().requires_grad_()
        with qkernels.use_backend("cpu"):
            out = torch.stack(list(cliff_loss(z, cond_index=idx, grid=(-5.0, 5.0, 40), return_terms=True)))
            (out.sum() + klm_loss(z)).backward()
        results[isa] = (out.detach(), z.grad)
    zr = z0.clone().requires_grad_()
    out = torch.stack(list(cliff_loss(zr, cond_index=idx, grid=(-5.0, 5.0, 40), return_terms=True)))
    (out.sum() + klm_loss(zr)).backward()
    for isa, (got, grad) in results.items():
        torch.testing.assert_close(got, out.detach(), **tols(dtype), msg=f"{isa} values")
        torch.testing.assert_close(
            grad / zr.grad.abs().max(), zr.grad / zr.grad.abs().max(), **tols(dtype), msg=f"{isa} grad"
        )


@pytest.mark.skipif(DEVICE != "cpu" or "cpu" not in backends_of("klm"), reason="the cpu kernels")
def test_cpu_kernels_bitwise_independent_of_thread_count():
    # fixed task partitions (Cliff's groups of conditioning latents, KLM's tiles) summed in a fixed
    # order: the same bits with 1 thread as with several
    z0, idx = latents(300, 5, torch.float32), cond_rows(300, 5, 12)

    def run():
        z = z0.clone().requires_grad_()
        with qkernels.use_backend("cpu"):
            out = cliff_loss(z, cond_index=idx) + klm_loss(z)
        out.backward()
        return out.detach(), z.grad

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(max(2, before))
        many = run()
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU")
@pytest.mark.parametrize("given_std", [False, True])
def test_triton_klm_in_a_cuda_graph(given_std):
    """Issue 53's KLM (arrival tickets, their counters made inside the capture): forward + backward captured in a
    CUDA graph at the benchmark's 4096 x 64 and replayed twice: the eager results bit for bit, and no host
    synchronization inside the op."""
    if "triton" not in backends_of("klm"):
        pytest.skip("triton KDE backend not available")
    z0 = latents(4096, 64, torch.float32, seed=7)
    s0 = (ref.population_std(z0) * 1.3 + 0.1).detach()
    z, s = z0.clone().requires_grad_(), s0.clone().requires_grad_()

    def step():
        z.grad = s.grad = None
        with qkernels.use_backend("triton"):
            loss = klm_loss(z, std=s) if given_std else klm_loss(z)
        loss.backward()
        return (loss, z.grad) + ((s.grad,) if given_std else ())

    assert_graph_replays_match(step, [t.detach().clone() for t in step()])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("deriv", [False, True])
def test_kde_grid_backends_match_reference(dtype, deriv):
    samples = latents(57, 3, dtype)
    points = (torch.randn(3, 13, generator=_gen(4), dtype=torch.float64) * 2).to(dtype).to(DEVICE)
    up = torch.randn(3, 13, generator=_gen(6), dtype=torch.float64).to(dtype).to(DEVICE)
    res = {}
    for name in backends_of("kde_grid", triton=False):
        p, s = points.clone().requires_grad_(), samples.clone().requires_grad_()
        with qkernels.use_backend(name):
            out = kde_grid(p, s, 0.4, derivative=deriv)
        (out * up).sum().backward()
        res[name] = (out.detach(), p.grad, s.grad)
    for name, got in res.items():
        for a, b in zip(got, res["reference"], strict=True):
            torch.testing.assert_close(a, b, **tols(dtype), msg=name)


# ------------------------------------------------------------------ triton backend (tiny shapes: interpreter)


def _triton_kde(name):
    """The module ``name`` of the triton KDE package (qkernels/triton/kde/); skips where that backend
    is not available."""
    if "triton" not in backends_of("klm"):
        pytest.skip("triton KDE backend not available")
    return importlib.import_module(f"qkernels.triton.kde.{name}")


@pytest.fixture
def small_tiles(monkeypatch):
    klm, grid = _triton_kde("klm"), _triton_kde("grid")
    # KLM: "warps" of 4 threads, 2 latents a thread (float32 forward; else 1): d = 3 pads to 4 latents, 2 threads a
    # row and 2 rows a block (else 4 threads, 2 rows); ranges of 3 samples a (several, the last partial); load steps
    # of 4 values (prologue steps of 2 rows x 2 latents, loss partials 4 a step, chain partials 1-2 rows a step),
    # chain programs of 4 rows. kde_grid: 4-wide point/sample tiles. Every shape below has several blocks and a
    # partial last one, exercising the streaming loops, the masks and the ordered reductions
    for name, value in {"WARP": 4, "KLM_ROW_VALUES": 2, "KLM_MIN_SPAN": 3, "KLM_STEP_VALUES": 4}.items():
        monkeypatch.setattr(klm, name, value)
    monkeypatch.setattr(klm, "KLM_CHAIN_ROWS", 4)
    monkeypatch.setattr(klm, "KLM_PROLOGUE_COLS", 2)
    monkeypatch.setattr(grid, "BLOCK_K_GRID", 4)
    monkeypatch.setattr(grid, "BLOCK_S_GRID", 4)
    monkeypatch.setattr(grid, "POINT_BLOCKS", (4,))
    monkeypatch.setattr(grid, "POINT_TILE", 16)


def _grads_vs_reference(fn, inputs, up=None):
    """Values and input gradients of fn under the reference and the triton backend."""
    res = {}
    for name in ("reference", "triton"):
        xs = [x.clone().requires_grad_() for x in inputs]
        with qkernels.use_backend(name):
            out = fn(*xs)
        (out if up is None else out * up).sum().backward()
        res[name] = (out.detach(), *(x.grad for x in xs))
    return res


@pytest.mark.parametrize("dtype", DTYPES)
# 17 x 2: 5 row blocks of 4 (float32 forward; else 9 of 2) x 5 ranges of 4 samples a, the last of 1; the
# forward's loss partials of 5 (or 9) blocks added in 2 (3) steps of 4; the chain's 9 in 5 steps of 2
@pytest.mark.parametrize("shape", [(7, 3), (5, 1), (9, 5), (17, 2)])
def test_triton_klm_matches_reference(small_tiles, shape, dtype):
    n, d = shape
    z0 = latents(n, d, dtype)
    s0 = (ref.population_std(z0) * 1.3 + 0.1).detach()
    res = _grads_vs_reference(lambda z, s: klm_loss(z, std=s), (z0, s0))
    for a, b, what in zip(res["triton"], res["reference"], ("loss", "grad z", "grad std"), strict=True):
        torch.testing.assert_close(a, b, **tols(dtype), msg=what)
    assert res["triton"][1].abs().max() > 0 and res["triton"][2].abs().max() > 0
    # lse (the saved per-sample log-sum-exps) matches the reference too, and the default std
    # (differentiable through z) gives the same gradient as the reference
    torch.testing.assert_close(torch.ops.qkernels.klm_triton(z0, s0)[1], ref.klm(z0, s0)[1], **tols(dtype))
    res = _grads_vs_reference(klm_loss, (z0,))
    for a, b in zip(res["triton"], res["reference"], strict=True):
        torch.testing.assert_close(a, b, **tols(dtype))


def test_triton_klm_grad_loss_scales(small_tiles):
    z, s = latents(6, 2), torch.tensor([0.7, 1.3], dtype=torch.float64, device=DEVICE)
    _, lse = torch.ops.qkernels.klm_triton(z, s)
    one = torch.ops.qkernels.klm_backward_triton(torch.tensor(1.0, dtype=z.dtype, device=DEVICE), z, s, lse)
    half = torch.ops.qkernels.klm_backward_triton(torch.tensor(-0.5, dtype=z.dtype, device=DEVICE), z, s, lse)
    for a, b in zip(half, one, strict=True):
        torch.testing.assert_close(a, -0.5 * b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("deriv", [False, True])
@pytest.mark.parametrize("shape", [(11, 3, 7), (6, 1, 9)])  # (n, d, K)
def test_triton_kde_grid_matches_reference(small_tiles, shape, dtype, deriv):
    n, d, k = shape
    samples = latents(n, d, dtype)
    points = (torch.randn(d, k, generator=_gen(4), dtype=torch.float64) * 2).to(dtype).to(DEVICE)
    up = torch.randn(d, k, generator=_gen(6), dtype=torch.float64).to(dtype).to(DEVICE)
    res = _grads_vs_reference(lambda p, s: kde_grid(p, s, 0.4, derivative=deriv), (points, samples), up)
    for a, b, what in zip(res["triton"], res["reference"], ("out", "grad points", "grad samples"), strict=True):
        torch.testing.assert_close(a, b, **tols(dtype), msg=what)
        assert b.abs().max() > 0, what


@pytest.mark.parametrize("dtype", DTYPES)
# (n, d, K, M); n = 19: 2 sample blocks; M = 1 arrives as a constexpr
@pytest.mark.parametrize("shape", [(7, 3, 11, 3), (19, 2, 9, 4), (6, 1, 5, 2), (12, 3, 9, 1)])
def test_triton_cliff_matches_reference(shape, dtype):
    _triton_kde("cliff")
    n, d, k, m = shape
    z0 = latents(n, d, dtype)
    idx = cond_rows(n, d, m)
    res = {}
    for name in ("reference", "triton"):
        z = z0.clone().requires_grad_()
        with qkernels.use_backend(name):
            out = cliff_loss(z, cond_index=idx, sigma=0.3, grid=(-3.0, 3.0, k), return_terms=True)
        # each term's gradient on its own (a sign error cannot hide in the total)
        grads = [torch.autograd.grad(out[1 + which], z, retain_graph=which < 2)[0] for which in range(3)]
        res[name] = (torch.stack([t.detach() for t in out[1:]]), torch.stack(grads))
    for a, b, what in zip(res["triton"], res["reference"], ("terms", "grads"), strict=True):
        torch.testing.assert_close(a, b, **tols(dtype), msg=what)
    assert res["reference"][1][0].abs().max() > 0 and res["reference"][1][2].abs().max() > 0
    if d > 1 and m > 1:  # one conditioning value: the mixture is that value's density, the JSD 0
        assert res["reference"][0][1] > 0 and res["reference"][1][1].abs().max() > 0


# under the interpreter the fused path's float64 at this size (15 s) is left to test_triton_cliff_matches_reference's
# float64 shapes (the fused path, one block)
BOTH_PATHS = unless_interpreted([(p, dt) for p in ("fused", "gemm") for dt in DTYPES], ("fused", torch.float64))


@pytest.mark.parametrize(("path", "dtype"), BOTH_PATHS, ids=str)
def test_triton_cliff_both_paths(monkeypatch, path, dtype):
    fused, gemm = _triton_kde("cliff_fused"), _triton_kde("cliff_gemm")
    # M = 70, K = 100: the fused path's (128, 128) block of J per pair, masked to (70, 100), in two column
    # blocks (forward) and two row blocks (backward), n = 80 in chunks of 64 (float32); forced onto the GEMM
    # path: one differentiated latent per chunk (3 chunks), the epilogue's k tiles 4096 / 128 = 32 wide, so
    # K = 100 takes four, the last partial
    n, d, k, m = 80, 3, 100, 70
    assert fused.fused_fits(n, d, m, k)
    if path == "gemm":
        monkeypatch.setattr(fused, "FUSED_MAX_TILE", 0)
        monkeypatch.setattr(gemm, "CHUNK_ELEMS", 1)
    z0, idx = latents(n, d, dtype), cond_rows(n, d, m)
    res = _grads_vs_reference(
        lambda z: torch.stack(list(cliff_loss(z, cond_index=idx, sigma=0.3, grid=(-3.0, 3.0, k), return_terms=True))),
        (z0,),
        torch.tensor([0.4, 0.3, 1.1, 0.7], dtype=dtype, device=DEVICE),
    )
    for a, b, what in zip(res["triton"], res["reference"], ("terms", "grad"), strict=True):
        torch.testing.assert_close(a, b, **tols(dtype), msg=what)
    assert res["reference"][0][2] > 0


# under the interpreter float64 at d = 3 (15 s) is left to d = 1 and test_triton_cliff_both_paths' GEMM path in float64
SKIPS = unless_interpreted([(d, dt) for d in (3, 1) for dt in DTYPES], (3, torch.float64))


@pytest.mark.parametrize(("d", "dtype"), SKIPS, ids=str)
def test_triton_cliff_gemm_path_skips_outside_the_window(monkeypatch, d, dtype):
    fused, gemm = _triton_kde("cliff_fused"), _triton_kde("cliff_gemm")
    # sigma 0.04: a grid tile's window (10 sigma) holds a fraction of the samples; the skipped
    # terms are below 10 e^-50 of a term's peak, so the result matches the dense reference
    n, k, m, sigma, grid = 160, 48, 20, 0.04, (-2.5, 2.5, 48)
    monkeypatch.setattr(fused, "FUSED_MAX_TILE", 0)
    monkeypatch.setattr(gemm, "GEMM_BLOCKS", {"R": 16, "S": 16, "K": 16, "warps": 4})
    z0, idx = latents(n, d, dtype), cond_rows(n, d, m)
    frac = gemm.biv_work_fraction(ref.standardize(z0), grid[0], grid[1], k, sigma)
    assert frac < 0.8, frac  # the skip is exercised
    res = _grads_vs_reference(
        lambda z: torch.stack(list(cliff_loss(z, cond_index=idx, sigma=sigma, grid=grid, return_terms=True))),
        (z0,),
        torch.tensor([0.4, 0.3, 1.1, 0.7], dtype=dtype, device=DEVICE),
    )
    for a, b, what in zip(res["triton"], res["reference"], ("terms", "grad"), strict=True):
        torch.testing.assert_close(a, b, **tols(dtype), msg=what)
    assert res["reference"][0][2 if d > 1 else 1] > 0


def _rel_errors(fn, z, want):
    """Relative errors (total, uni, biv, kl, gradient norm) of fn's Cliff terms at z against float64 ones."""
    z = z.clone().requires_grad_()
    got = fn(z)
    got.total.backward()
    errs = [abs(g.double().item() - w.item()) / abs(w.item()) for g, w in zip(got, want[0], strict=True)]
    return errs + [((z.grad.double() - want[1]).norm() / want[1].norm()).item()]


@pytest.mark.skipif(DEVICE != "cuda", reason="the matmul precision modes act on a GPU")
@pytest.mark.parametrize("path", ["fused", "gemm"])
@pytest.mark.parametrize(("mode", "bound"), [("high", 2e-4), ("medium", 1e-3)])
def test_triton_cliff_precision_modes(monkeypatch, path, mode, bound):
    # the bivariate products follow torch.get_float32_matmul_precision(): "highest" (3xTF32) within
    # 2x the float32 reference's own error of the loss terms and the gradient, against float64;
    # "high" (TF32) and "medium" (bf16 inputs) within the stated bounds (provisional: 10x the TF32 /
    # bf16 input-rounding error emulated on a CPU, until a GPU run measures them; benchmarks/RESULTS.md)
    if "triton" not in backends_of("cliff_loss"):
        pytest.skip("triton not available")
    import qkernels.triton.kde.cliff_fused as fused

    if path == "gemm":
        monkeypatch.setattr(fused, "FUSED_MAX_TILE", 0)
    n, d, k, m = 1024, 12, 100, 64
    z, idx = latents(n, d, torch.float32), cond_rows(n, d, m)

    def cliff(z):
        return cliff_loss(z, cond_index=idx, grid=(-5.0, 5.0, k), return_terms=True)

    z64 = z.double().requires_grad_()
    with qkernels.use_backend("reference"):
        want = cliff(z64)
        want[0].backward()
        own = _rel_errors(cliff, z, ([w.detach() for w in want], z64.grad))  # float32 reference, eager
    before = torch.get_float32_matmul_precision()
    try:
        with qkernels.use_backend("triton"):
            torch.set_float32_matmul_precision("highest")
            highest = _rel_errors(cliff, z, ([w.detach() for w in want], z64.grad))
            torch.set_float32_matmul_precision(mode)
            lower = _rel_errors(cliff, z, ([w.detach() for w in want], z64.grad))
        with qkernels.use_backend("reference"):
            ref_lower = _rel_errors(cliff, z, ([w.detach() for w in want], z64.grad))
    finally:
        torch.set_float32_matmul_precision(before)
    print(f"{path}: reference fp32 {own}, highest {highest}, {mode} {lower}, reference {mode} {ref_lower}")
    for h, o in zip(highest, own, strict=True):  # an error under 1e-6 (8 float32 ulps) is rounding luck: 1e-6
        assert h <= 2 * max(o, 1e-6), (highest, own)
    # "high" / "medium": within the bound, or within 2x the reference's own error under the same mode (its einsum
    # then runs in TF32 too). An H200 measured the gradient 7.8% off at "high" on the GEMM path, and 19% at
    # "medium" when it meant bf16 inputs (benchmarks/RESULTS.md): Cliff's gradient amplifies the rounding ~50x
    for low, r in zip(lower, ref_lower, strict=True):
        assert low <= max(bound, 2 * r), (lower, ref_lower)


def test_triton_cliff_fp32_underflow_finite():
    _triton_kde("cliff")
    _assert_underflow_case_within_float32_error()


def test_triton_cliff_divides_as_torch_does(monkeypatch):
    """Triton's float32 ``/`` is div.full.f32 on a GPU (up to 2 ulp), exact in the interpreter: here it is made
    approximate (each quotient off by up to 2^-22, random) and the fused Cliff must stay within the underflow
    case's bound. On an H200 the in-kernel grid step (hi - lo) / (K - 1) divided so put every grid point off
    torch.linspace's, and the gradient 4-6x the float32 reference's error (this emulation: 11-20x); the kernels
    divide with div.rn (``_cliff_common._div``) since."""
    interpreter = require("triton.runtime.interpreter", "triton")
    if not hasattr(interpreter, "InterpreterBuilder") or not os.environ.get("TRITON_INTERPRET"):
        pytest.skip("needs the Triton interpreter")
    _triton_kde("cliff")
    rng = np.random.default_rng(0)

    def approximate(a, b):
        q = np.divide(a, b)
        if q.dtype != np.float32:
            return q
        return (q.astype(np.float64) * (1 + (rng.random(q.shape) * 2 - 1) * 2.0**-22)).astype(np.float32)

    monkeypatch.setattr(
        interpreter.InterpreterBuilder, "create_fdiv", lambda self, lhs, rhs: self.binary_op(lhs, rhs, approximate)
    )
    _assert_underflow_case_within_float32_error()


def _assert_underflow_case_within_float32_error():
    # sigma 0.1 on a wide grid: most grid columns underflow to exactly 0 in fp32
    # each float32 backend within 2x the float32 reference's own error against float64 (or 8 ulps): an H200's
    # 3xTF32 products put one gradient element of this ill-conditioned case 3e-3 (relative) off the float32
    # reference, which was itself that far off
    z = latents(12, 2, torch.float32)
    idx = cond_rows(12, 2, 3)
    res = {}
    for name, dtype in (("reference", torch.float64), ("reference", torch.float32), ("triton", torch.float32)):
        zz = z.to(dtype, copy=True).requires_grad_()
        with qkernels.use_backend(name):
            loss = cliff_loss(zz, cond_index=idx, sigma=0.1, grid=(-6.0, 6.0, 16))
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(zz.grad).all(), name
        res[name, dtype] = (loss.detach().double(), zz.grad.double())
    exact = res["reference", torch.float64]
    own = [(a - b).abs() for a, b in zip(res["reference", torch.float32], exact, strict=True)]
    got = [(a - b).abs() for a, b in zip(res["triton", torch.float32], exact, strict=True)]
    for g, o, e in zip(got, own, exact, strict=True):
        floor = 1e-6 * e.abs().max()  # 8 float32 ulps of the largest value
        assert (g <= 2 * torch.maximum(o, floor)).all(), (g, o)


# ------------------------------------------------------------------ gradcheck / opcheck / compile


def _native(op):
    """Whether the C++ op ``qkernels::<op>`` has a kernel for the test device (the cuda backend has no Cliff: its
    CUDA C++ kernel was deleted in issue 26; the cpu one is tested on CPU tensors)."""
    return ("cuda" if DEVICE == "cuda" else "cpu") in implementations(op)


@pytest.mark.skipif(not _native("klm"), reason="native KDE ops not built")
def test_gradcheck_fp64():
    ops = torch.ops.qkernels
    if _native("cliff_loss"):
        z = latents(8, 3).requires_grad_()
        idx = cond_rows(8, 3, 3)
        w = torch.tensor([0.3, -0.2, 1.1, 0.6], dtype=torch.float64, device=DEVICE)
        assert torch.autograd.gradcheck(
            lambda z: (torch.stack(ops.cliff_loss(z, idx, 0.4, -3.0, 3.0, 9, 0.5, 1.0, 0.7)) * w).sum(), (z,)
        )
    z = latents(9, 3).requires_grad_()
    s = (ref.population_std(z) + 0.2).detach().requires_grad_()
    assert torch.autograd.gradcheck(lambda z, s: ops.klm(z, s)[0], (z, s))
    assert torch.autograd.gradcheck(lambda z: ops.klm(z, None)[0], (z,))  # the op's default std
    p = torch.randn(3, 5, dtype=torch.float64, device=DEVICE, requires_grad=True)
    for deriv in (False, True):
        assert torch.autograd.gradcheck(lambda p, z, deriv=deriv: ops.kde_grid(p, z, 0.5, deriv), (p, z))


def _op_args():
    return latents(10, 3), cond_rows(10, 3, 4)


# the Triton ops' registration (schema, fakes, autograd) does not depend on the dtype, and their float64 values are
# checked against the reference elsewhere: on a CPU, float32 only (the interpreter took 21 s for float64)
OPCHECK = unless_interpreted([(suffix, dt) for suffix in ("", "_triton") for dt in DTYPES], ("_triton", torch.float64))


@pytest.mark.parametrize(("suffix", "dt"), OPCHECK, ids=str)
def test_opcheck(suffix, dt):
    ops = torch.ops.qkernels
    if suffix == "" and not _native("klm"):
        pytest.skip("native KDE ops not built")
    elif suffix and (not hasattr(ops, "cliff_loss_triton") or "triton" not in backends_of("cliff_loss")):
        pytest.skip("triton KDE ops not available")
    z, idx = _op_args()
    z = z.to(dt)
    one = torch.tensor(1.0, dtype=dt, device=DEVICE)
    if suffix or _native("cliff_loss"):
        args = (idx, 0.3, -5.0, 5.0, 12, 0.5, 1.0, 0.7)
        torch.library.opcheck(getattr(ops, "cliff_loss" + suffix), (z.clone().requires_grad_(), *args))
        torch.library.opcheck(getattr(ops, "cliff_loss_backward" + suffix), (one, one, one, one, z, *args))
        torch.library.opcheck(getattr(ops, "cliff_loss_backward" + suffix), (one, None, None, None, z, *args))
    s = ref.population_std(z) + 0.1
    for std in (s, None):
        torch.library.opcheck(
            getattr(ops, "klm" + suffix),
            (z.clone().requires_grad_(), None if std is None else std.clone().requires_grad_()),
        )
        _, lse = getattr(ops, "klm" + suffix)(z, std)
        torch.library.opcheck(getattr(ops, "klm_backward" + suffix), (one, z, std, lse))
    x = ref.standardize(z)
    p = torch.linspace(-5, 5, 12, dtype=dt, device=DEVICE).reshape(3, 4).clone().requires_grad_()
    torch.library.opcheck(getattr(ops, "kde_grid" + suffix), (p, x.clone().requires_grad_(), 0.3, True))
    torch.library.opcheck(getattr(ops, "kde_grid_backward" + suffix), (p.detach(), p.detach(), x, 0.3, False))


# ------------------------------------------------------------------ properties from the papers


def _discontinuous_2d(n, seed=0):
    """Independent latents whose densities jump at 0 and 1 (p = 0.75 on [0, 1], 0.25 on [1, 2])."""
    g = _gen(seed)
    u = torch.rand(n, 2, generator=g, dtype=torch.float64)
    hi = (torch.rand(n, 2, generator=g, dtype=torch.float64) < 0.25).double()
    return u + hi


def _project(z, t1, t2):
    a1, a2 = math.radians(t1), math.radians(t2)
    w = torch.tensor([[math.cos(a1), math.cos(a2)], [math.sin(a1), math.sin(a2)]], dtype=z.dtype, device=z.device)
    return z @ w  # columns: <z, w_1>, <z, w_2>  (eq. 16)


def test_cliff_landscape_appendix_d():
    """Cliff App. D: l_uni lowest for axis-aligned directions; l_biv lowest at (0, 90) / (90, 0)
    and not on the diagonal t1 = t2."""
    name = "cpu" if "cpu" in backends_of("cliff_loss") else "reference"
    z = _discontinuous_2d(1500).to(DEVICE)
    idx = cond_rows(1500, 2, 10, seed=2)
    angles = list(range(0, 180, 15 if name == "cpu" else 30))
    with qkernels.use_backend(name):
        uni = {t: cliff_loss(_project(z, t, t + 90), cond_index=idx, return_terms=True).uni.item() for t in angles}
        biv = {}
        for t1 in angles:
            for t2 in angles:
                terms = cliff_loss(_project(z, t1, t2), cond_index=idx, return_terms=True)
                biv[t1, t2] = terms.biv.item()
    assert min(uni, key=uni.get) in (0, 90)
    assert uni[0] < min(uni[t] for t in angles if t % 90) and uni[90] < min(uni[t] for t in angles if t % 90)
    best = min(biv, key=biv.get)
    assert best in ((0, 90), (90, 0)), best
    diag = [biv[t, t] for t in angles]
    assert min(diag) > biv[0, 90] and min(diag) > biv[90, 0]


def _klm_gaussian_bias(n, d):
    """Large-n KLM of independent standard Gaussians: Tripod's marginal bandwidth = std smooths
    each q_j to N(0, 2) and the joint to N(0, 1 + f^2), so the estimator's zero sits at
    sum_j [E log N(0, 1 + f^2) - E log N(0, 2)] > 0 rather than at 0."""
    f2 = ref.silverman_factor(n, d) ** 2
    joint = -0.5 * math.log(2 * math.pi * (1 + f2)) - 0.5 / (1 + f2)
    marg = -0.5 * math.log(2 * math.pi * 2) - 0.25
    return d * (joint - marg)


def test_klm_independent_near_zero_and_grows_with_correlation():
    g = _gen(7)
    e = torch.randn(1500, 2, generator=g, dtype=torch.float64)
    values = []
    for rho in (0.0, 0.3, 0.6, 0.9):
        z = torch.stack([e[:, 0], rho * e[:, 0] + math.sqrt(1 - rho * rho) * e[:, 1]], 1)
        values.append(klm_loss(z.to(DEVICE)).item())
    # independent: ~0 up to the estimator's smoothing bias (0.19 here)
    assert abs(values[0] - _klm_gaussian_bias(1500, 2)) < 0.05, values
    assert all(b > a + 0.02 for a, b in zip(values, values[1:], strict=False)), values
    # the growth tracks the true mutual information -1/2 log(1 - rho^2) (0.83 at rho = 0.9)
    assert 0.5 < values[-1] - values[0] < 0.9, values
    # higher dimension: making one pair dependent raises KLM
    z4 = torch.randn(1500, 4, generator=g, dtype=torch.float64)
    z4c = z4.clone()
    z4c[:, 1] = 0.9 * z4[:, 0] + math.sqrt(1 - 0.81) * z4[:, 1]
    assert klm_loss(z4c.to(DEVICE)).item() > klm_loss(z4.to(DEVICE)).item() + 0.3


@pytest.mark.parametrize("name", backends_of("cliff_loss"))
def test_cliff_invariant_to_affine_rescaling(name):
    z = latents(90, 4)
    idx = cond_rows(90, 4, 7)
    # 1e-4: a nearly collapsed latent (variance ~1e-8) is still standardized exactly (the clamp is
    # on the std at 1e-6, i.e. on the variance at 1e-12)
    scale = torch.tensor([1e-4, 3.0, 250.0, 1.7], dtype=torch.float64, device=DEVICE)
    shift = torch.tensor([5.0, -2.0, 1e3, 0.1], dtype=torch.float64, device=DEVICE)
    with qkernels.use_backend(name):
        a = torch.stack(list(cliff_loss(z, cond_index=idx, return_terms=True)))
        b = torch.stack(list(cliff_loss(z * scale + shift, cond_index=idx, return_terms=True)))
    torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


# ------------------------------------------------------------------ API details and bad input


def test_cond_index_from_generator_and_terms():
    z = latents(50, 3)
    a = cliff_loss(z, generator=_gen(11), return_terms=True)
    b = cliff_loss(z, generator=_gen(11), return_terms=True)
    assert isinstance(a, CliffTerms)
    torch.testing.assert_close(torch.stack(list(a)), torch.stack(list(b)))
    assert math.isclose(a.total.item(), 0.5 * a.uni.item() + a.biv.item() + 0.7 * a.kl.item(), rel_tol=1e-12)
    assert cliff_loss(z, generator=_gen(11)).shape == ()


def test_bad_input_errors(all_value_checks):
    z = latents(20, 3)
    with pytest.raises(TypeError, match="z"):
        cliff_loss(z.numpy() if DEVICE == "cpu" else z.cpu().numpy())
    with pytest.raises(ValueError, match="n >= 2"):
        cliff_loss(z[:1])
    with pytest.raises(ValueError, match="a < b"):  # an empty integration interval
        cliff_loss(z, grid=(1.0, 1.0, 10))
    with pytest.raises(ValueError, match="z must have 2"):
        cliff_loss(z[0])
    bad = z.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        cliff_loss(bad)
    with pytest.raises(ValueError, match="sigma"):
        cliff_loss(z, sigma=0.0)
    with pytest.raises(ValueError, match="K"):
        cliff_loss(z, grid=(-5.0, 5.0, 1))
    with pytest.raises(ValueError, match="a < b"):
        cliff_loss(z, grid=(5.0, -5.0, 10))
    with pytest.raises(ValueError, match="num_cond"):
        cliff_loss(z, num_cond=21)
    with pytest.raises(ValueError, match="cond_index"):
        cliff_loss(z, cond_index=torch.zeros(2, 4, dtype=torch.long, device=DEVICE))
    with pytest.raises(ValueError, match="cond_index"):
        cliff_loss(z, cond_index=torch.full((3, 4), 20, dtype=torch.long, device=DEVICE))
    with pytest.raises(TypeError, match="cond_index"):
        cliff_loss(z, cond_index=torch.zeros(3, 4, device=DEVICE))
    with pytest.raises(ValueError, match="n >= 2"):
        klm_loss(z[:1])
    with pytest.raises(ValueError, match="std"):
        klm_loss(z, std=torch.ones(2, dtype=z.dtype, device=DEVICE))
    with pytest.raises(ValueError, match="std"):
        klm_loss(z, std=torch.zeros(3, dtype=z.dtype, device=DEVICE))
    with pytest.raises(TypeError, match="std"):
        klm_loss(z, std=torch.ones(3, dtype=torch.float32, device=DEVICE))
    with pytest.raises(ValueError, match="samples"):
        kde_grid(torch.zeros(2, 5, dtype=z.dtype, device=DEVICE), z, 0.1)
    with pytest.raises(ValueError, match="sigma"):
        kde_grid(torch.zeros(3, 5, dtype=z.dtype, device=DEVICE), z, -1.0)


def test_klm_scalar_std_broadcasts_and_bad_std_values(all_value_checks):
    """std: a number or a 0-d tensor is one scale for every latent (gradient summed over them)."""
    from qkernels.nn.kde import KLMLoss

    z = latents(20, 3)
    full = klm_loss(z, std=torch.full((3,), 0.7, dtype=z.dtype, device=DEVICE))
    assert klm_loss(z, std=0.7) == full
    assert KLMLoss()(z, 0.7) == full
    assert klm_loss(z, std=2) == klm_loss(z, std=2.0)
    s0 = torch.tensor(0.7, dtype=z.dtype, device=DEVICE, requires_grad=True)
    s1 = torch.full((3,), 0.7, dtype=z.dtype, device=DEVICE, requires_grad=True)
    klm_loss(z, std=s0).backward()
    klm_loss(z, std=s1).backward()
    torch.testing.assert_close(s0.grad, s1.grad.sum(), rtol=1e-12, atol=1e-14)
    for bad, exc in (
        (0, ValueError),
        (-1, ValueError),
        (0.0, ValueError),
        (float("inf"), ValueError),
        (True, TypeError),
        ("x", TypeError),
        ([0.7, 0.7, 0.7], TypeError),
        (torch.tensor(-1.0, dtype=z.dtype, device=DEVICE), ValueError),
        (torch.ones(1, 3, dtype=z.dtype, device=DEVICE), ValueError),
    ):
        with pytest.raises(exc, match="std"):
            klm_loss(z, std=bad)


def test_modules():
    from qkernels.nn.kde import CliffLoss, KLMLoss

    z = latents(40, 3).requires_grad_()
    crit = CliffLoss(num_cond=5, return_terms=True)
    out = crit(z, generator=_gen(2))
    assert isinstance(out, CliffTerms)
    out.total.backward()
    assert torch.isfinite(z.grad).all()
    assert "sigma=0.1" in repr(crit)
    # the module passes each hyper-parameter to its place: total = sum of lambda * term (numpy)
    idx = cond_rows(40, 3, 5)
    weighted = CliffLoss(sigma=0.25, grid=(-3.0, 3.0, 17), lambda_uni=0.3, lambda_biv=1.7, lambda_kl=0.9)
    uni, biv, kl = np_cliff(z.detach().cpu(), idx.cpu(), 0.25, (-3.0, 3.0, 17))
    assert math.isclose(weighted(z, cond_index=idx).item(), 0.3 * uni + 1.7 * biv + 0.9 * kl, rel_tol=1e-9)
    zd = z.detach().double()
    assert math.isclose(KLMLoss()(zd).item(), np_klm(zd.cpu().numpy(), zd.cpu().numpy().std(0) + 1e-6), rel_tol=1e-9)
    std = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64, device=zd.device)
    assert math.isclose(KLMLoss()(zd, std).item(), np_klm(zd.cpu().numpy(), std.cpu().numpy()), rel_tol=1e-9)
    with pytest.raises(ValueError, match="sigma"):
        CliffLoss(sigma=-1.0)


def test_cliff_loss_defaults_are_the_papers():
    # Cliff (ICML 2025) eq. 15 and App. F.4 (Shapes3D optimum): sigma 0.1, K = 100 points on [-5, 5], M = 10
    # conditioning rows, lambda_uni 0.5, lambda_biv 1, lambda_KL-uni 0.7; the module mirrors them
    import inspect

    from qkernels.nn.kde import CliffLoss

    want = {
        "sigma": 0.1,
        "grid": (-5.0, 5.0, 100),
        "num_cond": 10,
        "lambda_uni": 0.5,
        "lambda_biv": 1.0,
        "lambda_kl": 0.7,
    }
    for fn in (cliff_loss, CliffLoss.__init__):
        params = inspect.signature(fn).parameters
        assert {k: params[k].default for k in want} == want, fn


def test_num_cond_may_use_every_row():
    # num_cond = n draws every row once (without replacement): the bivariate term averages over the M
    # conditioning values, so it equals conditioning on the rows in order; n + 1 is an error
    z = latents(9, 3)
    whole = cliff_loss(z, num_cond=9, generator=torch.Generator().manual_seed(0), return_terms=True)
    ordered = cliff_loss(z, cond_index=torch.arange(9, device=DEVICE).repeat(3, 1), return_terms=True)
    torch.testing.assert_close(torch.stack(list(whole)), torch.stack(list(ordered)), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="num_cond must be <= n = 9"):
        cliff_loss(z, num_cond=10)


def test_generator_draws_independent_rows_per_latent():
    """Audit 9 review: drawing ONE set of conditioning rows shared by every latent survived. Each latent j
    gets its own M rows without replacement: the M smallest of n uniform keys drawn from the generator as
    one (d, n) matrix (row j for latent j), as argsort computes them here; the loss equals the float64
    equations on those rows."""
    n, d, m = 12, 3, 4
    z = latents(n, d)
    got = cliff_loss(z, num_cond=m, generator=_gen(21), sigma=0.3, grid=(-4.0, 4.0, 15), return_terms=True)
    idx = torch.rand(d, n, generator=_gen(21)).argsort(1)[:, :m].to(DEVICE)
    assert len({tuple(r) for r in idx.tolist()}) == d  # different rows per latent here
    uni, biv, kl = np_cliff(z.cpu(), idx.cpu(), 0.3, (-4.0, 4.0, 15))
    assert math.isclose(got.biv.item(), biv, rel_tol=1e-9)
    assert math.isclose(got.uni.item(), uni, rel_tol=1e-9) and math.isclose(got.kl.item(), kl, rel_tol=1e-9)
    # the module draws its own num_cond rows the same way (not the default M = 10)
    from qkernels.nn.kde import CliffLoss

    mod = CliffLoss(num_cond=m, sigma=0.3, grid=(-4.0, 4.0, 15), lambda_uni=1.0, lambda_biv=0.0, lambda_kl=0.0)
    crit = CliffLoss(num_cond=m, sigma=0.3, grid=(-4.0, 4.0, 15), lambda_uni=0.0, lambda_biv=1.0, lambda_kl=0.0)
    assert math.isclose(crit(z, generator=_gen(21)).item(), biv, rel_tol=1e-9)
    assert math.isclose(mod(z, generator=_gen(21)).item(), uni, rel_tol=1e-9)


def test_booleans_and_infinite_scales_are_rejected_by_name():
    """Audit 9 review: True accepted as a bandwidth, a tau or a grid size (bool is an int subclass), and an
    infinite std accepted, survived. Each is an error that names the argument."""
    z = latents(8, 2)
    with pytest.raises(TypeError, match="sigma must be a number, got bool"):
        cliff_loss(z, sigma=True)
    with pytest.raises(TypeError, match=r"grid\[2\] \(K\) must be an int, got True"):
        cliff_loss(z, grid=(-5.0, 5.0, True))
    with pytest.raises(TypeError, match="num_cond must be an int, got bool"):
        cliff_loss(z, num_cond=True)
    with pytest.raises(TypeError, match="tau must be a number, got bool"):
        qkernels.gumbel_quantize(z, torch.randn(4, dtype=z.dtype, device=DEVICE), True)
    with pytest.raises(ValueError, match="std must be a finite number > 0, got inf"):
        klm_loss(z, std=math.inf)
    with pytest.raises(TypeError, match="std must be None, a number or a tensor"):
        klm_loss(z, std=True)


# ------------------------------------------------------------------ degenerate latents (issue 40)


@pytest.mark.parametrize("spread", [0.0, 1e-7, 1e-5], ids=["constant", "var1e-14", "var1e-10"])
def test_cliff_degenerate_latent_every_backend_and_path(spread, monkeypatch):
    """What every backend returns for a latent whose variance is at or below the clamp (1e-12, std 1e-6): the
    reference's standardization x = (z - mean) / sqrt(max(var, 1e-12)), the std a constant below the clamp (no
    gradient through it). Float64, against the reference: the loss to 1e-10 and the gradient to 1e-8 of its
    largest entry (~1e7 for a column of spread 1e-7; a backward that mistreats the clamped std is off by ~1e-3 of
    it). On the triton backend both paths: the fused one and the block-sparse GEMM one."""
    z = latents(40, 3)
    z[:, 1] = 0.3 + spread * torch.linspace(-1, 1, 40, dtype=torch.float64, device=DEVICE) ** 3
    idx = cond_rows(40, 3, 6)

    def run(name):
        zz = z.clone().requires_grad_()
        with qkernels.use_backend(name):
            terms = cliff_loss(zz, cond_index=idx, sigma=0.2, grid=(-4.0, 4.0, 24), return_terms=True)
        terms.total.backward()
        return torch.stack(terms).detach(), zz.grad

    want, gwant = run("reference")
    assert torch.isfinite(want).all() and torch.isfinite(gwant).all()
    paths = [(b, None) for b in backends_of("cliff_loss") if b not in ("reference", "triton")]
    if "triton" in backends_of("cliff_loss"):
        fused = importlib.import_module("qkernels.triton.kde.cliff_fused")
        paths += [("triton", fused.FUSED_MAX_TILE), ("triton", 0)]  # 0: every tile on the GEMM path
    assert paths, "no kernel backend to compare"
    for name, tile in paths:
        if tile is not None:
            monkeypatch.setattr(importlib.import_module("qkernels.triton.kde.cliff_fused"), "FUSED_MAX_TILE", tile)
        got, g = run(name)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=f"{name} tile {tile}: loss terms")
        scale = gwant.abs().max()
        assert (g - gwant).abs().max() <= 1e-8 * scale, (name, tile, (g - gwant).abs().max().item(), scale.item())


@pytest.mark.parametrize("case", ["constant column", "n=2", "ties"])
def test_klm_and_kde_grid_degenerate_inputs_every_backend(case):
    """Issue 40: KLM (its default std: a constant column's is 1e-6) and kde_grid on a constant column, two
    samples, and samples repeated (ties: pair terms exp(0)); every backend against the reference in float64."""
    z = latents(2 if case == "n=2" else 24, 3)
    if case == "constant column":
        z[:, 0] = 1.25
    elif case == "ties":
        z[12:] = z[:12]
    points = torch.linspace(-3, 3, 15, dtype=torch.float64, device=DEVICE).repeat(3, 1)

    def run(name):
        zz, pp = z.clone().requires_grad_(), points.clone().requires_grad_()
        with qkernels.use_backend(name):
            loss = klm_loss(zz)
            grid = kde_grid(pp, zz, 0.3, derivative=True)
        torch.autograd.backward([loss, grid], [torch.ones_like(loss), torch.cos(grid)])
        return loss.detach(), grid.detach(), zz.grad, pp.grad

    want = run("reference")
    assert all(torch.isfinite(w).all() for w in want)
    for name in backends_of("klm"):
        for got, w, what in zip(run(name), want, ("klm", "kde_grid", "dz", "dpoints"), strict=True):
            scale = w.abs().max().clamp_min(1e-300)
            assert (got - w).abs().max() <= 1e-9 * scale, (name, case, what, (got - w).abs().max().item())
