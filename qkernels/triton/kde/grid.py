"""Per-latent Gaussian KDE grids on Triton: ``kde_grid`` and ``kde_grid_backward`` (the ops
``qkernels::kde_grid_triton`` and ``kde_grid_backward_triton``). A program takes one latent and a block
of its points and streams the samples (forward, points' gradient), or a block of its samples and
streams the points (samples' gradient). Terms beyond WINDOW sigma are dropped, as on the cpu backend
(kde.h); Cliff's GEMM path skips samples by the same window. Launches per forward + backward: 3.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from qkernels.triton._grid import cdiv, rows_per_program

WINDOW = tl.constexpr(10.0)  # kde_grid drops kernel terms beyond WINDOW sigma (as the cpu backend, kde.h)
SQRT_2PI = math.sqrt(2.0 * math.pi)


@triton.jit
def _kde_terms(p, x, inv_sigma, DERIV: tl.constexpr, GRAD: tl.constexpr):
    """Unnormalized kernel terms of points p and samples x (broadcast tiles): N(u) = exp(-u^2/2) or
    D(u) = -u N(u), u = (p - x) / sigma; with GRAD their derivative d/dp. Zero beyond WINDOW."""
    u = (p - x) * inv_sigma
    e = tl.where(tl.abs(u) <= WINDOW, tl.exp(-0.5 * u * u), 0.0)
    if GRAD:
        if DERIV:
            return -(1.0 - u * u) * e * inv_sigma
        return -u * e * inv_sigma
    if DERIV:
        return -u * e
    return e


@triton.jit
def _kde_grid_by_points(
    p_ptr,
    s_ptr,
    g_ptr,
    out_ptr,
    N,
    D,
    K,
    inv_sigma: tl.float64,
    scale: tl.float64,
    DERIV: tl.constexpr,
    GRAD: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    inv_sigma, scale = tl.full((), inv_sigma, p_ptr.dtype.element_ty), tl.full((), scale, p_ptr.dtype.element_ty)
    # one latent j and a block of its points; streams the samples. Forward: out = scale * sum_s
    # term. GRAD: the points' gradient g * scale * sum_s d term / dp.
    j = tl.program_id(1)
    ks = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = ks < K
    p = tl.load(p_ptr + j * K + ks, mask=kmask, other=0.0)
    acc = tl.zeros((BLOCK_K,), p.dtype)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        x = tl.load(s_ptr + ss * D + j, mask=smask, other=0.0)
        t = _kde_terms(p[:, None], x[None, :], inv_sigma, DERIV, GRAD)
        acc += tl.sum(tl.where(smask[None, :], t, 0.0), 1)
    if GRAD:
        acc = acc * tl.load(g_ptr + j * K + ks, mask=kmask, other=0.0)
    tl.store(out_ptr + j * K + ks, acc * scale, mask=kmask)


@triton.jit
def _kde_grid_samples_grad(
    p_ptr,
    s_ptr,
    g_ptr,
    gs_ptr,
    N,
    D,
    K,
    inv_sigma: tl.float64,
    scale: tl.float64,
    DERIV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    inv_sigma, scale = tl.full((), inv_sigma, p_ptr.dtype.element_ty), tl.full((), scale, p_ptr.dtype.element_ty)
    # one latent j and a block of its samples; streams the points: gs = -scale sum_k g_k d term/dp
    j = tl.program_id(1)
    ss = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    smask = ss < N
    x = tl.load(s_ptr + ss * D + j, mask=smask, other=0.0)
    acc = tl.zeros((BLOCK_S,), x.dtype)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        p = tl.load(p_ptr + j * K + ks, mask=kmask, other=0.0)
        g = tl.load(g_ptr + j * K + ks, mask=kmask, other=0.0)
        t = _kde_terms(p[None, :], x[:, None], inv_sigma, DERIV, True)
        acc += tl.sum(tl.where(kmask[None, :], g[None, :] * t, 0.0), 1)
    tl.store(gs_ptr + ss * D + j, -acc * scale, mask=smask)


BLOCK_K_GRID, BLOCK_S_GRID = 32, 32  # the samples' gradient: points x samples per step
POINT_BLOCKS, POINT_TILE = (32, 16, 8), 1024  # by points: the largest point block giving 2 programs per SM


def _by_points(points: torch.Tensor) -> tuple[tuple[int, int], dict]:
    """Grid and blocks of :func:`_kde_grid_by_points`: (cdiv(K, BLOCK_K), d) programs, BLOCK_K x BLOCK_S =
    1024 terms per step (d = 32, K = 128: 16 x 32 programs of 8 points, was 4 x 32 of 32)."""
    d, k = points.shape
    block_k = rows_per_program(k, d, points, POINT_BLOCKS)
    return (cdiv(k, block_k), d), {"BLOCK_K": block_k, "BLOCK_S": POINT_TILE // block_k}


def _kde_scale(n: int, sigma: float, derivative: bool) -> float:
    return 1.0 / (n * sigma * SQRT_2PI * (sigma if derivative else 1.0))


def kde_grid(points: torch.Tensor, samples: torch.Tensor, sigma: float, derivative: bool) -> torch.Tensor:
    points, samples = points.contiguous(), samples.contiguous()
    (d, k), n = points.shape, samples.shape[0]
    out = torch.empty_like(points)
    grid, blocks = _by_points(points)
    _kde_grid_by_points[grid](
        points,
        samples,
        points,
        out,
        n,
        d,
        k,
        1.0 / sigma,
        _kde_scale(n, sigma, derivative),
        DERIV=derivative,
        GRAD=False,
        **blocks,
    )
    return out


def kde_grid_backward(
    grad: torch.Tensor, points: torch.Tensor, samples: torch.Tensor, sigma: float, derivative: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    grad, points, samples = grad.to(points.dtype).contiguous(), points.contiguous(), samples.contiguous()
    (d, k), n = points.shape, samples.shape[0]
    scale = _kde_scale(n, sigma, derivative)
    gp, gs = torch.empty_like(points), torch.empty_like(samples)
    grid, blocks = _by_points(points)
    _kde_grid_by_points[grid](
        points,
        samples,
        grad,
        gp,
        n,
        d,
        k,
        1.0 / sigma,
        scale,
        DERIV=derivative,
        GRAD=True,
        **blocks,
    )
    _kde_grid_samples_grad[(cdiv(n, BLOCK_S_GRID), d)](
        points,
        samples,
        grad,
        gs,
        n,
        d,
        k,
        1.0 / sigma,
        scale,
        DERIV=derivative,
        BLOCK_K=BLOCK_K_GRID,
        BLOCK_S=BLOCK_S_GRID,
    )
    return gp, gs
