"""Triton kernels of the KDE hot path and their launch functions (registered as the ops
``qkernels::klm_triton``, ``kde_grid_triton``, ``cliff_loss_triton`` and their ``*_backward_triton``
by :mod:`qkernels.ops.kde`, which also checks their arguments).

Launches per forward + backward: klm 6 (issue 26: symmetric tiles, 3 each way), kde_grid 3,
cliff_loss 4 on the fused path (tiles up to 128 x 128 conditioning values x grid points at the
papers' batch sizes, :func:`fused_fits`), 65 on the GEMM path with one chunk (larger; ~40 of them
torch ops of the set-up), + 6 per further chunk.

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

from qkernels.reference.kde import silverman_factor, standardize

WINDOW = tl.constexpr(10.0)  # kde_grid drops kernel terms beyond WINDOW sigma (as the cpu backend, kde.h)
SQRT_2PI = math.sqrt(2.0 * math.pi)


# ----------------------------------------------------------------------------- klm
#
# Flash-style and symmetric (issue 26): the kernel matrices are symmetric, so each pair of sample
# tiles is computed once. Samples are grouped in super-blocks of KLM_SUPER rows; program (p, q),
# q <= p, walks the (BLOCK_B x BLOCK_B x D) pair tiles of super-blocks p and q in registers (never
# the n x n x d tensor) and writes, to a workspace ws (nsb, nsb, KLM_SUPER, W), the partial sums of
# super-block p's rows over q's samples (ws[p, q]) and, for q < p, of q's rows over p's samples
# (ws[q, p], the tiles' column sums, accumulated by this program alone). Every ws[r, q] is written
# by one program; _klm_rows then adds each row's nsb partials in a fixed order: deterministic.
# Forward (W = d + 1: the joint kernel and the d marginal ones): _klm_fwd_tiles, _klm_rows (lse and
# one loss partial per row block), _klm_loss: 3 launches. Backward (W = d: dLoss/dy): _klm_bwd_tiles,
# _klm_rows, _klm_grad (the chain through y = z / std and the default std): 3 launches. float32
# exponentials are exp2 with log2(e) folded into the scale (the SFU's instruction); float64 keeps
# exp. The running maximum of an online log-sum-exp is known up front: every exponent is <= 0 and
# the a = b term is exp(0) = 1, so the sums lie in [1, n] and are accumulated directly. Without a
# given std every program computes the population std of z + 1e-6 itself (two passes over z).

KLM_SUPER = 128  # at most this many rows per super-block; workspace n^2 / super (d + 1) values
LOG2E = 1.4426950408889634


def _klm_super(n: int, block: int) -> int:
    """Rows per super-block: about n / 16 (so that small batches still spread over ~136 programs),
    a power of 2 between BLOCK_B and KLM_SUPER."""
    return min(KLM_SUPER, max(block, triton.next_power_of_2(triton.cdiv(n, 16))))


def _klm_blocks(d: int) -> tuple[int, int, int]:
    """(BLOCK_B rows, BLOCK_A streamed samples, BLOCK_D latents): the pair tile is B x A x D."""
    block_d = triton.next_power_of_2(d)
    block = 32 if block_d <= 4 else 16 if block_d <= 16 else 8  # B * A * D <= 4096 up to d = 64
    return block, block, block_d


@triton.jit
def _klm_scale(z_ptr, std_ptr, cols, cmask, N, D, HAS_STD: tl.constexpr, BLOCK_A: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """(std, mean, var) of the latent columns ``cols``: std given, or z's population std + 1e-6."""
    dt = z_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_A, BLOCK_D), dt)
    for a0 in range(0, N, BLOCK_A):
        rows = a0 + tl.arange(0, BLOCK_A)
        acc += tl.load(z_ptr + rows[:, None] * D + cols[None, :], mask=(rows < N)[:, None] & cmask[None, :], other=0.0)
    mean = tl.sum(acc, 0) / N
    acc = tl.zeros((BLOCK_A, BLOCK_D), dt)
    for a0 in range(0, N, BLOCK_A):
        rows = a0 + tl.arange(0, BLOCK_A)
        m = (rows < N)[:, None] & cmask[None, :]
        dev = tl.where(m, tl.load(z_ptr + rows[:, None] * D + cols[None, :], mask=m, other=0.0) - mean[None, :], 0.0)
        acc += dev * dev
    var = tl.sum(acc, 0) / N
    if HAS_STD:
        std = tl.load(std_ptr + cols, mask=cmask, other=1.0)
    else:
        pos = var > 0
        std = tl.where(pos, tl.sqrt(tl.where(pos, var, 1.0)), 0.0) + tl.full((), 1e-6, dt)
    return std, mean, var


