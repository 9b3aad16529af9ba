"""Tripod's KLM on Triton: ``klm`` and ``klm_backward`` (the ops ``qkernels::klm_triton`` and
``klm_backward_triton``), KeOps-shaped: each row b of the samples is held in registers by its own threads
(its d scaled values and d marginal sums), the samples a streamed past it; never an (n, n) or (n, n, d) tensor.
Launches: 2 forward (prologue, pairs), 3 backward (prologue, pairs, chain).

Issue 53's shape, from the arithmetic: 4096 x 64 is ~1.07e9 Gaussians per pass, bound by the SFU's exponentials
(~0.26 ms per pass on an H100), not by its ~2 MB of data. The earlier kernel (symmetric (8 x 8 x 64) tiles,
gpu/experiments/klm_symmetric.py) reduced every tile across threads three ways and took 4.2 ms forward + backward on
an H200. Here no reduction crosses a thread in the pair loop but the joint exponent's, over the 2-4 threads of a
row when d > 32 (1-2 shuffles a pair); the price is visiting each ordered pair, not each unordered pair, once.

- ``_klm_prologue`` (grid: latent blocks): the std (given, or z's population std + 1e-6) and the transposed,
  scaled samples u = z / std c (d, n), c = sqrt(log2(e) / 2) in float32 (the Gaussians are exp2(-du^2), the SFU's
  instruction), sqrt(1 / 2) in float64 (exp(-du^2)); backward also exp(-lse) transposed (d + 1, n).
- ``_klm_pairs`` (grid: row blocks x SPLIT ranges of a): program (i, s) adds, for the rows b of block i, over the
  samples a of range s: forward the d marginal kernels and the joint one; backward the gradient terms. Their
  layout (d values down a row's threads, rows across the warp, one warp a program) follows from the loads and
  stores of the (d, n) tables, whose row stride is not specialized (``NS``): Triton then neither vectorizes along
  the rows nor spreads a row over the warps. The last of a row block's programs to finish (an arrival ticket,
  :mod:`qkernels.triton._tickets`) adds its ranges' partials in range order; forward, the last row block adds the
  loss partials in block order: deterministic.
- ``_klm_chain`` (backward): dLoss/dz through y = z / std and the default std.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from qkernels.reference.kde import silverman_factor
from qkernels.triton import _tickets
from qkernels.triton._grid import cdiv, min_programs, next_pow2
from qkernels.triton._tickets import last_to_arrive

LOG2E = 1.4426950408889634
WARP = 32  # threads of a _klm_pairs program (one warp)
KLM_ROW_VALUES = 32  # float32 latents a thread holds of its row, forward (above: 2, 4, ... threads a row)
KLM_MIN_SPAN = 64  # samples a at least per program (the row block's loads and partials amortized over them)
KLM_PROGRAMS_PER_SM = 16  # one-warp programs wanted per SM (resident on sm_90: 14 at 142 registers, 21 at 96)
KLM_STEP_VALUES = 4096  # values a load step of the prologue's passes and of the reductions over row blocks: each
# step is a round trip to L2 or HBM, and these loops are short of other work (the symmetric kernel's 8-row steps
# cost ~120 us a kernel at 4096 x 64 on the H200)
KLM_CHAIN_ROWS = 16  # rows of z per program of the chain
KLM_PROLOGUE_COLS = 4  # latents per program of the prologue


def _klm_plan(z: torch.Tensor, backward: bool) -> tuple[int, int, int, int]:
    """(BLOCK_B rows, BLOCK_D, SPLIT samples a per program, ranges S) of ``_klm_pairs`` for z (n, d): a warp's
    threads over BLOCK_B rows x BLOCK_D / KLM_ROW_VALUES threads per row; ranges enough for KLM_PROGRAMS_PER_SM programs
    per SM where each still spans KLM_MIN_SPAN samples (the last range may be shorter)."""
    n, d = z.shape
    block_d = next_pow2(d)
    # float64: half as many (two registers each); backward: half as many (five (d,) arrays a row, not three)
    values = max(1, KLM_ROW_VALUES * 4 // z.element_size() // (2 if backward else 1))
    block_b = max(2, WARP // max(1, block_d // values))
    blocks = cdiv(n, block_b)
    want = cdiv(min_programs(z) // 2 * KLM_PROGRAMS_PER_SM, blocks)
    ranges = max(1, min(want, n // KLM_MIN_SPAN))
    split = cdiv(n, ranges)
    return block_b, block_d, split, cdiv(n, split)


@triton.jit
def _gauss(s):
    """The Gaussian of a scaled square: exp2(-s) in float32 (u scaled by sqrt(log2(e) / 2)), exp(-s) in float64."""
    if s.dtype == tl.float32:
        return tl.exp2(-s)
    return tl.exp(-s)


@triton.jit
def _klm_prologue(
    z_ptr,
    std_ptr,
    lse_ptr,
    stat_ptr,
    ut_ptr,
    et_ptr,
    N,
    D,
    c: tl.float64,
    HAS_STD: tl.constexpr,
    BACKWARD: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Program j: latents [j BLOCK_C, (j + 1) BLOCK_C): stat[:, cols] = (std, mean, var) (mean and var 0 with a
    given std), ut[cols] = (z / std c)^T; BACKWARD also et[1 + cols] = exp(-lse[:, 1 + cols])^T and, program 0,
    et[0] = exp(-lse[:, 0])."""
    dt = z_ptr.dtype.element_ty
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < D
    if HAS_STD:
        std = tl.load(std_ptr + cols, mask=cmask, other=1.0)
        mean = tl.zeros((BLOCK_C,), dt)
        var = tl.zeros((BLOCK_C,), dt)
    else:
        acc = tl.zeros((ROWS, BLOCK_C), dt)
        for r0 in range(0, N, ROWS):
            rows = r0 + tl.arange(0, ROWS)
            m = (rows < N)[:, None] & cmask[None, :]
            acc += tl.load(z_ptr + rows[:, None] * D + cols[None, :], mask=m, other=0.0)
        mean = tl.sum(acc, 0) / N
        acc = tl.zeros((ROWS, BLOCK_C), dt)
        for r0 in range(0, N, ROWS):
            rows = r0 + tl.arange(0, ROWS)
            m = (rows < N)[:, None] & cmask[None, :]
            dev = tl.where(
                m, tl.load(z_ptr + rows[:, None] * D + cols[None, :], mask=m, other=0.0) - mean[None, :], 0.0
            )
            acc += dev * dev
        var = tl.sum(acc, 0) / N
        pos = var > 0
        std = tl.where(pos, tl.sqrt(tl.where(pos, var, 1.0)), 0.0) + tl.full((), 1e-6, dt)
    tl.store(stat_ptr + cols, std, mask=cmask)
    tl.store(stat_ptr + D + cols, mean, mask=cmask)
    tl.store(stat_ptr + 2 * D + cols, var, mask=cmask)
    scale = tl.full((), c, dt) / std
    for r0 in range(0, N, ROWS):
        rows = r0 + tl.arange(0, ROWS)
        rmask = rows < N
        m = rmask[:, None] & cmask[None, :]
        x = tl.load(z_ptr + rows[:, None] * D + cols[None, :], mask=m, other=0.0)
        tl.store(ut_ptr + cols[None, :] * N + rows[:, None], x * scale[None, :], mask=m)
        if BACKWARD:
            lm = tl.load(lse_ptr + rows[:, None] * (D + 1) + 1 + cols[None, :], mask=m, other=0.0)
            tl.store(et_ptr + (1 + cols[None, :]) * N + rows[:, None], tl.exp(-lm), mask=m)
            if tl.program_id(0) == 0:
                lj = tl.load(lse_ptr + rows * (D + 1), mask=rmask, other=0.0)
                tl.store(et_ptr + rows, tl.exp(-lj), mask=rmask)


