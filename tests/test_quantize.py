"""Quantization hot path: every available backend against float64 recomputations (numpy) and the
reference; gradients, gradcheck, opcheck, bad input, modules (torch.compile: test_compile.py)."""

import contextlib
import math

import numpy as np
import pytest
import torch
from conftest import BACKENDS, DEVICE, KERNEL_BACKENDS, assert_graph_replays_match, tol, unless_interpreted

import qkernels
from qkernels import nn as qnn

pytestmark = pytest.mark.slow  # a long file: scheduled first (tests/conftest.py)

SHAPES = [(1, 1, 2), (5, 7, 10), (123, 13, 64)]  # (batch, d, n_v)
DTYPES = [torch.float32, torch.float64]


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _inputs(batch, d, nv, dtype, global_codebook, seed=0):
    g = _gen(seed)
    z = (torch.randn(batch, d, generator=g, dtype=torch.float64) * 1.5).to(dtype)
    shape = (nv,) if global_codebook else (d, nv)
    values = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return z.to(DEVICE), values.to(DEVICE)


def np_nearest(z, values):
    """float64 numpy recomputation of QLAE's quantizer: argmin |z - v|, first index on ties."""
    z = np.asarray(z, np.float64)
    v = np.asarray(values, np.float64)
    v = np.broadcast_to(v, (z.shape[-1], v.shape[-1]))
    idx = np.empty(z.shape, np.int64)
    for i in range(z.shape[0]):
        for j in range(z.shape[1]):
            idx[i, j] = int(np.argmin(np.abs(z[i, j] - v[j])))
    q = v[np.arange(z.shape[1])[None, :], idx]
    return q, idx, float(np.mean((z - q) ** 2))


# ---------------------------------------------------------------------------- latent_quantize


@pytest.mark.parametrize("global_codebook", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_latent_quantize_forward_matches_float64(backend, shape, dtype, global_codebook):
    z, values = _inputs(*shape, dtype, global_codebook)
    out = qkernels.latent_quantize(z, values)
    q, idx, loss = np_nearest(z.double().cpu(), values.double().cpu())
    assert out.indices.dtype == torch.int64
    np.testing.assert_array_equal(out.indices.cpu().numpy(), idx)
    # z_q is exactly the chosen codebook value, in the input dtype
    assert out.z_q.dtype == dtype
    np.testing.assert_array_equal(out.z_q.cpu().double().numpy(), q)
    for loss_t in (out.loss_quantize, out.loss_commit):
        assert loss_t.shape == ()
        assert math.isclose(loss_t.item(), loss, rel_tol=1e-5 if dtype == torch.float32 else 1e-12)


@pytest.mark.parametrize("global_codebook", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_latent_quantize_gradients_match_reference(shape, dtype, global_codebook):
    z0, v0 = _inputs(*shape, dtype, global_codebook)
    upstream = torch.randn(z0.shape, generator=_gen(1), dtype=dtype).to(DEVICE)
    grads = {}
    for name in BACKENDS:
        z, v = z0.clone().requires_grad_(), v0.clone().requires_grad_()
        with qkernels.use_backend(name):
            out = qkernels.latent_quantize(z, v)
        ((out.z_q * upstream).sum() + 0.3 * out.loss_quantize + 0.7 * out.loss_commit).backward()
        grads[name] = (z.grad, v.grad)
    # independent float64 formulas: STE + commit gradient to z, quantize gradient to values
    q, idx, _ = np_nearest(z0.double().cpu(), v0.double().cpu())
    n = z0.numel()
    zd = z0.double().cpu().numpy()
    gz = upstream.double().cpu().numpy() + 0.7 * 2 * (zd - q) / n
    gv = np.zeros((1 if global_codebook else shape[1], shape[2]))
    for (i, j), k in np.ndenumerate(idx):
        gv[0 if global_codebook else j, k] += 0.3 * 2 * (q[i, j] - zd[i, j]) / n
    for name, (g_z, g_v) in grads.items():
        torch.testing.assert_close(g_z.cpu().double(), torch.from_numpy(gz), **tol(dtype), msg=name)
        torch.testing.assert_close(g_v.cpu().double().reshape(gv.shape), torch.from_numpy(gv), **tol(dtype), msg=name)


def test_latent_quantize_ties_and_out_of_range(backend):
    # z exactly between two values -> the lower index; repeated values -> the first copy
    values = torch.tensor([[1.0, 0.0, 2.0], [0.5, 0.5, -1.0]], device=DEVICE)
    z = torch.tensor([[0.5, 0.5], [1.5, 7.0], [-9.0, -0.3], [100.0, -0.25]], device=DEVICE)
    out = qkernels.latent_quantize(z, values)
    expected = torch.tensor([[0, 0], [0, 0], [1, 2], [2, 0]])  # -0.25: three-way tie
    assert torch.equal(out.indices.cpu(), expected)
    assert torch.equal(out.z_q.cpu(), values.cpu()[torch.arange(2), expected])


@pytest.mark.parametrize("nv", [9, 40])  # the cpu kernel scans up to 16 values, searches more (both paths)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("global_codebook", [False, True])
def test_latent_quantize_indices_exact_on_hard_inputs(backend, dtype, global_codebook, nv):
    # unsorted codebooks with repeated values, z on the values, halfway between them and far outside the
    # range (where distances round together: the first index among equal rounded distances wins), and a
    # codebook that changes between calls: indices exactly the float64 oracle's argmin of |z - v|
    g = _gen(5)
    d = 6
    rows = 1 if global_codebook else d
    base = torch.randint(-4, 5, (rows, nv), generator=g).to(dtype) / 2  # steps of 0.5, repeats
    mid = (base[:, :-1] + base[:, 1:]) / 2
    far = base.new_tensor([1e8, -1e8, 3e7, 1e18]).expand(rows, 4)
    picks = torch.cat([base, mid, base + 1e-3, far], 1)  # (rows, P) candidate latents per codebook row
    cols = torch.randint(0, picks.shape[1], (40, d), generator=g)
    z = torch.stack([picks[0 if global_codebook else j, cols[:, j]] for j in range(d)], 1)
    for values in (base, base.flip(-1) * 1.5):
        arg = values[0] if global_codebook else values
        out = qkernels.latent_quantize(z.to(DEVICE), arg.to(DEVICE))
        full = values.expand(d, -1)
        # |z - v| rounded in the input precision (as every backend computes it), argmin = first minimum
        want = (z[:, :, None] - full[None]).abs().double().argmin(-1)
        assert torch.equal(out.indices.cpu(), want)
        assert torch.equal(out.z_q.cpu(), full[torch.arange(d), want])


def test_latent_quantize_leading_dims(backend):
    z, values = _inputs(24, 5, 7, torch.float32, False)
    z4 = z.reshape(2, 3, 4, 5)
    out = qkernels.latent_quantize(z4, values)
    flat = qkernels.latent_quantize(z, values)
    assert out.z_q.shape == z4.shape and out.indices.shape == z4.shape
    assert torch.equal(out.indices.reshape(24, 5), flat.indices)


def test_latent_quantize_gradcheck_fp64():
    z, values = _inputs(6, 3, 5, torch.float64, False, seed=3)
    for name in BACKENDS:
        with qkernels.use_backend(name):
            # loss_commit is a true function of z, loss_quantize of values (indices stay fixed
            # under gradcheck's tiny perturbations)
            assert torch.autograd.gradcheck(
                lambda z_: qkernels.latent_quantize(z_, values).loss_commit, z.clone().requires_grad_()
            ), name
            assert torch.autograd.gradcheck(
                lambda v_: qkernels.latent_quantize(z, v_).loss_quantize, values.clone().requires_grad_()
            ), name


# ---------------------------------------------------------------------------- FSQ


@pytest.mark.parametrize("levels", [2, 5, 12, [3, 8, 12, 2]])
def test_fsq_matches_float64(levels):
    z = torch.randn(37, 4, generator=_gen(2), dtype=torch.float64, device="cpu") * 2
    z.requires_grad_()
    out = qkernels.fsq(z, levels)
    lv = np.broadcast_to(np.asarray(levels, np.float64), (4,))
    zd = z.detach().numpy()
    idx = np.round((np.tanh(zd) + 1) / 2 * (lv - 1))
    np.testing.assert_array_equal(out.indices.numpy(), idx.astype(np.int64))
    np.testing.assert_allclose(out.z_q.detach().numpy(), 2 * idx / (lv - 1) - 1, rtol=0, atol=1e-15)
    assert out.indices.min() >= 0 and (out.indices.numpy() <= lv - 1).all()
    assert out.loss_quantize.item() == 0 and out.loss_commit.item() == 0
    out.z_q.sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), 1 - np.tanh(zd) ** 2, rtol=1e-12)


