"""Edge values on every backend forced (issue 48), not only through ``auto`` (which on a CPU skips triton and,
per op, the kernels measured slower): ties, zeros, exact 0 / 1 noise, constant inputs, one category, one
sample. Each backend against the reference (the specification) or against values worked out by hand.

Covered elsewhere, on every backend: the KDE ops' constant columns, n = 2 and tied samples (test_kde.py, issue
40); latent_quantize's halfway ties, repeated values and far-out latents, n = 1 (test_quantize.py); the
curvature penalty's tied maxima and NaN (test_hessian.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import DEVICE

import qkernels
from qkernels._backend import implementations, kernels
from qkernels.reference import hessian as ref_hessian

DTYPES = [torch.float32, torch.float64]
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-6}, torch.float64: {"rtol": 1e-10, "atol": 1e-12}}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _run(backend: str, fn, leaves, upstream=None):
    """fn(*leaves) under ``backend``: (outputs, leaves' gradients of sum(output * upstream))."""
    xs = [t.clone().requires_grad_() for t in leaves]
    with qkernels.use_backend(backend):
        out = fn(*xs)
    outs = list(out) if isinstance(out, tuple) else [out]
    ups = upstream if upstream is not None else [torch.ones_like(o) for o in outs]
    pairs = [(o, u) for o, u in zip(outs, ups, strict=True) if o.requires_grad]
    torch.autograd.backward([o for o, _ in pairs], [u for _, u in pairs])
    return [o.detach() for o in outs], [x.grad if x.grad is not None else torch.zeros_like(x) for x in xs]


def _assert_like_reference(op: str, fn, leaves, upstream=None, dtype=torch.float64, what=""):
    want, gwant = _run("reference", fn, leaves, upstream)
    for w in want + gwant:
        assert torch.isfinite(w).all(), f"reference not finite {what}"
    for backend in kernels(op, DEVICE):
        got, ggot = _run(backend, fn, leaves, upstream)
        for i, (g, w) in enumerate(zip(got + ggot, want + gwant, strict=True)):
            assert torch.isfinite(g).all(), (backend, what, i)
            torch.testing.assert_close(g, w, **TOL[dtype], msg=lambda m, b=backend, i=i: f"{b} {what} [{i}]: {m}")


# ----------------------------------------------------------------------------- noise exactly 0 and 1


def _edge_noise(shape, dtype):
    """Uniform noise (N, d, K) with rows all 0, all 1, and 0 / 1 among interior values."""
    u = torch.rand(shape, generator=_gen(1), dtype=torch.float64).to(dtype)
    u[0] = 0.0
    u[1] = 1.0
    u[2, :, 0], u[2, :, -1] = 0.0, 1.0
    u[3, :, 1] = 0.0
    return u.to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hard", [False, True])
def test_categorical_noise_exactly_zero_and_one(dtype, hard):
    """Issue 48 (2): uniform noise u = 0 is valid ([0, 1)) and u = 1 is accepted; -log(-log(u)) is clamped, so
    every backend's sample, KL and gradients are finite and the reference's. A category with u = 0 among others keeps a
    weight far above the tolerance here (noise -log(-log(tiny)): -3.8 in float32, -6.5 in float64), which an
    unclamped log would make 0; u = 1 unclamped is an infinite logit (NaN)."""
    shape = (5, 3, 6)
    logits = (0.3 * torch.randn(shape, generator=_gen(2), dtype=torch.float64)).to(dtype).to(DEVICE)
    values = torch.randn(3, 6, generator=_gen(3), dtype=torch.float64).to(dtype).to(DEVICE)
    u = _edge_noise(shape, dtype)
    ups = [torch.randn(s, generator=_gen(4), dtype=torch.float64).to(dtype).to(DEVICE) for s in [(5, 3), shape, (5, 3)]]
    with qkernels.use_backend("reference"):  # the categories with u = 0 among others weigh well above the tolerance
        want = qkernels.categorical_latent(logits, values, uniform=u, tau=0.9, noise_scale=0.5)
    assert want.y[3, :, 1].min() > 100 * TOL[dtype]["atol"]
    _assert_like_reference(
        "relaxed_categorical",
        lambda lg, v: tuple(qkernels.categorical_latent(lg, v, tau=0.9, noise_scale=0.5, hard=hard, uniform=u)),
        (logits, values),
        ups,
        dtype,
        f"categorical hard={hard}",
    )
    z = torch.randn(5, 3, generator=_gen(5), dtype=torch.float64).to(dtype).to(DEVICE)
    gups = [ups[0], ups[1], ups[1].flip(0), ups[2]]
    _assert_like_reference(
        "gumbel_quantize",
        lambda z_, v: tuple(qkernels.gumbel_quantize(z_, v, 0.6, hard=hard, uniform=u)),
        (z, values[0]),
        gups,
        dtype,
        f"gumbel hard={hard}",
    )


# ----------------------------------------------------------------------------- one category, ties, constants


@pytest.mark.parametrize("dtype", DTYPES)
def test_categorical_one_category(dtype):
    """K = 1: y = 1, z = the value, KL = 0 and zero gradients for any logits and noise, on every backend."""
    logits = torch.randn(4, 3, 1, generator=_gen(6), dtype=torch.float64).to(dtype).to(DEVICE)
    values = torch.randn(3, 1, generator=_gen(7), dtype=torch.float64).to(dtype).to(DEVICE)
    u = torch.rand(4, 3, 1, generator=_gen(8), dtype=torch.float64).to(dtype).to(DEVICE)
    for backend in kernels("relaxed_categorical", DEVICE):
        (z, y, kl), (gl, gv) = _run(
            backend, lambda lg, v: tuple(qkernels.categorical_latent(lg, v, uniform=u)), (logits, values)
        )
        assert torch.equal(y, torch.ones_like(y)) and torch.equal(kl.abs(), torch.zeros_like(kl)), backend
        assert torch.equal(z, values[:, 0].expand(4, 3)), backend
        assert torch.equal(gl.abs(), torch.zeros_like(gl)), backend
        assert torch.equal(gv, torch.full_like(gv, 4.0)), backend  # d z / d v = y = 1 per sample


@pytest.mark.parametrize("dtype", DTYPES)
def test_hard_sample_of_tied_logits_is_the_first_category(dtype):
    """Noise-free hard samples of exactly tied logits: the one-hot of the first maximum, on every backend (the
    reference's argmax); a constant row (every category tied) picks category 0 and has KL 0."""
    logits = torch.tensor(
        [[[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0]], [[-1.0, -1.0, -5.0, -1.0], [0.0, 0.0, 0.0, 0.0]]],
        dtype=dtype,
        device=DEVICE,
    )
    want = torch.tensor([[1, 0], [0, 0]], device=DEVICE)
    for backend in kernels("relaxed_categorical", DEVICE):
        with qkernels.use_backend(backend):
            out = qkernels.categorical_latent(logits, noise_scale=0.0, hard=True)
        assert torch.equal(out.y.argmax(-1), want) and torch.equal(out.y.sum(-1), torch.ones_like(out.z)), backend
        assert torch.equal(out.kl[:, 1].abs(), torch.zeros(2, dtype=dtype, device=DEVICE)), backend
    # gumbel_quantize: z halfway between two codebook values (a tie of the logits), noise exactly 0 (u = e^-1)
    z = torch.tensor([[0.5, -0.25]], dtype=dtype, device=DEVICE)
    values = torch.tensor([0.0, 1.0, -0.5, 2.0], dtype=dtype, device=DEVICE)
    u = torch.full((1, 2, 4), torch.exp(torch.tensor(-1.0, dtype=torch.float64)).item(), dtype=dtype, device=DEVICE)
    for backend in kernels("gumbel_quantize", DEVICE):
        with qkernels.use_backend(backend):
            out = qkernels.gumbel_quantize(z, values, 0.3, hard=True, uniform=u)
        assert out.weights.argmax(-1).tolist() == [[0, 0]], backend  # 0.5: values 0 and 1; -0.25: 0 and -0.5
        assert torch.equal(out.z_q, torch.zeros_like(z)), backend


@pytest.mark.parametrize("dtype", DTYPES)
def test_latent_quantize_one_value_and_constant_latents(dtype):
    """A codebook of one value (every index 0) and constant latents sitting on a codebook value (zero losses and
    a zero commitment gradient), per-latent and global codebooks, against the reference on every backend."""
    z = torch.randn(70, 3, generator=_gen(9), dtype=torch.float64).to(dtype).to(DEVICE)
    one = torch.tensor([[0.25], [-1.0], [2.0]], dtype=dtype, device=DEVICE)
    codebook = torch.tensor([-1.0, 0.5, 0.5, 3.0], dtype=dtype, device=DEVICE)
    flat = torch.full((9, 3), 0.5, dtype=dtype, device=DEVICE)
    one_ = torch.ones((), dtype=dtype, device=DEVICE)

    def lq(z_, v):
        q = qkernels.latent_quantize(z_, v)
        return q.z_q, q.indices, 0.3 * q.loss_quantize, 0.7 * q.loss_commit

    for values in (one, one[:1, 0]):
        ups = [torch.randn(70, 3, generator=_gen(10), dtype=torch.float64).to(dtype).to(DEVICE), None, one_, one_]
        _assert_like_reference("latent_quantize", lq, (z, values), ups, dtype, f"one value {tuple(values.shape)}")
    for backend in kernels("latent_quantize", DEVICE):
        (zq, idx, lq_, lc), (gz, gv) = _run(backend, lq, (flat, codebook), [torch.ones_like(flat), None, one_, one_])
        assert torch.equal(idx, torch.ones_like(idx)) and torch.equal(zq, flat), backend  # the first of two 0.5s
        assert lq_.item() == 0.0 and lc.item() == 0.0, backend
        assert torch.equal(gz, torch.ones_like(gz)) and torch.equal(gv.abs(), torch.zeros_like(gv)), backend


# ----------------------------------------------------------------------------- finite_difference_curvature


def _stacked(n, k, m, groups, dtype, seed=0):
    x = torch.randn(n * 2 * k * groups, m, generator=_gen(seed), dtype=torch.float64)
    return x.to(dtype).to(DEVICE)


@pytest.mark.parametrize(("dtype", "unbiased"), [(torch.float32, False), (torch.float64, True)])
def test_fdc_max_ties_take_the_first_column(dtype, unbiased):
    """Issue 48 (1): reduce="max" with two activation columns of exactly equal curvature takes the first, value
    and gradient, as the reference (torch.max's first index) on every backend: tied columns in one cpu tile of 512
    columns (5, 200), in neighbouring tiles (5, 700), in the second and third (600, 1050); the triton kernel's
    blocks are 128 wide. An all-zero input ties every column: column 0."""
    n, k, m, groups = 2, 2, 1100, 1
    op = "finite_difference_curvature"
    w = torch.randn(groups, n, generator=_gen(11), dtype=torch.float64).to(dtype).to(DEVICE)
    for first, second in ((5, 200), (5, 700), (600, 1050), (0, 1)):
        x = _stacked(n, k, m, groups, dtype)
        if (first, second) == (0, 1):
            x.zero_()
        else:
            x[:, first] *= 1e3
            x[:, second] = x[:, first]
        v_ref, a_ref = ref_hessian.finite_difference_curvature(x, n, k, 0.1, groups, unbiased, "max")
        assert torch.equal(a_ref, torch.full_like(a_ref, first))
        for backend in kernels(op, DEVICE):
            xx = x.clone().requires_grad_()
            v, a = implementations(op)[backend](xx, n, k, 0.1, groups, unbiased, "max")
            (g,) = torch.autograd.grad((v * w).sum(), xx)
            assert torch.equal(a, a_ref), (backend, first, second, a.tolist())
            torch.testing.assert_close(v, v_ref, **TOL[dtype], msg=f"{backend} ({first}, {second})")
            xr = x.clone().requires_grad_()
            (g_ref,) = torch.autograd.grad(
                (ref_hessian.finite_difference_curvature(xr, n, k, 0.1, groups, unbiased, "max")[0] * w).sum(), xr
            )
            scale = g_ref.abs().max().clamp_min(1.0)
            torch.testing.assert_close(
                g / scale, g_ref / scale, **TOL[dtype], msg=f"{backend} ({first}, {second}) grad"
            )
            assert torch.equal(g[:, second].abs(), torch.zeros_like(g[:, second])), (backend, first, second)


@pytest.mark.parametrize("dtype", DTYPES)
def test_curvature_penalty_zero_curvature(dtype):
    """Zero numerator and denominator curvatures (a decoder flat along every direction): the NHP ratio is
    0 / (0 + 1e-10) = 0 with the gradient 1 / 1e-10 to the numerator and 0 to the denominator, on every backend."""
    v0 = torch.zeros(2, 5, dtype=dtype, device=DEVICE)
    for reduction in ("mean", "max", "none"):
        _assert_like_reference(
            "curvature_penalty",
            lambda v, r=reduction: implementations("curvature_penalty")[qkernels.current_backend()](v, True, r),
            (v0,),
            dtype=dtype,
            what=reduction,
        )
