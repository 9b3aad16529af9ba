"""Hessian hot path: NHP (Tripod) and Hessian penalty (Peebles et al.) and the fused
finite_difference_curvature op, every backend against the reference and the paper's equations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import DEVICE

from qkernels import _ext
from qkernels._backend import implementations, kernels, unavailable_reason, use_backend
from qkernels.nn.hessian import HessianPenalty, NormalizedHessianPenalty
from qkernels.ops.hessian import (
    curvature_penalty,
    finite_difference_curvature,
    hessian_penalty,
    normalized_hessian_penalty,
    perturbed_batch,
)
from qkernels.reference import hessian as ref

pytestmark = pytest.mark.slow  # a long file: scheduled first (tests/conftest.py)

OP = "finite_difference_curvature"
BACKENDS = kernels(OP, DEVICE)
KERNEL_BACKENDS = [b for b in BACKENDS if b != "reference"]
TOL = {torch.float32: dict(rtol=2e-5, atol=1e-6), torch.float64: dict(rtol=1e-11, atol=1e-12)}


def _impl(backend):
    return implementations(OP)[backend]


def _stacked(n, k, m, groups, center, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = n * (2 * k * groups + (1 if center else 0))
    return torch.randn(rows, m, generator=g, dtype=torch.float64).to(dtype).to(DEVICE)


def test_backends_present():
    assert "reference" in BACKENDS
    if _ext.LOADED:
        assert unavailable_reason("cpu", "cpu") is None
        assert ("cuda" in BACKENDS) == (DEVICE == "cuda" and unavailable_reason("cuda") is None)


# ----------------------------------------------------------------------------- the fused op

CASES = [  # n, k, M, groups, unbiased, reduce, center
    (1, 2, 1, 2, False, "mean", False),
    (3, 3, 7, 2, False, "mean", True),
    (2, 2, 123, 1, True, "max", False),
    (7, 2, 600, 2, False, "mean", False),  # > one CPU tile (512) and > one triton block (128)
    (5, 4, 601, 1, True, "max", True),
    (4, 2, 130, 2, True, "max", False),
    (2, 5, 33, 1, False, "mean", True),
]


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_op_matches_reference(backend, dtype, case):
    n, k, m, groups, unbiased, reduce, center = case
    if backend == "triton" and m * n > 1500 and dtype == torch.float64:
        pytest.skip("interpreter: large fp64 case covered by fp32")
    x = _stacked(n, k, m, groups, center, dtype).requires_grad_()
    w = torch.randn(groups, n, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(DEVICE, dtype)
    v_ref, a_ref = ref.finite_difference_curvature(x, n, k, 0.1, groups, unbiased, reduce)
    (g_ref,) = torch.autograd.grad((v_ref * w).sum(), x)
    v, a = _impl(backend)(x, n, k, 0.1, groups, unbiased, reduce)
    (g,) = torch.autograd.grad((v * w).sum(), x)
    assert v.shape == (groups, n) and v.dtype == dtype and a.dtype == torch.long
    torch.testing.assert_close(v, v_ref, **TOL[dtype])
    assert torch.equal(a, a_ref)
    scale = g_ref.abs().max()
    torch.testing.assert_close(g / scale, g_ref / scale, **TOL[dtype])
    if center:
        assert torch.equal(g[:n], torch.zeros_like(g[:n]))


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("k", [2, 3])
def test_float32_activations_with_a_large_common_part(backend, k):
    """Activations around 100 whose curvature is 1e-5 of that (a decoder's activations at z +- h): in float32 the
    kernels' values keep their float64 ones (from the same float32 inputs) to 1e-4, and each element's gradients sum
    to zero over its 2k rows (1e-6 of their size), as the gradient of a variance over directions does. A kernel that
    means f(z + h) + f(z - h) in float32 rounds at 200's last bit: 1e-2 errors, and its gradients no longer sum to
    zero (the decoder's Jacobian at z then leaks into the parameters' gradient). (The reference, the paper's
    formula, sums f(z + h) + f(z - h) - 2 f(z) before it shifts: it rounds at that sum's last bit, 3e-3 here.)"""
    n, m = 3, 40
    g = torch.Generator().manual_seed(5)
    x = (100 + 1e-3 * torch.randn(n * 2 * k * 2, m, generator=g, dtype=torch.float64)).float().to(DEVICE)
    x.requires_grad_()
    v, _ = _impl(backend)(x, n, k, 0.1, 2, False, "mean")
    v64, _ = ref.finite_difference_curvature(x.detach().double(), n, k, 0.1, 2, False, "mean")
    torch.testing.assert_close(v.double(), v64, rtol=1e-4, atol=0)
    (grad,) = torch.autograd.grad(v.sum(), x)
    per_element = grad.double().reshape(2, k, 2, n, m).sum(dim=(1, 2))  # over the 2k rows of each element
    assert per_element.abs().max() <= 1e-6 * grad.abs().max(), (per_element.abs().max(), grad.abs().max())


def test_center_cancels_exactly_in_the_reference():
    """var_l(P_l - 2C + M_l) == var_l(P_l + M_l): the center rows carry no information."""
    n, k, m = 4, 3, 9
    x = _stacked(n, k, m, 2, True, torch.float64)
    with_c = ref.finite_difference_curvature(x, n, k, 0.1, 2, False, "mean")[0]
    without = ref.finite_difference_curvature(x[n:], n, k, 0.1, 2, False, "mean")[0]
    torch.testing.assert_close(with_c, without, rtol=1e-12, atol=0)
    x2 = x.clone()
    x2[:n] += 100.0  # a different center changes nothing
    torch.testing.assert_close(ref.finite_difference_curvature(x2, n, k, 0.1, 2, False, "mean")[0], with_c)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduce,unbiased,groups,center", [("mean", False, 2, True), ("max", True, 1, False)])
def test_op_gradcheck_fp64(backend, reduce, unbiased, groups, center):
    n, k, m = (1, 2, 3) if backend == "triton" else (2, 3, 5)  # interpreter: tiny
    x = _stacked(n, k, m, groups, center, torch.float64).requires_grad_()
    f = lambda t: _impl(backend)(t, n, k, 0.1, groups, unbiased, reduce)[0]
    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-5, rtol=1e-6)


def _opcheck_args():
    return [
        (_stacked(3, 2, 7, 2, False, torch.float32), 3, 2, 0.1, 2, False, "mean"),
        (_stacked(2, 3, 5, 1, True, torch.float64).requires_grad_(), 2, 3, 0.1, 1, True, "max"),
    ]


@pytest.mark.parametrize("name", ["finite_difference_curvature", "finite_difference_curvature_triton"])
def test_opcheck(name):
    if not hasattr(torch.ops.qkernels, name):
        pytest.skip(f"qkernels::{name} is not registered")
    if name.endswith("_triton") and "triton" not in BACKENDS:
        pytest.skip("triton unavailable")
    op = getattr(torch.ops.qkernels, name).default
    for args in _opcheck_args():
        torch.library.opcheck(op, args)


@pytest.mark.skipif(unavailable_reason("cpu", "cpu") is not None, reason="native extension not built")
def test_cpu_deterministic_across_threads():
    """About the CPU kernel: explicit CPU tensors, also on a GPU machine."""
    x = _stacked(9, 2, 1500, 2, False, torch.float32).cpu()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.qkernels.finite_difference_curvature(x, 9, 2, 0.1, 2, False, "mean")[0]
        torch.set_num_threads(max(2, before))
        many = torch.ops.qkernels.finite_difference_curvature(x, 9, 2, 0.1, 2, False, "mean")[0]
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)


