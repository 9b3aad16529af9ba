"""Triton kernels of the Hessian hot path and their launch functions (registered as the ops
``qkernels::perturbed_batch*_triton``, ``finite_difference_curvature*_triton`` and
``curvature_penalty*_triton`` by :mod:`qkernels.ops.hessian`, which also checks their arguments).
Every op is one launch forward and one backward (the curvature backward with center rows: one more,
the zero fill of their gradient); semantics: :mod:`qkernels.reference.hessian`.

finite_difference_curvature: same math as csrc/include/qkernels/hessian.h. Forward: one launch,
one program per (sample, group) streams the 2k perturbed rows of its sample, block of columns by
block (each block twice: mean, then squared deviations; the second read hits cache) and reduces
the columns in a fixed order (sum, and the first argmax), so results are deterministic. Backward:
one launch, one program per (sample, column block, group) recomputes the means and writes the
gradient of every stacked activation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from qkernels.reference.hessian import NHP_DENOM_EPS, STD_EPS
from qkernels.triton._grid import cdiv, next_pow2

BLOCK_C = 128  # activation columns per program (backward); per step of the forward's column loop ...
FWD_BLOCK_C = 512  # ... up to this many for wide activations: 4x the bytes in flight per step of its one
# program per (sample, group) (n = 64, M = 8192: 16 steps, not 64, of a latency-bound loop)


@triton.jit
def _fd_shift(x_ptr, offs, stride, mask):
    """Direction 0's plus and minus activations: the shift subtracted from every direction's (see _fd_mean)."""
    p0 = tl.load(x_ptr + offs, mask=mask, other=0.0)
    q0 = tl.load(x_ptr + offs + stride, mask=mask, other=0.0)
    return p0, q0


@triton.jit
def _fd_mean(x_ptr, offs, stride, mask, K, p0, q0):
    """Mean over the K directions of y_l = (f(z + h_l) - f(z + h_0)) + (f(z - h_l) - f(z - h_0)), eps^2 times the
    second difference minus direction 0's (csrc/include/qkernels/hessian.h: why not f(z + h) + f(z - h))."""
    s = tl.zeros(offs.shape, tl.float32 if x_ptr.dtype.element_ty == tl.float32 else tl.float64)
    for l in range(1, K):
        p = tl.load(x_ptr + offs + (2 * l) * stride, mask=mask, other=0.0)
        q = tl.load(x_ptr + offs + (2 * l + 1) * stride, mask=mask, other=0.0)
        s += (p - p0) + (q - q0)
    return s / K


