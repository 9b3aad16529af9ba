"""Hessian hot path: NHP (Tripod) and Hessian penalty (Peebles et al.) and the fused
finite_difference_curvature op, every backend against the reference and the paper's equations."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DEVICE

from qkernels import _ext
from qkernels._backend import implementations, kernels, unavailable_reason, use_backend
from qkernels.nn.hessian import HessianPenalty, NormalizedHessianPenalty
from qkernels.ops.hessian import (
    finite_difference_curvature,
    hessian_penalty,
    normalized_hessian_penalty,
)
from qkernels.reference import hessian as ref

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


def test_center_cancels_exactly_in_the_reference():
    """var_l(P_l - 2C + M_l) == var_l(P_l + M_l): the center rows carry no information."""
    n, k, m = 4, 3, 9
    x = _stacked(n, k, m, 2, True, torch.float64)
    with_c = ref.finite_difference_curvature(x, n, k, 0.1, 2, False, "mean")[0]
    without = ref.finite_difference_curvature(x[n:], n, k, 0.1, 2, False, "mean")[0]
    torch.testing.assert_close(with_c, without, rtol=1e-12, atol=0)
    x2 = x.clone()
    x2[:n] += 100.0  # a different center changes nothing
    torch.testing.assert_close(
        ref.finite_difference_curvature(x2, n, k, 0.1, 2, False, "mean")[0], with_c
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "reduce,unbiased,groups,center", [("mean", False, 2, True), ("max", True, 1, False)]
)
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


@pytest.mark.parametrize(
    "name", ["finite_difference_curvature", "finite_difference_curvature_triton"]
)
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
    g = torch.Generator().manual_seed(seed)
    r = (2 * torch.randint(0, 2, (k, *z.shape), generator=g, dtype=torch.int8) - 1).to(z.dtype)
    w = torch.randn((k, *z.shape), generator=g, dtype=z.dtype).to(z.device) if gaussian else None
    return r.to(z.device), w


def _oracle_fd(fn, z, h, eps):
    """(k, entries) second differences from separate forward passes, with the center term."""
    f0 = fn(z)
    out = []
    for hl in h:
        fp, fm = fn(z + hl), fn(z - hl)
        out.append(
            [
                (a - 2 * c + b).reshape(z.shape[0], -1) / eps**2
                for a, b, c in zip(fp, fm, f0, strict=True)
            ]
        )
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
            hp = hessian_penalty(
                fn, z, num_perturbations=k, generator=torch.Generator().manual_seed(0)
            )
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
    hp_expected = torch.stack(
        [2 * (a[off] ** 2).sum() for a in mats]
    ).mean()  # mean over the M = 2 outputs
    hp = hessian_penalty(
        fn, z, num_perturbations=k, reduction="mean", generator=torch.Generator().manual_seed(1)
    )
    assert abs(hp.item() / hp_expected.item() - 1) < 0.05
    scaled = [a * std[:, None] * std[None, :] for a in mats]
    num = sum(2 * (s[off] ** 2).sum() for s in scaled)
    den = sum(2 * (s**2).sum() for s in scaled)
    nhp = normalized_hessian_penalty(
        fn, z, std, num_perturbations=k, generator=torch.Generator().manual_seed(2)
    )
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
    per = hessian_penalty(
        fn, z, num_perturbations=k, reduction="none", generator=torch.Generator().manual_seed(3)
    )
    assert set(per) == {"a", "b"}
    torch.testing.assert_close(
        per["a"], torch.full((n,), 4.0, dtype=torch.float64, device=DEVICE), rtol=0.06, atol=0
    )
    torch.testing.assert_close(per["b"], 16 * z[:, 0] ** 2, rtol=0.06, atol=0)


# ------------------------------------------------------------------ invariances (Prop. 3.1)


def test_invariance_prop_3_1():
    n, d = 8, 3
    fn, _ = _mlp(d, seed=3)
    z = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    std = torch.tensor([0.7, 1.2, 0.4], dtype=torch.float64, device=DEVICE)
    s = torch.tensor([3.0, 0.2, 1.0], dtype=torch.float64, device=DEVICE)

    def nhp(f, zz, sd):
        return normalized_hessian_penalty(f, zz, sd, generator=torch.Generator().manual_seed(0))

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
    a = normalized_hessian_penalty(
        c, z, std, num_perturbations=k, generator=torch.Generator().manual_seed(0)
    )
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
    want = sum((_var([f[e] for f in fd_num], 0).mean(1) / (_var([f[e] for f in fd_den], 0).mean(1) + 1e-10)).mean()
               for e in range(2))
    torch.testing.assert_close(got, want, rtol=1e-8, atol=0)
    assert "num_perturbations=2" in repr(m)
    r, _ = _directions_like_api(z, k, 0, gaussian=False)
    fd = _oracle_fd(fn, z, eps * r, eps)
    want_max = sum(_var([f[e] for f in fd], 1).max() for e in range(2))
    torch.testing.assert_close(HessianPenalty()(fn, z, generator=torch.Generator().manual_seed(0)), want_max,
                               rtol=1e-8, atol=0)
    want_mean = sum(_var([f[e] for f in fd], 1).mean() for e in range(2))
    torch.testing.assert_close(HessianPenalty(reduction="mean")(fn, z, generator=torch.Generator().manual_seed(0)),
                               want_mean, rtol=1e-8, atol=0)


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
