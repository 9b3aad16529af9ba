"""Every kernel with blocks, tiles, chunks or super-blocks at a shape past its second one (issue 48): an
indexing or accumulation slip that only the third block, or a partial last one, reaches fails here. Each kernel
against float64 equations or the reference; the Triton kernels run under the interpreter (CPU), with tiles made
small where the real ones would take minutes there.

Boundaries crossed (kernel: unit, shape here):

- cpu latent_quantize (loss and codebook-gradient partials): row chunks of max(64, N / 64) rows: N = 200 (4
  chunks, the last partial) and N = 4200 (64 chunks of 66 rows, the cap);
- cpu relaxed_categorical backward (codebook-gradient partials): row chunks, N = 200;
- cpu finite_difference_curvature: column tiles of 512, M = 1100 (3 tiles; ties across them:
  test_edge_values.py);
- cpu Cliff: 16 groups of conditioning latents, d = 34 (2-3 latents per group);
- cpu KLM: row blocks of 64, n = 150 and 300 (test_kde.py);
- triton latent_quantize: latent blocks of 16, (N, d) = (150, 70) (5 blocks, the last partial; its small-tile
  boundaries: test_quantize.py);
- triton relaxed_categorical / gumbel_quantize: forward rows of 32, backward samples of 32 per latent, N d = 490;
- triton KLM: row blocks, ranges of samples and the ordered reductions (test_kde.py's small_tiles: the interpreter
  runs the same code at any block size; the unpatched plan: test_bounds.py);
- triton perturbed_batch: 32 x 16 tiles, (n, d) = (70, 35); curvature_penalty: blocks of 128, n = 300;
- triton finite_difference_curvature: blocks of 128 columns, M = 1100 (test_edge_values.py) and 600
  (test_hessian.py); kde_grid: 4-wide tiles, 3 blocks per axis (test_kde.py's small_tiles);
- triton Cliff: sample blocks of 16 (n = 80), GEMM tiles (n = 160), chunks of one latent (test_kde.py).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from conftest import DEVICE
from test_kde import cond_rows, latents
from test_quantize import np_nearest

import qkernels
from qkernels._backend import implementations, kernels
from qkernels.reference import hessian as ref_hessian

TOL = {torch.float32: {"rtol": 2e-5, "atol": 1e-6}, torch.float64: {"rtol": 1e-10, "atol": 1e-12}}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _triton(module: str):
    if "triton" not in kernels("latent_quantize", DEVICE):
        pytest.skip("triton backend not available")
    return importlib.import_module(f"qkernels.triton.{module}")


@pytest.fixture
def small_sums(monkeypatch):
    """The Triton quantize reductions add 4 partial rows per step and take 16 columns per program."""
    tq = _triton("quantize")
    monkeypatch.setattr(tq, "SUM_ROWS", 4)
    monkeypatch.setattr(tq, "SUM_COLS", 16)


# ----------------------------------------------------------------------------- latent_quantize


def _latent_quantize_vs_float64(backend, n, d, nv, global_codebook, dtype):
    g = _gen(n + d)
    z0 = (torch.randn(n, d, generator=g, dtype=torch.float64) * 1.5).to(dtype)
    v0 = torch.randn((nv,) if global_codebook else (d, nv), generator=g, dtype=torch.float64).to(dtype)
    up = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)
    z, v = z0.clone().to(DEVICE).requires_grad_(), v0.clone().to(DEVICE).requires_grad_()
    with qkernels.use_backend(backend):
        out = qkernels.latent_quantize(z, v)
    ((out.z_q * up.to(DEVICE)).sum() + 0.3 * out.loss_quantize + 0.7 * out.loss_commit).backward()
    # float64 equations: QLAE's nearest value, losses, straight-through + commitment gradient, codebook gradient
    q, idx, loss = np_nearest(z0.double(), v0.double())
    zd = z0.double().numpy()
    gv = np.zeros((1 if global_codebook else d, nv))
    np.add.at(
        gv,
        (np.zeros_like(idx) if global_codebook else np.broadcast_to(np.arange(d), idx.shape), idx),
        0.3 * 2 * (q - zd) / zd.size,
    )
    assert np.array_equal(out.indices.cpu().numpy(), idx), backend
    t = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-11, "atol": 1e-13}
    np.testing.assert_allclose(out.loss_commit.item(), loss, **t)
    np.testing.assert_allclose(out.loss_quantize.item(), loss, **t)
    np.testing.assert_allclose(z.grad.cpu().double().numpy(), up.double().numpy() + 0.7 * 2 * (zd - q) / zd.size, **t)
    np.testing.assert_allclose(v.grad.cpu().double().numpy().reshape(gv.shape), gv, **t)


@pytest.mark.parametrize("global_codebook", [False, True])
@pytest.mark.parametrize("shape", [(200, 3, 6), (4200, 2, 5)])
def test_cpu_latent_quantize_across_row_chunks(shape, global_codebook):
    if "cpu" not in kernels("latent_quantize", "cpu"):
        pytest.skip("native extension not built")
    for dtype in (torch.float32, torch.float64):
        _latent_quantize_vs_float64("cpu", *shape, global_codebook, dtype)


@pytest.mark.parametrize("global_codebook", [False, True])
def test_triton_latent_quantize_across_tiles(small_sums, global_codebook):
    """Issue 48 (4): a global codebook's gradient sums the partials of every (row tile, latent tile) program:
    d = 70 latents span three programs of 32."""
    _latent_quantize_vs_float64("triton", 150, 70, 5, global_codebook, torch.float64)


# ----------------------------------------------------------------------------- relaxed_categorical, gumbel


def _categorical_vs_reference(op, backend, n, d, k, global_codebook, dtype):
    g = _gen(n * d + k)
    x = torch.randn((n, d, k) if op == "relaxed_categorical" else (n, d), generator=g, dtype=torch.float64)
    v = torch.randn(1 if global_codebook else d, k, generator=g, dtype=torch.float64)
    u = torch.rand(n, d, k, generator=g, dtype=torch.float64).to(dtype).to(DEVICE)
    ups = [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).to(DEVICE) for s in [(n, d), (n, d, k)]]
    impls = implementations(op)
    res = {}
    for name in ("reference", backend):
        xx, vv = x.to(dtype).to(DEVICE).requires_grad_(), v.to(dtype).to(DEVICE).requires_grad_()
        out = (
            impls[name](xx, vv, u, 0.7, 1.3, False)
            if op == "relaxed_categorical"
            else impls[name](xx, vv, u, 0.7, False)
        )
        ws = [ups[0], ups[1], ups[0]] if op == "relaxed_categorical" else [ups[0], ups[1], ups[1].flip(0), ups[0]]
        torch.autograd.backward(list(out), ws)
        res[name] = [o.detach() for o in out] + [xx.grad, vv.grad]
    for i, (a, b) in enumerate(zip(res[backend], res["reference"], strict=True)):
        torch.testing.assert_close(a, b, **TOL[dtype], msg=lambda m, i=i: f"{op} {backend} output/grad {i}: {m}")


@pytest.mark.parametrize("global_codebook", [False, True])
def test_cpu_relaxed_categorical_across_row_chunks(global_codebook):
    if "cpu" not in kernels("relaxed_categorical", "cpu"):
        pytest.skip("native extension not built")
    for dtype in (torch.float32, torch.float64):
        _categorical_vs_reference("relaxed_categorical", "cpu", 200, 3, 5, global_codebook, dtype)


@pytest.mark.parametrize("op", ["relaxed_categorical", "gumbel_quantize"])
@pytest.mark.parametrize("global_codebook", [False, True])
def test_triton_categorical_across_row_blocks(small_sums, op, global_codebook):
    _categorical_vs_reference(op, "triton", 70, 7, 5, global_codebook, torch.float64)


# ----------------------------------------------------------------------------- Hessian


def test_fdc_mean_across_column_tiles():
    """reduce="mean" over M = 1100 columns: 3 cpu tiles of 512 (partial sums added in order), 9 triton blocks."""
    n, k, groups = 3, 2, 2
    x0 = torch.randn(n * 2 * k * groups, 1100, generator=_gen(12), dtype=torch.float64).to(DEVICE)
    w = torch.randn(groups, n, generator=_gen(13), dtype=torch.float64).to(DEVICE)
    xr = x0.clone().requires_grad_()
    want = ref_hessian.finite_difference_curvature(xr, n, k, 0.1, groups, False, "mean")[0]
    (g_ref,) = torch.autograd.grad((want * w).sum(), xr)
    for backend in kernels("finite_difference_curvature", DEVICE):
        x = x0.clone().requires_grad_()
        got = implementations("finite_difference_curvature")[backend](x, n, k, 0.1, groups, False, "mean")[0]
        (g,) = torch.autograd.grad((got * w).sum(), x)
        torch.testing.assert_close(got, want, **TOL[torch.float64], msg=backend)
        torch.testing.assert_close(g, g_ref, **TOL[torch.float64], msg=backend)


def test_triton_perturbed_batch_and_penalty_across_blocks():
    """perturbed_batch: 3 row tiles x 3 latent blocks; curvature_penalty: 3 blocks of 128 samples, with the
    maximum tied between the first block and the third (the gradient shared evenly, as Tensor.max)."""
    _triton("hessian")
    impl_pb, impl_cp = implementations("perturbed_batch"), implementations("curvature_penalty")
    z0 = torch.randn(70, 35, generator=_gen(14), dtype=torch.float64).to(DEVICE)
    draws = torch.randn(3, 70, 35, generator=_gen(15), dtype=torch.float64).to(DEVICE)
    std0 = (torch.rand(35, generator=_gen(16), dtype=torch.float64) + 0.5).to(DEVICE)
    w = torch.randn(2 * 3 * 70, 35, generator=_gen(17), dtype=torch.float64).to(DEVICE)
    for scale in ("std", "population"):
        res = {}
        for name in ("reference", "triton"):
            z, std = z0.clone().requires_grad_(), std0.clone().requires_grad_()
            out = impl_pb[name](z, draws, std if scale == "std" else None, 0.1, 1, scale)
            wrt = [z, std] if scale == "std" else [z]
            res[name] = [out.detach(), *torch.autograd.grad((out * w).sum(), wrt)]
        for a, b in zip(res["triton"], res["reference"], strict=True):
            torch.testing.assert_close(a, b, **TOL[torch.float64], msg=scale)
    v0 = (torch.rand(2, 300, generator=_gen(18), dtype=torch.float64) + 0.05).to(DEVICE)
    v0[0, 5] = v0[0, 260] = 10.0
    v0[1, 5] = v0[1, 260] = 0.5
    for ratio in (True, False):
        for reduction in ("mean", "max", "none"):
            res = {}
            for name in ("reference", "triton"):
                v = (v0 if ratio else v0[:1]).clone().requires_grad_()
                out = impl_cp[name](v, ratio, reduction)
                res[name] = [out.detach(), torch.autograd.grad((out * torch.cos(out.detach())).sum(), v)[0]]
            for a, b in zip(res["triton"], res["reference"], strict=True):
                torch.testing.assert_close(a, b, **TOL[torch.float64], msg=f"{ratio} {reduction}")
            if reduction == "max":
                g = res["triton"][1][0]
                assert g[5] == g[260] != 0 and torch.count_nonzero(g) == 2


# ----------------------------------------------------------------------------- KDE


def test_cpu_cliff_groups_of_several_conditioning_latents():
    """d = 34 latents: the cpu bivariate pass's 16 groups hold 2-3 conditioning latents each (every group writes
    its own gradient slice, added in order)."""
    if "cpu" not in kernels("cliff_loss", "cpu"):
        pytest.skip("native extension not built")
    for dtype in (torch.float32, torch.float64):
        z0, idx = latents(30, 34, dtype, seed=3).cpu(), cond_rows(30, 34, 3, seed=4).cpu()
        res = {}
        for name in ("reference", "cpu"):
            z = z0.clone().requires_grad_()
            with qkernels.use_backend(name):
                out = qkernels.cliff_loss(z, cond_index=idx, grid=(-4.0, 4.0, 12), return_terms=True)
            torch.stack([0.3 * out.uni, 1.3 * out.biv, 0.7 * out.kl]).sum().backward()
            res[name] = (torch.stack(list(out)).detach(), z.grad)
        t = {"rtol": 2e-4, "atol": 2e-5} if dtype == torch.float32 else TOL[dtype]
        torch.testing.assert_close(res["cpu"][0], res["reference"][0], **t)
        scale = res["reference"][1].abs().max()
        torch.testing.assert_close(res["cpu"][1] / scale, res["reference"][1] / scale, **t)