@triton.jit
def _fdc_fwd(
    x_ptr,
    val_ptr,
    arg_ptr,
    N,
    M,
    K,
    row_offset,
    inv_eps2: tl.float64,
    divisor: tl.float64,
    USE_MAX: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    acc = tl.float32 if x_ptr.dtype.element_ty == tl.float32 else tl.float64
    inv_eps2, divisor = tl.full((), inv_eps2, acc), tl.full((), divisor, acc)
    i, g = tl.program_id(0), tl.program_id(1)
    stride = tl.cast(N, tl.int64) * M  # (N == 1 arrives as a constexpr int: no .to)
    base = (row_offset + g * 2 * K * N + i).to(tl.int64) * M
    lanes = tl.arange(0, BLOCK_C)
    total = tl.zeros((BLOCK_C,), acc)
    best = tl.full((BLOCK_C,), float("-inf"), acc)
    at = tl.full((BLOCK_C,), 0, tl.int64)
    for c0 in range(0, M, BLOCK_C):  # column blocks in order: a fixed-order reduction
        cols = c0 + lanes
        mask = cols < M
        offs = base + cols
        p0, q0 = _fd_shift(x_ptr, offs, stride, mask)
        mean = _fd_mean(x_ptr, offs, stride, mask, K, p0, q0)
        m2 = tl.zeros(mean.shape, mean.dtype)
        for l in range(0, K):
            p = tl.load(x_ptr + offs + (2 * l) * stride, mask=mask, other=0.0)
            q = tl.load(x_ptr + offs + (2 * l + 1) * stride, mask=mask, other=0.0)
            dev = ((p - p0) + (q - q0) - mean) * inv_eps2
            m2 += dev * dev
        var = m2 / divisor
        total += tl.where(mask, var, 0.0)
        # per lane the first maximum (strict >; a NaN beats everything, as in torch.max)
        take = mask & ((var > best) | ((var != var) & (best == best)))
        best = tl.where(take, var, best)
        at = tl.where(take, cols.to(tl.int64), at)
    nan = best != best
    top = tl.max(tl.where(nan, float("-inf"), best), 0)
    has_nan = tl.max(nan.to(tl.int32), 0) > 0
    cand = tl.where(has_nan, nan, best == top)
    first = tl.min(tl.where(cand, at, M), 0)  # the first column of the maximum
    if USE_MAX:
        value = tl.where(has_nan, float("nan"), top)
    else:
        value = tl.sum(total, 0) / tl.cast(M, acc)
    slot = g * N + i
    tl.store(val_ptr + slot, value.to(val_ptr.dtype.element_ty))
    tl.store(arg_ptr + slot, first)


@triton.jit
def _fdc_bwd(
    x_ptr,
    grad_ptr,
    arg_ptr,
    gx_ptr,
    N,
    M,
    K,
    row_offset,
    inv_eps2: tl.float64,
    scale: tl.float64,
    USE_MAX: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    acc = tl.float32 if x_ptr.dtype.element_ty == tl.float32 else tl.float64
    inv_eps2, scale = tl.full((), inv_eps2, acc), tl.full((), scale, acc)
    i, cb, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cols < M
    stride = tl.cast(N, tl.int64) * M  # (N == 1 arrives as a constexpr int: no .to)
    offs = (row_offset + g * 2 * K * N + i).to(tl.int64) * M + cols
    p0, q0 = _fd_shift(x_ptr, offs, stride, mask)
    mean = _fd_mean(x_ptr, offs, stride, mask, K, p0, q0)
    gout = tl.load(grad_ptr + g * N + i)
    coef = gout * scale  # scale = 2 / divisor / eps^2 (/ M for the mean)
    if USE_MAX:
        am = tl.load(arg_ptr + g * N + i)
        coef = tl.where(cols == am, coef, 0.0)
    for l in range(0, K):
        p = tl.load(x_ptr + offs + (2 * l) * stride, mask=mask, other=0.0)
        q = tl.load(x_ptr + offs + (2 * l + 1) * stride, mask=mask, other=0.0)
        v = (coef * (((p - p0) + (q - q0) - mean) * inv_eps2)).to(x_ptr.dtype.element_ty)
        tl.store(gx_ptr + offs + (2 * l) * stride, v, mask=mask)
        tl.store(gx_ptr + offs + (2 * l + 1) * stride, v, mask=mask)


def _launch_shape(stacked, n, k, groups):
    """(M columns, center rows before the perturbed blocks, backward launch grid)."""
    rows, m = stacked.shape
    return m, rows - n * 2 * k * groups, (n, cdiv(m, BLOCK_C), groups)


def finite_difference_curvature(
    stacked: torch.Tensor,
    n: int,
    num_perturbations: int,
    eps: float,
    groups: int,
    unbiased: bool,
    reduce: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch, grid (n, groups): each program streams its sample's 2k rows block by block."""
    stacked = stacked.contiguous()
    k = num_perturbations
    m, offset, _ = _launch_shape(stacked, n, k, groups)
    values = torch.empty(groups, n, dtype=stacked.dtype, device=stacked.device)
    argmax = torch.empty(groups, n, dtype=torch.long, device=stacked.device)
    _fdc_fwd[(n, groups)](
        stacked,
        values,
        argmax,
        n,
        m,
        k,
        offset,
        1.0 / (eps * eps),
        float(k - 1 if unbiased else k),
        USE_MAX=reduce == "max",
        BLOCK_C=min(FWD_BLOCK_C, max(BLOCK_C, next_pow2(m))),
    )
    return values, argmax


def finite_difference_curvature_backward(
    grad: torch.Tensor,
    stacked: torch.Tensor,
    argmax: torch.Tensor,
    n: int,
    num_perturbations: int,
    eps: float,
    groups: int,
    unbiased: bool,
    reduce: str,
) -> torch.Tensor:
    k = num_perturbations
    m, offset, grid = _launch_shape(stacked, n, k, groups)
    stacked = stacked.contiguous()
    grad, argmax = grad.to(stacked.dtype).contiguous(), argmax.contiguous()
    grad_stacked = torch.empty_like(stacked)
    if offset:
        grad_stacked[:offset].zero_()  # the center cancels from the variance
    scale = 2.0 / (k - 1 if unbiased else k) / (eps * eps)
    if reduce != "max":
        scale /= m
    _fdc_bwd[grid](
        stacked,
        grad,
        argmax,
        grad_stacked,
        n,
        m,
        k,
        offset,
        1.0 / (eps * eps),
        scale,
        USE_MAX=reduce == "max",
        BLOCK_C=BLOCK_C,
    )
    return grad_stacked


# ----------------------------------------------------------------------------- perturbed_batch
#
# Forward: one launch, grid (cdiv(n, BLOCK_N), cdiv(d, BLOCK_D)): each program writes the 2D rows
# z +- h_l of its (rows, latents) tile for every direction l; with the population scale it first
# computes its latents' std of z (two passes over the n rows of its columns, no launch).
# Backward: one launch, grid (cdiv(d, BLOCK_D),): each program owns a block of latents, so the
# scale's gradient (a sum over all n rows and D directions) is reduced by one program in a fixed
# order; with the population scale it then adds that gradient's path through std(z) to grad_z.

SCALE_CODES = {"std": 0, "population": 1, "one": 2}
BLOCK_N, BLOCK_D = 32, 16  # perturbed_batch tile: rows x latents


@triton.jit
def _pb_direction(u_ptr, l, rows, cols, mask, su0, su1, su2, SIGNS):
    """u_l on a tile: the raw draw, or its sign (+1 where >= 0, else -1) for l < SIGNS."""
    u = tl.load(u_ptr + l * su0 + rows[:, None] * su1 + cols[None, :] * su2, mask=mask, other=0.0)
    return tl.where(l < SIGNS, tl.where(u >= 0, 1.0, -1.0).to(u.dtype), u)


@triton.jit
def _pb_stats(z_ptr, cols, cmask, N, M, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """(pivot, mean - pivot, population std) of z's columns ``cols``. Shifted by the first row (the
    pivot), so a constant column has exactly 0 deviations: std 0 and no gradient through it, as the
    reference (torch.var); a mean that rounds off the constant would give it an O(1) one."""
    dt = z_ptr.dtype.element_ty
    nf = tl.cast(N, dt)
    pivot = tl.load(z_ptr + cols, mask=cmask, other=0.0)
    acc = tl.zeros((BLOCK_N, BLOCK_D), dt)
    for r0 in range(0, N, BLOCK_N):
        rows = (r0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        m = (rows < N)[:, None] & cmask[None, :]
        x = tl.load(z_ptr + rows[:, None] * M + cols[None, :], mask=m, other=0.0)
        acc += tl.where(m, x - pivot[None, :], 0.0)
    shift = tl.sum(acc, 0) / nf
    acc = tl.zeros((BLOCK_N, BLOCK_D), dt)
    for r0 in range(0, N, BLOCK_N):
        rows = (r0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        m = (rows < N)[:, None] & cmask[None, :]
        x = tl.load(z_ptr + rows[:, None] * M + cols[None, :], mask=m, other=0.0)
        dev = tl.where(m, (x - pivot[None, :]) - shift[None, :], 0.0)
        acc += dev * dev
    var = tl.sum(acc, 0) / nf
    pos = var > 0
    safe = tl.where(pos, var, 1.0)
    if dt == tl.float32:
        root = tl.sqrt_rn(safe)  # IEEE-rounded (tl.sqrt is the fast approximation in fp32)
    else:
        root = tl.sqrt(safe)  # float64: IEEE
    return pivot, shift, tl.where(pos, root, 0.0)


@triton.jit
def _pb_step(
    z_ptr, std_ptr, cols, cmask, N, M, eps, std_eps, SCALE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr
):
    """eps * s per latent (BLOCK_D,), s the scale of SCALE (0 std, 1 population, 2 one)."""
    dt = z_ptr.dtype.element_ty
    if SCALE == 0:
        s = tl.load(std_ptr + cols, mask=cmask, other=1.0)
        step = eps * s
    elif SCALE == 1:
        _, _, sd = _pb_stats(z_ptr, cols, cmask, N, M, BLOCK_N, BLOCK_D)
        step = eps * (sd + std_eps)
    else:
        step = tl.full((BLOCK_D,), 0.0, dt) + eps
    return step


@triton.jit
def _pb_fwd(
    z_ptr,
    u_ptr,
    std_ptr,
    out_ptr,
    N,
    M,
    D,
    SIGNS,
    su0,
    su1,
    su2,
    eps: tl.float64,
    std_eps: tl.float64,
    SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    dt = z_ptr.dtype.element_ty
    eps, std_eps = tl.full((), eps, dt), tl.full((), std_eps, dt)
    rb, cb = tl.program_id(0), tl.program_id(1)
    cols = (cb * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
    cmask = cols < M
    step = _pb_step(z_ptr, std_ptr, cols, cmask, N, M, eps, std_eps, SCALE, BLOCK_N, BLOCK_D)
    rows = (rb * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    mask = (rows < N)[:, None] & cmask[None, :]
    z = tl.load(z_ptr + rows[:, None] * M + cols[None, :], mask=mask, other=0.0)
    n64 = tl.cast(N, tl.int64)
    for l in range(0, D):
        if SCALE == 2:
            h = _pb_direction(u_ptr, l, rows, cols, mask, su0, su1, su2, SIGNS) * eps
        else:
            h = _pb_direction(u_ptr, l, rows, cols, mask, su0, su1, su2, SIGNS) * step[None, :]
        plus = ((2 * l) * n64 + rows)[:, None] * M + cols[None, :]
        tl.store(out_ptr + plus, z + h, mask=mask)
        tl.store(out_ptr + plus + n64 * M, z - h, mask=mask)


@triton.jit
def _pb_pair_grads(g_ptr, l, rows, cols, mask, n64, M):
    """The upstream gradients (g+, g-) of this row block's rows z + h_l and z - h_l."""
    plus = ((2 * l) * n64 + rows)[:, None] * M + cols[None, :]
    return tl.load(g_ptr + plus, mask=mask, other=0.0), tl.load(g_ptr + plus + n64 * M, mask=mask, other=0.0)


@triton.jit
def _pb_bwd(
    g_ptr,
    z_ptr,
    u_ptr,
    gz_ptr,
    gs_ptr,
    N,
    M,
    D,
    SIGNS,
    su0,
    su1,
    su2,
    eps: tl.float64,
    SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    dt = z_ptr.dtype.element_ty
    eps = tl.full((), eps, dt)
    cb = tl.program_id(0)
    cols = (cb * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
    cmask = cols < M
    n64 = tl.cast(N, tl.int64)
    # grad_s = eps * sum_{l, i} (g+ - g-) u_l; grad_z = sum_l (g+ + g-) (+ the population term)
    gs = tl.zeros((BLOCK_N, BLOCK_D), dt)
    for r0 in range(0, N, BLOCK_N):
        rows = (r0 + tl.arange(0, BLOCK_N)).to(tl.int64)
        mask = (rows < N)[:, None] & cmask[None, :]
        gz = tl.zeros((BLOCK_N, BLOCK_D), dt)
        for l in range(0, D):
            gp, gm = _pb_pair_grads(g_ptr, l, rows, cols, mask, n64, M)
            gz += gp + gm
            gs += (gp - gm) * _pb_direction(u_ptr, l, rows, cols, mask, su0, su1, su2, SIGNS)
        if SCALE != 1:
            tl.store(gz_ptr + rows[:, None] * M + cols[None, :], gz, mask=mask)
    grad_s = tl.sum(gs, 0) * eps
    tl.store(gs_ptr + cols, grad_s, mask=cmask)
    if SCALE == 1:  # s = std(z) + 1e-6: ds_j / dz_ij = (z_ij - mean_j) / (n std_j), 0 where std_j = 0
        pivot, shift, sd = _pb_stats(z_ptr, cols, cmask, N, M, BLOCK_N, BLOCK_D)
        coef = tl.where(sd > 0, grad_s / (tl.cast(N, dt) * tl.where(sd > 0, sd, 1.0)), 0.0)
        for r0 in range(0, N, BLOCK_N):
            rows = (r0 + tl.arange(0, BLOCK_N)).to(tl.int64)
            mask = (rows < N)[:, None] & cmask[None, :]
            gz = tl.zeros((BLOCK_N, BLOCK_D), dt)
            for l in range(0, D):
                gp, gm = _pb_pair_grads(g_ptr, l, rows, cols, mask, n64, M)
                gz += gp + gm
            z = tl.load(z_ptr + rows[:, None] * M + cols[None, :], mask=mask, other=0.0)
            gz += coef[None, :] * ((z - pivot[None, :]) - shift[None, :])
            tl.store(gz_ptr + rows[:, None] * M + cols[None, :], gz, mask=mask)


def _std_arg(std: torch.Tensor | None, z: torch.Tensor, scale: str) -> torch.Tensor:
    return std.contiguous() if scale == "std" else z  # z: a placeholder pointer the kernel never reads


def perturbed_batch(
    z: torch.Tensor,
    draws: torch.Tensor,
    std: torch.Tensor | None,
    eps: float,
    signs: int,
    scale: str,
) -> torch.Tensor:
    """(2 D n, d) stacked batch; one launch, grid (cdiv(n, 32), cdiv(d, 16))."""
    z = z.contiguous()
    n, d = z.shape
    count = draws.shape[0]
    out = torch.empty(2 * count * n, d, dtype=z.dtype, device=z.device)
    _pb_fwd[(cdiv(n, BLOCK_N), cdiv(d, BLOCK_D))](
        z,
        draws,
        _std_arg(std, z, scale),
        out,
        n,
        d,
        count,
        signs,
        *draws.stride(),
        eps,
        STD_EPS,
        SCALE=SCALE_CODES[scale],
        BLOCK_N=BLOCK_N,
        BLOCK_D=BLOCK_D,
    )
    return out


def perturbed_batch_backward(
    grad: torch.Tensor,
    z: torch.Tensor,
    draws: torch.Tensor,
    std: torch.Tensor | None,
    eps: float,
    signs: int,
    scale: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(grad_z (n, d), grad_s (d,): the gradient of the scale s); one launch, grid (cdiv(d, 16),)."""
    z = z.contiguous()
    grad = grad.to(z.dtype).contiguous()
    n, d = z.shape
    grad_z, grad_s = torch.empty_like(z), torch.empty(d, dtype=z.dtype, device=z.device)
    _pb_bwd[(cdiv(d, BLOCK_D),)](
        grad,
        z,
        draws,
        grad_z,
        grad_s,
        n,
        d,
        draws.shape[0],
        signs,
        *draws.stride(),
        eps,
        SCALE=SCALE_CODES[scale],
        BLOCK_N=BLOCK_N,
        BLOCK_D=BLOCK_D,
    )
    return grad_z, grad_s


# ----------------------------------------------------------------------------- curvature_penalty
#
# values (groups, n) -> p_i (NHP: num_i / (den_i + 1e-10); HP: values[0, i]) -> mean, max or none.
# Forward: one launch; grid (1,) for "mean" / "max" (one program sums / maximizes the n values in
# a fixed order), (cdiv(n, BLOCK_P),) for "none". Backward: one launch, grid (cdiv(n, BLOCK_P),);
# for "max" every program recomputes the maximum and the number of ties (n is a batch size).

REDUCTION_CODES = {"mean": 0, "max": 1, "none": 2}
BLOCK_P = 128


@triton.jit
def _cp_values(v_ptr, offs, mask, N, denom_eps, RATIO: tl.constexpr):
    num = tl.load(v_ptr + offs, mask=mask, other=0.0)
    if RATIO:
        den = tl.load(v_ptr + N + offs, mask=mask, other=1.0)
        return num, den + denom_eps
    return num, num


@triton.jit
def _cp_max(v_ptr, N, denom_eps, RATIO: tl.constexpr, BLOCK_P: tl.constexpr):
    """(max_i p_i with NaN propagated, number of i with p_i == max or both NaN)."""
    dt = v_ptr.dtype.element_ty
    best = tl.full((BLOCK_P,), float("-inf"), dt)
    nans = tl.zeros((BLOCK_P,), tl.int32)
    for b0 in range(0, N, BLOCK_P):
        offs = b0 + tl.arange(0, BLOCK_P)
        mask = offs < N
        num, den = _cp_values(v_ptr, offs, mask, N, denom_eps, RATIO)
        p = num / den if RATIO else num
        nan = mask & (p != p)
        nans += nan.to(tl.int32)
        best = tl.maximum(best, tl.where(mask & (p == p), p, float("-inf")))
    has_nan = tl.sum(nans, 0) > 0
    top = tl.where(has_nan, float("nan"), tl.max(best, 0))
    ties = tl.zeros((BLOCK_P,), tl.int32)
    for b0 in range(0, N, BLOCK_P):
        offs = b0 + tl.arange(0, BLOCK_P)
        mask = offs < N
        num, den = _cp_values(v_ptr, offs, mask, N, denom_eps, RATIO)
        p = num / den if RATIO else num
        ties += (mask & tl.where(has_nan, p != p, p == top)).to(tl.int32)
    return top, tl.sum(ties, 0)


@triton.jit
def _cp_fwd(
    v_ptr, out_ptr, N, denom_eps: tl.float64, RATIO: tl.constexpr, REDUCTION: tl.constexpr, BLOCK_P: tl.constexpr
):
    dt = v_ptr.dtype.element_ty
    denom_eps = tl.full((), denom_eps, dt)
    if REDUCTION == 2:
        offs = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        mask = offs < N
        num, den = _cp_values(v_ptr, offs, mask, N, denom_eps, RATIO)
        tl.store(out_ptr + offs, num / den if RATIO else num, mask=mask)
    elif REDUCTION == 1:
        top, _ = _cp_max(v_ptr, N, denom_eps, RATIO, BLOCK_P)
        tl.store(out_ptr, top)
    else:
        acc = tl.zeros((BLOCK_P,), dt)
        for b0 in range(0, N, BLOCK_P):
            offs = b0 + tl.arange(0, BLOCK_P)
            mask = offs < N
            num, den = _cp_values(v_ptr, offs, mask, N, denom_eps, RATIO)
            acc += tl.where(mask, num / den if RATIO else num, 0.0)
        tl.store(out_ptr, tl.sum(acc, 0) / tl.cast(N, dt))


@triton.jit
def _cp_bwd(
    g_ptr, v_ptr, gv_ptr, N, denom_eps: tl.float64, RATIO: tl.constexpr, REDUCTION: tl.constexpr, BLOCK_P: tl.constexpr
):
    dt = v_ptr.dtype.element_ty
    denom_eps = tl.full((), denom_eps, dt)
    offs = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    mask = offs < N
    num, den = _cp_values(v_ptr, offs, mask, N, denom_eps, RATIO)
    if REDUCTION == 2:
        coef = tl.load(g_ptr + offs, mask=mask, other=0.0)
    elif REDUCTION == 1:
        top, ties = _cp_max(v_ptr, N, denom_eps, RATIO, BLOCK_P)
        p = num / den if RATIO else num
        hit = tl.where(top != top, p != p, p == top)
        coef = tl.where(hit, tl.load(g_ptr) / tl.cast(ties, dt), 0.0)
    else:
        coef = tl.zeros((BLOCK_P,), dt) + tl.load(g_ptr) / tl.cast(N, dt)
    if RATIO:
        tl.store(gv_ptr + offs, coef / den, mask=mask)
        tl.store(gv_ptr + N + offs, -coef * num / (den * den), mask=mask)
    else:
        tl.store(gv_ptr + offs, coef, mask=mask)


def curvature_penalty(values: torch.Tensor, ratio: bool, reduction: str) -> torch.Tensor:
    """0-d penalty ("mean", "max") or (n,) per-sample values ("none"); one launch."""
    values = values.contiguous()
    n = values.shape[1]
    none = reduction == "none"
    out = torch.empty((n,) if none else (), dtype=values.dtype, device=values.device)
    _cp_fwd[(cdiv(n, BLOCK_P) if none else 1,)](
        values, out, n, NHP_DENOM_EPS, RATIO=ratio, REDUCTION=REDUCTION_CODES[reduction], BLOCK_P=BLOCK_P
    )
    return out


def curvature_penalty_backward(grad: torch.Tensor, values: torch.Tensor, ratio: bool, reduction: str) -> torch.Tensor:
    """grad_values (groups, n); one launch, grid (cdiv(n, 128),)."""
    values = values.contiguous()
    grad = grad.to(values.dtype).contiguous()
    n = values.shape[1]
    grad_values = torch.empty_like(values)
    _cp_bwd[(cdiv(n, BLOCK_P),)](
        grad,
        values,
        grad_values,
        n,
        NHP_DENOM_EPS,
        RATIO=ratio,
        REDUCTION=REDUCTION_CODES[reduction],
        BLOCK_P=BLOCK_P,
    )
    return grad_values