def test_fsq_module_round_trip():
    fsq = qnn.FSQ([3, 12, 5])
    out = fsq(torch.randn(50, 3, generator=_gen(3)) * 3)
    assert torch.equal(fsq.values_to_indices(out.z_q), out.indices)
    torch.testing.assert_close(fsq.indices_to_values(out.indices), out.z_q)
    # values off the grid (e.g. after arithmetic) map to the NEAREST level: L = 5 levels at -1, -0.5, ..., 1
    five = qnn.FSQ(5)
    grid = torch.linspace(-1, 1, 5)[:, None]
    for shift in (-0.2, -0.01, 0.01, 0.2):
        assert five.values_to_indices((grid + shift).clamp(-1, 1)).flatten().tolist() == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------------------- Gumbel / categorical


def np_relaxed(logits, values, uniform, tau, noise_scale, hard):
    """float64 numpy recomputation of the relaxed categorical sample and KL to uniform."""
    logits = np.asarray(logits, np.float64)
    a = logits.copy()
    if uniform is not None:
        u = np.clip(np.asarray(uniform, np.float64), 1e-300, 1 - 1.1102230246251565e-16)
        a = a + noise_scale * -np.log(-np.log(u))
    a = a / tau
    y = np.exp(a - a.max(-1, keepdims=True))
    y /= y.sum(-1, keepdims=True)
    if hard:
        y = np.eye(y.shape[-1])[y.argmax(-1)]
    v = np.broadcast_to(np.asarray(values, np.float64), logits.shape[-2:])
    z = (y * v).sum(-1)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    kl = (p * np.log(p * logits.shape[-1])).sum(-1)
    return z, y, kl


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 2), (5, 7, 10), (33, 3, 64)])  # (batch, d, K)
def test_categorical_latent_matches_float64(backend, shape, dtype, hard):
    g = _gen(4)
    logits = (torch.randn(shape, generator=g, dtype=torch.float64) * 2).to(dtype).to(DEVICE)
    values = torch.randn(shape[1:], generator=g, dtype=torch.float64).to(dtype).to(DEVICE)
    uniform = torch.rand(shape, generator=g, dtype=torch.float64).to(dtype).to(DEVICE)
    out = qkernels.categorical_latent(logits, values, tau=0.7, noise_scale=1.3, hard=hard, uniform=uniform)
    z, y, kl = np_relaxed(logits.cpu(), values.cpu(), uniform.cpu(), 0.7, 1.3, hard)
    t = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
    np.testing.assert_allclose(out.z.cpu().double().numpy(), z, **t)
    np.testing.assert_allclose(out.y.cpu().double().numpy(), y, **t)
    np.testing.assert_allclose(out.kl.cpu().double().numpy(), kl, **t)


@pytest.mark.parametrize("global_codebook", [False, True])
def test_gumbel_quantize_matches_float64(backend, global_codebook):
    # the public path from z and the codebook: FactorQVAE's logits are the negative squared
    # distances to every codebook value, recomputed here in numpy (not from qkernels)
    g = _gen(13)
    z = torch.randn(17, 4, generator=g, dtype=torch.float64)
    values = torch.randn((9,) if global_codebook else (4, 9), generator=g, dtype=torch.float64)
    u = torch.rand(17, 4, 9, generator=g, dtype=torch.float64)
    out = qkernels.gumbel_quantize(z.to(DEVICE), values.to(DEVICE), 0.6, uniform=u.to(DEVICE))
    vn = np.broadcast_to(values.numpy(), (4, 9))
    logits = -((z.numpy()[:, :, None] - vn[None]) ** 2)
    zq, y, kl = np_relaxed(logits, vn, u.numpy(), 0.6, 1.0, False)
    t = {"rtol": 1e-10, "atol": 1e-12}
    np.testing.assert_allclose(out.logits.cpu().numpy(), logits, **t)
    np.testing.assert_allclose(out.weights.cpu().numpy(), y, **t)
    np.testing.assert_allclose(out.z_q.cpu().numpy(), zq, **t)
    np.testing.assert_allclose(out.kl_uniform.cpu().numpy(), kl, **t)


