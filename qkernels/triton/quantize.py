"""Triton kernels of the quantization hot path and their launch functions (registered as the ops
``qkernels::*_triton`` by :mod:`qkernels.ops.quantize`, which also checks their arguments).

Same math as csrc/include/qkernels/quantize.h. Reductions over samples (losses, codebook
gradients) are deterministic: each program of a tile kernel writes its partial sums to a
workspace, and they are added in a fixed order, by the last program of the same launch to finish
(latent_quantize: :mod:`qkernels.triton._tickets`) or by :func:`_sum_rows` (one program per block
of columns, a second launch).

Launches per call (forward + backward):

- ``latent_quantize``: 1 + 1. Forward: the nearest value, z_q, indices and both losses. Backward:
  grad_z and grad_values = grad_loss_quantize 2 / (N d) sum over each value's elements of
  (z_q - z) = 2 / (N d) (count v - sum of z), each program binning its tiles' elements by index
  (the declared backward op takes z, values and indices, not the forward's bins);
- ``relaxed_categorical``: 1 + 2 (the backward's codebook gradient is reduced by a second kernel);
- ``gumbel_quantize``: 1 + 2, the relaxed_categorical kernels with ``FROM_Z``: the logits
  -(z - values)^2 are computed in the kernels instead of read.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from qkernels.triton import _tickets
from qkernels.triton._grid import cdiv, min_programs, next_pow2
from qkernels.triton._tickets import last_to_arrive

LQ_ROWS, LQ_BLOCK_D = 16, 16  # latent_quantize: rows a step x latents per program
LQ_UNROLL = 4  # latent_quantize forward: codebook values a step of its scan (their loads issued together)
LQ_BLOCK_V = 64  # latent_quantize backward: codebook values per pass of its codebook-gradient sums
LQ_FWD_PER_SM, LQ_BWD_PER_SM = 8, 2  # programs per SM (the forward's partials are one number each)
LQ_LOSS_STEP = 1024  # latent_quantize forward: loss partials added a step
LQ_GRAD_STEP = 32768  # latent_quantize backward: bytes of codebook partials loaded a step, at most this many ...
LQ_GRAD_COLS, LQ_GRAD_ROWS = 512, 128  # ... columns x rows (programs)
BLOCK_R = 32  # relaxed_categorical forward: rows of K categories per program
BLOCK_S = 32  # relaxed_categorical backward: rows (samples of one latent, per-latent codebooks) per program, ...
CATEGORICAL_TILE = 1024  # ... at most this many (rows x categories) per program (more spill registers on sm_90)
SUM_ROWS, SUM_COLS = 32, 64  # _sum_rows: rows added per step, most columns per program


@triton.jit
def _sum_rows(
    part_ptr,
    out_ptr,
    out2_ptr,
    g_ptr,
    R,
    C,
    scale: tl.float64,
    HAS_G: tl.constexpr,
    SECOND: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """out[c] = sum_r part[r, c] * scale (* g[0] when HAS_G; also into out2[c] when SECOND).

    part is (R, C) row-major; program i owns columns [i BLOCK_C, (i + 1) BLOCK_C) and adds the rows
    in a fixed order: the same bits on every run."""
    dt = out_ptr.dtype.element_ty
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    acc = tl.zeros((BLOCK_R, BLOCK_C), dt)
    for r0 in range(0, R, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        m = (rows[:, None] < R) & cmask[None, :]
        acc += tl.load(part_ptr + rows[:, None] * C + cols[None, :], mask=m, other=0.0).to(dt)
    s = tl.full((), scale, dt)
    if HAS_G:
        s = tl.load(g_ptr).to(dt) * s
    total = tl.sum(acc, 0) * s
    tl.store(out_ptr + cols, total, mask=cmask)
    if SECOND:
        tl.store(out2_ptr + cols, total, mask=cmask)


def _sum_rows_launch(
    part: torch.Tensor,
    out: torch.Tensor,
    rows: int,
    cols: int,
    scale: float,
    g: torch.Tensor | None = None,
    out2: torch.Tensor | None = None,
) -> None:
    """Launch :func:`_sum_rows` on the contiguous workspace ``part`` viewed as (rows, cols)."""
    block_c = min(max(next_pow2(cols), 16), SUM_COLS)
    _sum_rows[(cdiv(cols, block_c),)](
        part,
        out,
        out if out2 is None else out2,
        out if g is None else g,
        rows,
        cols,
        scale,
        HAS_G=g is not None,
        SECOND=out2 is not None,
        BLOCK_R=SUM_ROWS,
        BLOCK_C=block_c,
    )


@triton.jit
def _lq_rows(pid_n, N, rows_per_program):
    """The rows [start, end) of row program pid_n."""
    start = pid_n * rows_per_program
    return start, tl.minimum(start + rows_per_program, N)


@triton.jit
def _lq_tile(r0, end, cols, cmask, D, ROWS: tl.constexpr):
    """Element mask and offsets of the (ROWS, BLOCK_D) tile of rows [r0, r0 + ROWS) (those before ``end``)."""
    rows = r0 + tl.arange(0, ROWS)
    mask = (rows[:, None] < end) & cmask[None, :]
    return mask, rows[:, None] * D + cols[None, :]


@triton.jit
def _lq_add_rows(src_ptr, stride, R, J, dst_ptr, scale, BLOCK_P: tl.constexpr, BLOCK_J: tl.constexpr):
    """dst[j] = scale sum_r src[r stride + j] for j < J: the rows r < R (other programs' partials) added in their
    order, BLOCK_P x BLOCK_J a step."""
    for j0 in range(0, J, BLOCK_J):
        js = j0 + tl.arange(0, BLOCK_J)
        total = tl.zeros((BLOCK_J,), dst_ptr.dtype.element_ty)
        for p0 in range(0, R, BLOCK_P):
            ps = p0 + tl.arange(0, BLOCK_P)
            m = (ps[:, None] < R) & (js[None, :] < J)
            total += tl.sum(
                tl.load(src_ptr + ps[:, None] * stride + js[None, :], mask=m, other=0.0, cache_modifier=".cg"), 0
            )
        tl.store(dst_ptr + js, total * scale, mask=js < J)


@triton.jit
def _latent_quantize_fwd(
    z_ptr,
    v_ptr,
    zq_ptr,
    idx_ptr,
    lq_ptr,
    lc_ptr,
    part_ptr,
    N,
    D,
    NV,
    rows_per_program,
    inv_count: tl.float64,
    cnt_ptr,
    GLOBAL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    UNROLL: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Program (i, j): latents [j BLOCK_D, (j + 1) BLOCK_D) of rows [i rows_per_program, (i + 1) rows_per_program),
    ROWS rows a step: the nearest value (a scan of the codebook, UNROLL values a step; strict <: ties keep the
    lowest index), z_q, indices, and its sum of (z - z_q)^2 to part[i, j]; the last program to finish adds the
    partials in index order: both losses."""
    dt = z_ptr.dtype.element_ty
    pid_n, pid_d = tl.program_id(0), tl.program_id(1)
    cols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    vrow = cols * 0 if GLOBAL else cols
    start, end = _lq_rows(pid_n, N, rows_per_program)
    sq = tl.zeros((ROWS, BLOCK_D), dt)
    for r0 in range(start, end, ROWS):
        mask, offs = _lq_tile(r0, end, cols, cmask, D, ROWS)
        x = tl.load(z_ptr + offs, mask=mask, other=0.0)
        best_d = tl.full((ROWS, BLOCK_D), float("inf"), dt)
        best_k = tl.zeros((ROWS, BLOCK_D), tl.int32)
        for k0 in range(0, NV, UNROLL):
            for u in tl.static_range(UNROLL):
                k = k0 + u
                # past the codebook: an infinite distance, never nearer (a scan of the valid values alone)
                v = tl.load(v_ptr + vrow * NV + k, mask=cmask & (vrow * 0 + k < NV), other=float("inf"))
                dist = tl.abs(x - v[None, :])
                better = dist < best_d
                best_d = tl.where(better, dist, best_d)
                best_k = tl.where(better, k, best_k)
        q = tl.load(v_ptr + vrow[None, :] * NV + best_k, mask=mask, other=0.0)
        tl.store(zq_ptr + offs, q, mask=mask)
        tl.store(idx_ptr + offs, best_k.to(tl.int64), mask=mask)
        diff = tl.where(mask, x - q, 0.0)
        sq += diff * diff
    programs = tl.num_programs(0) * tl.num_programs(1)
    tl.store(part_ptr + pid_n * tl.num_programs(1) + pid_d, tl.sum(tl.sum(sq, 1), 0))
    if last_to_arrive(cnt_ptr, programs):
        acc = tl.zeros((BLOCK_P,), dt)
        for p0 in range(0, programs, BLOCK_P):
            ps = p0 + tl.arange(0, BLOCK_P)
            acc += tl.load(part_ptr + ps, mask=ps < programs, other=0.0, cache_modifier=".cg")
        loss = tl.sum(acc, 0) * tl.full((), inv_count, dt)
        tl.store(lq_ptr, loss)
        tl.store(lc_ptr, loss)


@triton.jit
def _latent_quantize_bwd(
    gzq_ptr,
    glq_ptr,
    glc_ptr,
    z_ptr,
    v_ptr,
    idx_ptr,
    gz_ptr,
    gv_ptr,
    part_ptr,
    team_ptr,
    N,
    D,
    NV,
    rows_per_program,
    TEAM,
    scale: tl.float64,
    cnt_ptr,
    GLOBAL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    """Program (i, j), tiles as the forward's: grad_z = grad_z_q + grad_loss_commit scale (z - q) (NaN where an
    index is out of range), and its codebook partials: per latent and value v (BLOCK_V values a pass over its
    rows), the sum of q - z over its elements of index v, to part[i, latent, v] (one codebook per latent) or,
    added over its latents, part[i, j, v] (a global codebook). A latent block's partials (all of them: global)
    are added in two fixed-order levels: the last program of each team of TEAM consecutive row programs to finish
    adds its team's, then the last of those adds the teams' sums: grad_values = grad_loss_quantize scale sum.
    The sums over a tile's rows stay in each thread (no shuffles): values and latents are spread over the
    threads, and each thread compares its latent's ROWS indices with its values."""
    dt = z_ptr.dtype.element_ty
    scale = tl.full((), scale, dt)
    pid_n, pid_d = tl.program_id(0), tl.program_id(1)
    cols = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    vrow = cols * 0 if GLOBAL else cols
    start, end = _lq_rows(pid_n, N, rows_per_program)
    s_c = tl.load(glc_ptr).to(dt) * scale
    vs = tl.arange(0, BLOCK_V)
    for v0 in range(0, NV, BLOCK_V):
        acc = tl.zeros((BLOCK_V, BLOCK_D), dt)  # (value, latent): sums of q - z
        for r0 in range(start, end, ROWS):
            mask, offs = _lq_tile(r0, end, cols, cmask, D, ROWS)
            x = tl.load(z_ptr + offs, mask=mask, other=0.0)
            idx = tl.load(idx_ptr + offs, mask=mask, other=0)
            ok = (idx >= 0) & (idx < NV)  # an out-of-range index: NaN gradient, never an out-of-bounds read
            q = tl.load(v_ptr + vrow[None, :] * NV + idx, mask=mask & ok, other=0.0)
            diff = tl.where(mask, x - q, 0.0)
            if v0 == 0:
                g = tl.load(gzq_ptr + offs, mask=mask, other=0.0)
                tl.store(gz_ptr + offs, tl.where(ok, g + s_c * diff, float("nan")), mask=mask)
            k = tl.where(ok, idx - v0, -1).to(tl.int32)  # the index's place in this pass; -1: none
            hit = k[:, None, :] == vs[None, :, None]  # (ROWS, BLOCK_V, BLOCK_D)
            acc += tl.sum(tl.where(hit, -diff[:, None, :], 0.0), 0)
        vmask = v0 + vs < NV
        if GLOBAL:
            pid = pid_n * tl.num_programs(1) + pid_d
            tl.store(part_ptr + pid * NV + v0 + vs, tl.sum(acc, 1), mask=vmask)
        else:
            out = part_ptr + (pid_n * D + cols[None, :]) * NV + v0 + vs[:, None]
            tl.store(out, acc, mask=vmask[:, None] & cmask[None, :])
    # the block's partials: rows r < R (row programs) of part + base, stride apart; J columns (latents x values).
    # Added in two levels, each in a fixed order: teams of TEAM consecutive rows (by the team's last program to
    # finish), then the teams' sums (by the last team to finish): TEAM + R / TEAM rows read after the last program
    if GLOBAL:
        me, R, group = pid_n * tl.num_programs(1) + pid_d, tl.num_programs(0) * tl.num_programs(1), 0
        base, stride, J = 0, NV, NV
    else:
        me, R, group = pid_n, tl.num_programs(0), pid_d
        base, stride, J = pid_d * BLOCK_D * NV, D * NV, tl.minimum(BLOCK_D, D - pid_d * BLOCK_D) * NV
    teams = (R + TEAM - 1) // TEAM
    team = me // TEAM
    counters = cnt_ptr + group * (teams + 1)  # the group's; then one per team
    if last_to_arrive(counters + 1 + team, tl.minimum(TEAM, R - team * TEAM)):
        _lq_add_rows(
            part_ptr + base + team * TEAM * stride,
            stride,
            tl.minimum(TEAM, R - team * TEAM),
            J,
            team_ptr + base + team * stride,
            tl.full((), 1.0, dt),
            BLOCK_P,
            BLOCK_J,
        )
        if last_to_arrive(counters, teams):
            g_q = tl.load(glq_ptr).to(dt) * scale
            _lq_add_rows(team_ptr + base, stride, teams, J, gv_ptr + base, g_q, BLOCK_P, BLOCK_J)


def _lq_plan(z: torch.Tensor, per_sm: int) -> tuple[int, tuple[int, int]]:
    """(rows per program, grid) of a latent_quantize kernel for z (N, d): latent blocks of LQ_BLOCK_D, and row ranges
    (multiples of LQ_ROWS) making at least ``per_sm`` programs per SM where there are rows enough."""
    n, d = z.shape
    blocks = cdiv(d, LQ_BLOCK_D)
    ranges = max(1, min(cdiv(min_programs(z) // 2 * per_sm, blocks), cdiv(n, LQ_ROWS)))
    rows = max(LQ_ROWS, n // ranges // LQ_ROWS * LQ_ROWS)
    return rows, (cdiv(n, rows), blocks)


def latent_quantize(
    z: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """1 launch: :func:`_latent_quantize_fwd` (grid :func:`_lq_plan`) writes z_q, indices and both losses."""
    z, values = z.contiguous(), values.contiguous()
    n, d = z.shape
    rows, grid = _lq_plan(z, LQ_FWD_PER_SM)
    z_q = torch.empty_like(z)
    idx = torch.empty(z.shape, dtype=torch.long, device=z.device)
    loss_q, loss_c = z.new_empty(()), z.new_empty(())
    part = z.new_empty(grid[0] * grid[1])
    _tickets.launch(
        _latent_quantize_fwd,
        grid,
        1,
        z,
        values,
        z_q,
        idx,
        loss_q,
        loss_c,
        part,
        n,
        d,
        values.shape[1],
        rows,
        1.0 / (n * d),
        GLOBAL=values.shape[0] == 1,
        ROWS=LQ_ROWS,
        BLOCK_D=LQ_BLOCK_D,
        UNROLL=LQ_UNROLL,
        BLOCK_P=LQ_LOSS_STEP,
    )
    return z_q, idx, loss_q, loss_c


def latent_quantize_backward(
    grad_zq: torch.Tensor,
    grad_loss_quantize: torch.Tensor,
    grad_loss_commit: torch.Tensor,
    z: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """1 launch: :func:`_latent_quantize_bwd` (grid :func:`_lq_plan`) writes grad_z and grad_values."""
    z, values, indices, grad_zq = z.contiguous(), values.contiguous(), indices.contiguous(), grad_zq.contiguous()
    n, d = z.shape
    g, nv = values.shape
    rows, grid = _lq_plan(z, LQ_BWD_PER_SM)
    grad_z = torch.empty_like(z)
    grad_values = torch.empty_like(values)
    rows_r = grid[0] * grid[1] if g == 1 else grid[0]  # partial rows of a group (all of them: global)
    team = math.isqrt(rows_r - 1) + 1  # ceil(sqrt): teams of as many rows as there are teams
    teams = cdiv(rows_r, team)
    part = z.new_empty(rows_r * (nv if g == 1 else d * nv))
    team_part = z.new_empty(teams * (nv if g == 1 else d * nv))
    block_j = min(next_pow2(nv if g == 1 else min(LQ_BLOCK_D, d) * nv), LQ_GRAD_COLS)
    block_p = max(1, min(LQ_GRAD_STEP // z.element_size() // block_j, LQ_GRAD_ROWS))
    _tickets.launch(
        _latent_quantize_bwd,
        grid,
        (1 if g == 1 else grid[1]) * (teams + 1),
        grad_zq,
        grad_loss_quantize,
        grad_loss_commit,
        z,
        values,
        indices,
        grad_z,
        grad_values,
        part,
        team_part,
        n,
        d,
        nv,
        rows,
        team,
        2.0 / (n * d),
        GLOBAL=g == 1,
        ROWS=LQ_ROWS,
        BLOCK_D=LQ_BLOCK_D,
        BLOCK_V=min(next_pow2(nv), LQ_BLOCK_V),
        BLOCK_P=block_p,
        BLOCK_J=block_j,
    )
    return grad_z, grad_values


# ----------------------------------------------------------------------------- relaxed categorical
# Rows r = n d + j of (N, d) latents, each with K categories. With FROM_Z (gumbel_quantize) the
# logits of a row are -(z[r] - values[j])^2, computed in the kernel from the latents z (N, d)
# instead of read from an (N, d, K) tensor.


@triton.jit
def _perturbed_softmax(l, u_ptr, offs, mask, kmask, tau, noise_scale, HAS_NOISE: tl.constexpr):
    """Soft sample y and plain log-probabilities logp of a (BLOCK_R, BLOCK_K) tile of logits l."""
    a = l
    if HAS_NOISE:
        u = tl.load(u_ptr + offs, mask=mask, other=0.5)
        # clamp u into [tiny, 1 - ulp/2] of the dtype; constants built in the dtype (a bare Python
        # float literal is a float32 constant in Triton: 1 - 2^-53 would round to 1)
        tiny = tl.full((), 1e-20 if l.dtype == tl.float32 else 1e-300, l.dtype)
        top = tl.full((), 1.0 - 5.9604645e-08 if l.dtype == tl.float32 else 1.0 - 1.1102230246251565e-16, l.dtype)
        u = tl.minimum(tl.maximum(u, tiny), top)
        a = l + noise_scale * -tl.log(-tl.log(u))
    a = tl.where(kmask, a / tau, float("-inf"))
    e = tl.exp(a - tl.max(a, 1)[:, None])
    y = e / tl.sum(e, 1)[:, None]
    lm = tl.where(kmask, l, float("-inf"))
    el = tl.exp(lm - tl.max(lm, 1)[:, None])
    logp = tl.where(kmask, lm - tl.max(lm, 1)[:, None] - tl.log(tl.sum(el, 1))[:, None], 0.0)
    return y, logp


@triton.jit
def _row_tile(R, K, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """This program's (BLOCK_R, BLOCK_K) tile of the (R, K) rows of categories."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ks = tl.arange(0, BLOCK_K)
    rmask = rows < R
    kmask = ks[None, :] < K
    return rows, ks, rmask, kmask, rmask[:, None] & kmask, rows[:, None] * K + ks[None, :]


@triton.jit
def _latent_tile(N, D, K, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (i, j)'s (BLOCK_S, BLOCK_K) tile: samples [i BLOCK_S, (i + 1) BLOCK_S) of latent j."""
    n = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    rows = n * D + tl.program_id(1)
    ks = tl.arange(0, BLOCK_K)
    rmask = n < N
    kmask = ks[None, :] < K
    return rows, ks, rmask, kmask, rmask[:, None] & kmask, rows[:, None] * K + ks[None, :]


@triton.jit
def _codebook_rows(v_ptr, rows, ks, mask, D, K, GLOBAL: tl.constexpr):
    """The codebook values of each row's latent (row r is latent r % D), (BLOCK_R, BLOCK_K)."""
    vrow = rows * 0 if GLOBAL else rows % D
    return tl.load(v_ptr + vrow[:, None] * K + ks[None, :], mask=mask, other=0.0)


@triton.jit
def _relaxed_categorical_fwd(
    x_ptr,
    u_ptr,
    v_ptr,
    z_ptr,
    y_ptr,
    kl_ptr,
    lo_ptr,
    R,
    D,
    K,
    tau: tl.float64,
    noise_scale: tl.float64,
    log_k: tl.float64,
    HAS_NOISE: tl.constexpr,
    HARD: tl.constexpr,
    GLOBAL: tl.constexpr,
    FROM_Z: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """x: the logits (R, K), or with FROM_Z the latents (R,), whose logits -(x - v)^2 it writes to lo."""
    dt = x_ptr.dtype.element_ty
    tau, noise_scale, log_k = tl.full((), tau, dt), tl.full((), noise_scale, dt), tl.full((), log_k, dt)
    rows, ks, rmask, kmask, mask, offs = _row_tile(R, K, BLOCK_R, BLOCK_K)
    v = _codebook_rows(v_ptr, rows, ks, mask, D, K, GLOBAL)
    if FROM_Z:
        diff = tl.load(x_ptr + rows, mask=rmask, other=0.0)[:, None] - v
        l = -(diff * diff)
        tl.store(lo_ptr + offs, l, mask=mask)
    else:
        l = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y, logp = _perturbed_softmax(l, u_ptr, offs, mask, kmask, tau, noise_scale, HAS_NOISE)
    if HARD:
        am = tl.argmax(y, 1, tie_break_left=True)
        y = tl.where(ks[None, :] == am[:, None], 1.0, 0.0).to(y.dtype)
    tl.store(y_ptr + offs, y, mask=mask)
    tl.store(z_ptr + rows, tl.sum(y * v, 1), mask=rmask)
    p = tl.where(kmask, tl.exp(logp), 0.0)
    tl.store(kl_ptr + rows, tl.sum(p * (logp + log_k), 1), mask=rmask)


@triton.jit
def _relaxed_categorical_bwd(
    gz_ptr,
    gy_ptr,
    gkl_ptr,
    glo_ptr,
    x_ptr,
    u_ptr,
    v_ptr,
    yo_ptr,
    gx_ptr,
    part_ptr,
    N,
    D,
    K,
    tau: tl.float64,
    noise_scale: tl.float64,
    HAS_NOISE: tl.constexpr,
    GLOBAL: tl.constexpr,
    FROM_Z: tl.constexpr,
    HAS_GZ: tl.constexpr,
    HAS_GY: tl.constexpr,
    HAS_GKL: tl.constexpr,
    HAS_GLO: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """grad of x (the logits, or with FROM_Z the latents, adding the logits' own gradient glo) and
    this program's codebook partials: sum over its rows of g_z y_out (+ FROM_Z: the logits' term
    2 g (z - v)); yo is the forward's y (one-hot when hard); HAS_*: which upstream gradients
    exist (a missing one is zero). A global codebook: program i takes rows [i BLOCK_S,
    (i + 1) BLOCK_S) of all N d rows (contiguous) and writes part[i, :]; one codebook per latent:
    program (i, j) takes BLOCK_S samples of latent j and writes part[i, j, :]."""
    dt = x_ptr.dtype.element_ty
    tau, noise_scale = tl.full((), tau, dt), tl.full((), noise_scale, dt)
    if GLOBAL:
        rows, ks, rmask, kmask, mask, offs = _row_tile(N * D, K, BLOCK_S, BLOCK_K)
    else:
        rows, ks, rmask, kmask, mask, offs = _latent_tile(N, D, K, BLOCK_S, BLOCK_K)
    v = _codebook_rows(v_ptr, rows, ks, mask, D, K, GLOBAL)
    if FROM_Z:
        diff = tl.load(x_ptr + rows, mask=rmask, other=0.0)[:, None] - v
        l = -(diff * diff)
    else:
        l = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y, logp = _perturbed_softmax(l, u_ptr, offs, mask, kmask, tau, noise_scale, HAS_NOISE)
    gy = tl.zeros((BLOCK_S, BLOCK_K), dt)
    contrib = tl.zeros((BLOCK_S, BLOCK_K), dt)
    if HAS_GY:
        gy = tl.load(gy_ptr + offs, mask=mask, other=0.0)
    if HAS_GZ:
        g_z = tl.load(gz_ptr + rows, mask=rmask, other=0.0)
        gy = gy + g_z[:, None] * v
        contrib = g_z[:, None] * tl.load(yo_ptr + offs, mask=mask, other=0.0)
    dot = tl.sum(y * gy, 1)
    gl = y * (gy - dot[:, None]) / tau
    if HAS_GKL:
        g_kl = tl.load(gkl_ptr + rows, mask=rmask, other=0.0)
        p = tl.where(kmask, tl.exp(logp), 0.0)
        ent = tl.sum(p * logp, 1)
        gl = gl + g_kl[:, None] * p * (logp - ent[:, None])
    if FROM_Z:
        if HAS_GLO:
            gl = gl + tl.load(glo_ptr + offs, mask=mask, other=0.0)
        t = tl.where(mask, gl * diff, 0.0)
        t = t + t  # d logits / d values = 2 (z - v) = -d logits / d z
        tl.store(gx_ptr + rows, -tl.sum(t, 1), mask=rmask)
        contrib = contrib + t
    else:
        tl.store(gx_ptr + offs, gl, mask=mask)
    base = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * K
    tl.store(part_ptr + base + ks, tl.sum(tl.where(mask, contrib, 0.0), 0), mask=ks < K)


def _relaxed_forward(x, values, uniform, tau, noise_scale, hard, k, lo):
    """Launch the forward kernel on rows of x (logits (N, d, K), or latents (N, d) with logits out lo)."""
    n, d = x.shape[0], x.shape[1]
    r = n * d
    z = x.new_empty(n, d)
    y = x.new_empty(n, d, k)
    kl = x.new_empty(n, d)
    _relaxed_categorical_fwd[(cdiv(r, BLOCK_R),)](
        x,
        x if uniform is None else uniform,
        values,
        z,
        y,
        kl,
        y if lo is None else lo,
        r,
        d,
        k,
        tau,
        noise_scale,
        math.log(k),
        HAS_NOISE=uniform is not None,
        HARD=hard,
        GLOBAL=values.shape[0] == 1,
        FROM_Z=lo is not None,
        BLOCK_R=BLOCK_R,
        BLOCK_K=next_pow2(k),
    )
    return z, y, kl


def _relaxed_backward(grad_z, grad_y, grad_kl, grad_lo, x, values, uniform, y, tau, noise_scale, from_z):
    """Launch the backward kernel, grid (cdiv(N d, S), 1) for a global codebook, else (cdiv(N, S), d), S = 32
    rows (16 for K = 64: at most 1024 entries per program), and the codebook reduction (over the grid's first
    axis). A None upstream gradient is zero (nothing is read for it)."""
    n, d = x.shape[0], x.shape[1]
    g, k = values.shape
    block_k = next_pow2(k)
    block_s = max(1, min(BLOCK_S, CATEGORICAL_TILE // block_k))  # K = 64: 16 rows (32 spilled on sm_90)
    grid = (cdiv(n * d, block_s), 1) if g == 1 else (cdiv(n, block_s), d)
    grad_x = torch.empty_like(x)
    part = x.new_empty(grid[0], grid[1], k)
    _relaxed_categorical_bwd[grid](
        *(x if t is None else t for t in (grad_z, grad_y, grad_kl, grad_lo)),
        x,
        x if uniform is None else uniform,
        values,
        y,
        grad_x,
        part,
        n,
        d,
        k,
        tau,
        noise_scale,
        HAS_NOISE=uniform is not None,
        GLOBAL=g == 1,
        FROM_Z=from_z,
        HAS_GZ=grad_z is not None,
        HAS_GY=grad_y is not None,
        HAS_GKL=grad_kl is not None,
        HAS_GLO=grad_lo is not None,
        BLOCK_S=block_s,
        BLOCK_K=block_k,
    )
    grad_values = torch.empty_like(values)
    _sum_rows_launch(part, grad_values, grid[0], grid[1] * k, 1.0)
    return grad_x, grad_values


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def relaxed_categorical(
    logits: torch.Tensor,
    values: torch.Tensor,
    uniform: torch.Tensor | None,
    tau: float,
    noise_scale: float,
    hard: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """1 launch, grid (cdiv(N d, 32),)."""
    logits = logits.contiguous()
    return _relaxed_forward(
        logits, values.contiguous(), _contiguous(uniform), tau, noise_scale, hard, logits.shape[2], None
    )


def relaxed_categorical_backward(
    grad_z: torch.Tensor,
    grad_y: torch.Tensor,
    grad_kl: torch.Tensor,
    logits: torch.Tensor,
    values: torch.Tensor,
    uniform: torch.Tensor | None,
    y: torch.Tensor,
    tau: float,
    noise_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """2 launches: grad_logits and codebook partials (:func:`_relaxed_backward`), then their sum."""
    return _relaxed_backward(
        grad_z.contiguous(),
        grad_y.contiguous(),
        grad_kl.contiguous(),
        None,
        logits.contiguous(),
        values.contiguous(),
        _contiguous(uniform),
        y.contiguous(),
        tau,
        noise_scale,
        False,
    )


def gumbel_quantize(
    z: torch.Tensor,
    values: torch.Tensor,
    uniform: torch.Tensor | None,
    tau: float,
    hard: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """1 launch, grid (cdiv(N d, 32),): logits, relaxed sample, z_q and KL from z and the codebook."""
    z = z.contiguous()
    logits = z.new_empty(z.shape[0], z.shape[1], values.shape[1])
    z_q, y, kl = _relaxed_forward(z, values.contiguous(), _contiguous(uniform), tau, 1.0, hard, values.shape[1], logits)
    return z_q, y, logits, kl


def gumbel_quantize_backward(
    grad_zq: torch.Tensor | None,
    grad_y: torch.Tensor | None,
    grad_logits: torch.Tensor | None,
    grad_kl: torch.Tensor | None,
    z: torch.Tensor,
    values: torch.Tensor,
    uniform: torch.Tensor | None,
    y: torch.Tensor,
    tau: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """2 launches: grad_z and codebook partials (:func:`_relaxed_backward`), then their sum. An
    upstream gradient that is None is zero (no zeros tensor is made for an unused output)."""
    return _relaxed_backward(
        _contiguous(grad_zq),
        _contiguous(grad_y),
        _contiguous(grad_kl),
        _contiguous(grad_logits),
        z.contiguous(),
        values.contiguous(),
        _contiguous(uniform),
        y.contiguous(),
        tau,
        1.0,
        True,
    )
