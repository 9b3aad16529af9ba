"""Cliff's GEMM path on Triton, for shapes beyond
:func:`~qkernels.triton.kde.cliff_fused.fused_fits`: per chunk of differentiated latents, the
bivariate grids as one block-sparse product on the tensor cores over each latent's sorted samples and
a fused JSD epilogue; one program per latent for the uni and KL-uni terms. :mod:`~qkernels.triton.kde.cliff`
calls :func:`_gemm_terms` and :func:`_gemm_terms_backward` on standardized latents.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from qkernels.triton.kde._cliff_common import (
    _column_backward,
    _div,
    _dker_tile,
    _dot_precision,
    _dxlogx,
    _mma,
    _normalized,
    _xlogx,
)
from qkernels.triton.kde.grid import WINDOW

# GEMM path. For every ordered pair (i, j) the bivariate grid is a matrix product,
# J[i, j] = Kz[j] (M x n) @ Dt[i] (n x K) with Dt[i][s, k] = D(t_k - x_si), Kz[j][m, s] =
# N(zeta_jm - x_sj); for a chunk of CI differentiated latents at once it is one block-sparse
# product on the tensor cores (_biv_fwd, tl.dot at the precision of _dot_precision): KzT (n, d M)
# is a table built once (d M n exps), Dt is never stored (its tiles are computed in registers), and
# with each latent's samples sorted (torch.sort, once per call) a k tile sums only the contiguous
# run of samples within WINDOW sigma of its grid points. A fused epilogue (one program per pair of
# the chunk) normalizes each column over k and reduces to the pair's JSD (forward) or writes
# dLoss/dJ (backward). The backward: _biv_dkz (gKz += dJ @ Dt^T, k tiles outside a sample block's
# window skipped), _biv_dx (gDt = KzT @ dJ fused with the chain through dD/dx and the uni term's
# dLoss/dG, per block of sorted samples, gDt never stored), then _kz_grad through dN/dx. Memory:
# KzT and gKz (d M n each) plus one chunk of J / dJ (d M CI K): CI is chosen so that a chunk of J
# holds <= CHUNK_ELEMS values. Normalizing constants cancel in the normalized grids (also p_j(zeta_m),
# constant over k), so D(u) = -u e^{-u^2/2} and N(w) = e^{-w^2/2} are used unnormalized. Uni and
# KL-uni: one program per latent (n (K + K_u) exps each, a small share of the work).

CHUNK_ELEMS = 1 << 22  # values of J per chunk of differentiated latents (16 MiB in fp32)
BLOCK_T = 32  # (rows, columns) tile of the table kernel
GEMM_BLOCKS = {"R": 64, "S": 32, "K": 32, "warps": 8}  # conditioning rows x samples x grid points per tl.dot tile


@triton.jit
def _zeta(x_ptr, ci_ptr, offs, js, mask, N, D):
    """Conditioning values x[cond_index.flat[offs], js] (offs = j M + m); NaN for an out-of-range row
    (never read)."""
    rows = tl.load(ci_ptr + offs, mask=mask, other=0)
    ok = (rows >= 0) & (rows < N)
    z = tl.load(x_ptr + rows * D + js, mask=mask & ok, other=0.0)
    return tl.where(ok | ~mask, z, float("nan"))


@triton.jit
def _count_below(v_ptr, n, lo, hi, BLOCK: tl.constexpr):
    """(#{v < lo}, #{v <= hi}) of the n values at v_ptr: for sorted values, the index range
    [first, last) of those within [lo, hi]."""
    c_lo = tl.zeros((BLOCK,), tl.int32)
    c_hi = tl.zeros((BLOCK,), tl.int32)
    for o in range(0, n, BLOCK):
        offs = o + tl.arange(0, BLOCK)
        v = tl.load(v_ptr + offs, mask=offs < n, other=float("inf"))
        c_lo += (v < lo).to(tl.int32)
        c_hi += (v <= hi).to(tl.int32)
    return tl.sum(c_lo, 0), tl.sum(c_hi, 0)


@triton.jit
def _kz_table(x_ptr, ci_ptr, out_ptr, N, D, M, inv_sigma: tl.float64, BLOCK: tl.constexpr):
    """out (n, d M): out[s, j M + m] = N(zeta_jm - x_sj). Grid (n / BLOCK, d M / BLOCK)."""
    inv_sigma = tl.full((), inv_sigma, x_ptr.dtype.element_ty)
    ss = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rows = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    rmask, smask = rows < D * M, ss < N
    js = rows // M
    zeta = _zeta(x_ptr, ci_ptr, rows, js, rmask, N, D)
    msk = smask[:, None] & rmask[None, :]
    x = tl.load(x_ptr + ss[:, None] * D + js[None, :], mask=msk, other=0.0)
    w = (zeta[None, :] - x) * inv_sigma
    tl.store(out_ptr + ss[:, None] * (D * M) + rows[None, :], tl.exp(-0.5 * w * w), mask=msk)


@triton.jit
def _biv_fwd(
    kzt_ptr,
    order_ptr,
    xs_ptr,
    t_ptr,
    out_ptr,
    i0,
    N,
    DM,
    K,
    CI,
    NKT,
    inv_sigma: tl.float64,
    window: tl.float64,
    PRECISION: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[r, c K + k] = sum_s KzT[s, r] D(t_k - x_s,i) for latent i = i0 + c of the chunk and every
    conditioning row r = j M + m: J of the pairs (j, i). Latent i's samples are read in sorted order
    (order, xs: (d, n)), and each k tile sums only over the contiguous run of samples within
    ``window`` = WINDOW sigma of its grid points (every skipped |D| <= WINDOW e^(-WINDOW^2 / 2)).
    Grid (CI * NKT, d M / BLOCK_R): programs launched together share a column block of KzT
    (n BLOCK_R values, in L2) and differ in (latent, k tile)."""
    dt = kzt_ptr.dtype.element_ty
    inv_sigma, window = tl.full((), inv_sigma, dt), tl.full((), window, dt)
    rs = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(0) // NKT
    ks = (tl.program_id(0) % NKT) * BLOCK_K + tl.arange(0, BLOCK_K)
    i = i0 + c
    rmask, kmask = rs < DM, ks < K
    t = tl.load(t_ptr + ks, mask=kmask, other=0.0)
    lo, hi = _count_below(
        xs_ptr + i * N,
        N,
        tl.min(tl.where(kmask, t, float("inf")), 0) - window,
        tl.max(tl.where(kmask, t, float("-inf")), 0) + window,
        256,
    )
    acc = tl.zeros((BLOCK_R, BLOCK_K), dt)
    for s0 in range(lo, hi, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < hi
        rows = tl.load(order_ptr + i * N + ss, mask=smask, other=0)
        x = tl.load(xs_ptr + i * N + ss, mask=smask, other=0.0)
        kz = tl.load(kzt_ptr + rows[:, None] * DM + rs[None, :], mask=smask[:, None] & rmask[None, :], other=0.0)
        dker, _ = _dker_tile(t, kmask, x, smask, inv_sigma)  # (K, S)
        acc = _mma(tl.trans(kz), tl.trans(dker), acc, PRECISION)
    tl.store(out_ptr + rs[:, None] * (CI * K) + c * K + ks[None, :], acc, mask=rmask[:, None] & kmask[None, :])


@triton.jit
def _biv_dx(
    kzt_ptr,
    order_ptr,
    xs_ptr,
    t_ptr,
    dj_ptr,
    gu_ptr,
    gx_ptr,
    i0,
    N,
    D,
    DM,
    K,
    CI,
    inv_sigma: tl.float64,
    window: tl.float64,
    PRECISION: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """gx[s, i] = sum_k (gDt[s, k] + gu[i, k]) dD(t_k - x_si)/dx with gDt = KzT @ dJ[:, c K:(c + 1) K]
    (never stored) for a block of latent i = i0 + c's samples in sorted order: the gradient through the
    derivative table and the uni term's dLoss/dG, over only the grid points within ``window`` of the
    block's samples. Grid (n / BLOCK_S, CI)."""
    dt = kzt_ptr.dtype.element_ty
    inv_sigma, window = tl.full((), inv_sigma, dt), tl.full((), window, dt)
    ss = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    c = tl.program_id(1)
    i = i0 + c
    smask = ss < N
    rows = tl.load(order_ptr + i * N + ss, mask=smask, other=0)
    x = tl.load(xs_ptr + i * N + ss, mask=smask, other=0.0)
    k_lo, k_hi = _count_below(
        t_ptr,
        K,
        tl.min(tl.where(smask, x, float("inf")), 0) - window,
        tl.max(tl.where(smask, x, float("-inf")), 0) + window,
        256,
    )
    acc = tl.zeros((BLOCK_S,), dt)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < k_hi
        g = tl.zeros((BLOCK_S, BLOCK_K), dt)
        for r0 in range(0, DM, BLOCK_R):
            rr = r0 + tl.arange(0, BLOCK_R)
            rmask = rr < DM
            kz = tl.load(kzt_ptr + rows[:, None] * DM + rr[None, :], mask=smask[:, None] & rmask[None, :], other=0.0)
            dj = tl.load(
                dj_ptr + rr[:, None] * (CI * K) + c * K + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0
            )
            g = _mma(kz, dj, g, PRECISION)
        t = tl.load(t_ptr + ks, mask=kmask, other=0.0)
        _, ddx = _dker_tile(t, kmask, x, smask, inv_sigma)  # (K, S)
        g += tl.load(gu_ptr + i * K + ks, mask=kmask, other=0.0)[None, :]
        acc += tl.sum(g * tl.trans(ddx), 1)
    tl.store(gx_ptr + rows * D + i, acc, mask=smask)


@triton.jit
def _biv_dkz(
    x_ptr,
    t_ptr,
    dj_ptr,
    gkz_ptr,
    i0,
    N,
    D,
    DM,
    K,
    CI,
    inv_sigma: tl.float64,
    window: tl.float64,
    ACCUMULATE: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """gKz[r, s] (+)= sum_c sum_k dJ[r, c K + k] D(t_k - x_s,i0+c) over the chunk's latents, over only
    the grid points within ``window`` of the block's samples (samples in their own order).
    Grid (d M / BLOCK_R, n / BLOCK_S)."""
    dt = x_ptr.dtype.element_ty
    inv_sigma, window = tl.full((), inv_sigma, dt), tl.full((), window, dt)
    rr = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ss = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    rmask, smask = rr < DM, ss < N
    out = gkz_ptr + rr[:, None] * N + ss[None, :]
    omask = rmask[:, None] & smask[None, :]
    if ACCUMULATE:
        acc = tl.load(out, mask=omask, other=0.0)
    else:
        acc = tl.zeros((BLOCK_R, BLOCK_S), dt)
    for c in range(0, CI):
        x = tl.load(x_ptr + ss * D + i0 + c, mask=smask, other=0.0)
        k_lo, k_hi = _count_below(
            t_ptr,
            K,
            tl.min(tl.where(smask, x, float("inf")), 0) - window,
            tl.max(tl.where(smask, x, float("-inf")), 0) + window,
            256,
        )
        for k0 in range(k_lo, k_hi, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < k_hi
            t = tl.load(t_ptr + ks, mask=kmask, other=0.0)
            dker, _ = _dker_tile(t, kmask, x, smask, inv_sigma)  # (K, S)
            dj = tl.load(
                dj_ptr + rr[:, None] * (CI * K) + c * K + ks[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0
            )
            acc = _mma(dj, dker, acc, PRECISION)
    tl.store(out, acc, mask=omask)


@triton.jit
def _epilogue_tile(j_ptr, base, k0, mmask, cpos, cs, K, M, BLOCK_K: tl.constexpr):
    """Columns k0 .. k0 + BLOCK_K of a pair's (M, K) block: values g, normalized p (columns over k,
    normalizers cs), the mixture over m and the k indices."""
    ks = k0 + tl.arange(0, BLOCK_K)
    g = tl.load(j_ptr + base + ks[None, :], mask=mmask[:, None] & (ks < K)[None, :], other=0.0)
    p = tl.where(cpos[:, None], _div(tl.abs(g), cs[:, None]), 0.0)
    return g, p, _div(tl.sum(p, 0), M.to(p.dtype)), ks


@triton.jit
def _jsd_epilogue(
    j_ptr,
    g_ptr,
    out_ptr,
    gb_ptr,
    i0,
    CI,
    D,
    M,
    K,
    step: tl.float64,
    BACKWARD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Pair (j = program_id(0), i = i0 + program_id(1)) of a chunk of J (d M, CI K): the (M, K)
    block's columns m normalized over k, JSD = H(mean_m p_m) - mean_m H(p_m) to out[j, i]
    (forward) or dLoss/dJ of the block for dLoss/dJSD = gb_ptr[0] to g (backward; 0 for i == j;
    g may be j itself: every element is read before its tile is written). NaN in the block (an
    out-of-range conditioning row) gives a NaN JSD / gradient. Two (forward) or three passes over
    k tiles; every m of the block in one tile (BLOCK_M >= M)."""
    dt = j_ptr.dtype.element_ty
    step = tl.full((), step, dt)
    j = tl.program_id(0)
    il = tl.program_id(1)
    i = i0 + il
    ld = CI * K
    ms = tl.arange(0, BLOCK_M)
    mmask = ms < M
    base = (j * M + ms)[:, None] * ld + il * K
    c = tl.zeros((BLOCK_M,), dt)
    bad = tl.zeros((BLOCK_M,), tl.int32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        msk = mmask[:, None] & (ks < K)[None, :]
        g = tl.load(j_ptr + base + ks[None, :], mask=msk, other=0.0)
        c += tl.sum(tl.abs(g), 1)
        bad += tl.sum((g != g).to(tl.int32), 1)
    c = step * c
    cpos = c > 0
    cs = tl.where(cpos, c, 1.0)
    nan = tl.sum(bad, 0) > 0
    h_each = tl.zeros((BLOCK_M,), dt)
    h_mix = tl.zeros((BLOCK_K,), dt)
    dot = tl.zeros((BLOCK_M,), dt)
    s = _div(step, M.to(dt))
    if BACKWARD:
        s = s * tl.load(gb_ptr)
    for k0 in range(0, K, BLOCK_K):
        g, p, mix, _ = _epilogue_tile(j_ptr, base, k0, mmask, cpos, cs, K, M, BLOCK_K)
        if BACKWARD:
            dot += tl.sum(s * (_dxlogx(p) - _dxlogx(mix)[None, :]) * p, 1)
        else:
            h_each += tl.sum(_xlogx(p), 1)
            h_mix += _xlogx(mix)
    if BACKWARD:
        for k0 in range(0, K, BLOCK_K):
            g, p, mix, ks = _epilogue_tile(j_ptr, base, k0, mmask, cpos, cs, K, M, BLOCK_K)
            msk = mmask[:, None] & (ks < K)[None, :]
            gp = s * (_dxlogx(p) - _dxlogx(mix)[None, :])
            sgn = tl.where(g > 0, 1.0, tl.where(g < 0, -1.0, 0.0))
            dg = tl.where(cpos[:, None], _div(sgn * (gp - step * dot[:, None]), cs[:, None]), 0.0)
            dg = tl.where(i == j, 0.0, tl.where(nan, float("nan"), dg))
            tl.store(g_ptr + base + ks[None, :], dg, mask=msk)
    else:
        jsd = -step * tl.sum(h_mix, 0) + _div(step * tl.sum(h_each, 0), M.to(dt))
        jsd = tl.where(i == j, 0.0, tl.where(nan, float("nan"), jsd))
        tl.store(out_ptr + j * D + i, jsd)


@triton.jit
def _kz_grad(
    x_ptr,
    ci_ptr,
    gkz_ptr,
    gx_ptr,
    gzeta_ptr,
    N,
    D,
    M,
    inv_sigma: tl.float64,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Chain through the kernel table: gx[s, j] = sum_m gKz[j M + m, s] dN/dx_sj and the partial
    sums over this block of samples of gzeta[j, m] = -sum_s gKz dN/dx_sj, written to
    gzeta[program_id(0), j, m] (summed over blocks afterwards). Grid (n / BLOCK_S, d)."""
    inv_sigma = tl.full((), inv_sigma, x_ptr.dtype.element_ty)
    sb = tl.program_id(0)
    j = tl.program_id(1)
    ss = sb * BLOCK_S + tl.arange(0, BLOCK_S)
    ms = tl.arange(0, BLOCK_M)
    smask, mmask = ss < N, ms < M
    zeta = _zeta(x_ptr, ci_ptr, j * M + ms, j, mmask, N, D)
    x = tl.load(x_ptr + ss * D + j, mask=smask, other=0.0)
    w = (zeta[:, None] - x[None, :]) * inv_sigma
    msk = mmask[:, None] & smask[None, :]
    dn = tl.where(msk, w * inv_sigma * tl.exp(-0.5 * w * w), 0.0)  # dN/dx_sj
    gk = tl.load(gkz_ptr + (j * M + ms)[:, None] * N + ss[None, :], mask=msk, other=0.0)
    prod = gk * dn
    tl.store(gx_ptr + ss * D + j, tl.sum(prod, 0), mask=smask)
    tl.store(gzeta_ptr + (sb * D + j) * M + ms, -tl.sum(prod, 1), mask=mmask)


@triton.jit
def _uni_grid(x_ptr, t, kmask, i, N, D, inv_sigma, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr):
    g = tl.zeros((BLOCK_K,), t.dtype)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        xi = tl.load(x_ptr + ss * D + i, mask=smask, other=0.0)
        dk, _ = _dker_tile(t, kmask, xi, smask, inv_sigma)
        g += tl.sum(dk, 1)
    return g


@triton.jit
def _kl_lse(x_ptr, v, i, N, D, inv_sigma, BLOCK_S: tl.constexpr):
    """Online log-sum-exp over the samples of -(v - x_si)^2 / (2 sigma^2), per point v."""
    m_run = tl.full(v.shape, float("-inf"), v.dtype)
    l_run = tl.zeros(v.shape, v.dtype)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        xi = tl.load(x_ptr + ss * D + i, mask=smask, other=0.0)
        u = (v[:, None] - xi[None, :]) * inv_sigma
        a = tl.where(smask[None, :], -0.5 * u * u, float("-inf"))
        m_new = tl.maximum(m_run, tl.max(a, 1))  # finite: every block holds a sample
        l_run = l_run * tl.exp(m_run - m_new) + tl.sum(tl.exp(a - m_new[:, None]), 1)
        m_run = m_new
    return m_run + tl.log(l_run)


@triton.jit
def _cliff_uni_kl(
    x_ptr,
    t_ptr,
    v_ptr,
    uni_ptr,
    kl_ptr,
    guni_ptr,
    lse_ptr,
    gu_ptr,
    N,
    D,
    K,
    KU,
    inv_sigma: tl.float64,
    step: tl.float64,
    log_const: tl.float64,
    BACKWARD: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_KU: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Latent i = program_id(0): forward, its uni entropy and KL-uni term; BACKWARD, dLoss/dG of
    its uni grid (to gu[i, :], for _biv_dx) and its KL log-sum-exps (to lse[i, :])."""
    dt = x_ptr.dtype.element_ty
    inv_sigma, step, log_const = tl.full((), inv_sigma, dt), tl.full((), step, dt), tl.full((), log_const, dt)
    i = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    t = tl.load(t_ptr + ks, mask=kmask, other=0.0)
    g = _uni_grid(x_ptr, t, kmask, i, N, D, inv_sigma, BLOCK_K, BLOCK_S)[:, None]
    p, cs, cpos = _normalized(g, step)
    vs = tl.arange(0, BLOCK_KU)
    vmask = vs < KU
    v = tl.load(v_ptr + vs, mask=vmask, other=0.0)
    lse = _kl_lse(x_ptr, v, i, N, D, inv_sigma, BLOCK_S)
    if BACKWARD:
        g_uni = tl.load(guni_ptr)
        dg = tl.sum(_column_backward(g, p, -g_uni * step * _dxlogx(p), cs, cpos, step), 1)
        tl.store(gu_ptr + i * K + ks, dg, mask=kmask)
        tl.store(lse_ptr + i * KU + vs, lse, mask=vmask)
    else:
        tl.store(uni_ptr + i, -step * tl.sum(tl.sum(_xlogx(p), 1), 0))
        # kl_i = -log(2 sqrt 3) - mean_v log p_i(v), log p_i(v) = lse_v - log(n sigma sqrt(2 pi))
        tl.store(kl_ptr + i, log_const - _div(tl.sum(tl.where(vmask, lse, 0.0), 0), KU.to(lse.dtype)))


@triton.jit
def _kl_grad(
    x_ptr,
    v_ptr,
    lse_ptr,
    gk_ptr,
    gx_ptr,
    N,
    D,
    KU,
    inv_sigma: tl.float64,
    BLOCK_KU: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """gx[s, i] += -g_kl / K_u sum_v softmax_s(v) (v - x_si) / sigma^2. Grid (n / BLOCK_S, d)."""
    inv_sigma = tl.full((), inv_sigma, x_ptr.dtype.element_ty)
    ss = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    i = tl.program_id(1)
    smask = ss < N
    vs = tl.arange(0, BLOCK_KU)
    vmask = vs < KU
    v = tl.load(v_ptr + vs, mask=vmask, other=0.0)
    lse = tl.load(lse_ptr + i * KU + vs, mask=vmask, other=0.0)
    x = tl.load(x_ptr + ss * D + i, mask=smask, other=0.0)
    u = (v[:, None] - x[None, :]) * inv_sigma
    sm = tl.where(vmask[:, None] & smask[None, :], tl.exp(-0.5 * u * u - lse[:, None]), 0.0)
    g_kl = tl.load(gk_ptr)
    prev = tl.load(gx_ptr + ss * D + i, mask=smask, other=0.0)
    tl.store(gx_ptr + ss * D + i, prev - _div(g_kl, KU.to(u.dtype)) * tl.sum(sm * u * inv_sigma, 0), mask=smask)


def _gemm_setup(x, grid, cond_index, sigma):
    """The GEMM path's per-call tables: latent-major sorted samples xs and their rows order (d, n),
    KzT (n, d M), the chunk size CI and the block sizes."""
    x, grid, ci = x.contiguous(), grid.contiguous(), cond_index.contiguous()
    (n, d), k, m = x.shape, grid.shape[0], ci.shape[1]
    xs, order = torch.sort(x.t(), 1)
    kzt = x.new_empty(n, d * m)
    _kz_table[(triton.cdiv(n, BLOCK_T), triton.cdiv(d * m, BLOCK_T))](x, ci, kzt, n, d, m, 1.0 / sigma, BLOCK=BLOCK_T)
    chunk = max(1, min(d, CHUNK_ELEMS // max(1, d * m * k)))  # differentiated latents per chunk
    return x, grid, ci, xs.contiguous(), order.contiguous(), kzt, chunk


def _biv_chunk(x, grid, xs, order, kzt, i0, c, sigma, precision):
    """J of the pairs (j, i) for the chunk's latents i0 .. i0 + c: (d M, c K)."""
    (n, dm), k = kzt.shape, grid.shape[0]
    b = GEMM_BLOCKS
    out = x.new_empty(dm, c * k)
    nkt = triton.cdiv(k, b["K"])
    _biv_fwd[(c * nkt, triton.cdiv(dm, b["R"]))](
        kzt,
        order,
        xs,
        grid,
        out,
        i0,
        n,
        dm,
        k,
        c,
        nkt,
        1.0 / sigma,
        WINDOW.value * sigma,
        PRECISION=precision,
        BLOCK_R=b["R"],
        BLOCK_S=b["S"],
        BLOCK_K=b["K"],
        num_warps=b["warps"],
    )
    return out


def biv_work_fraction(x: torch.Tensor, a: float, b: float, k: int, sigma: float) -> float:
    """The share of the dense bivariate product's (sample, grid point) work that :func:`_biv_fwd`
    does for standardized latents x (n, d): per latent and k tile, the samples within the window,
    in whole BLOCK_S blocks, over n. Host-side (for tests and benchmarks/HISTORY.md's GPU notes)."""
    n, d = x.shape
    t = torch.linspace(a, b, k, dtype=torch.float64)
    xs = x.detach().double().cpu().t().sort(1).values.contiguous()
    tiles = t.split(GEMM_BLOCKS["K"])
    lo = torch.stack([torch.searchsorted(xs, (tt[0] - WINDOW.value * sigma).expand(d, 1).contiguous()) for tt in tiles])
    hi = torch.stack(
        [torch.searchsorted(xs, (tt[-1] + WINDOW.value * sigma).expand(d, 1).contiguous(), right=True) for tt in tiles]
    )
    bs = GEMM_BLOCKS["S"]
    work = sum(((h - l + bs - 1) // bs * bs * len(tt)).sum().item() for l, h, tt in zip(lo, hi, tiles, strict=True))
    return work / (d * k * n)


def _uni_kl_blocks(k, ku, m):
    block_m = max(16, triton.next_power_of_2(m))
    return {
        "k": max(16, triton.next_power_of_2(k)),
        "ku": triton.next_power_of_2(ku),
        "m": block_m,
        "ke": max(16, min(triton.next_power_of_2(k), 4096 // block_m)),
        "s": 16,
        "ew": 8 if block_m >= 256 else 4,
    }  # the epilogue: (256, 32) tiles at 4 warps spilled 1-2 KB on sm_90


def _gemm_terms(
    x: torch.Tensor, grid: torch.Tensor, uni_points: torch.Tensor, cond_index: torch.Tensor, sigma: float, step: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, d = x.shape
    k, ku, m = grid.shape[0], uni_points.shape[0], cond_index.shape[1]
    bl = _uni_kl_blocks(k, ku, m)
    uni, kl = x.new_empty(d), x.new_empty(d)
    log_const = -math.log(2 * math.sqrt(3.0)) + math.log(n * sigma) + 0.5 * math.log(2 * math.pi)
    _cliff_uni_kl[(d,)](
        x,
        grid,
        uni_points,
        uni,
        kl,
        x,
        x,
        x,
        n,
        d,
        k,
        ku,
        1.0 / sigma,
        step,
        log_const,
        BACKWARD=False,
        BLOCK_K=bl["k"],
        BLOCK_KU=bl["ku"],
        BLOCK_S=bl["s"],
    )
    jsd = x.new_zeros(d, d)
    precision = _dot_precision(x.dtype, d * d * n * m * k)
    x, grid, ci, xs, order, kzt, chunk = _gemm_setup(x, grid, cond_index, sigma)
    for i0 in range(0, d, chunk):
        c = min(chunk, d - i0)
        prod = _biv_chunk(x, grid, xs, order, kzt, i0, c, sigma, precision)
        _jsd_epilogue[(d, c)](
            prod,
            prod,
            jsd,
            x,
            i0,
            c,
            d,
            m,
            k,
            step,
            BACKWARD=False,
            BLOCK_M=bl["m"],
            BLOCK_K=bl["ke"],
            num_warps=bl["ew"],
        )
    return uni.sum(), jsd.sum(), kl.sum()


def _gemm_terms_backward(
    grad_uni: torch.Tensor,
    grad_biv: torch.Tensor,
    grad_kl: torch.Tensor,
    x: torch.Tensor,
    grid: torch.Tensor,
    uni_points: torch.Tensor,
    cond_index: torch.Tensor,
    sigma: float,
    step: float,
) -> torch.Tensor:
    n, d = x.shape
    k, ku, m = grid.shape[0], uni_points.shape[0], cond_index.shape[1]
    bl = _uni_kl_blocks(k, ku, m)
    g_u, g_b, g_k = (g.to(x.dtype).reshape(1) for g in (grad_uni, grad_biv, grad_kl))
    gu, lse = x.new_empty(d, k), x.new_empty(d, ku)
    _cliff_uni_kl[(d,)](
        x,
        grid,
        uni_points,
        x,
        x,
        g_u,
        lse,
        gu,
        n,
        d,
        k,
        ku,
        1.0 / sigma,
        step,
        0.0,
        BACKWARD=True,
        BLOCK_K=bl["k"],
        BLOCK_KU=bl["ku"],
        BLOCK_S=bl["s"],
    )
    precision = _dot_precision(x.dtype, d * d * n * m * k)
    x, grid, ci, xs, order, kzt, chunk = _gemm_setup(x, grid, cond_index, sigma)
    b, dm, win = GEMM_BLOCKS, d * m, WINDOW.value * sigma
    gx = torch.empty_like(x)  # through the derivative-kernel tables (uni and biv)
    gkz = x.new_empty(dm, n)
    for i0 in range(0, d, chunk):
        c = min(chunk, d - i0)
        prod = _biv_chunk(x, grid, xs, order, kzt, i0, c, sigma, precision)
        _jsd_epilogue[(d, c)](
            prod,
            prod,
            prod,
            g_b,
            i0,
            c,
            d,
            m,
            k,
            step,
            BACKWARD=True,
            BLOCK_M=bl["m"],
            BLOCK_K=bl["ke"],
            num_warps=bl["ew"],
        )  # prod now holds dLoss/dJ
        _biv_dkz[(triton.cdiv(dm, b["R"]), triton.cdiv(n, b["S"]))](
            x,
            grid,
            prod,
            gkz,
            i0,
            n,
            d,
            dm,
            k,
            c,
            1.0 / sigma,
            win,
            ACCUMULATE=i0 > 0,
            PRECISION=precision,
            BLOCK_R=b["R"],
            BLOCK_S=b["S"],
            BLOCK_K=b["K"],
            num_warps=b["warps"],
        )
        _biv_dx[(triton.cdiv(n, b["S"]), c)](
            kzt,
            order,
            xs,
            grid,
            prod,
            gu,
            gx,
            i0,
            n,
            d,
            dm,
            k,
            c,
            1.0 / sigma,
            win,
            PRECISION=precision,
            BLOCK_S=b["S"],
            BLOCK_K=b["K"],
            BLOCK_R=max(16, b["R"] // 2),  # tl.dot: every tile dimension >= 16
            num_warps=min(4, b["warps"]),
        )  # 8: 128 registers, spills (sm_90)
    gxz = torch.empty_like(x)
    nb = triton.cdiv(n, bl["s"])
    gzeta = x.new_empty(nb, d, m)
    _kz_grad[(nb, d)](x, ci, gkz, gxz, gzeta, n, d, m, 1.0 / sigma, BLOCK_M=bl["m"], BLOCK_S=bl["s"])
    # zeta[j, m] = x[cond_index[j, m], j]: scatter its gradient back to the rows (O(d M)). An
    # out-of-range row made zeta NaN in the kernels; clamping keeps the scatter in bounds.
    cols = torch.arange(d, device=x.device)[:, None].expand(d, m)
    gx = (gx + gxz).index_put((ci.clamp(0, n - 1), cols), gzeta.sum(0), accumulate=True)
    _kl_grad[(triton.cdiv(n, bl["s"]), d)](
        x, uni_points, lse, g_k, gx, n, d, ku, 1.0 / sigma, BLOCK_KU=bl["ku"], BLOCK_S=bl["s"]
    )
    return gx