@pytest.mark.parametrize("hard", [False, True])
@pytest.mark.parametrize("global_codebook", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gumbel_quantize_gradients_match_reference(dtype, global_codebook, hard):
    g = _gen(5)
    z0 = torch.randn(19, 6, generator=g, dtype=dtype).to(DEVICE)
    v0 = torch.randn((9,) if global_codebook else (6, 9), generator=g, dtype=dtype).to(DEVICE)
    u = torch.rand(19, 6, 9, generator=g, dtype=dtype).to(DEVICE)
    ups = [torch.randn(s, generator=g, dtype=dtype).to(DEVICE) for s in [(19, 6), (19, 6, 9), (19, 6, 9), (19, 6)]]
    results = {}
    for name in BACKENDS:
        z, v = z0.clone().requires_grad_(), v0.clone().requires_grad_()
        with qkernels.use_backend(name):
            out = qkernels.gumbel_quantize(z, v, 0.5, hard=hard, uniform=u)
        sum(((o * w).sum() for o, w in zip(out, ups, strict=True))).backward()
        results[name] = [t.detach() for t in out] + [z.grad, v.grad]
    for name in KERNEL_BACKENDS:
        for got, want in zip(results[name], results["reference"], strict=True):
            torch.testing.assert_close(
                got,
                want,
                rtol=1e-4 if dtype == torch.float32 else 1e-9,
                atol=1e-5 if dtype == torch.float32 else 1e-11,
                msg=name,
            )


@pytest.mark.skipif(DEVICE != "cpu" or "cpu" not in BACKENDS, reason="the cpu kernels")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_categorical_kernels_same_on_baseline_isa(monkeypatch, dtype):
    """The cpu relaxed_categorical kernels are compiled twice (baseline x86-64 and AVX+FMA, csrc/cpu/isa.h) and
    picked at run time: both copies match the reference, soft and hard, K a whole number of vectors (16) or not
    (13: masked lanes)."""
    g = _gen(31)
    for k in (13, 16):
        lg0 = (torch.randn(9, 3, k, generator=g, dtype=torch.float64) * 2).to(dtype)
        v0 = torch.randn(3, k, generator=g, dtype=torch.float64).to(dtype)
        u = torch.rand(9, 3, k, generator=g, dtype=torch.float64).to(dtype)
        ups = [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in [(9, 3), (9, 3, k), (9, 3)]]
        for hard in (False, True):
            res = {}
            for isa, backend in (("auto", "reference"), ("baseline", "cpu"), ("auto", "cpu")):
                monkeypatch.setenv("QKERNELS_CPU_ISA", isa)
                lg, v = lg0.clone().requires_grad_(), v0.clone().requires_grad_()
                with qkernels.use_backend(backend):
                    out = qkernels.categorical_latent(lg, v, tau=0.8, noise_scale=1.2, hard=hard, uniform=u)
                torch.autograd.backward(list(out), ups)
                res[(isa, backend)] = [t.detach() for t in out] + [lg.grad, v.grad]
            for key in (("baseline", "cpu"), ("auto", "cpu")):
                for a, b in zip(res[key], res[("auto", "reference")], strict=True):
                    torch.testing.assert_close(a, b, **tol(dtype), msg=f"{key} K={k} hard={hard}")


def test_relaxed_categorical_gradcheck_fp64():
    g = _gen(6)
    logits = torch.randn(4, 3, 5, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_()
    values = torch.randn(3, 5, generator=g, dtype=torch.float64).to(DEVICE).requires_grad_()
    u = torch.rand(4, 3, 5, generator=g, dtype=torch.float64).to(DEVICE)
    for name in BACKENDS:
        with qkernels.use_backend(name):
            assert torch.autograd.gradcheck(
                lambda lg, v: tuple(qkernels.categorical_latent(lg, v, tau=0.8, noise_scale=0.9, uniform=u)),
                (logits, values),
                fast_mode=name == "triton" and DEVICE == "cpu",  # random projections: the interpreter is slow
            ), name


def test_categorical_latent_defaults_and_noise_free(backend):
    logits = torch.randn(8, 4, 16, generator=_gen(7)).to(DEVICE)
    out = qkernels.categorical_latent(logits, noise_scale=0.0, tau=2.0)
    values = torch.linspace(-1, 1, 16, device=DEVICE)
    y = torch.softmax(logits / 2.0, -1)
    torch.testing.assert_close(out.y, y)
    torch.testing.assert_close(out.z, (y * values).sum(-1))
    # KL to uniform: 0 for uniform logits, log K for a (numerically) one-hot distribution
    flat = qkernels.categorical_latent(torch.zeros(2, 3, 16, device=DEVICE), noise_scale=0.0)
    torch.testing.assert_close(flat.kl, torch.zeros(2, 3, device=DEVICE), atol=1e-6, rtol=0)
    peaked = torch.full((1, 1, 16), -1e4, device=DEVICE)
    peaked[..., 3] = 0
    assert math.isclose(qkernels.categorical_latent(peaked, noise_scale=0.0).kl.item(), math.log(16), rel_tol=1e-5)


def test_generator_gives_identical_samples_across_backends():
    logits = torch.randn(10, 4, 8, generator=_gen(8)).to(DEVICE)
    outs = []
    for name in BACKENDS:
        with qkernels.use_backend(name):
            outs.append(qkernels.categorical_latent(logits, generator=torch.Generator(DEVICE).manual_seed(9)).y)
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-5, atol=1e-6)
    # and a different seed gives a different sample
    other = qkernels.categorical_latent(logits, generator=torch.Generator(DEVICE).manual_seed(10)).y
    assert not torch.allclose(other, outs[0])


def test_gumbel_hard_is_one_hot_of_nearest_when_noise_free():
    # with uniform = exp(-1) the Gumbel noise is exactly 0 for every category
    z = torch.randn(20, 3, generator=_gen(11)).to(DEVICE)
    values = torch.randn(7, generator=_gen(12)).to(DEVICE)
    u = torch.full((20, 3, 7), math.exp(-1.0), device=DEVICE)
    out = qkernels.gumbel_quantize(z, values, 0.3, hard=True, uniform=u)
    nearest = qkernels.latent_quantize(z, values)
    assert torch.equal(out.weights.argmax(-1), nearest.indices)
    assert torch.equal(out.z_q, nearest.z_q)


def _gumbel_case(n, d, k, dtype, global_codebook, seed=20):
    g = _gen(seed)
    z = (torch.randn(n, d, generator=g, dtype=torch.float64) * 1.5).to(dtype).to(DEVICE)
    v = torch.randn(1 if global_codebook else d, k, generator=g, dtype=torch.float64).to(dtype).to(DEVICE)
    u = torch.rand(n, d, k, generator=g, dtype=torch.float64).to(dtype).to(DEVICE)
    ups = [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).to(DEVICE) for s in [(n, d), (n, d, k)] * 2]
    return z, v, u, [ups[0], ups[1], ups[3], ups[2]]  # grads of z_q (n, d), y, logits (n, d, k), kl (n, d)


def _gumbel_run(impl, z0, v0, u, ups, hard, used=(0, 1, 2, 3)):
    """Outputs and the gradients of z and values from the outputs ``used`` (the others unused)."""
    z, v = z0.clone().requires_grad_(), v0.clone().requires_grad_()
    out = impl(z, v, u, 0.6, hard)
    torch.autograd.backward([out[i] for i in used], [ups[i] for i in used])
    return [t.detach() for t in out] + [z.grad, v.grad]


# (N, d, K); a global codebook at 40 x 30: 38 row tiles, in float32 only under the Triton interpreter (float64
# took 12 s there; float64 across row tiles: 37 x 5 x 7)
GUMBEL_CASES = unless_interpreted(
    [
        (shape, global_codebook, dtype)
        for shape, global_codebook in [
            ((1, 1, 2), False),
            ((1, 1, 2), True),
            ((37, 5, 7), False),
            ((37, 5, 7), True),
            ((40, 30, 3), True),
        ]
        for dtype in DTYPES
    ],
    ((40, 30, 3), True, torch.float64),
)