@triton.jit
def _gauss(s, c, c2):
    """exp(c s): exp2(c2 s) with c2 = c log2(e) in float32 (the SFU's instruction), exp in float64."""
    if s.dtype == tl.float32:
        return tl.exp2(c2 * s)
    return tl.exp(c * s)


@triton.jit
def _klm_y(z_ptr, std, rows, cols, cmask, N, D):
    """y = z / std of the given rows (0 outside) and the row mask."""
    rmask = rows < N
    m = rmask[:, None] & cmask[None, :]
    return tl.load(z_ptr + rows[:, None] * D + cols[None, :], mask=m, other=0.0) / std[None, :], rmask


@triton.jit
def _ws_add(ws_ptr, p, q, r0, NSB, W, msum, jsum, cmask, ACCUMULATE, JOINT: tl.constexpr, SUPER: tl.constexpr,
            BLOCK: tl.constexpr):
    """ws[p, q, r0:r0 + BLOCK] (+)= [msum (BLOCK, d) | jsum (BLOCK,) if JOINT] (+ where ACCUMULATE)."""
    rows = ((p * NSB + q) * SUPER + r0 + tl.arange(0, BLOCK)) * W
    cols = tl.arange(0, msum.shape[1])
    offs = rows[:, None] + cols[None, :]
    if ACCUMULATE:
        msum += tl.load(ws_ptr + offs, mask=cmask[None, :], other=0.0)
        if JOINT:
            jsum += tl.load(ws_ptr + rows + W - 1)
    tl.store(ws_ptr + offs, msum, mask=cmask[None, :])
    if JOINT:
        tl.store(ws_ptr + rows + W - 1, jsum)
    tl.debug_barrier()  # later tiles of this program read these rows back


