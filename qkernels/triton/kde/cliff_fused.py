"""Cliff's fused path on Triton, for small tiles (the papers' batch sizes; :func:`fused_fits` decides):
one program per ordered latent pair, standardization included, four launches per forward + backward
(:func:`_cliff_fused_fwd`, :func:`_cliff_sum`; :func:`_cliff_fused_bwd`, :func:`_cliff_grad`),
launched by :mod:`~qkernels.triton.kde.cliff`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from qkernels.triton.kde._cliff_common import _column_backward, _dker_tile, _dxlogx, _mma, _normalized, _xlogx

# One program per ordered pair (j = program_id(0) conditioning latent, i = program_id(1)
# differentiated latent), standardization included: each program computes the mean and clamped
# std of its two columns itself (two passes over z each), builds the Gaussian tiles of a block of
# samples in registers (Kz: BLOCK_M x BLOCK_S, Dt: BLOCK_S x BLOCK_K) and accumulates the pair's
# bivariate grid J = Kz @ Dt (M x K) with tl.dot over the samples; the epilogue normalizes J's rows
# over k and reduces them to the pair's JSD. Diagonal programs (i = j, whose JSD is 0) compute latent
# i's uni entropy and KL-uni term instead. The forward writes one value per program to a workspace
# and _cliff_sum (one program) adds them in a fixed order and applies the lambdas: 2 launches. The
# backward recomputes J, forms dLoss/dJ in registers, then runs the transposed products per block of
# samples and writes every program's contribution to each sample of its two columns (and to its
# conditioning values) to a workspace; _cliff_grad (one program per latent) adds the contributions in
# a fixed order and applies the standardization's backward: 2 launches. Deterministic, no atomics.
# Work per program: n (M + K) exps and 2 n M K FLOPs (x3 backward); d^2 programs.

FUSED_MAX_TILE = 128 * 128  # the fused path holds a BLOCK_M x BLOCK_K block of J (and dJ) per program
# ... and is taken up to this many multiply-adds per product (d^2 n BLOCK_M BLOCK_K): the papers' batch
# sizes, where issue 25's estimate puts it ahead (benchmarks/RESULTS.md); above, the GEMM path, measured
# on an H100 (13.4 ms at (4096, 32, 128, 128)), until a GPU run measures the fused one there
FUSED_MAX_WORK = 1 << 33


def fused_fits(n: int, d: int, m: int, k: int) -> bool:
    """Whether Cliff of (n, d) latents with M conditioning values and K grid points takes the fused
    path (the one rule choosing between the two)."""
    tile = max(16, triton.next_power_of_2(m)) * max(16, triton.next_power_of_2(k))
    return tile <= FUSED_MAX_TILE and d * d * n * tile <= FUSED_MAX_WORK


@triton.jit
def _column(z_ptr, col, N, D, BLOCK_S: tl.constexpr):
    """(mean, std, unclamped) of column ``col`` of z: Cliff's standardization x = (z - mean) / std,
    std = sqrt(max(var, MIN_VAR)); ``unclamped`` = var >= MIN_VAR (the std then depends on z)."""
    dt = z_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_S,), dt)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        acc += tl.load(z_ptr + ss * D + col, mask=ss < N, other=0.0)
    mean = tl.sum(acc, 0) / N
    acc = tl.zeros((BLOCK_S,), dt)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        dev = tl.where(ss < N, tl.load(z_ptr + ss * D + col, mask=ss < N, other=0.0) - mean, 0.0)
        acc += dev * dev
    var = tl.sum(acc, 0) / N
    min_var = tl.full((), 1e-12, dt)
    return mean, tl.sqrt(tl.maximum(var, min_var)), var >= min_var


@triton.jit
def _standardized(z_ptr, ss, smask, col, D, mean, std):
    return tl.where(smask, (tl.load(z_ptr + ss * D + col, mask=smask, other=0.0) - mean) / std, 0.0)


@triton.jit
def _linspace(lo, hi, K, ks):
    """torch.linspace(lo, hi, K)[ks] in lo's dtype (the same formula: the second half counted from hi)."""
    step = (hi - lo) / (K - 1)
    return tl.where(ks < K // 2, lo + step * ks, hi - step * (K - 1 - ks))


@triton.jit
def _uni_kl_pass(z_ptr, i, N, D, mean, std, t, v, kmask, inv_sigma, BLOCK_S: tl.constexpr):
    """Latent i's unnormalized derivative grid G[k] = sum_s D(t_k - x_si) and the log-sum-exps
    lse[k] = log sum_s exp(-(v_k - x_si)^2 / (2 sigma^2)) of the KL-uni points (online)."""
    g = tl.zeros(t.shape, t.dtype)
    m_run = tl.full(v.shape, float("-inf"), v.dtype)
    l_run = tl.zeros(v.shape, v.dtype)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        x = _standardized(z_ptr, ss, smask, i, D, mean, std)
        dk, _ = _dker_tile(t, kmask, x, smask, inv_sigma)  # (K, S)
        g += tl.sum(dk, 1)
        u = (v[:, None] - x[None, :]) * inv_sigma
        a = tl.where(smask[None, :], -0.5 * u * u, float("-inf"))
        m_new = tl.maximum(m_run, tl.max(a, 1))  # finite: every block holds a sample
        l_run = l_run * tl.exp(m_run - m_new) + tl.sum(tl.exp(a - m_new[:, None]), 1)
        m_run = m_new
    return g, m_run + tl.log(l_run)


@triton.jit
def _pair_tiles(z_ptr, ss, smask, i, j, D, mean_i, std_i, mean_j, std_j, zeta, mmask, t, kmask, inv_sigma):
    """A block of samples' tiles of pair (j, i): Kz[m, s] = N(zeta_m - x_sj), its d/dx_sj, Dt[s, k] =
    D(t_k - x_si) and its d/dx_si; 0 outside the masks."""
    xi = _standardized(z_ptr, ss, smask, i, D, mean_i, std_i)
    xj = _standardized(z_ptr, ss, smask, j, D, mean_j, std_j)
    w = (zeta[:, None] - xj[None, :]) * inv_sigma
    e = tl.where(mmask[:, None] & smask[None, :], tl.exp(-0.5 * w * w), 0.0)
    dkt, ddkt = _dker_tile(t, kmask, xi, smask, inv_sigma)  # (K, S)
    return e, e * w * inv_sigma, tl.trans(dkt), tl.trans(ddkt)


@triton.jit
def _pair_grid(z_ptr, i, j, N, D, mean_i, std_i, mean_j, std_j, zeta, mmask, t, kmask, inv_sigma,
               BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """J (BLOCK_M, BLOCK_K) = sum over samples of Kz[m, s] Dt[s, k] (tl.dot per block of samples)."""
    acc = tl.zeros((BLOCK_M, BLOCK_K), t.dtype)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        kz, _, dt_, _ = _pair_tiles(z_ptr, ss, ss < N, i, j, D, mean_i, std_i, mean_j, std_j, zeta, mmask, t, kmask,
                                    inv_sigma)
        acc = _mma(kz, dt_, acc, PRECISION)
    return acc


@triton.jit
def _rows_normalized(jg, step):
    """Rows of J normalized over k: p = |J| / (step sum_k |J|) (0 for a zero row), the row
    normalizers and which rows are non-zero."""
    c = step * tl.sum(tl.abs(jg), 1)
    cpos = c > 0
    cs = tl.where(cpos, c, 1.0)
    return tl.where(cpos[:, None], tl.abs(jg) / cs[:, None], 0.0), cs, cpos


@triton.jit
def _has_nan(x):
    return tl.sum(tl.sum((x != x).to(tl.int32), 1), 0) > 0


@triton.jit
def _pair_setup(z_ptr, ci_ptr, i, j, N, D, M, a, b, K, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """Column statistics of latents i and j, the grid points and latent j's conditioning values
    zeta_m = x[cond_index[j, m], j] (NaN for an out-of-range row, never read)."""
    mean_i, std_i, full_i = _column(z_ptr, i, N, D, BLOCK_S)
    mean_j, std_j, _ = _column(z_ptr, j, N, D, BLOCK_S)
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    t = _linspace(a, b, K, ks)
    ms = tl.arange(0, BLOCK_M)
    mmask = ms < M
    rows = tl.load(ci_ptr + j * M + ms, mask=mmask, other=0)
    ok = (rows >= 0) & (rows < N)
    zj = tl.load(z_ptr + rows * D + j, mask=mmask & ok, other=0.0)
    zeta = tl.where(ok | ~mmask, (zj - mean_j) / std_j, float("nan"))
    return mean_i, std_i, mean_j, std_j, t, kmask, zeta, ms, mmask


@triton.jit
def _uni_kl_values(z_ptr, i, N, D, K, mean_i, std_i, t, kmask, inv_sigma, step, log_const,
                   BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    """Latent i's uni entropy and KL-uni term."""
    v = _kl_points(K, t.dtype, BLOCK_K)
    g, lse = _uni_kl_pass(z_ptr, i, N, D, mean_i, std_i, t, v, kmask, inv_sigma, BLOCK_S)
    p, cs, cpos = _normalized(g[:, None], step)
    uni = -step * tl.sum(tl.sum(_xlogx(p), 1), 0)
    return uni, log_const - tl.sum(tl.where(kmask, lse, 0.0), 0) / K


@triton.jit
def _kl_points(K, dt: tl.constexpr, BLOCK_K: tl.constexpr):
    """The KL-uni points linspace(-sqrt 3, sqrt 3, K) in dtype dt."""
    return _linspace(tl.full((), -1.7320508075688772, dt), tl.full((), 1.7320508075688772, dt), K,
                     tl.arange(0, BLOCK_K))


@triton.jit
def _jsd_value(jg, M, step):
    """The JSD of a pair from its bivariate grid J (rows m >= M are 0): NaN if J holds a NaN."""
    p, cs, cpos = _rows_normalized(jg, step)
    mix = tl.sum(p, 0) / M
    jsd = -step * tl.sum(_xlogx(mix), 0) + step * tl.sum(tl.sum(_xlogx(p), 1), 0) / M
    return tl.where(_has_nan(jg), float("nan"), jsd)


@triton.jit
def _cliff_fused_fwd(
    z_ptr, ci_ptr, ws_ptr, N, D, M, K, a: tl.float64, b: tl.float64, inv_sigma: tl.float64,
    step: tl.float64, log_const: tl.float64,
    BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    """ws[j D + i] = JSD of pair (j, i) (0 on the diagonal); ws[D^2 + i] = uni_i, ws[D^2 + D + i] = kl_i."""
    dt = z_ptr.dtype.element_ty
    a, b, inv_sigma = tl.full((), a, dt), tl.full((), b, dt), tl.full((), inv_sigma, dt)
    step, log_const = tl.full((), step, dt), tl.full((), log_const, dt)
    j = tl.program_id(0)
    i = tl.program_id(1)
    mean_i, std_i, mean_j, std_j, t, kmask, zeta, ms, mmask = _pair_setup(z_ptr, ci_ptr, i, j, N, D, M, a, b, K,
                                                                         BLOCK_S, BLOCK_M, BLOCK_K)
    if i == j:
        uni, kl = _uni_kl_values(z_ptr, i, N, D, K, mean_i, std_i, t, kmask, inv_sigma, step, log_const, BLOCK_S,
                                 BLOCK_K)
        tl.store(ws_ptr + D * D + i, uni)
        tl.store(ws_ptr + D * D + D + i, kl)
        tl.store(ws_ptr + j * D + i, tl.zeros((), dt))
    else:
        jg = _pair_grid(z_ptr, i, j, N, D, mean_i, std_i, mean_j, std_j, zeta, mmask, t, kmask, inv_sigma,
                        BLOCK_S, BLOCK_M, BLOCK_K, PRECISION)
        tl.store(ws_ptr + j * D + i, _jsd_value(jg, M, step))


@triton.jit
def _cliff_sum(ws_ptr, total_ptr, uni_ptr, biv_ptr, kl_ptr, D, lu: tl.float64, lb: tl.float64, lk: tl.float64,
               BLOCK: tl.constexpr):
    """The three terms (sums of the workspace in a fixed order) and the weighted total (one program)."""
    dt = ws_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK,), dt)
    for o in range(0, D * D, BLOCK):
        offs = o + tl.arange(0, BLOCK)
        acc += tl.load(ws_ptr + offs, mask=offs < D * D, other=0.0)
    biv = tl.sum(acc, 0)
    acc_u = tl.zeros((BLOCK,), dt)
    acc_k = tl.zeros((BLOCK,), dt)
    for o in range(0, D, BLOCK):
        offs = o + tl.arange(0, BLOCK)
        acc_u += tl.load(ws_ptr + D * D + offs, mask=offs < D, other=0.0)
        acc_k += tl.load(ws_ptr + D * D + D + offs, mask=offs < D, other=0.0)
    uni, kl = tl.sum(acc_u, 0), tl.sum(acc_k, 0)
    tl.store(uni_ptr, uni)
    tl.store(biv_ptr, biv)
    tl.store(kl_ptr, kl)
    tl.store(total_ptr, tl.full((), lu, dt) * uni + tl.full((), lb, dt) * biv + tl.full((), lk, dt) * kl)


@triton.jit
def _term_grad(gt_ptr, g_ptr, lam, HAS_TOTAL: tl.constexpr, HAS_TERM: tl.constexpr):
    """dLoss/dterm = lambda * dLoss/dtotal + dLoss/dterm (either may be absent: 0)."""
    g = tl.zeros((), lam.dtype)
    if HAS_TOTAL:
        g += lam * tl.load(gt_ptr).to(lam.dtype)
    if HAS_TERM:
        g += tl.load(g_ptr).to(lam.dtype)
    return g


@triton.jit
def _uni_kl_backward(z_ptr, i, pair, N, D, M, K, mean_i, std_i, t, kmask, inv_sigma, step, g_u, g_k,
                     wsd_ptr, wsc_ptr, wsz_ptr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Diagonal program: dLoss/dx_si of the uni and KL-uni terms to wsd (zeros to wsc and wsz)."""
    dt = t.dtype
    v = _kl_points(K, dt, BLOCK_K)
    g, lse = _uni_kl_pass(z_ptr, i, N, D, mean_i, std_i, t, v, kmask, inv_sigma, BLOCK_S)
    p, cs, cpos = _normalized(g[:, None], step)
    dg = tl.sum(_column_backward(g[:, None], p, -g_u * step * _dxlogx(p), cs, cpos, step), 1)  # dLoss/dG
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        x = _standardized(z_ptr, ss, smask, i, D, mean_i, std_i)
        _, ddx = _dker_tile(t, kmask, x, smask, inv_sigma)  # (K, S)
        u = (v[:, None] - x[None, :]) * inv_sigma
        sm = tl.where(kmask[:, None] & smask[None, :], tl.exp(-0.5 * u * u - lse[:, None]), 0.0)
        gx = tl.sum(dg[:, None] * ddx, 0) - g_k / K * tl.sum(sm * u * inv_sigma, 0)
        tl.store(wsd_ptr + pair * N + ss, gx, mask=smask)
        tl.store(wsc_ptr + pair * N + ss, tl.zeros((BLOCK_S,), dt), mask=smask)
    ms = tl.arange(0, BLOCK_M)
    tl.store(wsz_ptr + pair * M + ms, tl.zeros((BLOCK_M,), dt), mask=ms < M)


@triton.jit
def _jsd_backward(jg, M, step, g_b):
    """dLoss/dJ of g_b * JSD (NaN if J holds a NaN): JSD = H(mix) - mean_m H(p_m) gives dLoss/dp_mk =
    g_b step / M (dxlogx(p_mk) - dxlogx(mix_k)), then the row normalization p = |J| / c."""
    p, cs, cpos = _rows_normalized(jg, step)
    mix = tl.sum(p, 0) / M
    gp = g_b * step / M * (_dxlogx(p) - _dxlogx(mix)[None, :])
    dot = tl.sum(gp * p, 1)
    sgn = tl.where(jg > 0, 1.0, tl.where(jg < 0, -1.0, 0.0))
    dj = tl.where(cpos[:, None], sgn * (gp - step * dot[:, None]) / cs[:, None], 0.0)
    return tl.where(_has_nan(jg), float("nan"), dj)


@triton.jit
def _cliff_fused_bwd(
    z_ptr, ci_ptr, gt_ptr, gu_ptr, gb_ptr, gk_ptr, wsd_ptr, wsc_ptr, wsz_ptr, N, D, M, K,
    a: tl.float64, b: tl.float64, inv_sigma: tl.float64, step: tl.float64,
    lu: tl.float64, lb: tl.float64, lk: tl.float64,
    HAS_T: tl.constexpr, HAS_U: tl.constexpr, HAS_B: tl.constexpr, HAS_K: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    """Pair (j, i)'s dLoss/dx (x standardized): wsd[(j D + i) N + s] the part through Dt (x_si; on the
    diagonal: uni and KL-uni), wsc[(j D + i) N + s] through Kz (x_sj), wsz[(j D + i) M + m] through
    the conditioning value zeta_jm."""
    dt = z_ptr.dtype.element_ty
    a, b, inv_sigma, step = tl.full((), a, dt), tl.full((), b, dt), tl.full((), inv_sigma, dt), tl.full((), step, dt)
    j = tl.program_id(0)
    i = tl.program_id(1)
    pair = j * D + i
    mean_i, std_i, mean_j, std_j, t, kmask, zeta, ms, mmask = _pair_setup(z_ptr, ci_ptr, i, j, N, D, M, a, b, K,
                                                                         BLOCK_S, BLOCK_M, BLOCK_K)
    if i == j:
        g_u = _term_grad(gt_ptr, gu_ptr, tl.full((), lu, dt), HAS_T, HAS_U)
        g_k = _term_grad(gt_ptr, gk_ptr, tl.full((), lk, dt), HAS_T, HAS_K)
        _uni_kl_backward(z_ptr, i, pair, N, D, M, K, mean_i, std_i, t, kmask, inv_sigma, step, g_u, g_k,
                         wsd_ptr, wsc_ptr, wsz_ptr, BLOCK_S, BLOCK_M, BLOCK_K)
    else:
        g_b = _term_grad(gt_ptr, gb_ptr, tl.full((), lb, dt), HAS_T, HAS_B)
        jg = _pair_grid(z_ptr, i, j, N, D, mean_i, std_i, mean_j, std_j, zeta, mmask, t, kmask, inv_sigma,
                        BLOCK_S, BLOCK_M, BLOCK_K, PRECISION)
        dj = _jsd_backward(jg, M, step, g_b)
        gzeta = tl.zeros((BLOCK_M,), dt)
        for s0 in range(0, N, BLOCK_S):
            ss = s0 + tl.arange(0, BLOCK_S)
            smask = ss < N
            kz, dkz, dt_, ddt = _pair_tiles(z_ptr, ss, smask, i, j, D, mean_i, std_i, mean_j, std_j, zeta, mmask, t,
                                            kmask, inv_sigma)
            g_dt = _mma(tl.trans(kz), dj, tl.zeros((BLOCK_S, BLOCK_K), dt), PRECISION)  # (S, K)
            g_kz = _mma(dj, tl.trans(dt_), tl.zeros((BLOCK_M, BLOCK_S), dt), PRECISION)  # (M, S)
            prod = g_kz * dkz
            tl.store(wsd_ptr + pair * N + ss, tl.sum(g_dt * ddt, 1), mask=smask)
            tl.store(wsc_ptr + pair * N + ss, tl.sum(prod, 0), mask=smask)
            gzeta -= tl.sum(prod, 1)
        tl.store(wsz_ptr + pair * M + ms, gzeta, mask=mmask)


@triton.jit
def _cliff_grad(z_ptr, ci_ptr, wsd_ptr, wsc_ptr, wsz_ptr, gz_ptr, N, D, M,
                BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr):
    """Latent c = program_id(0): dLoss/dx_sc = sum_j wsd[(j D + c) N + s] + sum_i wsc[(c D + i) N + s] +
    the conditioning values' share (rows cond_index[c, m]), then through x = (z - mean) / std:
    dLoss/dz = (g - mean(g) - x mean(g x)) / std (without the last term where the std is clamped)."""
    dt = z_ptr.dtype.element_ty
    c = tl.program_id(0)
    mean, std, full = _column(z_ptr, c, N, D, BLOCK_S)
    ms = tl.arange(0, BLOCK_M)
    mmask = ms < M
    rows = tl.load(ci_ptr + c * M + ms, mask=mmask, other=-1)
    gzeta = tl.zeros((BLOCK_M,), dt)
    for i in range(0, D):
        gzeta += tl.load(wsz_ptr + (c * D + i) * M + ms, mask=mmask, other=0.0)
    acc_g = tl.zeros((BLOCK_S,), dt)
    acc_gx = tl.zeros((BLOCK_S,), dt)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        g = tl.sum(tl.where((rows[None, :] == ss[:, None]) & mmask[None, :], gzeta[None, :], 0.0), 1)
        for o in range(0, D):
            g += tl.load(wsd_ptr + (o * D + c) * N + ss, mask=smask, other=0.0)
            g += tl.load(wsc_ptr + (c * D + o) * N + ss, mask=smask, other=0.0)
        x = _standardized(z_ptr, ss, smask, c, D, mean, std)
        acc_g += tl.where(smask, g, 0.0)
        acc_gx += tl.where(smask, g * x, 0.0)
        tl.store(gz_ptr + ss * D + c, g, mask=smask)
    g_mean = tl.sum(acc_g, 0) / N
    gx_mean = tl.where(full, tl.sum(acc_gx, 0) / N, 0.0)
    tl.debug_barrier()
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        x = _standardized(z_ptr, ss, smask, c, D, mean, std)
        g = tl.load(gz_ptr + ss * D + c, mask=smask, other=0.0)
        tl.store(gz_ptr + ss * D + c, (g - g_mean - x * gx_mean) / std, mask=smask)