@triton.jit(do_not_specialize=["NS"])
def _klm_pairs(
    ut_ptr,
    et_ptr,
    ws_ptr,
    lse_ptr,
    part_ptr,
    out_ptr,
    g_ptr,
    NS,
    N,
    D,
    SPLIT,
    S,
    R,
    inv_f2: tl.float64,
    out_scale: tl.float64,
    const: tl.float64,
    cnt_ptr,
    BACKWARD: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Program (i, s): rows b of block i against samples a of range s, partials to ws[s, :, rows] (NS = N, the
    tables' row stride, unspecialized). Forward: ws[s, j] = sum_a exp(-du_baj^2) for each latent j and ws[s, D] =
    sum_a exp(-|du_ba|^2 / f^2); the range's last program writes lse's rows and part[i] = sum_b (lse[b, 0] -
    sum_j lse[b, 1 + j]), the last block out = sum_i part[i] out_scale + const (BLOCK_R partials a step;
    out_scale = 1 / N: no division). Backward: ws[s, j] = sum_a [(Pj_ba + Pj_ab) - (P_ba + P_ab) / f^2] du_baj
    (P: the softmaxes of the forward's kernels, from et); the last program writes out[b, j] = g out_scale ws-sum
    (dLoss/dy, out_scale = 1 / (N c)) and part[i, j] = sum_b out[b, j] y_bj."""
    dt = ut_ptr.dtype.element_ty
    pid_b, pid_s = tl.program_id(0), tl.program_id(1)
    rows = pid_b * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_D)
    rmask, cmask = rows < N, cols < D
    tile = cols[:, None] * NS + rows[None, :]  # (BLOCK_D, BLOCK_B) offsets in a (d, n) table
    m2 = cmask[:, None] & rmask[None, :]
    ub = tl.load(ut_ptr + tile, mask=m2, other=0.0)
    f2 = tl.full((), inv_f2, dt)
    a0 = pid_s * SPLIT
    a1 = tl.minimum(a0 + SPLIT, N)
    part_ws = ws_ptr + pid_s * (D + 1) * NS
    if BACKWARD:
        elb = tl.load(et_ptr + rows, mask=rmask, other=0.0)
        eltb = tl.load(et_ptr + NS + tile, mask=m2, other=0.0)
        acc = tl.zeros((BLOCK_D, BLOCK_B), dt)
        ua = tl.load(ut_ptr + cols * NS + a0, mask=cmask, other=0.0)
        elta = tl.load(et_ptr + (1 + cols) * NS + a0, mask=cmask, other=0.0)
        ela = tl.load(et_ptr + a0)
        for a in range(a0, a1):
            # the next step's loads issued before this step's exponentials (their latency hidden behind them); the
            # last step's next sample is clamped to a valid one, loaded and not used
            nxt = tl.minimum(a + 1, N - 1)
            next_ua = tl.load(ut_ptr + cols * NS + nxt, mask=cmask, other=0.0)
            next_elta = tl.load(et_ptr + (1 + cols) * NS + nxt, mask=cmask, other=0.0)
            next_ela = tl.load(et_ptr + nxt)
            du = ub - ua[:, None]
            sq = du * du
            wj = _gauss(tl.sum(sq, 0) * f2) * (elb + ela) * f2
            # Pj_ba + Pj_ab = exp(-du^2) (1 / M_bj + 1 / M_aj): one accumulator; 6 flops a value (the joint sum's
            # add included) and one exponential
            acc += (_gauss(sq) * (eltb + elta[:, None]) - wj[None, :]) * du
            ua, elta, ela = next_ua, next_elta, next_ela
        tl.store(part_ws + tile, acc, mask=m2)
    else:
        msum = tl.zeros((BLOCK_D, BLOCK_B), dt)
        jsum = tl.zeros((BLOCK_B,), dt)
        ua = tl.load(ut_ptr + cols * NS + a0, mask=cmask, other=0.0)
        for a in range(a0, a1):
            next_ua = tl.load(ut_ptr + cols * NS + tl.minimum(a + 1, N - 1), mask=cmask, other=0.0)  # as backward
            du = ub - ua[:, None]
            ua = next_ua
            sq = du * du
            msum += _gauss(sq)
            jsum += _gauss(tl.sum(sq, 0) * f2)
        tl.store(part_ws + tile, msum, mask=m2)
        tl.store(part_ws + D * NS + rows, jsum, mask=rmask)
    if last_to_arrive(cnt_ptr + pid_b, S):
        acc = tl.zeros((BLOCK_D, BLOCK_B), dt)
        jacc = tl.zeros((BLOCK_B,), dt)
        for s in range(0, S):
            base = ws_ptr + s * (D + 1) * NS
            acc += tl.load(base + tile, mask=m2, other=0.0, cache_modifier=".cg")
            if not BACKWARD:
                jacc += tl.load(base + D * NS + rows, mask=rmask, other=0.0, cache_modifier=".cg")
        if BACKWARD:
            gy = tl.where(m2, acc * (tl.load(g_ptr).to(dt) * tl.full((), out_scale, dt)), 0.0)
            tl.store(out_ptr + rows[None, :] * D + cols[:, None], gy, mask=m2)
            # y = u / c = u N out_scale
            tl.store(part_ptr + pid_b * D + cols, tl.sum(gy * ub, 1) * (N * tl.full((), out_scale, dt)), mask=cmask)
        else:
            lj = tl.log(tl.where(rmask, jacc, 1.0))
            lm = tl.log(tl.where(m2, acc, 1.0))
            tl.store(lse_ptr + rows * (D + 1), lj, mask=rmask)
            tl.store(lse_ptr + rows[None, :] * (D + 1) + 1 + cols[:, None], lm, mask=m2)
            tl.store(part_ptr + pid_b, tl.sum(lj - tl.sum(lm, 0), 0))
            if last_to_arrive(cnt_ptr + R, R):
                total = tl.zeros((BLOCK_R,), dt)
                for i0 in range(0, R, BLOCK_R):
                    ii = i0 + tl.arange(0, BLOCK_R)
                    total += tl.load(part_ptr + ii, mask=ii < R, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr, tl.sum(total, 0) * tl.full((), out_scale, dt) + tl.full((), const, dt))


@triton.jit
def _klm_chain(
    z_ptr,
    stat_ptr,
    gz_ptr,
    part_ptr,
    gstd_ptr,
    N,
    D,
    P,
    HAS_STD: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PART_ROWS: tl.constexpr,
):
    """z = y std: dz = dy / std, dstd_j = -sum_b dy_bj y_bj / std_j (part's P rows, PART_ROWS a step, added in a
    fixed order); the default std adds dstd_j (z_bj - mean_j) / (N sqrt(var_j)) (0 where var_j = 0). gz holds
    dLoss/dy on entry and dLoss/dz on exit; program 0 writes dLoss/dstd (given std)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    m = (rows < N)[:, None] & cmask[None, :]
    std = tl.load(stat_ptr + cols, mask=cmask, other=1.0)
    acc = tl.zeros((PART_ROWS, BLOCK_D), std.dtype)
    for p0 in range(0, P, PART_ROWS):
        ps = p0 + tl.arange(0, PART_ROWS)
        acc += tl.load(part_ptr + ps[:, None] * D + cols[None, :], mask=(ps < P)[:, None] & cmask[None, :], other=0.0)
    s = tl.sum(acc, 0)
    gstd = -s / std
    offs = rows[:, None] * D + cols[None, :]
    gz = tl.load(gz_ptr + offs, mask=m, other=0.0) / std[None, :]
    if HAS_STD:
        if tl.program_id(0) == 0:
            tl.store(gstd_ptr + cols, gstd, mask=cmask)
    else:
        mean = tl.load(stat_ptr + D + cols, mask=cmask, other=0.0)
        var = tl.load(stat_ptr + 2 * D + cols, mask=cmask, other=0.0)
        pos = var > 0
        dstd = tl.where(pos, gstd / (N * tl.sqrt(tl.where(pos, var, 1.0))), 0.0)
        gz += dstd[None, :] * (tl.load(z_ptr + offs, mask=m, other=0.0) - mean[None, :])
    tl.store(gz_ptr + offs, gz, mask=m)


def _scale(z: torch.Tensor) -> float:
    """c of u = z / std c: sqrt(log2(e) / 2) in float32 (exp2), sqrt(1 / 2) in float64 (exp)."""
    return math.sqrt((LOG2E if z.dtype == torch.float32 else 1.0) / 2)


def _prologue(z, std, lse):
    """(stat (3, d), ut (d, n), et (d + 1, n) or None): one launch."""
    n, d = z.shape
    stat = z.new_empty(3, d)
    ut = z.new_empty(d, n)
    et = None if lse is None else z.new_empty(d + 1, n)
    _klm_prologue[(cdiv(d, KLM_PROLOGUE_COLS),)](
        z,
        z if std is None else std,
        z if lse is None else lse,
        stat,
        ut,
        ut if et is None else et,
        n,
        d,
        _scale(z),
        HAS_STD=std is not None,
        BACKWARD=lse is not None,
        ROWS=KLM_STEP_VALUES // KLM_PROLOGUE_COLS,
        BLOCK_C=KLM_PROLOGUE_COLS,
    )
    return stat, ut, et


def _pairs(z, ut, et, lse, part, out, g, backward):
    n, d = z.shape
    block_b, block_d, split, ranges = _klm_plan(z, backward)
    blocks = cdiv(n, block_b)
    f = silverman_factor(n, d)
    ws = z.new_empty(ranges * (d + 1) * n)
    _tickets.launch(
        _klm_pairs,
        (blocks, ranges),
        blocks + 1,
        ut,
        ut if et is None else et,
        ws,
        lse,
        part,
        out,
        g,
        n,
        n,
        d,
        split,
        ranges,
        blocks,
        1.0 / (f * f),
        1.0 / (n * _scale(z)) if backward else 1.0 / n,
        (d - 1) * math.log(n) - d * math.log(f),
        BACKWARD=backward,
        BLOCK_B=block_b,
        BLOCK_D=block_d,
        BLOCK_R=min(next_pow2(blocks), KLM_STEP_VALUES),
        num_warps=1,
    )


def klm(z: torch.Tensor, std: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss (), lse (n, d + 1)) as :func:`qkernels.reference.kde.klm`: 2 launches."""
    z = z.contiguous()
    std = None if std is None else std.contiguous()
    n, d = z.shape
    _, ut, _ = _prologue(z, std, None)
    lse = z.new_empty(n, d + 1)
    loss = z.new_empty(())
    block_b = _klm_plan(z, False)[0]
    _pairs(z, ut, None, lse, z.new_empty(cdiv(n, block_b)), loss, loss, False)
    return loss, lse


def klm_backward(
    grad_loss: torch.Tensor, z: torch.Tensor, std: torch.Tensor | None, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dLoss/dz (n, d), dLoss/dstd (d,), empty without std): 3 launches."""
    z, lse = z.contiguous(), lse.contiguous()
    std = None if std is None else std.contiguous()
    n, d = z.shape
    stat, ut, et = _prologue(z, std, lse)
    blocks = cdiv(n, _klm_plan(z, True)[0])
    part = z.new_empty(blocks, d)
    gz = torch.empty_like(z)
    _pairs(z, ut, et, lse, part, gz, grad_loss, True)
    gstd = z.new_empty(0 if std is None else d)
    _klm_chain[(cdiv(n, KLM_CHAIN_ROWS),)](
        z,
        stat,
        gz,
        part,
        gstd,
        n,
        d,
        blocks,
        HAS_STD=std is not None,
        ROWS=KLM_CHAIN_ROWS,
        BLOCK_D=next_pow2(d),
        PART_ROWS=max(1, min(next_pow2(blocks), KLM_STEP_VALUES // next_pow2(d))),
    )
    return gz, gstd