@triton.jit
def _klm_tiles(
    z_ptr, std_ptr, lse_ptr, ws_ptr, N, D, NSB, c_joint: tl.float64, c2_joint: tl.float64, c2_marg: tl.float64,
    inv_f2: tl.float64, BACKWARD: tl.constexpr, HAS_STD: tl.constexpr, SUPER: tl.constexpr, BLOCK: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Program (p, q), q <= p (others return): for every row b of super-block p and sample a of q,
    forward: ws[p, q, b] = [sum_a exp(-(y_bj - y_aj)^2 / 2) for each j | sum_a exp(c_joint |y_b - y_a|^2)]
    (W = d + 1); BACKWARD: ws[p, q, b, j] = sum_a [-(P_ba + P_ab) / f^2 + (Pj_ba + Pj_ab)] (y_bj - y_aj)
    (W = d) with the joint softmax P_ba = exp(J_ba - L_b) and the per-latent ones Pj_ba from the
    forward's lse. For q < p also ws[q, p] (the tiles' column sums, the terms being symmetric)."""
    p = tl.program_id(0)
    q = tl.program_id(1)
    if q <= p:
        dt = z_ptr.dtype.element_ty
        cj, cj2, cm2, if2 = (tl.full((), c_joint, dt), tl.full((), c2_joint, dt), tl.full((), c2_marg, dt),
                             tl.full((), inv_f2, dt))
        cols = tl.arange(0, BLOCK_D)
        cmask = cols < D
        std, _, _ = _klm_scale(z_ptr, std_ptr, cols, cmask, N, D, HAS_STD, BLOCK, BLOCK_D)
        w = D if BACKWARD else D + 1
        for b0 in range(0, SUPER, BLOCK):
            rows_b = p * SUPER + b0 + tl.arange(0, BLOCK)
            yb, bmask = _klm_y(z_ptr, std, rows_b, cols, cmask, N, D)
            jsum = tl.zeros((BLOCK,), dt)
            msum = tl.zeros((BLOCK, BLOCK_D), dt)
            if BACKWARD:
                mb = bmask[:, None] & cmask[None, :]
                elb = tl.exp(-tl.load(lse_ptr + rows_b * (D + 1), mask=bmask, other=0.0))
                eltb = tl.exp(-tl.load(lse_ptr + rows_b[:, None] * (D + 1) + 1 + cols[None, :], mask=mb, other=0.0))
            a_end = tl.where(q < p, SUPER, b0 + BLOCK)  # the diagonal super-block: its lower triangle of tiles
            for a0 in range(0, a_end, BLOCK):
                rows_a = q * SUPER + a0 + tl.arange(0, BLOCK)
                ya, amask = _klm_y(z_ptr, std, rows_a, cols, cmask, N, D)
                diff = yb[:, None, :] - ya[None, :, :]  # (B, A, D); masked latents are 0 - 0
                sq = diff * diff
                pm = bmask[:, None] & amask[None, :]
                ej = tl.where(pm, _gauss(tl.sum(sq, 2), cj, cj2), 0.0)  # (B, A)
                em = tl.where(pm[:, :, None], _gauss(sq, -0.5, cm2), 0.0)  # (B, A, D)
                if BACKWARD:
                    ma = amask[:, None] & cmask[None, :]
                    ela = tl.exp(-tl.load(lse_ptr + rows_a * (D + 1), mask=amask, other=0.0))
                    elta = tl.exp(-tl.load(lse_ptr + rows_a[:, None] * (D + 1) + 1 + cols[None, :], mask=ma,
                                           other=0.0))
                    wj = -ej * (elb[:, None] + ela[None, :]) * if2
                    em = (wj[:, :, None] + em * (eltb[:, None, :] + elta[None, :, :])) * diff
                msum += tl.sum(em, 1)
                jsum += tl.sum(ej, 1)
                if (q < p) | (a0 < b0):  # off the diagonal: the column sums are rows a's (antisymmetric backward)
                    cm = tl.sum(em, 0)
                    _ws_add(ws_ptr, q, p, a0, NSB, w, -cm if BACKWARD else cm, tl.sum(ej, 0), cmask, b0 > 0,
                            not BACKWARD, SUPER, BLOCK)
            _ws_add(ws_ptr, p, q, b0, NSB, w, msum, jsum, cmask, False, not BACKWARD, SUPER, BLOCK)


@triton.jit
def _ws_rows(ws_ptr, rows, cols, cmask, NSB, W, SUPER: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """sum over q (in order) of ws[rows // SUPER, q, rows % SUPER]: (BLOCK, BLOCK_D) marginal
    columns and (BLOCK,) column d (the joint one, forward)."""
    dt = ws_ptr.dtype.element_ty
    base = (rows // SUPER) * NSB * SUPER + rows % SUPER
    m = tl.zeros((BLOCK, BLOCK_D), dt)
    j = tl.zeros((BLOCK,), dt)
    for q in range(0, NSB):
        r = (base + q * SUPER) * W
        m += tl.load(ws_ptr + r[:, None] + cols[None, :], mask=cmask[None, :], other=0.0)
        j += tl.load(ws_ptr + r + W - 1)
    return m, j


@triton.jit
def _klm_fwd_rows(ws_ptr, lse_ptr, part_ptr, N, D, NSB, SUPER: tl.constexpr, BLOCK: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """lse[b] = [log of the joint sum | log of each marginal sum] and part[program] = sum_b (joint -
    sum_j marginal) over this block of rows. Grid (n / BLOCK,)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, BLOCK_D)
    rmask, cmask = rows < N, cols < D
    mb = rmask[:, None] & cmask[None, :]
    msum, jsum = _ws_rows(ws_ptr, rows, cols, cmask, NSB, D + 1, SUPER, BLOCK, BLOCK_D)
    lj = tl.log(tl.where(rmask, jsum, 1.0))
    lm = tl.log(tl.where(mb, msum, 1.0))
    tl.store(lse_ptr + rows * (D + 1), lj, mask=rmask)
    tl.store(lse_ptr + rows[:, None] * (D + 1) + 1 + cols[None, :], lm, mask=mb)
    tl.store(part_ptr + tl.program_id(0), tl.sum(lj - tl.sum(lm, 1), 0))


