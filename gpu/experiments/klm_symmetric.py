"""The Triton KLM before issue 53's KeOps-shaped kernels (main at 62aab71), kept for one GPU A/B only.

Flash-style over symmetric (8 x 8 x 64 at d = 64) tiles of sample pairs, each unordered pair once; 6 launches per
forward + backward (3 each way). 4.16 ms forward + backward at 4096 x 64 on an H200 (2026-11-27).
gpu/gpu_check_ops.py's ``speed`` step times it as the variant ``triton_symmetric`` beside the package's ``triton``:
:func:`patched` makes ``qkernels.klm_loss`` run it, so both variants pay the same host path (validation, backend
choice, autograd node). Delete this file once a GPU run has measured both.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

import qkernels.ops.kde as ops_kde
from qkernels.reference.kde import silverman_factor
from qkernels.triton._grid import cdiv, next_pow2

# Flash-style and symmetric: the kernel matrices are symmetric, so each pair of sample
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
    """Rows per super-block: about n / 32 (nsb ~ 32 super-blocks, nsb (nsb + 1) / 2 ~ 528 programs: two per SM
    of an H100 from n = 1024 on; was n / 16, 136 programs), a power of 2 between BLOCK_B and KLM_SUPER."""
    return min(KLM_SUPER, max(block, next_pow2(cdiv(n, 32))))


def _scale_rows(block_d: int) -> int:
    """Rows of z per step of the std's two passes (every kernel computes the std itself): ~4096 values per load.
    Each step is one round trip to L2; at 8 rows (the pair tile's) the H200 spent ~120 us per kernel on them at
    4096 x 64 (_klm_grad 126 us, _klm_bwd_rows 218 us, against 9 us for _klm_fwd_rows, which has none)."""
    return max(8, 4096 // block_d)


def _klm_blocks(d: int) -> tuple[int, int, int]:
    """(BLOCK_B rows, BLOCK_A streamed samples, BLOCK_D latents): the pair tile is B x A x D."""
    block_d = next_pow2(d)
    block = 32 if block_d <= 4 else 16 if block_d <= 16 else 8  # B * A * D <= 4096 up to d = 64
    return block, block, block_d


@triton.jit
def _klm_scale(z_ptr, std_ptr, cols, cmask, N, D, HAS_STD: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr):
    """(std, mean, var) of the latent columns ``cols``: std given (mean and var then 0: not read), or z's population
    std + 1e-6 (two passes over z, BLOCK_A rows per step)."""
    dt = z_ptr.dtype.element_ty
    if HAS_STD:
        zero = tl.zeros((BLOCK_D,), dt)
        return tl.load(std_ptr + cols, mask=cmask, other=1.0), zero, zero
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
def _ws_offsets(p, q, r0, NSB, W, SUPER: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):
    """Offsets of ws[p, q, r0:r0 + BLOCK]: (BLOCK, BLOCK_D) marginal columns and (BLOCK,) the joint one (W - 1)."""
    rows = ((p * NSB + q) * SUPER + r0 + tl.arange(0, BLOCK)) * W
    return rows[:, None] + tl.arange(0, BLOCK_D)[None, :], rows + W - 1


@triton.jit
def _ws_load(
    ws_ptr,
    p,
    q,
    r0,
    NSB,
    W,
    cmask,
    JOINT: tl.constexpr,
    SUPER: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """ws[p, q, r0:r0 + BLOCK]: (msum (BLOCK, BLOCK_D), jsum (BLOCK,); 0 without JOINT)."""
    offs, joint = _ws_offsets(p, q, r0, NSB, W, SUPER, BLOCK, BLOCK_D)
    msum = tl.load(ws_ptr + offs, mask=cmask[None, :], other=0.0)
    jsum = tl.zeros((BLOCK,), ws_ptr.dtype.element_ty)
    if JOINT:
        jsum = tl.load(ws_ptr + joint)
    return msum, jsum


@triton.jit
def _ws_store(
    ws_ptr, p, q, r0, NSB, W, msum, jsum, cmask, JOINT: tl.constexpr, SUPER: tl.constexpr, BLOCK: tl.constexpr
):
    """ws[p, q, r0:r0 + BLOCK] = [msum (BLOCK, d) | jsum (BLOCK,) if JOINT]."""
    offs, joint = _ws_offsets(p, q, r0, NSB, W, SUPER, BLOCK, msum.shape[1])
    tl.store(ws_ptr + offs, msum, mask=cmask[None, :])
    if JOINT:
        tl.store(ws_ptr + joint, jsum)


@triton.jit
def _klm_tiles(
    z_ptr,
    std_ptr,
    lse_ptr,
    ws_ptr,
    N,
    D,
    NSB,
    c_joint: tl.float64,
    c2_joint: tl.float64,
    c2_marg: tl.float64,
    inv_f2: tl.float64,
    BACKWARD: tl.constexpr,
    HAS_STD: tl.constexpr,
    SUPER: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
):
    """Program t of the lower triangle of super-block pairs, (p, q) with q <= p, t = p (p + 1) / 2 + q (the
    grid launches no idle program): for every row b of super-block p and sample a of q,
    forward: ws[p, q, b] = [sum_a exp(-(y_bj - y_aj)^2 / 2) for each j | sum_a exp(c_joint |y_b - y_a|^2)]
    (W = d + 1); BACKWARD: ws[p, q, b, j] = sum_a [-(P_ba + P_ab) / f^2 + (Pj_ba + Pj_ab)] (y_bj - y_aj)
    (W = d) with the joint softmax P_ba = exp(J_ba - L_b) and the per-latent ones Pj_ba from the
    forward's lse. For q < p also ws[q, p] (the tiles' column sums, the terms being symmetric)."""
    t = tl.program_id(0)
    p = ((tl.sqrt((8 * t + 1).to(tl.float32)) - 1.0) * 0.5).to(tl.int32)  # then exact in integers
    p = tl.where(p * (p + 1) // 2 > t, p - 1, p)
    p = tl.where((p + 1) * (p + 2) // 2 <= t, p + 1, p)
    q = t - p * (p + 1) // 2
    if q <= p:
        dt = z_ptr.dtype.element_ty
        cj, cj2, cm2, if2 = (
            tl.full((), c_joint, dt),
            tl.full((), c2_joint, dt),
            tl.full((), c2_marg, dt),
            tl.full((), inv_f2, dt),
        )
        cols = tl.arange(0, BLOCK_D)
        cmask = cols < D
        std, _, _ = _klm_scale(z_ptr, std_ptr, cols, cmask, N, D, HAS_STD, SCALE_ROWS, BLOCK_D)
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
                # off the diagonal the tile's column sums are rows a's (antisymmetric backward), added to what earlier
                # row blocks left in ws[q, p, a0] (the diagonal super-block's: the row sums of row block a0). That
                # value is loaded before the tile's exponentials, so that its latency hides behind them, and stored
                # after: no barrier per tile, one per row block (below)
                cols_a = (q < p) | (a0 < b0)
                prev_m = tl.zeros((BLOCK, BLOCK_D), dt)
                prev_j = tl.zeros((BLOCK,), dt)
                if cols_a & (b0 > 0):
                    prev_m, prev_j = _ws_load(ws_ptr, q, p, a0, NSB, w, cmask, not BACKWARD, SUPER, BLOCK, BLOCK_D)
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
                    elta = tl.exp(-tl.load(lse_ptr + rows_a[:, None] * (D + 1) + 1 + cols[None, :], mask=ma, other=0.0))
                    wj = -ej * (elb[:, None] + ela[None, :]) * if2
                    em = (wj[:, :, None] + em * (eltb[:, None, :] + elta[None, :, :])) * diff
                msum += tl.sum(em, 1)
                jsum += tl.sum(ej, 1)
                if cols_a:
                    cm = tl.sum(em, 0)
                    _ws_store(
                        ws_ptr,
                        q,
                        p,
                        a0,
                        NSB,
                        w,
                        prev_m + (-cm if BACKWARD else cm),
                        prev_j + tl.sum(ej, 0),
                        cmask,
                        not BACKWARD,
                        SUPER,
                        BLOCK,
                    )
            _ws_store(ws_ptr, p, q, b0, NSB, w, msum, jsum, cmask, not BACKWARD, SUPER, BLOCK)
            tl.debug_barrier()  # this row block's stores before the next one's loads (a value's threads may differ)


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
def _klm_fwd_rows(
    ws_ptr, lse_ptr, part_ptr, N, D, NSB, SUPER: tl.constexpr, BLOCK: tl.constexpr, BLOCK_D: tl.constexpr
):
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
def _klm_bwd_rows(
    z_ptr,
    std_ptr,
    ws_ptr,
    g_ptr,
    gy_ptr,
    part_ptr,
    N,
    D,
    NSB,
    HAS_STD: tl.constexpr,
    SUPER: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
):
    """gy[b] = dLoss/dy_b = g / n times the row sums of the backward tiles; part[program, j] =
    sum_b gy_bj y_bj over this block of rows. Grid (n / BLOCK,)."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, BLOCK_D)
    rmask, cmask = rows < N, cols < D
    mb = rmask[:, None] & cmask[None, :]
    acc, _ = _ws_rows(ws_ptr, rows, cols, cmask, NSB, D, SUPER, BLOCK, BLOCK_D)
    std, _, _ = _klm_scale(z_ptr, std_ptr, cols, cmask, N, D, HAS_STD, SCALE_ROWS, BLOCK_D)
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
    z_ptr,
    std_ptr,
    gz_ptr,
    part_ptr,
    gstd_ptr,
    N,
    D,
    P,
    HAS_STD: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_D: tl.constexpr,
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
    if backward and z.dtype == torch.float64 and block * block * block_d > 2048:
        block //= 2  # the float64 backward's pair tile spilled registers on sm_90 at 32 x 32 x 4
    sup = _klm_super(n, block)
    nsb = cdiv(n, sup)
    ws = z.new_empty(nsb * nsb * sup * (d if backward else d + 1))
    c_joint = -0.5 / (f * f)
    _klm_tiles[(nsb * (nsb + 1) // 2,)](
        z,
        z if std is None else std,
        lse,
        ws,
        n,
        d,
        nsb,
        c_joint,
        c_joint * LOG2E,
        -0.5 * LOG2E,
        1.0 / (f * f),
        BACKWARD=backward,
        HAS_STD=std is not None,
        SUPER=sup,
        BLOCK=block,
        BLOCK_D=block_d,
        SCALE_ROWS=_scale_rows(block_d),
    )
    return ws, nsb, sup, block, block_d


def klm(z: torch.Tensor, std: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    z = z.contiguous()
    std = None if std is None else std.contiguous()
    n, d = z.shape
    lse = z.new_empty(n, d + 1)
    ws, nsb, sup, block, block_d = _klm_launch(z, std, lse, False)
    grid = (cdiv(n, block),)
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
    grid = (cdiv(n, block),)
    gz = torch.empty_like(z)
    part = z.new_empty(grid[0], d)
    gstd = z.new_empty(0 if std is None else d)
    s = z if std is None else std
    _klm_bwd_rows[grid](
        z,
        s,
        ws,
        grad_loss,
        gz,
        part,
        n,
        d,
        nsb,
        HAS_STD=std is not None,
        SUPER=sup,
        BLOCK=block,
        BLOCK_D=block_d,
        SCALE_ROWS=_scale_rows(block_d),
    )
    _klm_grad[grid](
        z,
        s,
        gz,
        part,
        gstd,
        n,
        d,
        grid[0],
        HAS_STD=std is not None,
        BLOCK_B=block,
        BLOCK_A=_scale_rows(block_d),
        BLOCK_D=block_d,
    )
    return gz, gstd


class _Node(torch.autograd.Function):
    """These launch functions behind one autograd node, as qkernels.ops._library.thin_autograd runs a Triton op."""

    @staticmethod
    def forward(ctx, z, std):
        with torch._C._AutoDispatchBelowAutograd():
            loss, lse = klm(z, std)
        ctx.save_for_backward(z, std, lse)
        ctx.set_materialize_grads(False)
        return loss, lse

    @staticmethod
    def backward(ctx, grad_loss, _grad_lse):
        z, std, lse = ctx.saved_tensors
        with torch._C._AutoDispatchBelowAutograd():
            gz, gstd = klm_backward(grad_loss, z, std, lse)
        return gz, (gstd if std is not None else None)


def _impl(z, std):
    if torch.is_grad_enabled() and (z.requires_grad or (std is not None and std.requires_grad)):
        return _Node.apply(z, std)
    return klm(z, std)


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Inside: ``qkernels.klm_loss`` runs these kernels (whatever backend is chosen; CUDA or interpreted tensors)."""
    select = ops_kde.select

    def pick(op, *args, **kwargs):
        return ("triton", _impl) if op == "klm" else select(op, *args, **kwargs)

    ops_kde.select = pick
    try:
        yield
    finally:
        ops_kde.select = select
