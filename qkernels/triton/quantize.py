"""Triton kernels of the quantization hot path and their launch functions (registered as the ops
``qkernels::*_triton`` by :mod:`qkernels.ops.quantize`, which also checks their arguments).

Same math as csrc/include/qkernels/quantize.h. Reductions over samples (losses, codebook
gradients) write per-program partial sums that are added by torch in a fixed order, so results are
deterministic.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK_N, BLOCK_D = 64, 32  # latent_quantize tile: rows x latents
BLOCK_R = 32  # relaxed_categorical: rows of K categories per program


@triton.jit
def _tile(N, D, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows, latent columns, column mask, element mask and offsets of this program's (N, D) tile."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    mask = (rows[:, None] < N) & cmask[None, :]
    return cols, cmask, mask, rows[:, None] * D + cols[None, :]


@triton.jit
def _latent_quantize_fwd(
    z_ptr, v_ptr, zq_ptr, idx_ptr, part_ptr, N, D, NV,
    GLOBAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
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
        better = dist < best_d  # strict: ties keep the lowest index
        best_d = tl.where(better, dist, best_d)
        best_k = tl.where(better, k, best_k)
        best_v = tl.where(better, v[None, :], best_v)
    tl.store(zq_ptr + offs, best_v, mask=mask)
    tl.store(idx_ptr + offs, best_k, mask=mask)
    diff = tl.where(mask, x - best_v, 0.0).to(tl.float32 if x.dtype == tl.float32 else tl.float64)
    tl.store(part_ptr + pid_n * tl.num_programs(1) + pid_d, tl.sum(tl.sum(diff * diff, 1), 0))


@triton.jit
def _latent_quantize_bwd(
    gzq_ptr, glc_ptr, z_ptr, v_ptr, idx_ptr, gz_ptr, part_ptr, N, D, NV, scale: tl.float64,
    GLOBAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    scale = tl.full((), scale, z_ptr.dtype.element_ty)
    pid_n, pid_d = tl.program_id(0), tl.program_id(1)
    cols, cmask, mask, offs = _tile(N, D, BLOCK_N, BLOCK_D)
    x = tl.load(z_ptr + offs, mask=mask, other=0.0)
    idx = tl.load(idx_ptr + offs, mask=mask, other=0)
    ok = (idx >= 0) & (idx < NV)  # an out-of-range index: NaN gradient, never an out-of-bounds read
    vrow = cols * 0 if GLOBAL else cols
    q = tl.load(v_ptr + vrow[None, :] * NV + idx, mask=mask & ok, other=0.0)
    diff = tl.where(mask, x - q, 0.0)
    g = tl.load(gzq_ptr + offs, mask=mask, other=0.0)
    s_c = tl.load(glc_ptr) * scale
    tl.store(gz_ptr + offs, tl.where(ok, g + s_c * diff, float("nan")), mask=mask)
    # codebook partials: sum over this tile's rows of (q - x) for every value k
    for k in range(0, NV):
        contrib = tl.sum(tl.where(idx == k, -diff, 0.0), 0)  # (BLOCK_D,)
        if GLOBAL:
            tl.store(part_ptr + (pid_n * tl.num_programs(1) + pid_d) * NV + k, tl.sum(contrib, 0))
        else:
            tl.store(part_ptr + (pid_n * D + cols) * NV + k, contrib, mask=cmask)


def _grid(n: int, d: int) -> tuple[int, int]:
    return triton.cdiv(n, BLOCK_N), triton.cdiv(d, BLOCK_D)


def latent_quantize(
    z: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    z, values = z.contiguous(), values.contiguous()
    n, d = z.shape
    grid = _grid(n, d)
    z_q = torch.empty_like(z)
    idx = torch.empty(z.shape, dtype=torch.long, device=z.device)
    part = torch.empty(grid, dtype=z.dtype, device=z.device)
    _latent_quantize_fwd[grid](
        z, values, z_q, idx, part, n, d, values.shape[1],
        GLOBAL=values.shape[0] == 1, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
    )
    loss = part.sum() / (n * d)
    return z_q, idx, loss, loss.clone()


def latent_quantize_backward(
    grad_zq: torch.Tensor,
    grad_loss_quantize: torch.Tensor,
    grad_loss_commit: torch.Tensor,
    z: torch.Tensor,
    values: torch.Tensor,
    indices: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    z, values, indices, grad_zq = z.contiguous(), values.contiguous(), indices.contiguous(), grad_zq.contiguous()
    n, d = z.shape
    g, nv = values.shape
    grid = _grid(n, d)
    grad_z = torch.empty_like(z)
    part_shape = (grid[0], grid[1], nv) if g == 1 else (grid[0], d, nv)
    part = torch.empty(part_shape, dtype=z.dtype, device=z.device)
    scale = 2.0 / (n * d)
    _latent_quantize_bwd[grid](
        grad_zq, grad_loss_commit.reshape(1).to(z.dtype), z, values, indices, grad_z, part,
        n, d, nv, scale, GLOBAL=g == 1, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
    )
    dims = (0, 1) if g == 1 else (0,)
    grad_values = (part.sum(dims) * (grad_loss_quantize * scale)).reshape(g, nv)
    return grad_z, grad_values.to(values.dtype)


@triton.jit
def _perturbed_softmax(l_ptr, u_ptr, offs, mask, kmask, tau, noise_scale, HAS_NOISE: tl.constexpr):
    """Soft sample y and plain log-probabilities logp of a (BLOCK_R, BLOCK_K) tile."""
    l = tl.load(l_ptr + offs, mask=mask, other=0.0)
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
def _codebook_rows(v_ptr, rows, ks, mask, D, K, GLOBAL: tl.constexpr):
    """The codebook values of each row's latent (row r is latent r % D), (BLOCK_R, BLOCK_K)."""
    vrow = rows * 0 if GLOBAL else rows % D
    return tl.load(v_ptr + vrow[:, None] * K + ks[None, :], mask=mask, other=0.0)