@triton.jit
def _klm_bwd_rows(z_ptr, std_ptr, ws_ptr, g_ptr, gy_ptr, part_ptr, N, D, NSB, HAS_STD: tl.constexpr,
                  SUPER: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """gy[b] = dLoss/dy_b = g / n times the row sums of the backward tiles; part[program, j] =
    sum_b gy_bj y_bj over this block of rows. Grid (n / BLOCK,)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, BLOCK_D)
    rmask, cmask = rows < N, cols < D
    mb = rmask[:, None] & cmask[None, :]
    acc, _ = _ws_rows(ws_ptr, rows, cols, cmask, NSB, D, SUPER, BLOCK, BLOCK_D)
    std, _, _ = _klm_scale(z_ptr, std_ptr, cols, cmask, N, D, HAS_STD, BLOCK, BLOCK_D)
    yb, _ = _klm_y(z_ptr, std, rows, cols, cmask, N, D)
    gy = tl.where(mb, acc * (tl.load(g_ptr).to(acc.dtype) / N), 0.0)
    tl.store(gy_ptr + rows[:, None] * D + cols[None, :], gy, mask=mb)
    tl.store(part_ptr + tl.program_id(0) * D + cols, tl.sum(gy * yb, 0), mask=cmask)


@triton.jit
def _klm_loss(part_ptr, loss_ptr, P, N, const: tl.float64, BLOCK: tl.constexpr):
    """loss = sum of the P partials / N + const, summed in a fixed order (one program)."""
    dt = part_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK,), dt)
    for p0 in range(0, P, BLOCK):
        ps = p0 + tl.arange(0, BLOCK)
        acc += tl.load(part_ptr + ps, mask=ps < P, other=0.0)
    tl.store(loss_ptr, tl.sum(acc, 0) / N + tl.full((), const, dt))


@triton.jit
def _klm_grad(
    z_ptr, std_ptr, gz_ptr, part_ptr, gstd_ptr, N, D, P,
    HAS_STD: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # z = y * std: dz = dy / std, dstd_j = -sum_b dy_bj y_bj / std_j (the partials, summed in a fixed
    # order); the default std adds dstd_j (z_bj - mean_j) / (n sqrt(var_j)) (zero where var_j = 0).
    # gz_ptr holds dLoss/dy on entry and dLoss/dz on exit; program 0 writes dLoss/dstd (given std).
    rows_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_D)
    bmask, cmask = rows_b < N, cols < D
    mb = bmask[:, None] & cmask[None, :]
    std, mean, var = _klm_scale(z_ptr, std_ptr, cols, cmask, N, D, HAS_STD, BLOCK_A, BLOCK_D)
    s = tl.zeros((BLOCK_D,), std.dtype)
    for p in range(0, P):
        s += tl.load(part_ptr + p * D + cols, mask=cmask, other=0.0)
    gstd = -s / std
    offs = rows_b[:, None] * D + cols[None, :]
    gz = tl.load(gz_ptr + offs, mask=mb, other=0.0) / std[None, :]
    if HAS_STD:
        if tl.program_id(0) == 0:
            tl.store(gstd_ptr + cols, gstd, mask=cmask)
    else:
        pos = var > 0
        dstd = tl.where(pos, gstd / (N * tl.sqrt(tl.where(pos, var, 1.0))), 0.0)
        z = tl.load(z_ptr + offs, mask=mb, other=0.0)
        gz += dstd[None, :] * (z - mean[None, :])
    tl.store(gz_ptr + offs, gz, mask=mb)


def _klm_launch(z, std, lse, backward):
    """The tile pass: (workspace, nsb, super, block, block_d)."""
    n, d = z.shape
    f = silverman_factor(n, d)
    block, _, block_d = _klm_blocks(d)
    sup = _klm_super(n, block)
    nsb = triton.cdiv(n, sup)
    ws = z.new_empty(nsb * nsb * sup * (d if backward else d + 1))
    c_joint = -0.5 / (f * f)
    _klm_tiles[(nsb, nsb)](z, z if std is None else std, lse, ws, n, d, nsb, c_joint, c_joint * LOG2E, -0.5 * LOG2E,
                           1.0 / (f * f), BACKWARD=backward, HAS_STD=std is not None, SUPER=sup, BLOCK=block,
                           BLOCK_D=block_d)
    return ws, nsb, sup, block, block_d


def klm(z: torch.Tensor, std: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    z = z.contiguous()
    std = None if std is None else std.contiguous()
    n, d = z.shape
    lse = z.new_empty(n, d + 1)
    ws, nsb, sup, block, block_d = _klm_launch(z, std, lse, False)
    grid = (triton.cdiv(n, block),)
    part = z.new_empty(grid[0])
    _klm_fwd_rows[grid](ws, lse, part, n, d, nsb, SUPER=sup, BLOCK=block, BLOCK_D=block_d)
    loss = z.new_empty(())
    const = (d - 1) * math.log(n) - d * math.log(silverman_factor(n, d))
    _klm_loss[(1,)](part, loss, grid[0], n, const, BLOCK=128)
    return loss, lse


def klm_backward(
    grad_loss: torch.Tensor, z: torch.Tensor, std: torch.Tensor | None, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    z, lse = z.contiguous(), lse.contiguous()
    std = None if std is None else std.contiguous()
    n, d = z.shape
    ws, nsb, sup, block, block_d = _klm_launch(z, std, lse, True)
    grid = (triton.cdiv(n, block),)
    gz = torch.empty_like(z)
    part = z.new_empty(grid[0], d)
    gstd = z.new_empty(0 if std is None else d)
    s = z if std is None else std
    _klm_bwd_rows[grid](z, s, ws, grad_loss, gz, part, n, d, nsb, HAS_STD=std is not None, SUPER=sup,
                        BLOCK=block, BLOCK_D=block_d)
    _klm_grad[grid](z, s, gz, part, gstd, n, d, grid[0], HAS_STD=std is not None, BLOCK_B=block, BLOCK_A=block,
                    BLOCK_D=block_d)
    return gz, gstd


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


# ----------------------------------------------------------------------------- cliff_loss
#
# Two paths, chosen by :func:`fused_fits` from the shape: the fused path below (one program per
# pair, four launches, for tiles up to 128 x 128 at the papers' batch sizes) and the GEMM path (issue 12),
# whose tables and products live in memory (for larger tiles; its standardization, grids and
# lambdas run as torch ops around it).
#
# GEMM path (issues 12, 26). For every ordered pair (i, j) the bivariate grid is a matrix product,
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
def _zeta(x_ptr, ci_ptr, offs, js, mask, N, D):
    """Conditioning values x[cond_index.flat[offs], js] (offs = j M + m); NaN for an out-of-range row
    (never read)."""
    rows = tl.load(ci_ptr + offs, mask=mask, other=0)
    ok = (rows >= 0) & (rows < N)
    z = tl.load(x_ptr + rows * D + js, mask=mask & ok, other=0.0)
    return tl.where(ok | ~mask, z, float("nan"))


@triton.jit
def _mma(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b on the tensor cores at PRECISION: "ieee" (exact; float64), "tf32x3" (split
    float32, about float32's error), "tf32", or "bf16" (the inputs rounded to bfloat16, exact in a
    TF32 product)."""
    if PRECISION == "bf16":
        out = tl.dot(a.to(tl.bfloat16).to(a.dtype), b.to(tl.bfloat16).to(b.dtype), acc, input_precision="tf32")
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


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
def _biv_fwd(kzt_ptr, order_ptr, xs_ptr, t_ptr, out_ptr, i0, N, DM, K, CI, NKT, inv_sigma: tl.float64,
             window: tl.float64, PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
             BLOCK_K: tl.constexpr):
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
    lo, hi = _count_below(xs_ptr + i * N, N, tl.min(tl.where(kmask, t, float("inf")), 0) - window,
                          tl.max(tl.where(kmask, t, float("-inf")), 0) + window, 256)
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
def _biv_dx(kzt_ptr, order_ptr, xs_ptr, t_ptr, dj_ptr, gu_ptr, gx_ptr, i0, N, D, DM, K, CI,
            inv_sigma: tl.float64, window: tl.float64, PRECISION: tl.constexpr, BLOCK_S: tl.constexpr,
            BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
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
    k_lo, k_hi = _count_below(t_ptr, K, tl.min(tl.where(smask, x, float("inf")), 0) - window,
                              tl.max(tl.where(smask, x, float("-inf")), 0) + window, 256)
    acc = tl.zeros((BLOCK_S,), dt)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < k_hi
        g = tl.zeros((BLOCK_S, BLOCK_K), dt)
        for r0 in range(0, DM, BLOCK_R):
            rr = r0 + tl.arange(0, BLOCK_R)
            rmask = rr < DM
            kz = tl.load(kzt_ptr + rows[:, None] * DM + rr[None, :], mask=smask[:, None] & rmask[None, :], other=0.0)
            dj = tl.load(dj_ptr + rr[:, None] * (CI * K) + c * K + ks[None, :], mask=rmask[:, None] & kmask[None, :],
                         other=0.0)
            g = _mma(kz, dj, g, PRECISION)
        t = tl.load(t_ptr + ks, mask=kmask, other=0.0)
        _, ddx = _dker_tile(t, kmask, x, smask, inv_sigma)  # (K, S)
        g += tl.load(gu_ptr + i * K + ks, mask=kmask, other=0.0)[None, :]
        acc += tl.sum(g * tl.trans(ddx), 1)
    tl.store(gx_ptr + rows * D + i, acc, mask=smask)


@triton.jit
def _biv_dkz(x_ptr, t_ptr, dj_ptr, gkz_ptr, i0, N, D, DM, K, CI, inv_sigma: tl.float64, window: tl.float64,
             ACCUMULATE: tl.constexpr, PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
             BLOCK_K: tl.constexpr):
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
        k_lo, k_hi = _count_below(t_ptr, K, tl.min(tl.where(smask, x, float("inf")), 0) - window,
                                  tl.max(tl.where(smask, x, float("-inf")), 0) + window, 256)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < k_hi
            t = tl.load(t_ptr + ks, mask=kmask, other=0.0)
            dker, _ = _dker_tile(t, kmask, x, smask, inv_sigma)  # (K, S)
            dj = tl.load(dj_ptr + rr[:, None] * (CI * K) + c * K + ks[None, :], mask=rmask[:, None] & kmask[None, :],
                         other=0.0)
            acc = _mma(dj, dker, acc, PRECISION)
    tl.store(out, acc, mask=omask)


@triton.jit
def _epilogue_tile(j_ptr, base, k0, mmask, cpos, cs, K, M, BLOCK_K: tl.constexpr):
    """Columns k0 .. k0 + BLOCK_K of a pair's (M, K) block: values g, normalized p (columns over k,
    normalizers cs), the mixture over m and the k indices."""
    ks = k0 + tl.arange(0, BLOCK_K)
    g = tl.load(j_ptr + base + ks[None, :], mask=mmask[:, None] & (ks < K)[None, :], other=0.0)
    p = tl.where(cpos[:, None], tl.abs(g) / cs[:, None], 0.0)
    return g, p, tl.sum(p, 0) / M, ks


@triton.jit
def _jsd_epilogue(j_ptr, g_ptr, out_ptr, gb_ptr, i0, CI, D, M, K, step: tl.float64,
                  BACKWARD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
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
    s = step / M
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
            dg = tl.where(cpos[:, None], sgn * (gp - step * dot[:, None]) / cs[:, None], 0.0)
            dg = tl.where(i == j, 0.0, tl.where(nan, float("nan"), dg))
            tl.store(g_ptr + base + ks[None, :], dg, mask=msk)
    else:
        jsd = -step * tl.sum(h_mix, 0) + step * tl.sum(h_each, 0) / M
        jsd = tl.where(i == j, 0.0, tl.where(nan, float("nan"), jsd))
        tl.store(out_ptr + j * D + i, jsd)


@triton.jit
def _kz_grad(x_ptr, ci_ptr, gkz_ptr, gx_ptr, gzeta_ptr, N, D, M, inv_sigma: tl.float64,
             BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr):
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
def _cliff_uni_kl(x_ptr, t_ptr, v_ptr, uni_ptr, kl_ptr, guni_ptr, lse_ptr, gu_ptr, N, D, K, KU,
                  inv_sigma: tl.float64, step: tl.float64, log_const: tl.float64, BACKWARD: tl.constexpr,
                  BLOCK_K: tl.constexpr, BLOCK_KU: tl.constexpr, BLOCK_S: tl.constexpr):
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
        tl.store(kl_ptr + i, log_const - tl.sum(tl.where(vmask, lse, 0.0), 0) / KU)


@triton.jit
def _kl_grad(x_ptr, v_ptr, lse_ptr, gk_ptr, gx_ptr, N, D, KU, inv_sigma: tl.float64,
             BLOCK_KU: tl.constexpr, BLOCK_S: tl.constexpr):
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
    tl.store(gx_ptr + ss * D + i, prev - g_kl / KU * tl.sum(sm * u * inv_sigma, 0), mask=smask)


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
    _biv_fwd[(c * nkt, triton.cdiv(dm, b["R"]))](kzt, order, xs, grid, out, i0, n, dm, k, c, nkt, 1.0 / sigma,
                                                 WINDOW.value * sigma, PRECISION=precision, BLOCK_R=b["R"],
                                                 BLOCK_S=b["S"], BLOCK_K=b["K"], num_warps=b["warps"])
    return out


def biv_work_fraction(x: torch.Tensor, a: float, b: float, k: int, sigma: float) -> float:
    """The share of the dense bivariate product's (sample, grid point) work that :func:`_biv_fwd`
    does for standardized latents x (n, d): per latent and k tile, the samples within the window,
    in whole BLOCK_S blocks, over n. Host-side (for tests and benchmarks/RESULTS.md)."""
    n, d = x.shape
    t = torch.linspace(a, b, k, dtype=torch.float64)
    xs = x.detach().double().cpu().t().sort(1).values.contiguous()
    tiles = t.split(GEMM_BLOCKS["K"])
    lo = torch.stack([torch.searchsorted(xs, (tt[0] - WINDOW.value * sigma).expand(d, 1).contiguous()) for tt in tiles])
    hi = torch.stack([torch.searchsorted(xs, (tt[-1] + WINDOW.value * sigma).expand(d, 1).contiguous(), right=True)
                      for tt in tiles])
    bs = GEMM_BLOCKS["S"]
    work = sum(((h - l + bs - 1) // bs * bs * len(tt)).sum().item() for l, h, tt in zip(lo, hi, tiles, strict=True))
    return work / (d * k * n)


def _uni_kl_blocks(k, ku, m):
    block_m = max(16, triton.next_power_of_2(m))
    return {"k": max(16, triton.next_power_of_2(k)), "ku": triton.next_power_of_2(ku), "m": block_m,
            "ke": max(16, min(triton.next_power_of_2(k), 8192 // block_m)), "s": 16}


def _gemm_terms(
    x: torch.Tensor, grid: torch.Tensor, uni_points: torch.Tensor, cond_index: torch.Tensor, sigma: float, step: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, d = x.shape
    k, ku, m = grid.shape[0], uni_points.shape[0], cond_index.shape[1]
    bl = _uni_kl_blocks(k, ku, m)
    uni, kl = x.new_empty(d), x.new_empty(d)
    log_const = -math.log(2 * math.sqrt(3.0)) + math.log(n * sigma) + 0.5 * math.log(2 * math.pi)
    _cliff_uni_kl[(d,)](
        x, grid, uni_points, uni, kl, x, x, x, n, d, k, ku, 1.0 / sigma, step, log_const, BACKWARD=False,
        BLOCK_K=bl["k"], BLOCK_KU=bl["ku"], BLOCK_S=bl["s"],
    )
    jsd = x.new_zeros(d, d)
    precision = _dot_precision(x.dtype)
    x, grid, ci, xs, order, kzt, chunk = _gemm_setup(x, grid, cond_index, sigma)
    for i0 in range(0, d, chunk):
        c = min(chunk, d - i0)
        prod = _biv_chunk(x, grid, xs, order, kzt, i0, c, sigma, precision)
        _jsd_epilogue[(d, c)](prod, prod, jsd, x, i0, c, d, m, k, step, BACKWARD=False, BLOCK_M=bl["m"],
                              BLOCK_K=bl["ke"])
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
        x, grid, uni_points, x, x, g_u, lse, gu, n, d, k, ku, 1.0 / sigma, step, 0.0, BACKWARD=True,
        BLOCK_K=bl["k"], BLOCK_KU=bl["ku"], BLOCK_S=bl["s"],
    )
    precision = _dot_precision(x.dtype)
    x, grid, ci, xs, order, kzt, chunk = _gemm_setup(x, grid, cond_index, sigma)
    b, dm, win = GEMM_BLOCKS, d * m, WINDOW.value * sigma
    gx = torch.empty_like(x)  # through the derivative-kernel tables (uni and biv)
    gkz = x.new_empty(dm, n)
    for i0 in range(0, d, chunk):
        c = min(chunk, d - i0)
        prod = _biv_chunk(x, grid, xs, order, kzt, i0, c, sigma, precision)
        _jsd_epilogue[(d, c)](prod, prod, prod, g_b, i0, c, d, m, k, step, BACKWARD=True,
                              BLOCK_M=bl["m"], BLOCK_K=bl["ke"])  # prod now holds dLoss/dJ
        _biv_dkz[(triton.cdiv(dm, b["R"]), triton.cdiv(n, b["S"]))](
            x, grid, prod, gkz, i0, n, d, dm, k, c, 1.0 / sigma, win, ACCUMULATE=i0 > 0, PRECISION=precision,
            BLOCK_R=b["R"], BLOCK_S=b["S"], BLOCK_K=b["K"], num_warps=b["warps"])
        _biv_dx[(triton.cdiv(n, b["S"]), c)](kzt, order, xs, grid, prod, gu, gx, i0, n, d, dm, k, c, 1.0 / sigma, win,
                                             PRECISION=precision, BLOCK_S=b["S"], BLOCK_R=b["R"] // 2, BLOCK_K=b["K"],
                                             num_warps=b["warps"])
    gxz = torch.empty_like(x)
    nb = triton.cdiv(n, bl["s"])
    gzeta = x.new_empty(nb, d, m)
    _kz_grad[(nb, d)](x, ci, gkz, gxz, gzeta, n, d, m, 1.0 / sigma, BLOCK_M=bl["m"], BLOCK_S=bl["s"])
    # zeta[j, m] = x[cond_index[j, m], j]: scatter its gradient back to the rows (O(d M)). An
    # out-of-range row made zeta NaN in the kernels; clamping keeps the scatter in bounds.
    cols = torch.arange(d, device=x.device)[:, None].expand(d, m)
    gx = (gx + gxz).index_put((ci.clamp(0, n - 1), cols), gzeta.sum(0), accumulate=True)
    _kl_grad[(triton.cdiv(n, bl["s"]), d)](x, uni_points, lse, g_k, gx, n, d, ku, 1.0 / sigma,
                                           BLOCK_KU=bl["ku"], BLOCK_S=bl["s"])
    return gx


# ------------------------------ Cliff, fused path (small tiles): four launches per forward + backward
#
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
MIN_VAR = 1e-12  # standardization: the variance is clamped here (std >= 1e-6), as reference.standardize
SQRT3 = math.sqrt(3.0)


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


# ------------------------------ Cliff launchers (registered as qkernels::cliff_loss_triton and its backward)


def _dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision (:func:`_mma`) for Cliff's bivariate products: float64 exact;
    float32 per torch.get_float32_matmul_precision(): "highest" 3xTF32 ("tf32x3": about float32's own
    error, on the tensor cores), "high" TF32, "medium" bf16 inputs."""
    if dtype == torch.float64:
        return "ieee"
    return {"highest": "tf32x3", "high": "tf32"}.get(torch.get_float32_matmul_precision(), "bf16")


def _fused_blocks(m: int, k: int) -> dict:
    block_m, block_k = max(16, triton.next_power_of_2(m)), max(16, triton.next_power_of_2(k))
    return {"BLOCK_S": 16, "BLOCK_M": block_m, "BLOCK_K": block_k, "num_warps": 8 if block_m * block_k >= 8192 else 4}


def _log_const(n: int, sigma: float) -> float:
    """kl_i = log_const - mean_k lse_k: -log(2 sqrt 3) + log(n sigma sqrt(2 pi))."""
    return -math.log(2 * SQRT3) + math.log(n * sigma) + 0.5 * math.log(2 * math.pi)


def _grids(z, a, b, k):
    return (torch.linspace(a, b, k, dtype=z.dtype, device=z.device),
            torch.linspace(-SQRT3, SQRT3, k, dtype=z.dtype, device=z.device))


def cliff_loss(
    z: torch.Tensor, cond_index: torch.Tensor, sigma: float, a: float, b: float, num_points: int,
    lambda_uni: float, lambda_biv: float, lambda_kl: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    z, ci = z.contiguous(), cond_index.contiguous()
    (n, d), m, k = z.shape, ci.shape[1], num_points
    step = (b - a) / k
    total, uni, biv, kl = (z.new_empty(()) for _ in range(4))
    if fused_fits(n, d, m, k):
        ws = z.new_empty(d * d + 2 * d)
        _cliff_fused_fwd[(d, d)](z, ci, ws, n, d, m, k, a, b, 1.0 / sigma, step, _log_const(n, sigma),
                                 PRECISION=_dot_precision(z.dtype), **_fused_blocks(m, k))
        _cliff_sum[(1,)](ws, total, uni, biv, kl, d, lambda_uni, lambda_biv, lambda_kl, BLOCK=128)
        return total, uni, biv, kl
    t, v = _grids(z, a, b, k)
    terms = _gemm_terms(standardize(z), t, v, ci, sigma, step)
    for out, term in zip((uni, biv, kl), terms, strict=True):
        out.copy_(term)
    total.copy_(lambda_uni * uni + lambda_biv * biv + lambda_kl * kl)
    return total, uni, biv, kl


def cliff_loss_backward(
    grad_total: torch.Tensor | None, grad_uni: torch.Tensor | None, grad_biv: torch.Tensor | None,
    grad_kl: torch.Tensor | None, z: torch.Tensor, cond_index: torch.Tensor, sigma: float, a: float, b: float,
    num_points: int, lambda_uni: float, lambda_biv: float, lambda_kl: float,
) -> torch.Tensor:
    z, ci = z.contiguous(), cond_index.contiguous()
    (n, d), m, k = z.shape, ci.shape[1], num_points
    step = (b - a) / k
    grads = (grad_total, grad_uni, grad_biv, grad_kl)
    if fused_fits(n, d, m, k):
        ws = z.new_empty(2 * d * d * n + d * d * m)
        wsd, wsc, wsz = ws[: d * d * n], ws[d * d * n: 2 * d * d * n], ws[2 * d * d * n:]
        flags = {f"HAS_{c}": g is not None for c, g in zip("TUBK", grads, strict=True)}  # None: no zeros made
        bl = _fused_blocks(m, k)
        gz = torch.empty_like(z)
        _cliff_fused_bwd[(d, d)](z, ci, *(z if g is None else g for g in grads), wsd, wsc, wsz, n, d, m, k, a, b,
                                 1.0 / sigma, step, lambda_uni, lambda_biv, lambda_kl,
                                 PRECISION=_dot_precision(z.dtype), **flags, **bl)
        _cliff_grad[(d,)](z, ci, wsd, wsc, wsz, gz, n, d, m, BLOCK_S=bl["BLOCK_S"], BLOCK_M=bl["BLOCK_M"])
        return gz
    # the GEMM path: terms' gradients and the standardization's backward in torch (large shapes)
    zero = z.new_zeros(())
    g_t, g_u, g_b, g_k = (zero if g is None else g.to(z.dtype).reshape(()) for g in grads)
    t, v = _grids(z, a, b, k)
    x = standardize(z)
    gx = _gemm_terms_backward(lambda_uni * g_t + g_u, lambda_biv * g_t + g_b, lambda_kl * g_t + g_k, x, t, v, ci,
                              sigma, step)
    var = torch.var(z, 0, correction=0)
    std = var.clamp_min(MIN_VAR).sqrt()
    gxm = torch.where(var >= MIN_VAR, (gx * x).mean(0), 0.0)
    return (gx - gx.mean(0) - x * gxm) / std
