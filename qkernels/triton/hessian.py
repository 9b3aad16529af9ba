"""Triton kernels of the Hessian hot path and their launch functions (registered as the ops
``qkernels::finite_difference_curvature*_triton`` by :mod:`qkernels.ops.hessian`, which also checks
their arguments).

Same math as csrc/include/qkernels/hessian.h: one program per (sample, column block, group)
streams the 2k perturbed rows of its columns twice (mean, then squared deviations; the second read
hits cache) and writes a partial sum and a partial (max, first argmax). Partials are combined by
torch in a fixed order, so results are deterministic. The backward recomputes the means and writes
the gradient of every stacked activation in one pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_C = 128  # activation columns per program


@triton.jit
def _fd_mean(x_ptr, offs, stride, mask, K, inv_eps2):
    s = tl.zeros(offs.shape, tl.float32 if x_ptr.dtype.element_ty == tl.float32 else tl.float64)
    for l in range(0, K):
        p = tl.load(x_ptr + offs + (2 * l) * stride, mask=mask, other=0.0)
        q = tl.load(x_ptr + offs + (2 * l + 1) * stride, mask=mask, other=0.0)
        s += (p + q) * inv_eps2
    return s / K


@triton.jit
def _fdc_fwd(
    x_ptr,
    sum_ptr,
    max_ptr,
    arg_ptr,
    N,
    M,
    K,
    row_offset,
    inv_eps2: tl.float64,
    divisor: tl.float64,
    BLOCK_C: tl.constexpr,
):
    acc = tl.float32 if x_ptr.dtype.element_ty == tl.float32 else tl.float64
    inv_eps2, divisor = tl.full((), inv_eps2, acc), tl.full((), divisor, acc)
    i, cb, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = cols < M
    stride = tl.cast(N, tl.int64) * M  # (N == 1 arrives as a constexpr int: no .to)
    offs = (row_offset + g * 2 * K * N + i).to(tl.int64) * M + cols
    mean = _fd_mean(x_ptr, offs, stride, mask, K, inv_eps2)
    m2 = tl.zeros(mean.shape, mean.dtype)
    for l in range(0, K):
        p = tl.load(x_ptr + offs + (2 * l) * stride, mask=mask, other=0.0)
        q = tl.load(x_ptr + offs + (2 * l + 1) * stride, mask=mask, other=0.0)
        dev = (p + q) * inv_eps2 - mean
        m2 += dev * dev
    var = m2 / divisor
    slot = (g * N + i) * tl.num_programs(1) + cb
    tl.store(sum_ptr + slot, tl.sum(tl.where(mask, var, 0.0), 0))
    vmax = tl.where(mask, var, float("-inf"))
    tl.store(max_ptr + slot, tl.max(vmax, 0))
    tl.store(arg_ptr + slot, cb * BLOCK_C + tl.argmax(vmax, 0, tie_break_left=True))


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
    mean = _fd_mean(x_ptr, offs, stride, mask, K, inv_eps2)
    gout = tl.load(grad_ptr + g * N + i)
    coef = gout * scale  # scale = 2 / divisor / eps^2 (/ M for the mean)
    if USE_MAX:
        am = tl.load(arg_ptr + g * N + i)
        coef = tl.where(cols == am, coef, 0.0)
    for l in range(0, K):
        p = tl.load(x_ptr + offs + (2 * l) * stride, mask=mask, other=0.0)
        q = tl.load(x_ptr + offs + (2 * l + 1) * stride, mask=mask, other=0.0)
        v = (coef * ((p + q) * inv_eps2 - mean)).to(x_ptr.dtype.element_ty)
        tl.store(gx_ptr + offs + (2 * l) * stride, v, mask=mask)
        tl.store(gx_ptr + offs + (2 * l + 1) * stride, v, mask=mask)


def _launch_shape(stacked, n, k, groups):
    """(M columns, center rows before the perturbed blocks, launch grid)."""
    rows, m = stacked.shape
    return m, rows - n * 2 * k * groups, (n, triton.cdiv(m, BLOCK_C), groups)


def finite_difference_curvature(
    stacked: torch.Tensor,
    n: int,
    num_perturbations: int,
    eps: float,
    groups: int,
    unbiased: bool,
    reduce: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    stacked = stacked.contiguous()
    k = num_perturbations
    m, offset, grid = _launch_shape(stacked, n, k, groups)
    acc = torch.float64 if stacked.dtype == torch.float64 else torch.float32
    part_sum = torch.empty(grid[2], n, grid[1], dtype=acc, device=stacked.device)
    part_max = torch.empty_like(part_sum)
    part_arg = torch.empty(part_sum.shape, dtype=torch.long, device=stacked.device)
    _fdc_fwd[grid](
        stacked,
        part_sum,
        part_max,
        part_arg,
        n,
        m,
        k,
        offset,
        1.0 / (eps * eps),
        float(k - 1 if unbiased else k),
        BLOCK_C=BLOCK_C,
    )
    best, block = part_max.max(dim=-1)  # first block on ties -> first column
    argmax = part_arg.gather(-1, block[..., None])[..., 0]
    values = best if reduce == "max" else part_sum.sum(dim=-1) / m
    return values.to(stacked.dtype), argmax


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