# ------------------------------------------------------------------ penalties vs the equations


def _mlp(d, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    w1 = (torch.randn(d, 6, generator=g, dtype=torch.float64) / math.sqrt(d)).to(DEVICE, dtype)
    w2 = (torch.randn(6, 5, generator=g, dtype=torch.float64) / math.sqrt(6)).to(DEVICE, dtype)
    params = [w1.requires_grad_(), w2.requires_grad_()]

    def fn(x):
        h1 = torch.tanh(x @ params[0])
        h2 = torch.tanh(h1 @ params[1]) * h1[:, :1]
        return [h1, h2.reshape(-1, 5, 1)]

    return fn, params


def _directions_like_api(z, k, seed, gaussian):
    """The API's draws replayed: ONE block of standard normals, (2k, n, d) for NHP ((k, n, d) for
    HP); the Rademacher signs are the signs of the first k (+1 where >= 0), the Gaussians the rest."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn((2 * k if gaussian else k, *z.shape), generator=g, dtype=z.dtype)
    r = torch.where(u[:k] >= 0, 1.0, -1.0).to(z.dtype)
    return r.to(z.device), (u[k:].to(z.device) if gaussian else None)


def _oracle_fd(fn, z, h, eps):
    """(k, entries) second differences from separate forward passes, with the center term."""
    f0 = fn(z)
    out = []
    for hl in h:
        fp, fm = fn(z + hl), fn(z - hl)
        out.append([(a - 2 * c + b).reshape(z.shape[0], -1) / eps**2 for a, b, c in zip(fp, fm, f0, strict=True)])
    return out


def _var(xs, ddof):
    mean = sum(xs) / len(xs)
    return sum((x - mean) ** 2 for x in xs) / (len(xs) - ddof)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nhp_matches_float64_oracle(backend):
    n, d, k, eps, seed = 5, 3, 3, 0.1, 7
    fn, _ = _mlp(d)
    z = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    std = torch.tensor([0.5, 1.5, 0.9], dtype=torch.float64, device=DEVICE)
    with use_backend(backend):
        got = normalized_hessian_penalty(
            fn, z, std, num_perturbations=k, eps=eps, generator=torch.Generator().manual_seed(seed)
        )
        per = normalized_hessian_penalty(
            fn,
            z,
            std,
            num_perturbations=k,
            eps=eps,
            reduction="none",
            generator=torch.Generator().manual_seed(seed),
        )
    r, g = _directions_like_api(z, k, seed, gaussian=True)
    fd_num = _oracle_fd(fn, z, eps * std * r, eps)
    fd_den = _oracle_fd(fn, z, eps * std * g, eps)
    expected, expected_per = 0.0, []
    for e in range(2):
        num = _var([f[e] for f in fd_num], 0).mean(1)
        den = _var([f[e] for f in fd_den], 0).mean(1)
        expected_per.append(num / (den + 1e-10))
        expected = expected + expected_per[-1].mean()
    torch.testing.assert_close(got, expected, rtol=1e-8, atol=0)
    assert isinstance(per, list) and len(per) == 2
    for p, q in zip(per, expected_per, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-8, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["max", "mean"])
def test_hp_matches_float64_oracle(backend, reduction):
    n, d, k, eps, seed = 4, 3, 3, 0.1, 11
    fn, _ = _mlp(d, seed=1)
    z = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    with use_backend(backend):
        got = hessian_penalty(
            fn,
            z,
            num_perturbations=k,
            eps=eps,
            reduction=reduction,
            generator=torch.Generator().manual_seed(seed),
        )
    r, _ = _directions_like_api(z, k, seed, gaussian=False)
    fd = _oracle_fd(fn, z, eps * r, eps)
    expected = 0.0
    for e in range(2):
        var = _var([f[e] for f in fd], 1)
        expected = expected + (var.max() if reduction == "max" else var.mean())
    torch.testing.assert_close(got, expected, rtol=1e-8, atol=0)


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_penalty_gradients_kernel_vs_reference(backend, dtype):
    n, d, k = 6, 3, (8 if dtype == torch.float32 else 2)
    fn, params = _mlp(d, dtype=dtype)
    z = torch.randn(n, d, dtype=dtype, generator=torch.Generator().manual_seed(2)).to(DEVICE).requires_grad_()
    std = torch.tensor([0.5, 1.5, 0.9], dtype=dtype, device=DEVICE).requires_grad_()
    grads = {}
    for name in ("reference", backend):
        with use_backend(name):
            nhp = normalized_hessian_penalty(
                fn, z, std, num_perturbations=k, generator=torch.Generator().manual_seed(0)
            )
            hp = hessian_penalty(fn, z, num_perturbations=k, generator=torch.Generator().manual_seed(0))
        grads[name] = torch.autograd.grad(nhp + hp, [z, std, *params])
    # fp32: the gradient weights each row's Jacobian by +-(fd_l - mean), a difference of
    # cancelling O(f / eps^2) terms, and the NHP ratio divides by a k-sample variance that can be
    # small at k = 2; reduction-order rounding is amplified accordingly. fp32 is compared at k = 8
    # (benign conditioning) relative to the largest entry; fp64 at the default k = 2, tightly.
    rel = 1e-2 if dtype == torch.float32 else 1e-9
    for a, b in zip(grads[backend], grads["reference"], strict=True):
        assert (a - b).abs().max() <= rel * b.abs().max()


# ----------------------------------------------------------------------------- closed forms


def _quadratic(mats):
    """f(z) = [z^T A_e z / 2]_e: Hessian A_e, exact under central differences."""
    return lambda x: torch.einsum("nd,edf,nf->ne", x, mats, x) / 2


def _sym(d, seed):
    a = torch.randn(d, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    return (a + a.T) / 2


def test_closed_form_quadratic_converges():
    """HP -> 2 sum_{i!=j} A_ij^2 (eq. 8); NHP -> eq. 16 (Prop. 3.2), element means first."""
    d, n, k = 4, 16, 4000
    mats = torch.stack([_sym(d, 0), _sym(d, 1)])
    std = torch.tensor([0.5, 2.0, 1.0, 0.8], dtype=torch.float64, device=DEVICE)
    z = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    fn = _quadratic(mats)
    off = ~torch.eye(d, dtype=torch.bool, device=DEVICE)
    hp_expected = torch.stack([2 * (a[off] ** 2).sum() for a in mats]).mean()  # mean over the M = 2 outputs
    hp = hessian_penalty(fn, z, num_perturbations=k, reduction="mean", generator=torch.Generator().manual_seed(1))
    assert abs(hp.item() / hp_expected.item() - 1) < 0.05
    scaled = [a * std[:, None] * std[None, :] for a in mats]
    num = sum(2 * (s[off] ** 2).sum() for s in scaled)
    den = sum(2 * (s**2).sum() for s in scaled)
    nhp = normalized_hessian_penalty(fn, z, std, num_perturbations=k, generator=torch.Generator().manual_seed(2))
    assert abs(nhp.item() / (num / den).item() - 1) < 0.05
    # k = 2 is a very noisy estimate: it must not already match to 5 % on every sample
    few = normalized_hessian_penalty(
        fn,
        z,
        std,
        num_perturbations=2,
        reduction="none",
        generator=torch.Generator().manual_seed(2),
    )
    assert ((few / (num / den) - 1).abs() > 0.05).any()


def test_closed_form_peebles_check():
    """G(z) = [z0 z1, z0^2 z1] -> per-sample penalties [4, 16 z0^2] as k grows."""
    n, k = 6, 4000
    z = torch.randn(n, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    fn = lambda x: {"a": x[:, 0] * x[:, 1], "b": x[:, 0] ** 2 * x[:, 1]}
    per = hessian_penalty(fn, z, num_perturbations=k, reduction="none", generator=torch.Generator().manual_seed(3))
    assert set(per) == {"a", "b"}
    torch.testing.assert_close(per["a"], torch.full((n,), 4.0, dtype=torch.float64, device=DEVICE), rtol=0.06, atol=0)
    torch.testing.assert_close(per["b"], 16 * z[:, 0] ** 2, rtol=0.06, atol=0)


# ------------------------------------------------------------------ invariances (Prop. 3.1)


def test_invariance_prop_3_1():
    n, d = 8, 3
    fn, _ = _mlp(d, seed=3)
    z = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    std = torch.tensor([0.7, 1.2, 0.4], dtype=torch.float64, device=DEVICE)
    s = torch.tensor([3.0, 0.2, 1.0], dtype=torch.float64, device=DEVICE)

    def nhp(f, zz, sd):
        # scaling the outputs by 7 is exact but for the + 1e-10 of the ratio's denominators, a
        # relative 1e-10 / den: seed 6 draws no near-equal pair of k = 2 Gaussian fds (every
        # den >= 1e-3; seed 0 has one of 4e-5, changing the value by 2e-6)
        return normalized_hessian_penalty(f, zz, sd, generator=torch.Generator().manual_seed(6))

    def hp(f, zz):
        return hessian_penalty(f, zz, reduction="mean", generator=torch.Generator().manual_seed(0))

    scaled_out = lambda x: [7.0 * a for a in fn(x)]
    rescaled_in = lambda x: fn(x / s)  # the same decoder in latents z' = s * z
    base = nhp(fn, z, std)
    torch.testing.assert_close(nhp(scaled_out, z, std), base, rtol=1e-7, atol=0)
    torch.testing.assert_close(nhp(rescaled_in, z * s, std * s), base, rtol=1e-7, atol=0)
    # the vanilla penalty changes under both
    torch.testing.assert_close(hp(scaled_out, z), 49 * hp(fn, z), rtol=1e-7, atol=0)
    assert abs(hp(rescaled_in, z * s).item() / hp(fn, z).item() - 1) > 0.1


# ----------------------------------------------------------------------------- one pass


class _Counting:
    def __init__(self, fn):
        self.fn, self.rows = fn, []

    def __call__(self, x):
        self.rows.append(x.shape[0])
        return self.fn(x)


def test_fn_called_once_on_the_stacked_batch():
    n, d, k = 5, 3, 2
    fn, _ = _mlp(d)
    z = torch.randn(n, d, dtype=torch.float64, device=DEVICE)
    std = torch.ones(d, dtype=torch.float64, device=DEVICE)
    c = _Counting(fn)
    a = normalized_hessian_penalty(c, z, std, num_perturbations=k, generator=torch.Generator().manual_seed(0))
    assert c.rows == [4 * k * n]
    c = _Counting(fn)
    hessian_penalty(c, z, num_perturbations=k, generator=torch.Generator().manual_seed(0))
    assert c.rows == [2 * k * n]
    c = _Counting(fn)
    b = normalized_hessian_penalty(
        c, z, std, num_perturbations=k, chunk_size=7, generator=torch.Generator().manual_seed(0)
    )
    assert c.rows == [7] * 5 + [5]
    torch.testing.assert_close(a, b, rtol=1e-12, atol=0)


def test_stacked_layout():
    """Row blocks: [z + v_1; z - v_1; ...; z + w_k; z - w_k], directions scaled by eps * std."""
    n, d, k, eps = 3, 2, 2, 0.1
    z = torch.randn(n, d, dtype=torch.float64, device=DEVICE)
    std = torch.tensor([0.5, 2.0], dtype=torch.float64, device=DEVICE)
    seen = []
    normalized_hessian_penalty(
        lambda x: seen.append(x) or x.sum(1, keepdim=True) ** 2,
        z,
        std,
        num_perturbations=k,
        eps=eps,
        generator=torch.Generator().manual_seed(0),
    )
    x = seen[0].reshape(2 * k, 2, n, d)
    h = (x[:, 0] - x[:, 1]) / 2
    torch.testing.assert_close((x[:, 0] + x[:, 1]) / 2, z.expand(2 * k, n, d))
    r = h[:k] / (eps * std)
    torch.testing.assert_close(r.abs(), torch.ones_like(r))
    r_api, g_api = _directions_like_api(z, k, 0, gaussian=True)
    torch.testing.assert_close(h, torch.cat([r_api, g_api]) * eps * std)


def test_modules_against_the_oracle():
    # NormalizedHessianPenalty's default std is the population std of z + 1e-6 (Tripod); HessianPenalty's
    # default reduction is the max over the function's outputs (Peebles et al.); both by the float64 oracle
    n, d, k, eps = 6, 3, 2, 0.1
    fn, _ = _mlp(d)
    z = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    m = NormalizedHessianPenalty()
    got = m(fn, z, generator=torch.Generator().manual_seed(0))
    std = torch.from_numpy(z.cpu().numpy().std(0) + 1e-6).to(DEVICE)
    r, g = _directions_like_api(z, k, 0, gaussian=True)
    fd_num, fd_den = _oracle_fd(fn, z, eps * std * r, eps), _oracle_fd(fn, z, eps * std * g, eps)
    want = sum(
        (_var([f[e] for f in fd_num], 0).mean(1) / (_var([f[e] for f in fd_den], 0).mean(1) + 1e-10)).mean()
        for e in range(2)
    )
    torch.testing.assert_close(got, want, rtol=1e-8, atol=0)
    assert "num_perturbations=2" in repr(m)
    r, _ = _directions_like_api(z, k, 0, gaussian=False)
    fd = _oracle_fd(fn, z, eps * r, eps)
    want_max = sum(_var([f[e] for f in fd], 1).max() for e in range(2))
    torch.testing.assert_close(
        HessianPenalty()(fn, z, generator=torch.Generator().manual_seed(0)), want_max, rtol=1e-8, atol=0
    )
    want_mean = sum(_var([f[e] for f in fd], 1).mean() for e in range(2))
    torch.testing.assert_close(
        HessianPenalty(reduction="mean")(fn, z, generator=torch.Generator().manual_seed(0)),
        want_mean,
        rtol=1e-8,
        atol=0,
    )


def test_nhp_std_default_and_scalar_one_rule_for_functional_and_module():
    """std omitted = z.std(0, correction=0) + 1e-6 (of z itself, differentiable in z) for the
    functional and the module alike; a number or 0-d tensor is broadcast to (d,)."""
    n, d = 6, 3
    fn, _ = _mlp(d)
    z0 = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).to(DEVICE)

    def nhp(std=None, module=False, omit=False):
        z = z0.clone().requires_grad_()
        kw = {} if omit else {"std": std(z) if callable(std) else std}
        penalty = NormalizedHessianPenalty() if module else normalized_hessian_penalty
        out = penalty(fn, z, generator=torch.Generator().manual_seed(0), **kw)
        out.backward()
        return out.detach(), z.grad

    def explicit(z):
        return z.std(0, correction=0) + 1e-6

    want, want_grad = nhp(explicit)
    for got, grad in (nhp(omit=True), nhp(module=True, omit=True), nhp(explicit, module=True)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
        torch.testing.assert_close(grad, want_grad, rtol=1e-10, atol=1e-12)  # the std's path to z included
    full = nhp(torch.full((d,), 0.7, dtype=torch.float64, device=DEVICE))[0]
    for scalar in (0.7, torch.tensor(0.7, dtype=torch.float64, device=DEVICE)):
        torch.testing.assert_close(nhp(scalar)[0], full, rtol=1e-12, atol=0)
        torch.testing.assert_close(nhp(scalar, module=True)[0], full, rtol=1e-12, atol=0)
    assert nhp(2)[0] == nhp(2.0)[0]


def test_float32_penalty_close_to_float64():
    """Same directions, fp32 decoder and fp32 reduction vs fp64 throughout."""
    n, d, k = 8, 3, 2
    fn64, _ = _mlp(d)
    fn32, _ = _mlp(d, dtype=torch.float32)
    z = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(8)).to(DEVICE)
    std = torch.tensor([0.5, 1.5, 0.9], dtype=torch.float64, device=DEVICE)
    seen = []
    a = normalized_hessian_penalty(
        lambda x: seen.append(x) or fn64(x),
        z,
        std,
        num_perturbations=k,
        generator=torch.Generator().manual_seed(0),
    )
    b = sum(
        (lambda v: (v[0] / (v[1] + 1e-10)).mean())(finite_difference_curvature(act, n, k, 0.1))
        for act in fn32(seen[0].float())
    )
    # fp32 rounding of f(z +- h) (~6e-8 |f|) against second differences of size ~|H| std^2
    assert abs(b.item() / a.item() - 1) < 1e-3


# ----------------------------------------------------------------------------- bad input


def _ok():
    fn, _ = _mlp(3)
    return fn, torch.randn(4, 3, dtype=torch.float64, device=DEVICE), torch.ones(3, dtype=torch.float64, device=DEVICE)


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(std=torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64, device=DEVICE)), ValueError, "std"),
        (dict(std=torch.ones(4, dtype=torch.float64)), ValueError, "std"),
        (dict(std=torch.ones(1, 3, dtype=torch.float64)), ValueError, "std"),
        (dict(std=torch.ones(3, device=DEVICE)), TypeError, "std"),
        (dict(std=0), ValueError, "std"),
        (dict(std=-1.0), ValueError, "std"),
        (dict(std=float("nan")), ValueError, "std"),
        (dict(std=True), TypeError, "std"),
        (dict(std="x"), TypeError, "std"),
        (dict(std=torch.tensor(0.0, dtype=torch.float64, device=DEVICE)), ValueError, "std"),
        (dict(num_perturbations=1), ValueError, "num_perturbations"),
        (dict(num_perturbations=2.0), TypeError, "num_perturbations"),
        (dict(eps=0.0), ValueError, "eps"),
        (dict(eps=-0.1), ValueError, "eps"),
        (dict(eps=float("inf")), ValueError, "eps"),
        (dict(reduction="sum"), ValueError, "reduction"),
        (dict(chunk_size=0), ValueError, "chunk_size"),
        (dict(fn=lambda x: x[:4]), ValueError, "fn output"),
        (dict(fn=lambda x: {"h": x.long()}), TypeError, "fn output 'h'"),
        (dict(fn=lambda x: [x, x[1:]]), ValueError, r"fn output \[1\]"),
        (dict(fn=lambda x: "x"), TypeError, "fn must return"),
        (dict(fn=3), TypeError, "fn must be callable"),
        (dict(z=torch.randn(3, dtype=torch.float64)), ValueError, "z"),
        (dict(z=torch.full((4, 3), float("nan"), dtype=torch.float64, device=DEVICE)), ValueError, "z"),
    ],
)
def test_nhp_bad_input(kwargs, exc, match, all_value_checks):
    fn, z, std = _ok()
    args = dict(fn=fn, z=z, std=std)
    args.update(kwargs)
    fn, z, std = args.pop("fn"), args.pop("z"), args.pop("std")
    with pytest.raises(exc, match=match):
        normalized_hessian_penalty(fn, z, std, **args)


def test_hp_and_op_bad_input():
    fn, z, _ = _ok()
    with pytest.raises(ValueError, match="reduction"):
        hessian_penalty(fn, z, reduction="sum")
    with pytest.raises(ValueError, match="num_perturbations"):
        hessian_penalty(fn, z, num_perturbations=1)
    with pytest.raises(ValueError, match="stacked"):
        finite_difference_curvature(torch.randn(10, 3), 2, 2, 0.1)
    with pytest.raises(ValueError, match="reduce"):
        finite_difference_curvature(torch.randn(16, 3), 2, 2, 0.1, reduce="min")
    with pytest.raises(TypeError, match="stacked"):
        finite_difference_curvature(torch.ones(16, 3, dtype=torch.long), 2, 2, 0.1)


def test_functional_op_flattens_trailing_dims():
    x = torch.randn(2 * 2 * 2 * 3, 4, 5, dtype=torch.float64, device=DEVICE)
    got = finite_difference_curvature(x, 3, 2, 0.1)
    exp = ref.finite_difference_curvature(x.reshape(24, 20), 3, 2, 0.1, 2, False, "mean")[0]
    torch.testing.assert_close(got, exp)


def test_modules_forward_their_settings():
    """Audit 9 review: a module that ignored its own eps (using 0.1) passed, as every module test used the
    defaults. NHP module with eps 0.3, k 3, reduction "none" and a chunked fn; HP module with eps 0.25,
    k 3, reduction "mean": both against the float64 oracle (directions replayed from the generator)."""
    n, d, k = 5, 3, 3
    fn, _ = _mlp(d)
    z = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    std = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64, device=DEVICE)
    calls = []

    def counted(x):
        calls.append(x.shape[0])
        return fn(x)

    m = NormalizedHessianPenalty(num_perturbations=k, eps=0.3, reduction="none", chunk_size=8)
    got = m(counted, z, std, generator=torch.Generator().manual_seed(1))
    assert calls and max(calls) <= 8 and sum(calls) == 4 * k * n
    r, g = _directions_like_api(z, k, 1, gaussian=True)
    fd_num, fd_den = _oracle_fd(fn, z, 0.3 * std * r, 0.3), _oracle_fd(fn, z, 0.3 * std * g, 0.3)
    assert isinstance(got, list) and len(got) == 2
    for e in range(2):
        want = _var([f[e] for f in fd_num], 0).mean(1) / (_var([f[e] for f in fd_den], 0).mean(1) + 1e-10)
        torch.testing.assert_close(got[e], want, rtol=1e-7, atol=1e-12)
    hp = HessianPenalty(num_perturbations=k, eps=0.25, reduction="mean")
    r, _ = _directions_like_api(z, k, 2, gaussian=False)
    fd = _oracle_fd(fn, z, 0.25 * r, 0.25)
    want = sum(_var([f[e] for f in fd], 1).mean() for e in range(2))
    torch.testing.assert_close(hp(fn, z, generator=torch.Generator().manual_seed(2)), want, rtol=1e-7, atol=0)
    assert "eps=0.3" in repr(m) and "reduction='none'" in repr(m) and "num_perturbations=3" in repr(m)


# ------------------------------------------------- perturbed_batch and curvature_penalty (issue 25)

PB_BACKENDS = kernels("perturbed_batch", DEVICE)
CP_BACKENDS = kernels("curvature_penalty", DEVICE)
PB_CASES = [  # n, d, D, signs, scale
    (1, 1, 2, 1, "std"),
    (1, 2, 2, 1, "population"),  # one sample: std 0, the scale is 1e-6, no gradient through it
    (7, 3, 4, 2, "population"),
    (5, 17, 2, 2, "one"),  # > one latent block (16)
    (33, 5, 3, 0, "population"),  # > one row tile (32)
    (3, 20, 2, 1, "std"),
]


def _pb_inputs(n, d, count, dtype, seed=0, constant_column=False):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g, dtype=torch.float64)
    if constant_column:
        z[:, 0] = 0.7
    draws = torch.randn(count, n, d, generator=g, dtype=torch.float64)
    std = torch.rand(d, generator=g, dtype=torch.float64) + 0.5
    return z.to(DEVICE, dtype), draws.to(DEVICE, dtype), std.to(DEVICE, dtype)


def _np_perturbed(z, draws, std, eps, signs, scale):
    """float64 numpy: rows [z + h_1; z - h_1; ...], h_l = u_l * eps * s, u_l = sign(draw_l) for l < signs."""
    z, u = z.detach().double().cpu().numpy(), draws.double().cpu().numpy().copy()
    u[:signs] = np.where(u[:signs] >= 0, 1.0, -1.0)
    s = {
        "std": std.detach().double().cpu().numpy() if std is not None else None,
        "population": z.std(0) + 1e-6,
        "one": 1.0,
    }[scale]
    h = u * (eps * s)
    return np.stack([z + h, z - h], 1).reshape(-1, z.shape[1])


@pytest.mark.parametrize("case", PB_CASES, ids=str)
def test_perturbed_batch_reference_is_the_equation(case):
    n, d, count, signs, scale = case
    z, draws, std = _pb_inputs(n, d, count, torch.float64)
    got = ref.perturbed_batch(z, draws, std if scale == "std" else None, 0.3, signs, scale)
    np.testing.assert_allclose(
        got.cpu().numpy(), _np_perturbed(z, draws, std, 0.3, signs, scale), rtol=1e-14, atol=1e-15
    )


@pytest.mark.parametrize("backend", [b for b in PB_BACKENDS if b != "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", PB_CASES, ids=str)
def test_perturbed_batch_matches_reference(backend, dtype, case):
    n, d, count, signs, scale = case
    z, draws, std = _pb_inputs(n, d, count, dtype, constant_column=n > 2 and scale == "population")
    z.requires_grad_()
    std = std.requires_grad_() if scale == "std" else None
    w = torch.randn(2 * count * n, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(DEVICE, dtype)
    impl = implementations("perturbed_batch")
    want = impl["reference"](z, draws, std, 0.1, signs, scale)
    got = impl[backend](z, draws, std, 0.1, signs, scale)
    assert got.shape == (2 * count * n, d) and got.dtype == dtype
    torch.testing.assert_close(got, want, **TOL[dtype])
    wrt = [z] + ([std] if std is not None else [])
    for g, r in zip(torch.autograd.grad((got * w).sum(), wrt), torch.autograd.grad((want * w).sum(), wrt), strict=True):
        scale_ = r.abs().max()
        torch.testing.assert_close(g / scale_, r / scale_, **TOL[dtype])
        assert torch.isfinite(g).all()


@pytest.mark.parametrize("backend", PB_BACKENDS)
@pytest.mark.parametrize("scale", ["std", "population", "one"])
def test_perturbed_batch_gradcheck_fp64(backend, scale):
    z, draws, std = _pb_inputs(3, 2, 2, torch.float64)
    impl = implementations("perturbed_batch")[backend]
    if scale == "std":
        args, f = (z.requires_grad_(), std.requires_grad_()), lambda a, s: impl(a, draws, s, 0.1, 1, scale)
    else:
        args, f = (z.requires_grad_(),), lambda a: impl(a, draws, None, 0.1, 1, scale)
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7, rtol=1e-6)


CP_CASES = [  # n, ratio, reduction
    (1, True, "mean"),
    (7, True, "none"),
    (130, True, "max"),  # > one block (128)
    (5, False, "max"),
    (200, False, "mean"),
    (3, False, "none"),
    (4, True, "mean"),
]


def _values(n, ratio, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(2 if ratio else 1, n, generator=g, dtype=torch.float64) + 0.05).to(DEVICE, dtype)


def _np_penalty(values, ratio, reduction):
    v = values.detach().double().cpu().numpy()
    p = v[0] / (v[1] + 1e-10) if ratio else v[0]
    return {"mean": p.mean(), "max": p.max(), "none": p}[reduction]


@pytest.mark.parametrize("case", CP_CASES, ids=str)
def test_curvature_penalty_reference_is_the_equation(case):
    n, ratio, reduction = case
    v = _values(n, ratio, torch.float64)
    got = ref.curvature_penalty(v, ratio, reduction)
    np.testing.assert_allclose(got.cpu().numpy(), _np_penalty(v, ratio, reduction), rtol=1e-14)


@pytest.mark.parametrize("backend", [b for b in CP_BACKENDS if b != "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CP_CASES, ids=str)
def test_curvature_penalty_matches_reference(backend, dtype, case):
    n, ratio, reduction = case
    v = _values(n, ratio, dtype).requires_grad_()
    impl = implementations("curvature_penalty")
    want, got = impl["reference"](v, ratio, reduction), impl[backend](v, ratio, reduction)
    assert got.shape == want.shape and got.dtype == dtype
    torch.testing.assert_close(got, want, **TOL[dtype])
    w = torch.randn(want.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(DEVICE, dtype)
    (g,), (r,) = torch.autograd.grad((got * w).sum(), v), torch.autograd.grad((want * w).sum(), v)
    torch.testing.assert_close(g, r, **TOL[dtype])


@pytest.mark.parametrize("backend", CP_BACKENDS)
@pytest.mark.parametrize("ratio", [True, False])
def test_curvature_penalty_max_ties_and_nan_like_tensor_max(backend, ratio):
    """``Tensor.max()``: tied maxima share the gradient evenly; a NaN is the maximum (and takes the
    whole gradient). Expectations by hand."""
    impl = implementations("curvature_penalty")[backend]
    v = torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0], [1.0] * 5], dtype=torch.float64, device=DEVICE)[: 2 if ratio else 1]
    v.requires_grad_()
    out = impl(v, ratio, "max")
    top = 3.0 / (1.0 + 1e-10) if ratio else 3.0
    torch.testing.assert_close(out, torch.tensor(top, dtype=torch.float64, device=DEVICE), rtol=1e-15, atol=0)
    (g,) = torch.autograd.grad(out * 6.0, v)
    want = torch.tensor([0.0, 2.0, 0.0, 2.0, 2.0], dtype=torch.float64, device=DEVICE)
    torch.testing.assert_close(g[0], want / (1.0 + 1e-10) if ratio else want, rtol=1e-15, atol=0)
    if ratio:
        torch.testing.assert_close(g[1], -want * 3.0 / (1.0 + 1e-10) ** 2, rtol=1e-15, atol=0)
    nan = v.detach().clone()
    nan[0, 2] = float("nan")
    nan.requires_grad_()
    out = impl(nan, ratio, "max")
    assert torch.isnan(out)
    (g,) = torch.autograd.grad(out * 6.0, nan)
    assert g[0, 2] != 0 and torch.equal(g[0, [0, 1, 3, 4]], torch.zeros(4, dtype=torch.float64, device=DEVICE))


@pytest.mark.parametrize("backend", CP_BACKENDS)
@pytest.mark.parametrize("reduction", ["mean", "max", "none"])
def test_curvature_penalty_gradcheck_fp64(backend, reduction):
    v = _values(3, True, torch.float64, seed=3).requires_grad_()
    f = lambda t: implementations("curvature_penalty")[backend](t, True, reduction)
    assert torch.autograd.gradcheck(f, (v,), eps=1e-6, atol=1e-7, rtol=1e-6)


def _new_opcheck_args():
    z, draws, std = _pb_inputs(3, 2, 2, torch.float32)
    z64, draws64, std64 = _pb_inputs(4, 3, 4, torch.float64, seed=1)
    return {
        "perturbed_batch_triton": [
            (z, draws, std, 0.1, 1, "std"),
            (z64.requires_grad_(), draws64, None, 0.2, 2, "population"),
            (z64, draws64, std64.requires_grad_(), 0.2, 2, "std"),
            (z, draws, None, 0.1, 2, "one"),
        ],
        "curvature_penalty_triton": [
            (_values(5, True, torch.float32), True, "mean"),
            (_values(4, False, torch.float64).requires_grad_(), False, "max"),
            (_values(3, True, torch.float64).requires_grad_(), True, "none"),
        ],
    }


@pytest.mark.parametrize("name", ["perturbed_batch_triton", "curvature_penalty_triton"])
def test_new_ops_opcheck(name):
    if not hasattr(torch.ops.qkernels, name):
        pytest.skip(f"qkernels::{name} is not registered (no triton)")
    op = getattr(torch.ops.qkernels, name).default
    for args in _new_opcheck_args()[name]:
        torch.library.opcheck(op, args)


@pytest.mark.skipif("triton" not in BACKENDS, reason="needs Triton (or its interpreter)")
def test_triton_ops_launch_once_each_way():
    """Each Triton op of the penalties is one kernel launch forward and one backward (issue 25)."""
    from qkernels.bench.launches import count_launches

    ops = torch.ops.qkernels
    z, draws, std = _pb_inputs(5, 3, 4, torch.float32)
    v = _values(5, True, torch.float32)
    x = _stacked(5, 2, 7, 2, False, torch.float32)
    fdc = ops.finite_difference_curvature_triton(x, 5, 2, 0.1, 2, False, "max")
    g_pb, g_cp, g_fdc = torch.ones(40, 3, device=DEVICE), torch.ones((), device=DEVICE), torch.ones(2, 5, device=DEVICE)
    calls = [
        lambda: ops.perturbed_batch_triton(z, draws, None, 0.1, 2, "population"),
        lambda: ops.perturbed_batch_backward_triton(g_pb, z, draws, None, 0.1, 2, "population"),
        lambda: ops.perturbed_batch_backward_triton(g_pb, z, draws, std, 0.1, 2, "std"),
        lambda: ops.curvature_penalty_triton(v, True, "mean"),
        lambda: ops.curvature_penalty_backward_triton(g_cp, v, True, "max"),
        lambda: ops.finite_difference_curvature_triton(x, 5, 2, 0.1, 2, False, "mean"),
        lambda: ops.finite_difference_curvature_backward_triton(g_fdc, x, fdc[1], 5, 2, 0.1, 2, False, "max"),
    ]
    for call in calls:
        tally = count_launches(call)
        assert (tally.total, tally.triton, tally.syncs) == (1, 1, 0), tally


@pytest.mark.skipif("triton" not in BACKENDS, reason="needs Triton (or its interpreter)")
def test_fdc_triton_argmax_is_the_first_column_across_blocks():
    """One program reduces every column block: a maximum tied between column 5 and column 200
    (another block of 128) gives column 5, as the reference (torch.max's first index)."""
    n, k, m = 2, 2, 300
    x = _stacked(n, k, m, 1, False, torch.float64)
    x[:, 5] *= 1e3
    x[:, 200] = x[:, 5]
    v_ref, a_ref = ref.finite_difference_curvature(x, n, k, 0.1, 1, True, "max")
    v, a = torch.ops.qkernels.finite_difference_curvature_triton(x, n, k, 0.1, 1, True, "max")
    assert torch.equal(a, a_ref) and torch.equal(a, torch.full((1, n), 5, device=DEVICE))
    torch.testing.assert_close(v, v_ref, rtol=1e-13, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_penalty_options_kernel_vs_reference(backend):
    """Default / tensor / scalar / 0-d std, NHP "none", HP "mean" and "none", a dict fn: values and
    gradients (z, std, fn's parameters) on every backend against the reference, float64."""
    n, d = 5, 3
    fn, params = _mlp(d)
    z = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(4)).to(DEVICE).requires_grad_()
    std = torch.tensor([0.5, 1.5, 0.9], dtype=torch.float64, device=DEVICE).requires_grad_()
    dict_fn = lambda x: dict(zip("ab", fn(x), strict=True))
    calls = {
        "nhp default std": lambda: normalized_hessian_penalty(fn, z, generator=_g()),
        "nhp std": lambda: normalized_hessian_penalty(fn, z, std, generator=_g()),
        "nhp scalar std": lambda: normalized_hessian_penalty(fn, z, 0.7, generator=_g()),
        "nhp 0-d std": lambda: normalized_hessian_penalty(fn, z, std[1], generator=_g()),
        "nhp none": lambda: sum(
            v @ torch.arange(1.0, n + 1, dtype=torch.float64, device=DEVICE)
            for v in normalized_hessian_penalty(dict_fn, z, reduction="none", generator=_g()).values()
        ),
        "hp max": lambda: hessian_penalty(fn, z, generator=_g()),
        "hp mean": lambda: hessian_penalty(fn, z, reduction="mean", generator=_g()),
        "hp none": lambda: sum(v.sum() for v in hessian_penalty(dict_fn, z, reduction="none", generator=_g()).values()),
        "chunked": lambda: normalized_hessian_penalty(fn, z, std, num_perturbations=3, chunk_size=7, generator=_g()),
    }
    for name, call in calls.items():
        out = {}
        for b in ("reference", backend):
            with use_backend(b):
                val = call()
            out[b] = (val.detach(), torch.autograd.grad(val, [z, std, *params], allow_unused=True))
        torch.testing.assert_close(out[backend][0], out["reference"][0], rtol=1e-10, atol=0, msg=name)
        for g, r in zip(out[backend][1], out["reference"][1], strict=True):
            if r is None:
                assert g is None, name
                continue
            torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9 * r.abs().max().item(), msg=name)


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_directions_are_this_ranks_rows_of_the_global_draw(backend, monkeypatch):
    """Data parallel (faked rank 1 of 3): the directions are rows n..2n of the (2k, 3n, d) draw one
    process makes for the global batch (a strided slice the kernels read in place)."""
    from qkernels import distributed
    from qkernels.ops import hessian as hessian_ops

    fake = lambda group=None: (1, 3)  # noqa: E731
    monkeypatch.setattr(distributed, "rank_and_size", fake)
    monkeypatch.setattr(hessian_ops, "rank_and_size", fake)
    n, d, k, eps = 4, 3, 2, 0.1
    fn, _ = _mlp(d)
    z = torch.randn(n, d, dtype=torch.float64, generator=_g(5)).to(DEVICE)
    std = torch.tensor([0.5, 1.5, 0.9], dtype=torch.float64, device=DEVICE)
    with use_backend(backend):
        got = normalized_hessian_penalty(fn, z, std, generator=_g(3), reduction="none", group=object())
    u = torch.randn((2 * k, 3 * n, d), generator=_g(3), dtype=torch.float64)[:, n : 2 * n].to(DEVICE)
    r, g = torch.where(u[:k] >= 0, 1.0, -1.0).to(u.dtype), u[k:]
    fd_num, fd_den = _oracle_fd(fn, z, eps * std * r, eps), _oracle_fd(fn, z, eps * std * g, eps)
    for e in range(2):
        want = _var([f[e] for f in fd_num], 0).mean(1) / (_var([f[e] for f in fd_den], 0).mean(1) + 1e-10)
        # atol: at k = 2 and d = 3 a sample's two sign vectors are equal up to sign with probability
        # 1/4, and its numerator is then 0 but for rounding
        torch.testing.assert_close(got[e], want, rtol=1e-8, atol=1e-12)


def test_new_ops_bad_input():
    z, draws, std = _pb_inputs(3, 2, 2, torch.float64)
    with pytest.raises(ValueError, match="draws"):
        perturbed_batch(z, draws[:, :2], std)
    with pytest.raises(ValueError, match="draws"):
        perturbed_batch(z, draws[0], std)
    with pytest.raises(ValueError, match="signs"):
        perturbed_batch(z, draws, std, signs=3)
    with pytest.raises(ValueError, match="scale"):
        perturbed_batch(z, draws, std, scale="unit")
    with pytest.raises(ValueError, match="needs std"):
        perturbed_batch(z, draws, scale="std")
    with pytest.raises(ValueError, match="std"):
        perturbed_batch(z, draws, torch.ones(3, dtype=torch.float64, device=DEVICE))
    with pytest.raises(TypeError, match="draws"):
        perturbed_batch(z, draws.float(), std)
    with pytest.raises(ValueError, match="eps"):
        perturbed_batch(z, draws, std, 0.0)
    with pytest.raises(TypeError, match="draws"):
        perturbed_batch(z, draws.long(), std)
    v = _values(4, True, torch.float64)
    with pytest.raises(ValueError, match="values"):
        curvature_penalty(v, ratio=False)
    with pytest.raises(ValueError, match="values"):
        curvature_penalty(v[:, :0], ratio=True)
    with pytest.raises(ValueError, match="reduction"):
        curvature_penalty(v, ratio=True, reduction="sum")
    with pytest.raises(TypeError, match="values has dtype torch.bfloat16"):
        curvature_penalty(v.bfloat16(), ratio=True)


def test_functional_new_ops_match_the_equations():
    """The public perturbed_batch / curvature_penalty (auto backend) against float64 numpy."""
    z, draws, std = _pb_inputs(4, 3, 4, torch.float64)
    np.testing.assert_allclose(
        perturbed_batch(z, draws, std, 0.2, signs=2).cpu().numpy(),
        _np_perturbed(z, draws, std, 0.2, 2, "std"),
        rtol=1e-14,
        atol=1e-15,
    )
    np.testing.assert_allclose(
        perturbed_batch(z, draws, eps=0.2, signs=1).cpu().numpy(),
        _np_perturbed(z, draws, None, 0.2, 1, "population"),
        rtol=1e-13,
        atol=1e-15,
    )
    v = _values(6, True, torch.float64)
    np.testing.assert_allclose(curvature_penalty(v, ratio=True).cpu().numpy(), _np_penalty(v, True, "mean"), rtol=1e-14)
