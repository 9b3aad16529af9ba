"""The Triton latent_quantize before the two-launch kernels (main at 89e2870), kept for one GPU A/B only.

Four launches per forward + backward: a tile kernel and a fixed-order reduction (``_sum_rows`` of
qkernels/triton/quantize.py, still used by the categorical ops) each way; the backward's tile kernel loops over all
n_v values per tile (387 us of the 0.58 ms the op took at 65536 x 64 on an H200, 2026-11-27). gpu/gpu_check_ops.py's
``speed`` step and gpu/gpu_quantize_roofline.py time it as the variant ``triton_4launch`` beside the package's
``triton`` (the two-launch kernels): :func:`patched` makes ``qkernels.latent_quantize`` run it, so both variants pay
the same host path (validation, backend choice, autograd node). Delete this file once a GPU run has measured both.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

import qkernels.ops.quantize as ops_quantize
from qkernels.triton._grid import cdiv, rows_per_program
from qkernels.triton.quantize import _sum_rows_launch

BLOCK_NS, BLOCK_D = (64, 32, 16), 32


@triton.jit
def _tile(N, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    mask = (rows[:, None] < N) & cmask[None, :]
    return cols, cmask, mask, rows[:, None] * D + cols[None, :]


@triton.jit
def _latent_quantize_4launch_fwd(
    z_ptr, v_ptr, zq_ptr, idx_ptr, part_ptr, N, D, NV, GLOBAL: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    pid_n, pid_d = tl.program_id(0), tl.program_id(1)
    cols, cmask, mask, offs = _tile(N, D, BLOCK_N, BLOCK_D)
    x = tl.load(z_ptr + offs, mask=mask, other=0.0)
    vrow = cols * 0 if GLOBAL else cols
    best_d = tl.full((BLOCK_N, BLOCK_D), float("inf"), x.dtype)
    best_k = tl.zeros((BLOCK_N, BLOCK_D), tl.int64)
    best_v = tl.zeros((BLOCK_N, BLOCK_D), x.dtype)
    for k in range(0, NV):
        v = tl.load(v_ptr + vrow * NV + k, mask=cmask, other=0.0)
        dist = tl.abs(x - v[None, :])
        better = dist < best_d
        best_d = tl.where(better, dist, best_d)
        best_k = tl.where(better, k, best_k)
        best_v = tl.where(better, v[None, :], best_v)
    tl.store(zq_ptr + offs, best_v, mask=mask)
    tl.store(idx_ptr + offs, best_k, mask=mask)
    diff = tl.where(mask, x - best_v, 0.0)
    tl.store(part_ptr + pid_n * tl.num_programs(1) + pid_d, tl.sum(tl.sum(diff * diff, 1), 0))


@triton.jit
def _latent_quantize_4launch_bwd(
    gzq_ptr, glc_ptr, z_ptr, v_ptr, idx_ptr, gz_ptr, part_ptr, N, D, NV, scale: tl.float64, GLOBAL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    dt = z_ptr.dtype.element_ty
    scale = tl.full((), scale, dt)
    pid_n, pid_d = tl.program_id(0), tl.program_id(1)
    cols, cmask, mask, offs = _tile(N, D, BLOCK_N, BLOCK_D)
    x = tl.load(z_ptr + offs, mask=mask, other=0.0)
    idx = tl.load(idx_ptr + offs, mask=mask, other=0)
    ok = (idx >= 0) & (idx < NV)
    vrow = cols * 0 if GLOBAL else cols
    q = tl.load(v_ptr + vrow[None, :] * NV + idx, mask=mask & ok, other=0.0)
    diff = tl.where(mask, x - q, 0.0)
    g = tl.load(gzq_ptr + offs, mask=mask, other=0.0)
    s_c = tl.load(glc_ptr).to(dt) * scale
    tl.store(gz_ptr + offs, tl.where(ok, g + s_c * diff, float("nan")), mask=mask)
    for k in range(0, NV):
        contrib = tl.sum(tl.where(idx == k, -diff, 0.0), 0)
        if GLOBAL:
            tl.store(part_ptr + (pid_n * tl.num_programs(1) + pid_d) * NV + k, tl.sum(contrib, 0))
        else:
            tl.store(part_ptr + (pid_n * D + cols) * NV + k, contrib, mask=cmask)


def _grid(z: torch.Tensor) -> tuple[int, tuple[int, int]]:
    n, d = z.shape
    block_n = rows_per_program(n, cdiv(d, BLOCK_D), z, BLOCK_NS)
    return block_n, (cdiv(n, block_n), cdiv(d, BLOCK_D))


def latent_quantize(z: torch.Tensor, values: torch.Tensor):
    """2 launches: the tile kernel, then ``_sum_rows`` for both losses."""
    z, values = z.contiguous(), values.contiguous()
    n, d = z.shape
    block_n, grid = _grid(z)
    z_q = torch.empty_like(z)
    idx = torch.empty(z.shape, dtype=torch.long, device=z.device)
    part = torch.empty(grid, dtype=z.dtype, device=z.device)
    _latent_quantize_4launch_fwd[grid](
        z, values, z_q, idx, part, n, d, values.shape[1], GLOBAL=values.shape[0] == 1, BLOCK_N=block_n, BLOCK_D=BLOCK_D
    )
    loss_q, loss_c = z.new_empty(()), z.new_empty(())
    _sum_rows_launch(part, loss_q, grid[0] * grid[1], 1, 1.0 / (n * d), out2=loss_c)
    return z_q, idx, loss_q, loss_c


def latent_quantize_backward(grad_zq, grad_loss_quantize, grad_loss_commit, z, values, indices):
    """2 launches: the tile kernel (grad_z and per-program codebook partials), then ``_sum_rows``."""
    z, values, indices, grad_zq = z.contiguous(), values.contiguous(), indices.contiguous(), grad_zq.contiguous()
    n, d = z.shape
    g, nv = values.shape
    block_n, grid = _grid(z)
    grad_z = torch.empty_like(z)
    part = torch.empty((grid[0], grid[1], nv) if g == 1 else (grid[0], d, nv), dtype=z.dtype, device=z.device)
    scale = 2.0 / (n * d)
    _latent_quantize_4launch_bwd[grid](
        grad_zq, grad_loss_commit, z, values, indices, grad_z, part, n, d, nv, scale, GLOBAL=g == 1,
        BLOCK_N=block_n, BLOCK_D=BLOCK_D,
    )  # fmt: skip
    grad_values = torch.empty_like(values)
    rows, cols = (grid[0] * grid[1], nv) if g == 1 else (grid[0], d * nv)
    _sum_rows_launch(part, grad_values, rows, cols, scale, g=grad_loss_quantize)
    return grad_z, grad_values


class _Node(torch.autograd.Function):
    """The launch functions behind one autograd node, as qkernels.ops._library.thin_autograd runs a Triton op."""

    @staticmethod
    def forward(ctx, z, values):
        with torch._C._AutoDispatchBelowAutograd():
            z_q, idx, loss_q, loss_c = latent_quantize(z, values)
        ctx.save_for_backward(z, values, idx)
        ctx.mark_non_differentiable(idx)
        ctx.set_materialize_grads(False)
        return z_q, idx, loss_q, loss_c

    @staticmethod
    def backward(ctx, grad_zq, _grad_idx, grad_lq, grad_lc):
        z, values, idx = ctx.saved_tensors
        grad_zq = torch.zeros_like(z) if grad_zq is None else grad_zq
        grad_lq = z.new_zeros(()) if grad_lq is None else grad_lq
        grad_lc = z.new_zeros(()) if grad_lc is None else grad_lc
        with torch._C._AutoDispatchBelowAutograd():
            grad_z, grad_values = latent_quantize_backward(grad_zq, grad_lq, grad_lc, z, values, idx)
        return grad_z, grad_values


def _impl(z, values):
    if torch.is_grad_enabled() and (z.requires_grad or values.requires_grad):
        return _Node.apply(z, values)
    return latent_quantize(z, values)


@contextlib.contextmanager
def patched() -> Iterator[None]:
    """Inside: ``qkernels.latent_quantize`` runs these kernels (whatever backend is chosen; CUDA or interpreted
    tensors, float32 / float64)."""
    select = ops_quantize.select

    def pick(op, *args, **kwargs):
        return ("triton", _impl) if op == "latent_quantize" else select(op, *args, **kwargs)

    ops_quantize.select = pick
    try:
        yield
    finally:
        ops_quantize.select = select
