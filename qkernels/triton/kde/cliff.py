"""The Cliff loss on Triton: ``cliff_loss`` and ``cliff_loss_backward`` (the ops
``qkernels::cliff_loss_triton`` and ``cliff_loss_backward_triton``). Two paths, chosen by
:func:`~qkernels.triton.kde.cliff_fused.fused_fits` from the shape: the fused path
(:mod:`~qkernels.triton.kde.cliff_fused`: one program per pair, for tiles up to 128 x 128 at the
papers' batch sizes) and the GEMM path (:mod:`~qkernels.triton.kde.cliff_gemm`, issue 12), whose
tables and products live in memory (for larger tiles; its standardization, grids and lambdas run here
as torch ops around it). Launches per forward + backward: 4 on the fused path, 65 on the GEMM path with
one chunk (~40 of them torch ops of the set-up), + 6 per further chunk.
"""

from __future__ import annotations

import math

import torch
import triton

from qkernels.reference.kde import standardize
from qkernels.triton.kde._cliff_common import MIN_VAR, SQRT3, _dot_precision
from qkernels.triton.kde.cliff_fused import _cliff_fused_bwd, _cliff_fused_fwd, _cliff_grad, _cliff_sum, fused_fits
from qkernels.triton.kde.cliff_gemm import _gemm_terms, _gemm_terms_backward


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
