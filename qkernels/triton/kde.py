"""Triton kernels of the KDE hot path and their launch functions (registered as the ops
``qkernels::klm_triton``, ``kde_grid_triton``, ``cliff_terms_triton`` and their ``*_backward_triton``
by :mod:`qkernels.ops.kde`, which also checks their arguments).

Same math as csrc/include/qkernels/kde.h and csrc/cpu/kde.cpp; semantics:
:mod:`qkernels.reference.kde`. No (n, n, d) or (n, n) tensor is written to memory: KLM streams
blocks of sample pairs through registers (flash-attention style), kde_grid streams samples (forward
and points' gradient) or points (samples' gradient). Every reduction is owned by one program and
summed in a fixed order, so results are deterministic.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from qkernels.reference.kde import silverman_factor

WINDOW = tl.constexpr(10.0)  # kde_grid drops kernel terms beyond WINDOW sigma (as the cpu backend, kde.h)
SQRT_2PI = math.sqrt(2.0 * math.pi)


# ----------------------------------------------------------------------------- klm


def _klm_blocks(d: int) -> tuple[int, int, int]:
    """(BLOCK_B rows, BLOCK_A streamed samples, BLOCK_D latents): the pair tile is B x A x D."""
    block_d = triton.next_power_of_2(d)
    block = 32 if block_d <= 4 else 16 if block_d <= 16 else 8  # B * A * D <= 4096 up to d = 64
    return block, block, block_d


@triton.jit
def _klm_pair_tile(y_ptr, yb, rows_a, cols, N, D):
    """Exact differences y_b - y_a of the streamed block (B, A, D) and its row mask."""
    amask = rows_a < N
    ya = tl.load(y_ptr + rows_a[:, None] * D + cols[None, :], mask=amask[:, None] & (cols < D)[None, :], other=0.0)
    return yb[:, None, :] - ya[None, :, :], amask  # masked latents are 0 - 0


@triton.jit
def _klm_fwd(
    y_ptr, lse_ptr, N, D, c_joint: tl.float64,
    BLOCK_B: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr,
):
    c_joint = tl.full((), c_joint, y_ptr.dtype.element_ty)
    # Log-sum-exps over a of exp(c_joint |y_b - y_a|^2) and of exp(-(y_bj - y_aj)^2 / 2). The
    # running maximum of an online log-sum-exp is known up front here: every exponent is <= 0 and
    # the a = b term is exp(0) = 1, so the sums lie in [1, n] and are accumulated directly.
    rows_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_D)
    bmask, cmask = rows_b < N, cols < D
    yb = tl.load(y_ptr + rows_b[:, None] * D + cols[None, :], mask=bmask[:, None] & cmask[None, :], other=0.0)
    jsum = tl.zeros((BLOCK_B,), yb.dtype)
    msum = tl.zeros((BLOCK_B, BLOCK_D), yb.dtype)
    for a0 in range(0, N, BLOCK_A):
        rows_a = a0 + tl.arange(0, BLOCK_A)
        diff, amask = _klm_pair_tile(y_ptr, yb, rows_a, cols, N, D)
        sq = diff * diff
        jsum += tl.sum(tl.where(amask[None, :], tl.exp(c_joint * tl.sum(sq, 2)), 0.0), 1)
        msum += tl.sum(tl.where(amask[None, :, None], tl.exp(-0.5 * sq), 0.0), 1)
    w = D + 1
    tl.store(lse_ptr + rows_b * w, tl.log(jsum), mask=bmask)
    mm = bmask[:, None] & cmask[None, :]
    tl.store(lse_ptr + rows_b[:, None] * w + 1 + cols[None, :], tl.log(tl.where(mm, msum, 1.0)), mask=mm)


@triton.jit
def _klm_bwd(
    y_ptr, lse_ptr, gy_ptr, N, D, c_joint: tl.float64, inv_f2: tl.float64, scale: tl.float64,
    BLOCK_B: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr,
):
    dt = y_ptr.dtype.element_ty
    c_joint, inv_f2, scale = tl.full((), c_joint, dt), tl.full((), inv_f2, dt), tl.full((), scale, dt)
    # dLoss/dy_bj = scale * sum_a [-(P_ba + P_ab) / f^2 + (Pj_ba + Pj_ab)] (y_bj - y_aj) with the
    # joint softmax P_ba = exp(J_ba - L_b) and the per-latent ones Pj_ba (the kernel matrices are
    # symmetric, so P_ab = exp(J_ba - L_a)).
    rows_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_D)
    bmask, cmask = rows_b < N, cols < D
    mb = bmask[:, None] & cmask[None, :]
    w = D + 1
    yb = tl.load(y_ptr + rows_b[:, None] * D + cols[None, :], mask=mb, other=0.0)
    elb = tl.exp(-tl.load(lse_ptr + rows_b * w, mask=bmask, other=0.0))
    eltb = tl.exp(-tl.load(lse_ptr + rows_b[:, None] * w + 1 + cols[None, :], mask=mb, other=0.0))
    acc = tl.zeros((BLOCK_B, BLOCK_D), yb.dtype)
    for a0 in range(0, N, BLOCK_A):
        rows_a = a0 + tl.arange(0, BLOCK_A)
        diff, amask = _klm_pair_tile(y_ptr, yb, rows_a, cols, N, D)
        ma = amask[:, None] & cmask[None, :]
        ela = tl.exp(-tl.load(lse_ptr + rows_a * w, mask=amask, other=0.0))
        elta = tl.exp(-tl.load(lse_ptr + rows_a[:, None] * w + 1 + cols[None, :], mask=ma, other=0.0))
        sq = diff * diff
        wj = -tl.exp(c_joint * tl.sum(sq, 2)) * (elb[:, None] + ela[None, :]) * inv_f2  # (B, A)
        wm = tl.exp(-0.5 * sq) * (eltb[:, None, :] + elta[None, :, :])  # (B, A, D)
        term = (wj[:, :, None] + wm) * diff
        acc += tl.sum(tl.where(amask[None, :, None], term, 0.0), 1)
    tl.store(gy_ptr + rows_b[:, None] * D + cols[None, :], acc * scale, mask=mb)


def klm(z: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    n, d = z.shape
    y = (z / std).contiguous()
    f = silverman_factor(n, d)
    lse = z.new_empty(n, d + 1)
    bb, ba, bd = _klm_blocks(d)
    _klm_fwd[(triton.cdiv(n, bb),)](y, lse, n, d, -0.5 / (f * f), BLOCK_B=bb, BLOCK_A=ba, BLOCK_D=bd)
    const = (d - 1) * math.log(n) - d * math.log(f)
    loss = (lse[:, 0] - lse[:, 1:].sum(1)).mean() + const
    return loss, lse


def klm_backward(
    grad_loss: torch.Tensor, z: torch.Tensor, std: torch.Tensor, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    n, d = z.shape
    y = (z / std).contiguous()
    f = silverman_factor(n, d)
    gy = torch.empty_like(y)
    bb, ba, bd = _klm_blocks(d)
    _klm_bwd[(triton.cdiv(n, bb),)](
        y, lse.contiguous(), gy, n, d, -0.5 / (f * f), 1.0 / (f * f), 1.0 / n,
        BLOCK_B=bb, BLOCK_A=ba, BLOCK_D=bd,
    )
    gy = gy * grad_loss.to(z.dtype)
    # z = y * std: dz = dy / std, dstd_j = -sum_b dy_bj y_bj / std_j (O(n d), left to torch)
    return gy / std, -(gy * y).sum(0) / std


# ----------------------------------------------------------------------------- kde_grid


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
    p_ptr, s_ptr, g_ptr, out_ptr, N, D, K, inv_sigma: tl.float64, scale: tl.float64,
    DERIV: tl.constexpr, GRAD: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
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
    p_ptr, s_ptr, g_ptr, gs_ptr, N, D, K, inv_sigma: tl.float64, scale: tl.float64,
    DERIV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
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


BLOCK_K_GRID, BLOCK_S_GRID = 32, 32


def _kde_scale(n: int, sigma: float, derivative: bool) -> float:
    return 1.0 / (n * sigma * SQRT_2PI * (sigma if derivative else 1.0))


def kde_grid(points: torch.Tensor, samples: torch.Tensor, sigma: float, derivative: bool) -> torch.Tensor:
    points, samples = points.contiguous(), samples.contiguous()
    (d, k), n = points.shape, samples.shape[0]
    out = torch.empty_like(points)
    _kde_grid_by_points[(triton.cdiv(k, BLOCK_K_GRID), d)](
        points, samples, points, out, n, d, k, 1.0 / sigma, _kde_scale(n, sigma, derivative),
        DERIV=derivative, GRAD=False, BLOCK_K=BLOCK_K_GRID, BLOCK_S=BLOCK_S_GRID,
    )
    return out


def kde_grid_backward(
    grad: torch.Tensor, points: torch.Tensor, samples: torch.Tensor, sigma: float, derivative: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    grad, points, samples = grad.to(points.dtype).contiguous(), points.contiguous(), samples.contiguous()
    (d, k), n = points.shape, samples.shape[0]
    scale = _kde_scale(n, sigma, derivative)
    gp, gs = torch.empty_like(points), torch.empty_like(samples)
    _kde_grid_by_points[(triton.cdiv(k, BLOCK_K_GRID), d)](
        points, samples, grad, gp, n, d, k, 1.0 / sigma, scale,
        DERIV=derivative, GRAD=True, BLOCK_K=BLOCK_K_GRID, BLOCK_S=BLOCK_S_GRID,
    )
    _kde_grid_samples_grad[(triton.cdiv(n, BLOCK_S_GRID), d)](
        points, samples, grad, gs, n, d, k, 1.0 / sigma, scale,
        DERIV=derivative, BLOCK_K=BLOCK_K_GRID, BLOCK_S=BLOCK_S_GRID,
    )
    return gp, gs


# ----------------------------------------------------------------------------- cliff_terms
#
# Memory: no (d, K, n), (d, M, n) or (d, d, M, K) tensor. Forward: one program per latent (uni and
# KL-uni) and one per ordered pair (i != j) whose K x M derivative grid G[k, m] = sum_s D(t_k - x_si)
# N(zeta_m - x_sj) is built by streaming the samples (tl.dot of kernel tiles), then normalized and
# reduced to the JSD in registers. Backward: one program per latent c owns column c of grad x: it
# recomputes the grids of every pair (c, q) and (q, c) and streams the samples again. Normalizing
# constants cancel in the normalized grids (also p_j(zeta_m), constant over k), so D(u) = -u e^{-u^2/2}
# and N(w) = e^{-w^2/2} are accumulated unnormalized.


@triton.jit
def _xlogx(p):
    pos = p > 0
    return tl.where(pos, p * tl.log(tl.where(pos, p, 1.0)), 0.0)


@triton.jit
def _dxlogx(p):
    pos = p > 0
    return tl.where(pos, tl.log(tl.where(pos, p, 1.0)) + 1.0, 0.0)


@triton.jit
def _normalized(g, step):
    """|g| / (step * sum_k |g|) per column (axis 0) of a (BK, BM) tile, its normalizer and mask."""
    c = step * tl.sum(tl.abs(g), 0)
    cpos = c > 0
    cs = tl.where(cpos, c, 1.0)
    return tl.where(cpos[None, :], tl.abs(g) / cs[None, :], 0.0), cs, cpos


@triton.jit
def _column_backward(g, p, gp, cs, cpos, step):
    """dLoss/dg of p = |g| / c given gp = dLoss/dp (columns along axis 0)."""
    dot = tl.sum(gp * p, 0)
    sgn = tl.where(g > 0, 1.0, tl.where(g < 0, -1.0, 0.0))
    return tl.where(cpos[None, :], sgn * (gp - step * dot[None, :]) / cs[None, :], 0.0)


@triton.jit
def _dker_tile(t, kmask, xs, smask, inv_sigma):
    """D(u), u = (t_k - x_s) / sigma, and dD/dx_s: (BK, BS) tiles, 0 outside the masks."""
    u = (t[:, None] - xs[None, :]) * inv_sigma
    m = kmask[:, None] & smask[None, :]
    e = tl.where(m, tl.exp(-0.5 * u * u), 0.0)
    return -u * e, (1.0 - u * u) * e * inv_sigma


@triton.jit
def _ker_tile(zeta, mmask, xs, smask, inv_sigma):
    """N(w), w = (zeta_m - x_s) / sigma, and w / sigma (dN/dx_s = w / sigma N = -dN/dzeta_m)."""
    w = (zeta[:, None] - xs[None, :]) * inv_sigma
    m = mmask[:, None] & smask[None, :]
    return tl.where(m, tl.exp(-0.5 * w * w), 0.0), w * inv_sigma


@triton.jit
def _pair_setup(x_ptr, t_ptr, ci_ptr, j, N, D, K, M, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr):
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    t = tl.load(t_ptr + ks, mask=kmask, other=0.0)
    ms = tl.arange(0, BLOCK_M)
    mmask = ms < M
    rows = tl.load(ci_ptr + j * M + ms, mask=mmask, other=0)
    ok = (rows >= 0) & (rows < N)  # an out-of-range row gives a NaN zeta, never an out-of-bounds read
    zeta = tl.load(x_ptr + rows * D + j, mask=mmask & ok, other=0.0)
    zeta = tl.where(ok | ~mmask, zeta, float("nan"))
    return t, kmask, zeta, mmask


@triton.jit
def _pair_grid(x_ptr, t, kmask, zeta, mmask, i, j, N, D, inv_sigma, ZGRAD: tl.constexpr,
               BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr):
    """G (BK, BM) of the pair (i, j) and, with ZGRAD, dG/dzeta_m."""
    g = tl.zeros((BLOCK_K, BLOCK_M), t.dtype)
    gz = tl.zeros((BLOCK_K, BLOCK_M), t.dtype)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        xi = tl.load(x_ptr + ss * D + i, mask=smask, other=0.0)
        xj = tl.load(x_ptr + ss * D + j, mask=smask, other=0.0)
        dk, _ = _dker_tile(t, kmask, xi, smask, inv_sigma)
        nk, wk = _ker_tile(zeta, mmask, xj, smask, inv_sigma)
        g += tl.dot(dk, tl.trans(nk), input_precision="ieee")
        if ZGRAD:
            gz += tl.dot(dk, tl.trans(-wk * nk), input_precision="ieee")
    return g, gz


@triton.jit
def _jsd(g, step, M):
    p, cs, cpos = _normalized(g, step)
    mix = tl.sum(p, 1) / M
    h_each = -step * tl.sum(tl.sum(_xlogx(p), 1), 0)
    h_mix = -step * tl.sum(_xlogx(mix), 0)
    return h_mix - h_each / M, p, mix, cs, cpos


@triton.jit
def _cliff_biv_fwd(x_ptr, t_ptr, ci_ptr, out_ptr, N, D, K, M, inv_sigma: tl.float64, step: tl.float64,
                   BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr):
    inv_sigma, step = tl.full((), inv_sigma, x_ptr.dtype.element_ty), tl.full((), step, x_ptr.dtype.element_ty)
    pid = tl.program_id(0)  # ordered pair (i, j), i != j
    i = pid // (D - 1)
    r = pid % (D - 1)
    j = r + (r >= i).to(tl.int32)
    t, kmask, zeta, mmask = _pair_setup(x_ptr, t_ptr, ci_ptr, j, N, D, K, M, BLOCK_K, BLOCK_M)
    g, _ = _pair_grid(x_ptr, t, kmask, zeta, mmask, i, j, N, D, inv_sigma, False, BLOCK_K, BLOCK_M, BLOCK_S)
    jsd, _, _, _, _ = _jsd(g, step, M)
    # an out-of-range conditioning row (NaN zeta) poisons the pair (the normalization would hide it)
    jsd = tl.where(tl.sum((mmask & (zeta != zeta)).to(tl.int32), 0) > 0, float("nan"), jsd)
    tl.store(out_ptr + pid, jsd)


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
def _cliff_uni_kl_fwd(x_ptr, t_ptr, v_ptr, uni_ptr, kl_ptr, N, D, K, KU, inv_sigma: tl.float64, step: tl.float64,
                      log_const: tl.float64,
                      BLOCK_K: tl.constexpr, BLOCK_KU: tl.constexpr, BLOCK_S: tl.constexpr):
    dt = x_ptr.dtype.element_ty
    inv_sigma, step, log_const = tl.full((), inv_sigma, dt), tl.full((), step, dt), tl.full((), log_const, dt)
    i = tl.program_id(0)
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    t = tl.load(t_ptr + ks, mask=kmask, other=0.0)
    g = _uni_grid(x_ptr, t, kmask, i, N, D, inv_sigma, BLOCK_K, BLOCK_S)
    p, _, _ = _normalized(g[:, None], step)
    tl.store(uni_ptr + i, -step * tl.sum(tl.sum(_xlogx(p), 1), 0))
    vs = tl.arange(0, BLOCK_KU)
    vmask = vs < KU
    v = tl.load(v_ptr + vs, mask=vmask, other=0.0)
    lse = _kl_lse(x_ptr, v, i, N, D, inv_sigma, BLOCK_S)
    # kl_i = -log(2 sqrt 3) - mean_v log p_i(v), log p_i(v) = lse_v - log(n sigma sqrt(2 pi))
    tl.store(kl_ptr + i, log_const - tl.sum(tl.where(vmask, lse, 0.0), 0) / KU)


@triton.jit
def _cliff_bwd(x_ptr, t_ptr, v_ptr, ci_ptr, gu_ptr, gb_ptr, gk_ptr, gx_ptr, gzeta_ptr, N, D, K, KU, M,
               inv_sigma: tl.float64, step: tl.float64,
               BLOCK_K: tl.constexpr, BLOCK_KU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr):
    inv_sigma, step = tl.full((), inv_sigma, x_ptr.dtype.element_ty), tl.full((), step, x_ptr.dtype.element_ty)
    c = tl.program_id(0)  # owns column c of grad x and row c of grad zeta
    g_uni = tl.load(gu_ptr)
    g_biv = tl.load(gb_ptr)
    g_kl = tl.load(gk_ptr)
    ks = tl.arange(0, BLOCK_K)
    kmask = ks < K
    t = tl.load(t_ptr + ks, mask=kmask, other=0.0)
    # uni: dLoss/dg of the column's derivative grid
    g = _uni_grid(x_ptr, t, kmask, c, N, D, inv_sigma, BLOCK_K, BLOCK_S)[:, None]
    p, cs, cpos = _normalized(g, step)
    dg = tl.sum(_column_backward(g, p, -g_uni * step * _dxlogx(p), cs, cpos, step), 1)  # (BK,)
    # kl: softmax weights over the samples
    vs = tl.arange(0, BLOCK_KU)
    vmask = vs < KU
    v = tl.load(v_ptr + vs, mask=vmask, other=0.0)
    lse = _kl_lse(x_ptr, v, c, N, D, inv_sigma, BLOCK_S)
    for s0 in range(0, N, BLOCK_S):
        ss = s0 + tl.arange(0, BLOCK_S)
        smask = ss < N
        xc = tl.load(x_ptr + ss * D + c, mask=smask, other=0.0)
        _, ddx = _dker_tile(t, kmask, xc, smask, inv_sigma)
        acc = tl.sum(dg[:, None] * ddx, 0)
        u = (v[:, None] - xc[None, :]) * inv_sigma
        sm = tl.where(vmask[:, None] & smask[None, :], tl.exp(-0.5 * u * u - lse[:, None]), 0.0)
        acc += -g_kl / KU * tl.sum(sm * u * inv_sigma, 0)
        tl.store(gx_ptr + ss * D + c, acc, mask=smask)
    # biv: the pairs (c, q) (c is the differentiated latent i) and (q, c) (c conditions)
    gzeta = tl.zeros((BLOCK_M,), t.dtype)
    bad = tl.zeros((BLOCK_M,), tl.int32)  # out-of-range conditioning rows met (NaN zeta)
    for q in range(0, D):
        if q != c:
            for side in tl.static_range(2):
                i = c if side == 0 else q
                j = q if side == 0 else c
                _, _, zeta, mmask = _pair_setup(x_ptr, t_ptr, ci_ptr, j, N, D, K, M, BLOCK_K, BLOCK_M)
                bad += (mmask & (zeta != zeta)).to(tl.int32)
                g2, gz = _pair_grid(x_ptr, t, kmask, zeta, mmask, i, j, N, D, inv_sigma, True,
                                    BLOCK_K, BLOCK_M, BLOCK_S)
                _, p2, mix, cs2, cpos2 = _jsd(g2, step, M)
                gp = g_biv * step / M * (_dxlogx(p2) - _dxlogx(mix)[:, None])
                dG = _column_backward(g2, p2, gp, cs2, cpos2, step)  # (BK, BM)
                if side == 1:
                    gzeta += tl.sum(dG * gz, 0)
                for s0 in range(0, N, BLOCK_S):
                    ss = s0 + tl.arange(0, BLOCK_S)
                    smask = ss < N
                    xi = tl.load(x_ptr + ss * D + i, mask=smask, other=0.0)
                    xj = tl.load(x_ptr + ss * D + j, mask=smask, other=0.0)
                    dk, ddx = _dker_tile(t, kmask, xi, smask, inv_sigma)
                    nk, wk = _ker_tile(zeta, mmask, xj, smask, inv_sigma)
                    if side == 0:  # through D(t_k - x_sc)
                        a = tl.dot(dG, nk, input_precision="ieee")  # (BK, BS)
                        contrib = tl.sum(ddx * a, 0)
                    else:  # through N(zeta_m - x_sc)
                        b = tl.dot(tl.trans(dG), dk, input_precision="ieee")  # (BM, BS)
                        contrib = tl.sum(wk * nk * b, 0)
                    prev = tl.load(gx_ptr + ss * D + c, mask=smask, other=0.0)
                    tl.store(gx_ptr + ss * D + c, prev + contrib, mask=smask)
    if tl.sum(bad, 0) > 0:  # column c of grad x is NaN
        for s0 in range(0, N, BLOCK_S):
            ss = s0 + tl.arange(0, BLOCK_S)
            tl.store(gx_ptr + ss * D + c, tl.full((BLOCK_S,), float("nan"), t.dtype), mask=ss < N)
    ms = tl.arange(0, BLOCK_M)
    tl.store(gzeta_ptr + c * M + ms, gzeta, mask=ms < M)


def _cliff_blocks(k: int, ku: int, m: int) -> tuple[int, int, int, int]:
    """(BLOCK_K, BLOCK_KU, BLOCK_M, BLOCK_S); tl.dot needs every dimension >= 16."""
    return (max(16, triton.next_power_of_2(k)), triton.next_power_of_2(ku), max(16, triton.next_power_of_2(m)), 16)


def cliff_terms(
    x: torch.Tensor, grid: torch.Tensor, uni_points: torch.Tensor, cond_index: torch.Tensor, sigma: float, step: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, grid, uni_points, ci = x.contiguous(), grid.contiguous(), uni_points.contiguous(), cond_index.contiguous()
    (n, d), k, ku, m = x.shape, grid.shape[0], uni_points.shape[0], ci.shape[1]
    bk, bku, bm, bs = _cliff_blocks(k, ku, m)
    uni, kl = x.new_empty(d), x.new_empty(d)
    log_const = -math.log(2 * math.sqrt(3.0)) + math.log(n * sigma) + 0.5 * math.log(2 * math.pi)
    _cliff_uni_kl_fwd[(d,)](
        x, grid, uni_points, uni, kl, n, d, k, ku, 1.0 / sigma, step, log_const,
        BLOCK_K=bk, BLOCK_KU=bku, BLOCK_S=bs,
    )
    jsd = x.new_zeros(max(1, d * (d - 1)))
    if d > 1:
        _cliff_biv_fwd[(d * (d - 1),)](
            x, grid, ci, jsd, n, d, k, m, 1.0 / sigma, step, BLOCK_K=bk, BLOCK_M=bm, BLOCK_S=bs
        )
    return uni.sum(), jsd.sum(), kl.sum()


def cliff_terms_backward(
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
    x, grid, uni_points, ci = x.contiguous(), grid.contiguous(), uni_points.contiguous(), cond_index.contiguous()
    (n, d), k, ku, m = x.shape, grid.shape[0], uni_points.shape[0], ci.shape[1]
    bk, bku, bm, bs = _cliff_blocks(k, ku, m)
    gx, gzeta = torch.empty_like(x), x.new_empty(d, m)
    g_u, g_b, g_k = (g.to(x.dtype).reshape(1) for g in (grad_uni, grad_biv, grad_kl))
    _cliff_bwd[(d,)](
        x, grid, uni_points, ci, g_u, g_b, g_k, gx, gzeta, n, d, k, ku, m, 1.0 / sigma, step,
        BLOCK_K=bk, BLOCK_KU=bku, BLOCK_M=bm, BLOCK_S=bs,
    )
    # zeta[j, m] = x[cond_index[j, m], j]: scatter its gradient back to the rows (O(d M)). An
    # out-of-range row made zeta NaN in the kernels; clamping keeps the scatter in bounds.
    cols = torch.arange(d, device=x.device)[:, None].expand(d, m)
    return gx.index_put((ci.clamp(0, n - 1), cols), gzeta, accumulate=True)