@pytest.mark.parametrize(("shape", "global_codebook", "dtype"), GUMBEL_CASES, ids=str)
def test_gumbel_quantize_op_matches_reference(shape, global_codebook, dtype):
    """Every backend's gumbel_quantize op (forward and the gradients of all four outputs, with and
    without noise, soft and hard) against the reference implementation."""
    impls = qkernels._backend.implementations("gumbel_quantize")
    z, v, u, ups = _gumbel_case(*shape, dtype, global_codebook)
    t = tol(dtype) if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}  # fp32: sums over 40 rows
    cases = [
        (u, False, (0, 1, 2, 3)),
        (u, True, (0, 1, 2, 3)),
        (None, False, (0, 1, 2, 3)),
        (None, True, (0, 1, 2, 3)),
        (u, False, (0, 3)),
        (u, True, (1, 2)),
    ]  # some outputs unused: no upstream gradient for them
    for uniform, hard, used in cases:
        want = _gumbel_run(impls["reference"], z, v, uniform, ups, hard, used)
        for name in KERNEL_BACKENDS:
            got = _gumbel_run(impls[name], z, v, uniform, ups, hard, used)
            for what, g, w in zip(("z_q", "y", "logits", "kl", "grad z", "grad values"), got, want, strict=True):
                assert g.dtype == w.dtype and g.shape == w.shape, (name, what)
                torch.testing.assert_close(
                    g,
                    w,
                    **t,
                    msg=lambda m, name=name, what=what, noise=uniform is not None, hard=hard: (
                        f"{name} {what} (noise {noise}, hard {hard}): {m}"
                    ),
                )


