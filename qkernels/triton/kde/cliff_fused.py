"""Cliff's fused path on Triton (pair tiles up to 128 x 128, every benchmark shape; :func:`fused_fits`
decides), shaped for a GPU of many SMs: the work of each latent pair is split over chunks of
samples, one program per (pair, chunk, tile), and the chunks' partial results are summed in a fixed order by
a second kernel. Six launches per forward + backward, launched by :mod:`~qkernels.triton.kde.cliff`:

- forward: :func:`_cliff_fused_fwd` (grid (d^2, S, KH)), :func:`_cliff_reduce` (grid (d^2, RB));
- backward: the same two (the products recomputed, then dLoss/dJ), :func:`_cliff_fused_bwd` (grid
  (d^2, S, 2 MH)), :func:`_cliff_grad` (grid (d,)).

Program (pair = j d + i, chunk c, column block h) of :func:`_cliff_fused_fwd` standardizes latents i and j
itself (two passes over both columns), builds the Gaussian tiles of its chunk's samples in registers (Kz:
BLOCK_M x BLOCK_S, N(zeta_jm - x_sj); Dt: BLOCK_S x BLOCK_K, D(t_k - x_si)) and accumulates its columns of
the chunk's share of the pair's bivariate grid J = Kz @ Dt (M x K) with ``tl.dot``; it writes that partial to
a workspace. A diagonal program (i = j, whose JSD is 0) writes its chunk's share of latent i's derivative
grid G and of the KL-uni log-sum-exps (running max and sum) instead. :func:`_cliff_reduce`, one program per
(pair, block of BLOCK_R rows of J), adds the S partials of its rows in chunk order, normalizes them over k
and writes its rows' share of the mixture over m and of the rows' entropies; the last of a pair's row
programs to finish (an atomic counter per pair, zeroed by the first kernel) adds those shares in row-block
order and writes the pair's JSD (forward) or dLoss/dJ in place of J (backward); in the forward the last pair
to finish (a second counter) adds all terms in a fixed order and applies the lambdas. Which program finishes
last varies; what it adds, and in which order, does not: the results are deterministic, bitwise. The
backward's :func:`_cliff_fused_bwd` runs the two transposed products (dLoss/dKz and dLoss/dDt, in different
programs, per block of rows of dJ) per block of its chunk's samples (dJ read in column blocks of BLOCK_KB)
and writes each program's contributions to every sample of its two columns and to its conditioning values;
:func:`_cliff_grad` adds them in a fixed order and applies the standardization's backward.

Work per pair and pass: 2 n M K FLOPs on the tensor cores (3xTF32: three MMAs each) and n (M + K) exps per
tile (Kz rebuilt per column block, Dt per row block); the forward, its recomputation in the backward and the
backward's two products. Grids: S = chunks per pair is chosen (:func:`plan`) so that the d (d - 1)
off-diagonal pairs make >= 2 programs per SM (SM count read from the device). Launch grids, registers and
shared memory for sm_90, and the roofline: benchmarks/HISTORY.md, "Cliff, GPU-shaped".
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from qkernels.triton.kde._cliff_common import _column_backward, _div, _dxlogx, _mma, _normalized, _xlogx

FUSED_MAX_TILE = 128 * 128  # the fused path holds a BLOCK_M x BLOCK_K block of J per program (else: GEMM path)
BLOCK_R = 16  # rows of J per program of _cliff_reduce
SMS_WITHOUT_A_GPU = 1  # the SM count plan() assumes off a GPU: the interpreter runs one program at a time


def fused_fits(n: int, d: int, m: int, k: int) -> bool:
    """Whether Cliff of (n, d) latents with M conditioning values and K grid points takes the fused
    path (the one rule choosing between the two)."""
    return max(16, triton.next_power_of_2(m)) * max(16, triton.next_power_of_2(k)) <= FUSED_MAX_TILE


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return SMS_WITHOUT_A_GPU
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan(n: int, d: int, m: int, k: int, dtype: torch.dtype, device: torch.device) -> dict:
    """Tiles and grids of the fused path. Chunks: CS samples (a multiple of BLOCK_S), S = cdiv(n, CS) per
    pair, so that the d (d - 1) off-diagonal pairs give at least 2 programs per SM (SM count of the device;
    fewer where n is too small). _cliff_fused_fwd: all BLOCK_M rows of J (M <= BLOCK_M) in column blocks of
    BLOCK_KJ (KH programs per pair and chunk), BLOCK_SF samples per tl.dot; _cliff_fused_bwd: row blocks of
    BLOCK_MH (MH per pair and chunk, times two sides), BLOCK_S samples, dJ in column blocks of BLOCK_KB;
    _cliff_reduce: BLOCK_K >= K columns. Chosen by compiling for sm_90 (Triton 3.6) at the benchmark shapes:
    these fit 227 KB of shared memory, and float32 spills no registers at 8 warps
    (tests/sm90/test_triton_cliff_gpu_shape.py; larger tiles spilled, float64's with float32's tiles needed
    295 KB of shared memory on an H200)."""
    block_m, block_k = max(16, triton.next_power_of_2(m)), max(16, triton.next_power_of_2(k))
    wide = dtype == torch.float32
    per_pair = triton.cdiv(2 * _sm_count(device), max(1, d * (d - 1)))  # chunks per pair for two waves
    share = n // per_pair  # samples per chunk at that split
    block_s = min(64 if wide else 16, max(16, 1 << max(0, share.bit_length() - 1)))
    cs = max(block_s, share // block_s * block_s)
    block_kj, block_mh = min(block_k, 64), min(block_m, 64)
    return {
        "BLOCK_M": block_m,
        "BLOCK_K": block_k,
        "BLOCK_S": block_s,
        "BLOCK_SF": min(block_s, 32),
        "CS": cs,
        "S": triton.cdiv(n, cs),
        "BLOCK_KJ": block_kj,
        "KH": triton.cdiv(k, block_kj),
        "BLOCK_MH": block_mh,
        "MH": triton.cdiv(m, block_mh),
        "BLOCK_KB": 16,
        "BLOCK_N": 2048 if wide else 1024,
        "RB": triton.cdiv(m, BLOCK_R),
        "num_warps": 8 if block_k >= 128 or block_m * block_k >= 8192 else 4,
    }


# ----------------------------------------------------------------------------- helpers


@triton.jit
def _sqrt(a):
    if a.dtype == tl.float32:
        return tl.sqrt_rn(a)
    else:
        return tl.sqrt(a)


@triton.jit
def _column_stats(z_ptr, i, j, N, D, BLOCK_N: tl.constexpr):
    """Means and clamped stds of columns i and j of z (two passes over both), as reference.standardize:
    x = (z - mean) / std, std = sqrt(max(var, MIN_VAR)) (MIN_VAR = 1e-12, spelled below)."""
    dt = z_ptr.dtype.element_ty
    acc_i = tl.zeros((BLOCK_N,), dt)
    acc_j = tl.zeros((BLOCK_N,), dt)
    for s0 in range(0, N, BLOCK_N):
        ss = s0 + tl.arange(0, BLOCK_N)
        acc_i += tl.load(z_ptr + ss * D + i, mask=ss < N, other=0.0)
        acc_j += tl.load(z_ptr + ss * D + j, mask=ss < N, other=0.0)
    mean_i = _div(tl.sum(acc_i, 0), N.to(dt))
    mean_j = _div(tl.sum(acc_j, 0), N.to(dt))
    acc_i = tl.zeros((BLOCK_N,), dt)
    acc_j = tl.zeros((BLOCK_N,), dt)
    for s0 in range(0, N, BLOCK_N):
        ss = s0 + tl.arange(0, BLOCK_N)
        dev_i = tl.where(ss < N, tl.load(z_ptr + ss * D + i, mask=ss < N, other=0.0) - mean_i, 0.0)
        dev_j = tl.where(ss < N, tl.load(z_ptr + ss * D + j, mask=ss < N, other=0.0) - mean_j, 0.0)
        acc_i += dev_i * dev_i
        acc_j += dev_j * dev_j
    min_var = tl.full((), 1e-12, dt)
    var_i = _div(tl.sum(acc_i, 0), N.to(dt))
    var_j = _div(tl.sum(acc_j, 0), N.to(dt))
    return mean_i, _sqrt(tl.maximum(var_i, min_var)), var_i >= min_var, mean_j, _sqrt(tl.maximum(var_j, min_var))


@triton.jit
def _standardized(z_ptr, ss, smask, col, D, mean, std):
    """x = (z - mean) / std of the samples ss of column col; FAR for a masked sample (FAR - t and FAR - zeta
    over sigma square to > 1e30: its Gaussian terms are exactly 0, so the tiles need no 2-D masks)."""
    return tl.where(smask, _div(tl.load(z_ptr + ss * D + col, mask=smask, other=0.0) - mean, std), 1e15)


@triton.jit
def _dker(t, x, inv_sigma):
    """D(u) = -u e^(-u^2 / 2), u = (t_k - x_s) / sigma, and dD/dx_s: (BLOCK_K, BLOCK_S) tiles."""
    u = (t[:, None] - x[None, :]) * inv_sigma
    e = tl.exp(-0.5 * u * u)
    return -u * e, (1.0 - u * u) * e * inv_sigma


@triton.jit
def _linspace(lo, hi, K, ks):
    """torch.linspace(lo, hi, K)[ks] in lo's dtype (the same formula: the second half counted from hi)."""
    step = _div(hi - lo, (K - 1).to(hi.dtype))
    return tl.where(ks < K // 2, lo + step * ks, hi - step * (K - 1 - ks))


@triton.jit
def _kl_points(K, ks, dt: tl.constexpr):
    """The KL-uni points linspace(-sqrt 3, sqrt 3, K)[ks] in dtype dt."""
    return _linspace(tl.full((), -1.7320508075688772, dt), tl.full((), 1.7320508075688772, dt), K, ks)


@triton.jit
def _zeta(z_ptr, ci_ptr, j, N, D, M, mean_j, std_j, ms):
    """Latent j's standardized conditioning values zeta_m = x[cond_index[j, m], j] for the rows ms (NaN for
    an out-of-range row: it makes the pair's J, its JSD and gradients NaN) and the row mask."""
    mmask = ms < M
    rows = tl.load(ci_ptr + j * M + ms, mask=mmask, other=0)
    ok = (rows >= 0) & (rows < N)
    zj = tl.load(z_ptr + rows * D + j, mask=mmask & ok, other=0.0)
    return tl.where(ok | ~mmask, _div(zj - mean_j, std_j), float("nan")), mmask


@triton.jit
def _kz_tile(xj, zeta, inv_sigma):
    """Kz[m, s] = N(zeta_m - x_sj) (BLOCK_M, BLOCK_S) and its derivative in x_sj (rows m >= M: any finite
    value, never stored; masked samples: 0)."""
    w = (zeta[:, None] - xj[None, :]) * inv_sigma
    e = tl.exp(-0.5 * w * w)
    return e, e * w * inv_sigma


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
def _rows_normalized(jg, step):
    """Rows of J normalized over k: p = |J| / (step sum_k |J|) (0 for a zero row), the row
    normalizers and which rows are non-zero."""
    c = step * tl.sum(tl.abs(jg), 1)
    cpos = c > 0
    cs = tl.where(cpos, c, 1.0)
    return tl.where(cpos[:, None], _div(tl.abs(jg), cs[:, None]), 0.0), cs, cpos


# ----------------------------------------------------------------------------- kernels


@triton.jit
def _cliff_fused_fwd(
    z_ptr,
    ci_ptr,
    wsj_ptr,
    wsu_ptr,
    stat_ptr,
    cnt_ptr,
    N,
    D,
    M,
    K,
    CS,
    a: tl.float64,
    b: tl.float64,
    inv_sigma: tl.float64,
    BLOCK_S: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Program (pair = j D + i, chunk c, column block h), samples [c CS, (c + 1) CS), grid points k of
    [h BLOCK_K, (h + 1) BLOCK_K): wsj[pair, c, :, k] (M, BLOCK_K) = the chunk's share of J = Kz_j @ Dt_i;
    diagonal programs wsu[i, c, :, k] (3, BLOCK_K) = the chunk's share of G_i[k] = sum_s D(t_k - x_si) and
    the KL-uni points' running (max, sum of exp). Diagonal program (c, h) = (0, 0) writes latent i's (mean,
    std, unclamped, 1 / std) to stat[i]; program (0, 0, 0) zeroes the D^2 + 1 counters of _cliff_reduce."""
    dt = z_ptr.dtype.element_ty
    a, b, inv_sigma = tl.full((), a, dt), tl.full((), b, dt), tl.full((), inv_sigma, dt)
    pair = tl.program_id(0)
    c = tl.program_id(1)
    h = tl.program_id(2)
    n_chunks = tl.num_programs(1)
    j = pair // D
    i = pair % D
    if (pair == 0) & (c == 0) & (h == 0):
        for o in range(0, D * D + 1, BLOCK_N):
            offs = o + tl.arange(0, BLOCK_N)
            tl.store(cnt_ptr + offs, tl.zeros((BLOCK_N,), tl.int32), mask=offs < D * D + 1)
    mean_i, std_i, full_i, mean_j, std_j = _column_stats(z_ptr, i, j, N, D, BLOCK_N)
    ks = h * BLOCK_K + tl.arange(0, BLOCK_K)
    kmask = ks < K
    t = _linspace(a, b, K, ks)
    lo = c * CS
    hi = tl.minimum(N, lo + CS)
    if i == j:
        if (c == 0) & (h == 0):
            tl.store(stat_ptr + 4 * i, mean_i)
            tl.store(stat_ptr + 4 * i + 1, std_i)
            tl.store(stat_ptr + 4 * i + 2, full_i.to(dt))
            tl.store(stat_ptr + 4 * i + 3, _div(tl.full((), 1.0, dt), std_i))
        v = _kl_points(K, ks, dt)
        g = tl.zeros((BLOCK_K,), dt)
        m_run = tl.full((BLOCK_K,), float("-inf"), dt)
        l_run = tl.zeros((BLOCK_K,), dt)
        for s0 in range(lo, hi, BLOCK_S):
            ss = s0 + tl.arange(0, BLOCK_S)
            smask = ss < hi
            x = _standardized(z_ptr, ss, smask, i, D, mean_i, std_i)
            dk = _dker(t, x, inv_sigma)[0]  # (K, S)
            g += tl.sum(dk, 1)
            u = (v[:, None] - x[None, :]) * inv_sigma
            e = -0.5 * u * u  # a masked sample's: -5e31, never the max (every block holds a sample)
            m_new = tl.maximum(m_run, tl.max(e, 1))
            l_run = l_run * tl.exp(m_run - m_new) + tl.sum(tl.exp(e - m_new[:, None]), 1)
            m_run = m_new
        base = wsu_ptr + (i * n_chunks + c) * 3 * K
        tl.store(base + ks, g, mask=kmask)
        tl.store(base + K + ks, m_run, mask=kmask)
        tl.store(base + 2 * K + ks, l_run, mask=kmask)
    else:
        ms = tl.arange(0, BLOCK_M)
        zeta, mmask = _zeta(z_ptr, ci_ptr, j, N, D, M, mean_j, std_j, ms)
        acc = tl.zeros((BLOCK_M, BLOCK_K), dt)  # J[:, ks]
        for s0 in range(lo, hi, BLOCK_S):
            ss = s0 + tl.arange(0, BLOCK_S)
            smask = ss < hi
            xi = _standardized(z_ptr, ss, smask, i, D, mean_i, std_i)
            xj = _standardized(z_ptr, ss, smask, j, D, mean_j, std_j)
            kz = _kz_tile(xj, zeta, inv_sigma)[0]
            dker = _dker(t, xi, inv_sigma)[0]  # (K, S)
            acc = _mma(kz, tl.trans(dker), acc, PRECISION)
        out = wsj_ptr + (pair * n_chunks + c) * M * K + ms[:, None] * K + ks[None, :]
        tl.store(out, acc, mask=mmask[:, None] & kmask[None, :])


@triton.jit
def _arrive_total(wst_ptr, cnt_ptr, total_ptr, uni_ptr, biv_ptr, kl_ptr, D, lu, lb, lk, BLOCK_K: tl.constexpr):
    """A pair's term is in wst: count it; the last of the D^2 adds the terms in a fixed order (the JSDs
    wst[:D^2], uni wst[D^2:D^2 + D], KL-uni wst[D^2 + D:]) and writes the outputs."""
    tl.debug_barrier()  # every thread's stores happen before the release
    if tl.atomic_add(cnt_ptr + D * D, 1, sem="acq_rel") == D * D - 1:
        dt = wst_ptr.dtype.element_ty
        acc = tl.zeros((BLOCK_K,), dt)
        for o in range(0, D * D, BLOCK_K):
            offs = o + tl.arange(0, BLOCK_K)
            acc += tl.load(wst_ptr + offs, mask=offs < D * D, other=0.0, cache_modifier=".cg")
        biv = tl.sum(acc, 0)
        acc_u = tl.zeros((BLOCK_K,), dt)
        acc_k = tl.zeros((BLOCK_K,), dt)
        for o in range(0, D, BLOCK_K):
            offs = o + tl.arange(0, BLOCK_K)
            acc_u += tl.load(wst_ptr + D * D + offs, mask=offs < D, other=0.0, cache_modifier=".cg")
            acc_k += tl.load(wst_ptr + D * D + D + offs, mask=offs < D, other=0.0, cache_modifier=".cg")
        uni, kl = tl.sum(acc_u, 0), tl.sum(acc_k, 0)
        tl.store(uni_ptr, uni)
        tl.store(biv_ptr, biv)
        tl.store(kl_ptr, kl)
        tl.store(total_ptr, lu * uni + lb * biv + lk * kl)


@triton.jit
def _uni_kl_finish(
    wsu_ptr,
    wst_ptr,
    gt_ptr,
    gu_ptr,
    gk_ptr,
    i,
    D,
    K,
    n_chunks,
    step,
    log_const,
    lu,
    lk,
    ks,
    kmask,
    BACKWARD: tl.constexpr,
    HAS_T: tl.constexpr,
    HAS_U: tl.constexpr,
    HAS_K: tl.constexpr,
):
    """Latent i's G and KL log-sum-exps from its chunks' shares (chunk order); forward: uni_i and kl_i to
    wst; backward: dLoss/dG and the log-sum-exps to wsu[i, 0, 0:2]."""
    dt = wsu_ptr.dtype.element_ty
    g = tl.zeros(ks.shape, dt)
    m_run = tl.full(ks.shape, float("-inf"), dt)
    l_run = tl.zeros(ks.shape, dt)
    for c in range(0, n_chunks):
        base = wsu_ptr + (i * n_chunks + c) * 3 * K
        g += tl.load(base + ks, mask=kmask, other=0.0)
        m_c = tl.load(base + K + ks, mask=kmask, other=0.0)
        m_new = tl.maximum(m_run, m_c)
        l_run = l_run * tl.exp(m_run - m_new) + tl.load(base + 2 * K + ks, mask=kmask, other=0.0) * tl.exp(m_c - m_new)
        m_run = m_new
    lse = m_run + tl.log(tl.where(kmask, l_run, 1.0))
    p, cs, cpos = _normalized(g[:, None], step)
    if BACKWARD:
        g_u = _term_grad(gt_ptr, gu_ptr, lu, HAS_T, HAS_U)
        dg = tl.sum(_column_backward(g[:, None], p, -g_u * step * _dxlogx(p), cs, cpos, step), 1)
        tl.store(wsu_ptr + i * n_chunks * 3 * K + ks, dg, mask=kmask)
        tl.store(wsu_ptr + i * n_chunks * 3 * K + K + ks, lse, mask=kmask)
    else:
        tl.store(wst_ptr + i * D + i, tl.zeros((), dt))
        tl.store(wst_ptr + D * D + i, -step * tl.sum(tl.sum(_xlogx(p), 1), 0))
        # kl_i = -log(2 sqrt 3) - mean_v log p_i(v), log p_i(v) = lse_v - log(n sigma sqrt(2 pi))
        tl.store(wst_ptr + D * D + D + i, log_const - _div(tl.sum(tl.where(kmask, lse, 0.0), 0), K.to(lse.dtype)))


@triton.jit
def _cliff_reduce(
    wsj_ptr,
    wsu_ptr,
    wsm_ptr,
    wst_ptr,
    cnt_ptr,
    total_ptr,
    uni_ptr,
    biv_ptr,
    kl_ptr,
    gt_ptr,
    gu_ptr,
    gb_ptr,
    gk_ptr,
    D,
    M,
    K,
    N_CHUNKS,
    step: tl.float64,
    log_const: tl.float64,
    lu: tl.float64,
    lb: tl.float64,
    lk: tl.float64,
    BACKWARD: tl.constexpr,
    HAS_T: tl.constexpr,
    HAS_U: tl.constexpr,
    HAS_B: tl.constexpr,
    HAS_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Program (pair, row block rb): J's rows rb BLOCK_R .. + BLOCK_R = the sum of the pair's chunk shares
    (BLOCK_C chunks per load, summed as a tree, blocks in chunk order), written back to wsj[pair, 0];
    their normalized rows' sum over m (the mixture's share) and entropy sum to wsm[pair, rb]. The pair's
    last row program (counter cnt[pair]) finishes it: forward, its JSD to wst[pair]; backward, dLoss/dJ
    over wsj[pair, 0]. Diagonal pairs: row block 0 finishes latent i's uni and KL-uni terms. Forward: the
    last pair finished writes the totals (:func:`_arrive_total`)."""
    dt = wsj_ptr.dtype.element_ty
    step, log_const = tl.full((), step, dt), tl.full((), log_const, dt)
    lu, lb, lk = tl.full((), lu, dt), tl.full((), lb, dt), tl.full((), lk, dt)
    pair = tl.program_id(0)
    rb = tl.program_id(1)
    n_blocks = tl.num_programs(1)
    j = pair // D
    i = pair % D
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    if i == j:
        if rb == 0:
            _uni_kl_finish(
                wsu_ptr,
                wst_ptr,
                gt_ptr,
                gu_ptr,
                gk_ptr,
                i,
                D,
                K,
                N_CHUNKS,
                step,
                log_const,
                lu,
                lk,
                ks,
                kmask,
                BACKWARD,
                HAS_T,
                HAS_U,
                HAS_K,
            )
            if not BACKWARD:
                _arrive_total(wst_ptr, cnt_ptr, total_ptr, uni_ptr, biv_ptr, kl_ptr, D, lu, lb, lk, BLOCK_K)
    else:
        rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
        msk = (rows < M)[:, None] & kmask[None, :]
        base = wsj_ptr + pair * N_CHUNKS * M * K
        rk = rows[:, None] * K + ks[None, :]
        cc = tl.arange(0, BLOCK_C)
        jr = tl.zeros((BLOCK_R, BLOCK_K), dt)
        for c0 in range(0, N_CHUNKS, BLOCK_C):
            part = tl.load(
                base + (c0 + cc)[:, None, None] * M * K + rk[None, :, :],
                mask=(c0 + cc < N_CHUNKS)[:, None, None] & msk[None, :, :],
                other=0.0,
            )
            jr += tl.sum(part, 0)
        tl.store(base + rk, jr, mask=msk)
        p, cs, cpos = _rows_normalized(jr, step)
        share = wsm_ptr + (pair * n_blocks + rb) * (BLOCK_K + 1)
        tl.store(share + ks, tl.sum(p, 0))
        bad = tl.sum(tl.sum((jr != jr).to(tl.int32), 1), 0) > 0  # p masks a NaN row (its normalizer is NaN)
        tl.store(share + BLOCK_K, tl.where(bad, float("nan"), tl.sum(tl.sum(_xlogx(p), 1), 0)))
        tl.debug_barrier()  # every thread's stores happen before the release
        if tl.atomic_add(cnt_ptr + pair, 1, sem="acq_rel") == n_blocks - 1:
            mix = tl.zeros((BLOCK_K,), dt)
            h_each = tl.zeros((), dt)
            for r in range(0, n_blocks):
                share = wsm_ptr + (pair * n_blocks + r) * (BLOCK_K + 1)
                mix += tl.load(share + ks, cache_modifier=".cg")
                h_each += tl.load(share + BLOCK_K, cache_modifier=".cg")
            mix = _div(mix, M.to(mix.dtype))
            nan = h_each != h_each  # a NaN in J (out-of-range conditioning row): NaN JSD and gradient
            if BACKWARD:
                # JSD = H(mix) - mean_m H(p_m): dLoss/dp_mk = g_b step / M (dxlogx(p_mk) - dxlogx(mix_k)),
                # then the row normalization p = |J| / c
                g_b = _term_grad(gt_ptr, gb_ptr, lb, HAS_T, HAS_B)
                for r in range(0, n_blocks):
                    rows = r * BLOCK_R + tl.arange(0, BLOCK_R)
                    msk = (rows < M)[:, None] & kmask[None, :]
                    rk = rows[:, None] * K + ks[None, :]
                    jr = tl.load(base + rk, mask=msk, other=0.0, cache_modifier=".cg")
                    p, cs, cpos = _rows_normalized(jr, step)
                    gp = _div(g_b * step, M.to(mix.dtype)) * (_dxlogx(p) - _dxlogx(mix)[None, :])
                    dot = tl.sum(gp * p, 1)
                    sgn = tl.where(jr > 0, 1.0, tl.where(jr < 0, -1.0, 0.0))
                    dj = tl.where(cpos[:, None], _div(sgn * (gp - step * dot[:, None]), cs[:, None]), 0.0)
                    tl.store(base + rk, tl.where(nan, float("nan"), dj), mask=msk)
            else:
                jsd = -step * tl.sum(_xlogx(mix), 0) + _div(step * h_each, M.to(mix.dtype))
                tl.store(wst_ptr + pair, tl.where(nan, float("nan"), jsd))
                _arrive_total(wst_ptr, cnt_ptr, total_ptr, uni_ptr, biv_ptr, kl_ptr, D, lu, lb, lk, BLOCK_K)


@triton.jit
def _cliff_fused_bwd(
    z_ptr,
    ci_ptr,
    wsj_ptr,
    wsu_ptr,
    stat_ptr,
    wsd_ptr,
    wsc_ptr,
    wsz_ptr,
    gt_ptr,
    gk_ptr,
    N,
    D,
    M,
    K,
    CS,
    a: tl.float64,
    b: tl.float64,
    inv_sigma: tl.float64,
    lk: tl.float64,
    HAS_T: tl.constexpr,
    HAS_K: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_KB: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Program (pair = j D + i, chunk c, (side, h)): dLoss/dx (x standardized) of its chunk's samples from
    the rows m of [h BLOCK_M, (h + 1) BLOCK_M) of dLoss/dJ (wsj[pair, 0], read in column blocks of BLOCK_KB)
    or, diagonal, dLoss/dG and the KL log-sum-exps (wsu[i, 0]) (:func:`_cliff_reduce`). Side 0, through
    Kz: wsc[pair, h, s] (x_sj) and wsz[pair, c, m] (the chunk's share through the conditioning value
    zeta_jm), from dLoss/dKz = dJ @ Dt^T; side 1, through Dt: wsd[pair, h, s] (x_si; diagonal, h = 0: uni
    and KL-uni), from dLoss/dDt = Kz^T @ dJ, a sum over m: each row block's share is summed by
    _cliff_grad. Sides and row blocks run in different programs: each holds a few tiles (registers)."""
    dt = z_ptr.dtype.element_ty
    a, b, inv_sigma = tl.full((), a, dt), tl.full((), b, dt), tl.full((), inv_sigma, dt)
    pair = tl.program_id(0)
    c = tl.program_id(1)
    n_chunks = tl.num_programs(1)
    n_row_blocks = tl.num_programs(2) // 2
    side = tl.program_id(2) // n_row_blocks
    h = tl.program_id(2) % n_row_blocks
    j = pair // D
    i = pair % D
    mean_i, std_i = tl.load(stat_ptr + 4 * i), tl.load(stat_ptr + 4 * i + 1)
    mean_j, std_j = tl.load(stat_ptr + 4 * j), tl.load(stat_ptr + 4 * j + 1)
    lo = c * CS
    hi = tl.minimum(N, lo + CS)
    out = (pair * n_row_blocks + h) * N  # this program's row of wsd / wsc
    ms = h * BLOCK_M + tl.arange(0, BLOCK_M)
    if (i == j) & ((side == 0) | (h > 0)):
        zero = wsd_ptr + out
        if side == 0:
            zero = wsc_ptr + out
            tl.store(wsz_ptr + (pair * n_chunks + c) * M + ms, tl.zeros((BLOCK_M,), dt), mask=ms < M)
        for s0 in range(lo, hi, BLOCK_S):
            ss = s0 + tl.arange(0, BLOCK_S)
            tl.store(zero + ss, tl.zeros((BLOCK_S,), dt), mask=ss < hi)
    elif i == j:  # side 1, h = 0: the uni and KL-uni terms' gradient
        g_k = _term_grad(gt_ptr, gk_ptr, tl.full((), lk, dt), HAS_T, HAS_K)
        ks = tl.arange(0, BLOCK_K)
        kmask = ks < K
        t = _linspace(a, b, K, ks)
        v = _kl_points(K, ks, dt)
        dg = tl.load(wsu_ptr + i * n_chunks * 3 * K + ks, mask=kmask, other=0.0)
        lse = tl.load(wsu_ptr + i * n_chunks * 3 * K + K + ks, mask=kmask, other=0.0)
        for s0 in range(lo, hi, BLOCK_S):
            ss = s0 + tl.arange(0, BLOCK_S)
            smask = ss < hi
            x = _standardized(z_ptr, ss, smask, i, D, mean_i, std_i)
            ddx = _dker(t, x, inv_sigma)[1]  # (K, S)
            u = (v[:, None] - x[None, :]) * inv_sigma
            sm = tl.where(kmask[:, None], tl.exp(-0.5 * u * u - lse[:, None]), 0.0)
            gx = tl.sum(dg[:, None] * ddx, 0) - _div(g_k, K.to(u.dtype)) * tl.sum(sm * u * inv_sigma, 0)
            tl.store(wsd_ptr + out + ss, gx, mask=smask)
    else:
        zeta, mmask = _zeta(z_ptr, ci_ptr, j, N, D, M, mean_j, std_j, ms)
        dj_rows = wsj_ptr + pair * n_chunks * M * K + ms[:, None] * K
        if side == 0:
            gzeta = tl.zeros((BLOCK_M,), dt)
            for s0 in range(lo, hi, BLOCK_S):
                ss = s0 + tl.arange(0, BLOCK_S)
                smask = ss < hi
                xi = _standardized(z_ptr, ss, smask, i, D, mean_i, std_i)
                g_kz = tl.zeros((BLOCK_M, BLOCK_S), dt)  # dLoss/dKz
                for k0 in range(0, K, BLOCK_KB):
                    ks = k0 + tl.arange(0, BLOCK_KB)
                    dker = _dker(_linspace(a, b, K, ks), xi, inv_sigma)[0]  # (KB, S)
                    dj = tl.load(dj_rows + ks[None, :], mask=mmask[:, None] & (ks < K)[None, :], other=0.0)
                    g_kz = _mma(dj, dker, g_kz, PRECISION)
                dkz = _kz_tile(_standardized(z_ptr, ss, smask, j, D, mean_j, std_j), zeta, inv_sigma)[1]
                prod = g_kz * dkz
                tl.store(wsc_ptr + out + ss, tl.sum(prod, 0), mask=smask)
                gzeta -= tl.sum(prod, 1)
            tl.store(wsz_ptr + (pair * n_chunks + c) * M + ms, gzeta, mask=mmask)
        else:
            for s0 in range(lo, hi, BLOCK_S):
                ss = s0 + tl.arange(0, BLOCK_S)
                smask = ss < hi
                xi = _standardized(z_ptr, ss, smask, i, D, mean_i, std_i)
                kzt = tl.trans(_kz_tile(_standardized(z_ptr, ss, smask, j, D, mean_j, std_j), zeta, inv_sigma)[0])
                g_x = tl.zeros((BLOCK_S,), dt)
                for k0 in range(0, K, BLOCK_KB):
                    ks = k0 + tl.arange(0, BLOCK_KB)
                    ddker = _dker(_linspace(a, b, K, ks), xi, inv_sigma)[1]  # (KB, S)
                    dj = tl.load(dj_rows + ks[None, :], mask=mmask[:, None] & (ks < K)[None, :], other=0.0)
                    g_dt = _mma(kzt, dj, tl.zeros((BLOCK_S, BLOCK_KB), dt), PRECISION)  # dLoss/dDt (S, KB)
                    g_x += tl.sum(g_dt * tl.trans(ddker), 1)
                tl.store(wsd_ptr + out + ss, g_x, mask=smask)


@triton.jit
def _cliff_grad(
    z_ptr,
    ci_ptr,
    stat_ptr,
    wsd_ptr,
    wsc_ptr,
    wsz_ptr,
    gz_ptr,
    N,
    D,
    M,
    N_CHUNKS,
    H,
    inv_n: tl.float64,
    BLOCK_S: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_O: tl.constexpr,
):
    """Latent c = program_id(0): dLoss/dx_sc = sum_j sum_h wsd[j D + c, h, s] + sum_i sum_h wsc[c D + i, h,
    s] (H row blocks per pair) + the conditioning values' share (rows cond_index[c, m]: sum_i sum_chunk
    wsz[c D + i, chunk, m]), each sum over BLOCK_O terms at a time (a tree), blocks in order; then through
    x = (z - mean) / std:
    dLoss/dz = (g - mean(g) - x mean(g x)) / std (without the last term where the std is clamped)."""
    dt = z_ptr.dtype.element_ty
    c = tl.program_id(0)
    mean, inv_std = tl.load(stat_ptr + 4 * c), tl.load(stat_ptr + 4 * c + 3)
    ms = tl.arange(0, BLOCK_M)
    mmask = ms < M
    rows = tl.load(ci_ptr + c * M + ms, mask=mmask, other=-1)
    oo = tl.arange(0, BLOCK_O)
    gzeta = tl.zeros((BLOCK_M,), dt)
    for o in range(0, D * N_CHUNKS, BLOCK_O):  # (i, chunk) pairs of the pairs (c, i), flat
        ic = o + oo
        gzeta += tl.sum(
            tl.load(
                wsz_ptr + (c * D * N_CHUNKS + ic)[:, None] * M + ms[None, :],
                mask=(ic < D * N_CHUNKS)[:, None] & mmask[None, :],
                other=0.0,
            ),
            0,
        )
    acc_g = tl.zeros((BLOCK_S,), dt)
    acc_gx = tl.zeros((BLOCK_S,), dt)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        g = tl.sum(tl.where((rows[None, :] == ss[:, None]) & mmask[None, :], gzeta[None, :], 0.0), 1)
        for o in range(0, D * H, BLOCK_O):  # (latent, row block) pairs, flat
            f = o + oo
            msk = (f < D * H)[:, None] & smask[None, :]
            rd = ((f // H) * D + c) * H + f % H  # wsd row of pair (f // H, c), row block f % H
            g += tl.sum(tl.load(wsd_ptr + rd[:, None] * N + ss[None, :], mask=msk, other=0.0), 0)
            g += tl.sum(tl.load(wsc_ptr + (c * D * H + f)[:, None] * N + ss[None, :], mask=msk, other=0.0), 0)
        x = (tl.load(z_ptr + ss * D + c, mask=smask, other=0.0) - mean) * inv_std
        acc_g += tl.where(smask, g, 0.0)
        acc_gx += tl.where(smask, g * x, 0.0)
        tl.store(gz_ptr + ss * D + c, g, mask=smask)
    # no division in this kernel (x and the result multiply by 1 / std, the means by 1 / n): ptxas spilled around
    # the IEEE division's slow-path subroutine; full is read here, not kept through the loops
    full = tl.load(stat_ptr + 4 * c + 2) > 0
    inv_n = tl.full((), inv_n, dt)
    g_mean = tl.sum(acc_g, 0) * inv_n
    gx_mean = tl.where(full, tl.sum(acc_gx, 0) * inv_n, 0.0)
    tl.debug_barrier()
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        x = (tl.load(z_ptr + ss * D + c, mask=smask, other=0.0) - mean) * inv_std
        g = tl.load(gz_ptr + ss * D + c, mask=smask, other=0.0)
        tl.store(gz_ptr + ss * D + c, (g - g_mean - x * gx_mean) * inv_std, mask=smask)