@triton.jit
def _relaxed_categorical_fwd(
    l_ptr, u_ptr, v_ptr, z_ptr, y_ptr, kl_ptr, R, D, K, tau: tl.float64, noise_scale: tl.float64, log_k: tl.float64,
    HAS_NOISE: tl.constexpr, HARD: tl.constexpr, GLOBAL: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    dt = l_ptr.dtype.element_ty
    tau, noise_scale, log_k = tl.full((), tau, dt), tl.full((), noise_scale, dt), tl.full((), log_k, dt)
    rows, ks, rmask, kmask, mask, offs = _row_tile(R, K, BLOCK_R, BLOCK_K)
    y, logp = _perturbed_softmax(l_ptr, u_ptr, offs, mask, kmask, tau, noise_scale, HAS_NOISE)
    if HARD:
        am = tl.argmax(y, 1, tie_break_left=True)
        y = tl.where(ks[None, :] == am[:, None], 1.0, 0.0).to(y.dtype)
    v = _codebook_rows(v_ptr, rows, ks, mask, D, K, GLOBAL)
    tl.store(y_ptr + offs, y, mask=mask)
    tl.store(z_ptr + rows, tl.sum(y * v, 1), mask=rmask)
    p = tl.where(kmask, tl.exp(logp), 0.0)
    tl.store(kl_ptr + rows, tl.sum(p * (logp + log_k), 1), mask=rmask)


@triton.jit
def _relaxed_categorical_bwd(
    gz_ptr, gy_ptr, gkl_ptr, l_ptr, u_ptr, v_ptr, gl_ptr, R, D, K, tau: tl.float64, noise_scale: tl.float64,
    HAS_NOISE: tl.constexpr, GLOBAL: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    tau, noise_scale = tl.full((), tau, l_ptr.dtype.element_ty), tl.full((), noise_scale, l_ptr.dtype.element_ty)
    rows, ks, rmask, kmask, mask, offs = _row_tile(R, K, BLOCK_R, BLOCK_K)
    y, logp = _perturbed_softmax(l_ptr, u_ptr, offs, mask, kmask, tau, noise_scale, HAS_NOISE)
    v = _codebook_rows(v_ptr, rows, ks, mask, D, K, GLOBAL)
    g_z = tl.load(gz_ptr + rows, mask=rmask, other=0.0)
    g_kl = tl.load(gkl_ptr + rows, mask=rmask, other=0.0)
    gy = tl.load(gy_ptr + offs, mask=mask, other=0.0) + g_z[:, None] * v
    dot = tl.sum(y * gy, 1)
    p = tl.where(kmask, tl.exp(logp), 0.0)
    ent = tl.sum(p * logp, 1)
    gl = y * (gy - dot[:, None]) / tau + g_kl[:, None] * p * (logp - ent[:, None])
    tl.store(gl_ptr + offs, gl, mask=mask)


def _rc_launch_args(logits, values):
    r = logits.shape[0] * logits.shape[1]
    return (triton.cdiv(r, BLOCK_R),), r, triton.next_power_of_2(logits.shape[2])


def relaxed_categorical(
    logits: torch.Tensor,
    values: torch.Tensor,
    uniform: torch.Tensor | None,
    tau: float,
    noise_scale: float,
    hard: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, values = logits.contiguous(), values.contiguous()
    u = logits if uniform is None else uniform.contiguous()
    n, d, k = logits.shape
    grid, r, block_k = _rc_launch_args(logits, values)
    z = logits.new_empty(n, d)
    y = torch.empty_like(logits)
    kl = logits.new_empty(n, d)
    _relaxed_categorical_fwd[grid](
        logits, u, values, z, y, kl, r, d, k, tau, noise_scale, math.log(k),
        HAS_NOISE=uniform is not None, HARD=hard, GLOBAL=values.shape[0] == 1,
        BLOCK_R=BLOCK_R, BLOCK_K=block_k,
    )
    return z, y, kl


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
    logits, values = logits.contiguous(), values.contiguous()
    grad_z, grad_y, grad_kl = grad_z.contiguous(), grad_y.contiguous(), grad_kl.contiguous()
    u = logits if uniform is None else uniform.contiguous()
    n, d, k = logits.shape
    grid, r, block_k = _rc_launch_args(logits, values)
    grad_logits = torch.empty_like(logits)
    _relaxed_categorical_bwd[grid](
        grad_z, grad_y, grad_kl, logits, u, values, grad_logits, r, d, k, tau, noise_scale,
        HAS_NOISE=uniform is not None, GLOBAL=values.shape[0] == 1,
        BLOCK_R=BLOCK_R, BLOCK_K=block_k,
    )
    # codebook gradient sum_rows g_z * y_out: a (batched) GEMV, left to BLAS
    if values.shape[0] == 1:
        grad_values = torch.einsum("nd,ndk->k", grad_z, y)[None]
    else:
        grad_values = torch.einsum("nd,ndk->dk", grad_z, y)
    return grad_logits, grad_values