def test_gumbel_quantize_logits_gradient_matches_float64():
    """The gradient through the logits output alone: d/dz sum(w * -(z - v)^2) = -2 sum_k w (z - v_k),
    d/dv_k = 2 sum w (z - v_k), recomputed in numpy."""
    z0, v0, u, _ = _gumbel_case(9, 3, 4, torch.float64, False, seed=21)
    w = torch.randn(9, 3, 4, generator=_gen(22), dtype=torch.float64).to(DEVICE)
    diff = z0.cpu().numpy()[:, :, None] - v0.cpu().numpy()[None]
    for name in BACKENDS:
        z, v = z0.clone().requires_grad_(), v0.clone().requires_grad_()
        with qkernels.use_backend(name):
            out = qkernels.gumbel_quantize(z, v, 0.6, uniform=u)
        (out.logits * w).sum().backward()
        np.testing.assert_allclose(z.grad.cpu().numpy(), (-2 * w.cpu().numpy() * diff).sum(-1), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(v.grad.cpu().numpy(), (2 * w.cpu().numpy() * diff).sum(0), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("global_codebook", [False, True])
def test_gumbel_quantize_gradcheck_fp64(global_codebook):
    z, v, u, _ = _gumbel_case(3, 2, 3, torch.float64, global_codebook, seed=23)
    v = v[0] if global_codebook else v
    for name in BACKENDS:
        with qkernels.use_backend(name):
            assert torch.autograd.gradcheck(
                lambda z_, v_: tuple(qkernels.gumbel_quantize(z_, v_, 0.7, uniform=u)),
                (z.clone().requires_grad_(), v.clone().requires_grad_()),
                fast_mode=True,
            ), name


@pytest.mark.skipif("triton" not in BACKENDS, reason="needs Triton (or its interpreter)")
def test_triton_gumbel_reductions_are_deterministic():
    """gumbel_quantize's codebook gradients are reduced in a fixed order (no atomics): bit-identical over runs
    where the reduction adds its partials in several steps (38 row tiles). latent_quantize's reductions:
    test_triton_latent_quantize_same_bits_whichever_program_arrives_last and the small-tile tests below."""
    z, v, u, ups = _gumbel_case(40, 30, 3, torch.float32, True, seed=25)
    impl = qkernels._backend.implementations("gumbel_quantize")["triton"]
    first, second = (_gumbel_run(impl, z, v, u, ups, False) for _ in range(2))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_categorical_latent_default_values_cost_no_launch():
    """linspace(-1, 1, K) is made once per (K, dtype, device), also when first made under
    inference mode; the values are numpy's linspace."""
    from qkernels.bench.launches import count_launches

    logits = torch.randn(6, 2, 5, generator=_gen(26), dtype=torch.float64).to(DEVICE)
    with torch.inference_mode():
        qkernels.categorical_latent(logits, noise_scale=0.0)
    lg = logits.clone().requires_grad_()

    def call():
        lg.grad = None
        qkernels.categorical_latent(lg, noise_scale=0.0).z.sum().backward()

    call()
    assert "linspace" not in count_launches(call).names
    p = np.exp(logits.cpu().numpy())
    p /= p.sum(-1, keepdims=True)
    values = np.linspace(-1, 1, 5)
    z = p @ values
    np.testing.assert_allclose(
        qkernels.categorical_latent(logits, noise_scale=0.0).z.cpu().numpy(), z, rtol=1e-10, atol=1e-12
    )
    np.testing.assert_allclose(lg.grad.cpu().numpy(), p * (values - z[..., None]), rtol=1e-10, atol=1e-12)


@pytest.mark.skipif("triton" not in BACKENDS, reason="needs Triton (or its interpreter)")
def test_triton_launches_per_forward_backward():
    """Issue 25: the fused paths' own kernels, forward + backward (upstream gradients given)."""
    from qkernels.bench.launches import count_launches

    z0, v0 = _inputs(16, 3, 5, torch.float32, False)
    lg0 = torch.randn(16, 3, 5, generator=_gen(27)).to(DEVICE)
    cases = {  # name -> (leaves, differentiable outputs, launches: total, Triton)
        "latent_quantize": (
            (z0, v0),
            lambda z, v: (lambda q: (q.z_q, q.loss_quantize, q.loss_commit))(qkernels.latent_quantize(z, v)),
            (4, 4),
        ),
        "gumbel_quantize": ((z0, v0[0]), lambda z, v: tuple(qkernels.gumbel_quantize(z, v, 0.5)), (4, 3)),  # + rand
        "categorical_latent": ((lg0,), lambda lg: tuple(qkernels.categorical_latent(lg)), (4, 3)),  # + rand
    }
    for name, (inputs, fn, (total, kernels)) in cases.items():
        with qkernels.use_backend("triton"):
            leaves = [t.clone().requires_grad_() for t in inputs]
            ups = [torch.randn_like(o) for o in fn(*leaves)]

            def run(fn=fn, leaves=leaves, ups=ups):
                for t in leaves:
                    t.grad = None  # no accumulation into .grad
                torch.autograd.backward(fn(*leaves), ups)

            run()
            tally = count_launches(run)
        assert tally.syncs == 0 and tally.total <= total and tally.triton <= kernels, (name, str(tally))


# ---------------------------------------------------------------------------- triton latent_quantize: 1 + 1 launches

needs_triton = pytest.mark.skipif("triton" not in BACKENDS, reason="needs Triton (or its interpreter)")
interpreted = pytest.mark.skipif(
    DEVICE != "cpu" or "triton" not in BACKENDS, reason="runs the Triton interpreter (program order, tiles made small)"
)


@pytest.fixture
def small_lq_tiles(monkeypatch):
    """The Triton latent_quantize kernels with tiles small enough to cross every boundary at tiny shapes: 4 x 4
    tiles, 4 values a pass of the codebook sums, a scan of 3 values a step, 4 programs wanted per kernel,
    reductions of 4 partials (forward) and 8 x 1 or 8 x 2 (backward, float64 or float32) a step."""
    import qkernels.triton.quantize as tq

    for name, value in {
        "LQ_ROWS": 4,
        "LQ_BLOCK_D": 4,
        "LQ_BLOCK_V": 4,
        "LQ_UNROLL": 3,
        "LQ_LOSS_STEP": 4,
        "LQ_GRAD_STEP": 64,
        "LQ_GRAD_COLS": 8,
        "LQ_FWD_PER_SM": 2,
        "LQ_BWD_PER_SM": 2,
    }.items():
        monkeypatch.setattr(tq, name, value)
    monkeypatch.setattr(tq, "min_programs", lambda t: 4)
    return tq


def _lq_run(z0, v0, up, backend="triton"):
    """One forward + backward of latent_quantize (0.3 loss_quantize + 0.7 loss_commit beside z_q * up): the
    outputs and the gradients, detached."""
    z, v = z0.clone().requires_grad_(), v0.clone().requires_grad_()
    with qkernels.use_backend(backend):
        out = qkernels.latent_quantize(z, v)
    ((out.z_q * up).sum() + 0.3 * out.loss_quantize + 0.7 * out.loss_commit).backward()
    return out.z_q.detach(), out.indices, out.loss_quantize.detach(), out.loss_commit.detach(), z.grad, v.grad


def _lq_float64(z0, v0, up, global_codebook):
    """QLAE's quantizer and the gradients of _lq_run's loss, recomputed in float64 (numpy)."""
    q, idx, loss = np_nearest(z0.double().cpu(), v0.double().cpu())
    zd = z0.double().cpu().numpy()
    gz = up.double().cpu().numpy() + 0.7 * 2 * (zd - q) / zd.size
    gv = np.zeros((1 if global_codebook else zd.shape[1], v0.shape[-1]))
    cols = np.zeros_like(idx) if global_codebook else np.broadcast_to(np.arange(zd.shape[1]), idx.shape)
    np.add.at(gv, (cols, idx), 0.3 * 2 * (q - zd) / zd.size)
    return q, idx, loss, gz, gv


def _assert_lq_float64(got, z0, v0, up, global_codebook):
    z_q, indices, loss_q, loss_c, g_z, g_v = got
    q, idx, loss, gz, gv = _lq_float64(z0, v0, up, global_codebook)
    t = tol(z0.dtype)
    np.testing.assert_array_equal(indices.cpu().numpy(), idx)
    np.testing.assert_array_equal(z_q.cpu().double().numpy(), q)
    for value in (loss_q, loss_c):
        np.testing.assert_allclose(value.item(), loss, **t)
    np.testing.assert_allclose(g_z.cpu().double().numpy(), gz, **t)
    np.testing.assert_allclose(g_v.cpu().double().numpy().reshape(gv.shape), gv, **t)


@interpreted
@pytest.mark.parametrize(
    "shape,global_codebook,dtype",
    [((26, 9, 10), False, torch.float32), ((26, 9, 10), True, torch.float64)]
    + [((n, d, 1), g, dt) for n, d in ((9, 5), (1, 1)) for g in (False, True) for dt in DTYPES],
)
def test_triton_latent_quantize_small_tiles_match_float64(small_lq_tiles, shape, global_codebook, dtype):
    """Every loop of the two kernels past its second step, and partial last ones: 26 x 9 latents are 3 latent
    blocks (the last of 1) x 3 row programs of 3, 3 and 1 row steps (the last of 2 rows); 10 values are 3 passes
    of the codebook sums (the last of 2) and 4 scan steps (the last of 1); the loss partials are added in 3 steps,
    the codebook partials in teams of 2 row programs (per-latent: 2 teams, the last of 1; 5 x 1 steps, float32)
    or 3 (global: 3 teams; 2 x 3 steps, float64). One value (a constexpr 1 in Triton), one sample, one latent."""
    z0, v0 = _inputs(*shape, dtype, global_codebook, seed=31)
    up = torch.randn(z0.shape, generator=_gen(32), dtype=dtype)
    _assert_lq_float64(_lq_run(z0, v0, up), z0, v0, up, global_codebook)


@interpreted
@pytest.mark.parametrize("global_codebook", [False, True])
def test_triton_latent_quantize_backward_skips_out_of_range_indices(small_lq_tiles, global_codebook):
    """The raw backward op with indices out of range (n_v, -1, 2^32 + 3: int32 would read it as 3): NaN grad_z
    there, and those elements in no value's sum, in every pass of the codebook sums."""
    z0, v0 = _inputs(20, 6, 11, torch.float64, global_codebook, seed=33)
    values = v0[None] if global_codebook else v0
    _, idx, _ = np_nearest(z0, v0)
    idx = torch.from_numpy(idx)
    bad = torch.zeros(idx.shape, dtype=torch.bool)
    bad[3, 1], bad[17, 4], bad[10, 0] = True, True, True
    idx[3, 1], idx[17, 4], idx[10, 0] = 11, -1, 2**32 + 3
    gzq = torch.randn(z0.shape, generator=_gen(34), dtype=torch.float64)
    g = torch.tensor(0.3, dtype=torch.float64)
    grad_z, grad_v = torch.ops.qkernels.latent_quantize_backward_triton(gzq, g, g, z0, values, idx)
    assert torch.isnan(grad_z[bad]).all() and torch.isfinite(grad_z[~bad]).all()
    full = values.expand(6, -1)
    q = torch.gather(full, 1, idx.clamp(0, 10).t()).t()
    want = np.zeros(values.shape)
    good = (~bad).numpy()
    cols = np.zeros_like(idx.numpy()) if global_codebook else np.broadcast_to(np.arange(6), idx.shape)
    np.add.at(want, (cols[good], idx.numpy()[good]), (0.3 * 2 * (q - z0) / z0.numel()).numpy()[good])
    np.testing.assert_allclose(grad_v.numpy(), want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(
        grad_z[~bad].numpy(), (gzq + 0.3 * 2 * (z0 - q) / z0.numel())[~bad].numpy(), rtol=1e-12, atol=1e-15
    )


@contextlib.contextmanager
def _program_order(order):
    """The interpreter runs each launch's programs in ``order(count)`` (a permutation of 0..count-1, row-major
    over the grid) instead of 0, 1, ...: which program arrives last, and so reduces, changes with it."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    set_dim, set_idx = builder.set_grid_dim, builder.set_grid_idx
    grid = {}

    def grid_dim(nx, ny, nz):
        grid["dims"], grid["perm"] = (nx, ny, nz), order(nx * ny * nz)
        set_dim(nx, ny, nz)

    def grid_idx(x, y, z):
        _, ny, nz = grid["dims"]
        f = grid["perm"][(x * ny + y) * nz + z]
        set_idx(f // (ny * nz), f // nz % ny, f % nz)

    builder.set_grid_dim, builder.set_grid_idx = grid_dim, grid_idx
    try:
        yield
    finally:
        del builder.set_grid_dim, builder.set_grid_idx  # the class's methods again


@interpreted
@pytest.mark.parametrize("global_codebook", [False, True])
def test_triton_latent_quantize_same_bits_whichever_program_arrives_last(small_lq_tiles, global_codebook):
    """The losses and the codebook gradient are added by the last programs to finish (of a team, of the teams), in
    the partials' order, not in the order programs arrive: float32 outputs bit-identical with the programs run in
    order, reversed and shuffled; right against float64."""
    # 8 x 2 programs, teams of 3, 3 and 2 row programs per latent block; 5 x 2, teams of 4, 4 and 2 (global)
    small_lq_tiles.min_programs = lambda t: 8 if global_codebook else 12
    z0, v0 = _inputs(60, 7, 4, torch.float32, global_codebook, seed=35)
    up = torch.randn(z0.shape, generator=_gen(36))
    orders = {
        "in order": lambda n: list(range(n)),
        "reversed": lambda n: list(range(n))[::-1],
        "shuffled": lambda n: np.random.default_rng(n).permutation(n).tolist(),
    }
    runs = {}
    for name, order in orders.items():
        with _program_order(order):
            runs[name] = _lq_run(z0, v0, up)
    for name, got in runs.items():
        for a, b in zip(runs["in order"], got, strict=True):
            assert torch.equal(a, b), name
    _assert_lq_float64(runs["in order"], z0, v0, up, global_codebook)


@interpreted
def test_triton_latent_quantize_launch_stopped_part_way_leaves_no_counter(small_lq_tiles):
    """A launch that fails between two programs (after some took their tickets) drops its counters: the next
    call is right, not reduced by the wrong program."""
    from triton.runtime import interpreter

    z0, v0 = _inputs(30, 7, 9, torch.float64, False, seed=37)
    up = torch.randn(z0.shape, generator=_gen(38), dtype=torch.float64)
    builder = interpreter.interpreter_builder
    set_idx, calls = builder.set_grid_idx, []

    def stop_at_the_fourth(x, y, z):
        calls.append((x, y, z))
        if len(calls) == 4:
            raise RuntimeError("stopped part-way")
        set_idx(x, y, z)

    builder.set_grid_idx = stop_at_the_fourth
    try:
        with pytest.raises(Exception, match="stopped part-way"):
            _lq_run(z0, v0, up)
    finally:
        del builder.set_grid_idx
    _assert_lq_float64(_lq_run(z0, v0, up), z0, v0, up, False)


@needs_triton
@pytest.mark.parametrize("global_codebook", [False, True])
def test_triton_latent_quantize_is_one_launch_each_way(global_codebook):
    """The forward is one Triton launch (z_q, indices, both losses); the backward one (grad_z, grad_values);
    nothing else launches (no zero fill: the counters are set back to 0 by the kernels) and nothing reads back."""
    from qkernels.bench.launches import count_launches

    z0, v0 = _inputs(40, 5, 6, torch.float32, global_codebook, seed=39)
    z, v = z0.clone().requires_grad_(), v0.clone().requires_grad_()
    with qkernels.use_backend("triton"):
        qkernels.latent_quantize(z, v)  # first call: the counters are made
        seen = {}
        fwd = count_launches(lambda: seen.setdefault("out", qkernels.latent_quantize(z, v)))
    out = seen["out"]
    ups = [torch.randn_like(out.z_q), torch.tensor(0.3, device=DEVICE), torch.tensor(0.7, device=DEVICE)]
    bwd = count_launches(lambda: torch.autograd.backward([out.z_q, out.loss_quantize, out.loss_commit], ups))
    assert (fwd.total, fwd.triton, fwd.syncs) == (1, 1, 0), str(fwd)
    assert (bwd.total, bwd.triton, bwd.syncs) == (1, 1, 0), str(bwd)
    assert dict(fwd.names) == {"_latent_quantize_fwd": 1} and dict(bwd.names) == {"_latent_quantize_bwd": 1}


@pytest.mark.skipif(DEVICE != "cuda" or "triton" not in BACKENDS, reason="needs a GPU")
@pytest.mark.parametrize("global_codebook", [False, True])
def test_triton_latent_quantize_in_a_cuda_graph(global_codebook):
    """Forward + backward captured in a CUDA graph (each launch's counters made inside the capture) and replayed
    twice: the eager results, bit for bit, with no host synchronization inside the op."""
    z0, v0 = _inputs(4096, 64, 64, torch.float32, global_codebook, seed=40)
    up = torch.randn(z0.shape, generator=_gen(41)).to(DEVICE)
    want = _lq_run(z0, v0, up)
    z, v = z0.clone().requires_grad_(), v0.clone().requires_grad_()

    def step():
        z.grad = v.grad = None
        with qkernels.use_backend("triton"):
            out = qkernels.latent_quantize(z, v)
        ((out.z_q * up).sum() + 0.3 * out.loss_quantize + 0.7 * out.loss_commit).backward()
        return out.z_q, out.indices, out.loss_quantize, out.loss_commit, z.grad, v.grad

    assert_graph_replays_match(step, want)


# ---------------------------------------------------------------------------- ops: opcheck


def _op_samples():
    z, v = _inputs(9, 4, 6, torch.float64, False)
    lg = torch.randn(3, 4, 6, dtype=torch.float64, device=DEVICE)
    u = torch.rand(3, 4, 6, dtype=torch.float64, device=DEVICE)
    return z, v, lg, u


@pytest.mark.parametrize("suffix", [""] + (["_triton"] if "triton" in BACKENDS else []))
def test_opcheck(suffix):
    if suffix == "" and "cpu" not in BACKENDS and "cuda" not in BACKENDS:
        pytest.skip("native extension not built")
    ops = torch.ops.qkernels
    z, v, lg, u = _op_samples()
    zr, vr = z.clone().requires_grad_(), v.clone().requires_grad_()
    torch.library.opcheck(getattr(ops, "latent_quantize" + suffix), (zr, vr))
    zq, idx, _, _ = getattr(ops, "latent_quantize" + suffix)(z, v)
    scalar = torch.tensor(0.5, dtype=torch.float64, device=DEVICE)
    torch.library.opcheck(getattr(ops, "latent_quantize_backward" + suffix), (zq, scalar, scalar, z, v, idx))
    lgr, vr2 = lg.clone().requires_grad_(), v.clone().requires_grad_()
    for uniform, hard in [(u, False), (None, True)]:
        torch.library.opcheck(getattr(ops, "relaxed_categorical" + suffix), (lgr, vr2, uniform, 0.7, 1.0, hard))
    zz, y, kl = getattr(ops, "relaxed_categorical" + suffix)(lg, v, u, 0.7, 1.0, False)
    torch.library.opcheck(getattr(ops, "relaxed_categorical_backward" + suffix), (zz, y, kl, lg, v, u, y, 0.7, 1.0))


@pytest.mark.skipif("triton" not in BACKENDS, reason="needs Triton (or its interpreter)")
@pytest.mark.parametrize("global_codebook", [False, True])
def test_opcheck_gumbel_quantize(global_codebook):
    """gumbel_quantize has Triton ops only (no C++ kernel)."""
    ops = torch.ops.qkernels
    z, v, lg, u = _op_samples()
    v = v[:1] if global_codebook else v
    zr, vr = z[:3].clone().requires_grad_(), v.clone().requires_grad_()
    for uniform, hard in [(u, False), (None, True)]:
        torch.library.opcheck(ops.gumbel_quantize_triton, (zr, vr, uniform, 0.7, hard))
    zq, y, logits, kl = ops.gumbel_quantize_triton(z[:3], v, u, 0.7, False)
    for uniform in (u, None):
        torch.library.opcheck(ops.gumbel_quantize_backward_triton, (zq, y, logits, kl, z[:3], v, uniform, y, 0.7))
    # upstream gradients of unused outputs are None (zero)
    torch.library.opcheck(ops.gumbel_quantize_backward_triton, (zq, None, None, kl, z[:3], v, u, y, 0.7))
    torch.library.opcheck(ops.gumbel_quantize_backward_triton, (None, y, logits, None, z[:3], v, u, y, 0.7))


# ---------------------------------------------------------------------------- bad input


def test_bad_input_errors():
    z = torch.randn(4, 3)
    v = torch.randn(3, 5)
    with pytest.raises(TypeError, match="z"):
        qkernels.latent_quantize(z.long(), v)
    with pytest.raises(TypeError, match="z"):
        qkernels.latent_quantize([[0.0]], v)
    with pytest.raises(ValueError, match="values"):
        qkernels.latent_quantize(z, torch.randn(4, 5))
    with pytest.raises(ValueError, match="values"):
        qkernels.latent_quantize(z, torch.randn(3, 5, 1))
    with pytest.raises(ValueError, match="z"):
        qkernels.latent_quantize(torch.empty(0, 3), v)
    with pytest.raises(ValueError, match="z.*NaN"):
        qkernels.latent_quantize(torch.tensor([[float("nan"), 0, 0]]), v)
    with pytest.raises(ValueError, match="values.*NaN"):
        qkernels.latent_quantize(z, torch.full((3, 5), float("inf")))
    with pytest.raises(TypeError, match="dtype"):
        qkernels.latent_quantize(z, v.double())
    with pytest.raises(ValueError, match="levels"):
        qkernels.fsq(z, 1)
    with pytest.raises(ValueError, match="levels"):
        qkernels.fsq(z, [3, 4])
    with pytest.raises(ValueError, match="levels must give 1 or d = 3 values, got 4"):
        qkernels.fsq(z, [3, 4, 5, 6])  # one too many
    with pytest.raises(TypeError, match="levels"):
        qkernels.fsq(z, 2.5)
    with pytest.raises(ValueError, match="tau"):
        qkernels.gumbel_quantize(z, torch.randn(5), 0.0)
    with pytest.raises(ValueError, match="values"):
        qkernels.gumbel_quantize(z, torch.randn(4, 5), 0.5)
    with pytest.raises(ValueError, match="uniform"):
        qkernels.gumbel_quantize(z, torch.randn(5), 0.5, uniform=torch.rand(4, 3, 6))
    with pytest.raises(ValueError, match="uniform"):
        qkernels.gumbel_quantize(z, torch.randn(5), 0.5, uniform=torch.rand(4, 3, 5) - 2)
    with pytest.raises(TypeError, match="uniform"):
        qkernels.gumbel_quantize(z, torch.randn(5), 0.5, uniform=torch.rand(4, 3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="z"):
        qkernels.gumbel_quantize(torch.empty(0, 3), torch.randn(5), 0.5)
    with pytest.raises(ValueError, match="tau"):
        qkernels.categorical_latent(torch.randn(2, 3, 4), tau=-1.0)
    with pytest.raises(ValueError, match="noise_scale"):
        qkernels.categorical_latent(torch.randn(2, 3, 4), noise_scale=-0.5)
    with pytest.raises(ValueError, match="values"):
        qkernels.categorical_latent(torch.randn(2, 3, 4), torch.randn(5))
    with pytest.raises(ValueError, match="logits"):
        qkernels.categorical_latent(torch.randn(4))
    with pytest.raises(ValueError, match="uniform"):
        qkernels.categorical_latent(torch.randn(2, 3, 4), uniform=torch.rand(2, 3, 5))
    with pytest.raises(ValueError, match="uniform"):
        qkernels.categorical_latent(torch.randn(2, 3, 4), uniform=torch.rand(2, 3, 4) + 1)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            qkernels.latent_quantize(z.cuda(), v)


def test_dtype_mismatch_messages_name_both_sides_and_the_fix():
    z64, v32 = torch.randn(4, 3, dtype=torch.float64), torch.randn(3, 5)
    fix = r"z has dtype torch.float64 but values has dtype torch.float32: .*z.to\(torch.float32\) or values.to\("
    with pytest.raises(TypeError, match=fix):
        qkernels.latent_quantize(z64, v32)
    fix = (
        r"z has dtype torch.float64 but the {}'s values have dtype torch.float32: convert z with "
        r"z.to\(torch.float32\) or the module with quantizer.to\(torch.float64\)"
    )
    for module in (qnn.LatentQuantizer(3, 5), qnn.GumbelQuantizer(5), qnn.GumbelQuantizer(5).eval()):
        with pytest.raises(TypeError, match=fix.format(type(module).__name__)):
            module(z64)
        assert module.to(torch.float64)(z64).z_q.dtype == torch.float64  # the fix works
    meta = torch.randn(4, 3, 5, device="meta")  # device mismatch with a buffer: same kind of hint
    with pytest.raises(ValueError, match=r"logits is on device meta but the CategoricalLatent's values .*cpu"):
        qnn.CategoricalLatent(3, 5)(meta)


# ---------------------------------------------------------------------------- modules


def test_latent_quantizer_module():
    lq = qnn.LatentQuantizer(4, 10)
    torch.testing.assert_close(lq.values[2], torch.linspace(-0.5, 0.5, 10))
    z = torch.randn(16, 4, generator=_gen(13), requires_grad=True)
    out = lq(z)
    (out.z_q.sum() + out.loss_quantize + out.loss_commit).backward()
    assert lq.values.grad is not None and lq.values.grad.abs().sum() > 0
    assert z.grad is not None
    assert torch.equal(lq.values_to_indices(lq.indices_to_values(out.indices)), out.indices)
    assert torch.equal(lq.indices_to_values(out.indices), out.z_q.detach())
    # distinct codebooks per latent: index i of latent j is codebook j's value i
    with torch.no_grad():
        lq.values.copy_(torch.arange(40.0).view(4, 10) / 7.0)
    idx = torch.tensor([[0, 9, 3, 5], [2, 2, 2, 2]])
    want = torch.tensor([[0 / 7, 19 / 7, 23 / 7, 35 / 7], [2 / 7, 12 / 7, 22 / 7, 32 / 7]])
    torch.testing.assert_close(lq.indices_to_values(idx), want)
    assert torch.equal(lq.values_to_indices(want), idx)
    glob = qnn.LatentQuantizer(4, 6, global_codebook=True)
    assert glob.values.shape == (6,)
    assert torch.equal(glob.indices_to_values(glob(z).indices), glob(z).z_q.detach())
    with pytest.raises(ValueError, match="init_range"):
        qnn.LatentQuantizer(4, 10, init_range=(1.0, -1.0))
    with pytest.raises(ValueError, match="num_values"):
        qnn.LatentQuantizer(4, 1)


def test_gumbel_and_categorical_modules():
    gq = qnn.GumbelQuantizer(64)
    z = torch.randn(8, 5, generator=_gen(14), requires_grad=True)
    out = gq(z, tau=0.9, generator=_gen(15))
    assert out.weights.shape == (8, 5, 64)
    out.z_q.sum().backward()
    assert gq.values.grad is not None and z.grad is not None
    gq.eval()
    ev = gq(z)
    nearest = qkernels.latent_quantize(z, gq.values)
    assert torch.equal(ev.z_q, nearest.z_q)
    assert torch.equal(gq.values_to_indices(ev.z_q), nearest.indices)
    cl = qnn.CategoricalLatent(5, 64)
    logits = torch.randn(8, 5, 64, generator=_gen(16))
    cl.eval()
    s = cl(logits)
    torch.testing.assert_close(s.z, torch.softmax(logits, -1) @ torch.linspace(-1, 1, 64))
    idx = torch.randint(0, 64, (8, 5), generator=_gen(17))
    assert torch.equal(cl.values_to_indices(cl.indices_to_values(idx)), idx)
    assert not any(p.requires_grad for p in cl.parameters())  # D-VAE's values are fixed


def test_gumbel_quantizer_codebook_init_is_standard_normal():
    """Audit 9 review: a U(0, 1) codebook init survived. FactorQVAE's codebook of scalars is initialised
    N(0, 1) (its code: torch.randn): about half negative, mean ~0 and std ~1 over 4096 draws."""
    torch.manual_seed(0)
    v = qnn.GumbelQuantizer(4096).values.detach().double()
    assert abs(float(v.mean())) < 0.06 and abs(float(v.std()) - 1.0) < 0.05
    assert 0.45 < float((v < 0).double().mean()) < 0.55 and float(v.abs().max()) > 3.0
    assert qnn.GumbelQuantizer(64).values.requires_grad  # learned


def test_modules_forward_hard_and_tau():
    """Audit 9 review: GumbelQuantizer(hard=True) sampling soft weights in training, and CategoricalLatent
    ignoring its tau, survived (tests used the defaults). hard: straight-through one-hots, z_q one of
    the codebook values, gradients still reach z; tau: y = softmax(logits / tau) without noise."""
    gq = qnn.GumbelQuantizer(6, hard=True)
    z = torch.randn(10, 3, generator=_gen(30), requires_grad=True)
    out = gq(z, tau=0.7, generator=_gen(31))
    w = out.weights.detach()
    assert torch.equal(w.sum(-1), torch.ones(10, 3)) and torch.equal(w.max(-1).values, torch.ones(10, 3))
    vals = gq.values.detach()
    torch.testing.assert_close(out.z_q.detach(), vals[w.argmax(-1)])
    out.z_q.sum().backward()
    assert z.grad is not None and z.grad.abs().sum() > 0
    cl = qnn.CategoricalLatent(3, 5, tau=0.5).eval()
    logits = torch.randn(4, 3, 5, generator=_gen(32), dtype=torch.float64)
    lg = logits.numpy()
    p = np.exp(lg / 0.5 - (lg / 0.5).max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(cl(logits).y.numpy(), p, rtol=1e-10)
    np.testing.assert_allclose(cl(logits).z.numpy(), p @ np.linspace(-1, 1, 5), rtol=1e-10, atol=1e-12)


def test_leading_dims_keep_every_output_shaped_like_the_input():
    """Audit 9 review: gumbel_quantize / categorical_latent returning kl flattened to (N, d), and fsq
    returning flat indices, for latents with extra leading dimensions survived. Each output of a
    (2, 3, d) input is the (6, d) result reshaped, the KL by the float64 formula sum p log(p K)."""
    g = _gen(40)
    z = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    v = torch.randn(5, generator=g, dtype=torch.float64)
    u = torch.rand(2, 3, 4, 5, generator=g, dtype=torch.float64)
    out = qkernels.gumbel_quantize(z, v, 0.7, uniform=u)
    flat = qkernels.gumbel_quantize(z.reshape(6, 4), v, 0.7, uniform=u.reshape(6, 4, 5))
    assert out.z_q.shape == out.kl_uniform.shape == (2, 3, 4) and out.weights.shape == out.logits.shape == u.shape
    lg = -((z.numpy()[..., None] - v.numpy()) ** 2)
    p = np.exp(lg - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(out.kl_uniform.numpy(), (p * np.log(p * 5)).sum(-1), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(out.weights, flat.weights.reshape(u.shape))
    logits = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    s = qkernels.categorical_latent(logits, uniform=u)
    s_flat = qkernels.categorical_latent(logits.reshape(6, 4, 5), uniform=u.reshape(6, 4, 5))
    assert s.z.shape == s.kl.shape == (2, 3, 4) and s.y.shape == logits.shape
    torch.testing.assert_close(s.kl, s_flat.kl.reshape(2, 3, 4))
    torch.testing.assert_close(s.z, s_flat.z.reshape(2, 3, 4))
    q = qkernels.fsq(z, 5)
    assert q.z_q.shape == q.indices.shape == (2, 3, 4)
    want = np.round((np.tanh(z.numpy()) + 1) / 2 * 4)
    assert torch.equal(q.indices, torch.from_numpy(want).long())


def test_ambiguous_layout_warns_once_and_an_explicit_dim_silences_it():
    """Issue 39: a (8, 12, 12, 12) input to a quantizer of 12 latents reads both channel-first and channel-last; the
    default (last axis) says so once, naming dim=; an explicit dim (even -1) says nothing."""
    import warnings

    from qkernels.nn import FSQ, LatentQuantizer

    x = torch.randn(8, 12, 12, 12)
    for make in (lambda **kw: LatentQuantizer(12, 5, **kw), lambda **kw: FSQ([5] * 12, **kw)):
        module = make()
        with pytest.warns(UserWarning, match=r"axis 1 and along its last axis.*pass dim=1"):
            module(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            module(x)  # once per module
            make(dim=-1)(x)
            torch.testing.assert_close(make(dim=1)(x).z_q, make(dim=-1)(x.movedim(1, -1)).z_q.movedim(-1, 1))
            make()(torch.randn(8, 12))  # 2-D: nothing to confuse
            make()(torch.randn(8, 3, 12, 12))  # axis 1 of another size


def test_functional_fsq_on_a_channel_first_tensor_says_how():
    hint = r"got 3; z has shape \(8, 3, 16, 16\).*z.movedim\(1, -1\).*FSQ\(levels, dim=1\)"
    with pytest.raises(ValueError, match=hint):
        qkernels.fsq(torch.randn(8, 3, 16, 16), [5, 5, 5])
    with pytest.raises(ValueError, match=r"got 2$"):  # no axis of 2 entries: no hint
        qkernels.fsq(torch.randn(8, 3, 16, 16), [5, 5])
