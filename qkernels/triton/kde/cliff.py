"""The Cliff loss on Triton: ``cliff_loss`` and ``cliff_loss_backward`` (the ops
``qkernels::cliff_loss_triton`` and ``cliff_loss_backward_triton``). Two paths, chosen by
:func:`~qkernels.triton.kde.cliff_fused.fused_fits` from the shape: the fused path
(:mod:`~qkernels.triton.kde.cliff_fused`: pair tiles up to 128 x 128, programs per (pair, chunk of
samples); 2 launches forward, 4 backward) and the GEMM path (:mod:`~qkernels.triton.kde.cliff_gemm`,
for larger tiles), whose tables and products live in memory (its standardization, grids and
lambdas run here as torch ops around it: 65 launches per forward + backward with one chunk, + 6 per further
chunk).
"""

from __future__ import annotations

import math

import torch
import triton

from qkernels.reference.kde import standardize
from qkernels.triton.kde._cliff_common import MIN_VAR, SQRT3, _dot_precision
from qkernels.triton.kde.cliff_fused import (
    BLOCK_R,
    _cliff_fused_bwd,
    _cliff_fused_fwd,
    _cliff_grad,
    _cliff_reduce,
    fused_fits,
    plan,
)
from qkernels.triton.kde.cliff_gemm import _gemm_terms, _gemm_terms_backward


def _log_const(n: int, sigma: float) -> float:
    """kl_i = log_const - mean_k lse_k: -log(2 sqrt 3) + log(n sigma sqrt(2 pi))."""
    return -math.log(2 * SQRT3) + math.log(n * sigma) + 0.5 * math.log(2 * math.pi)


def _partials(z, ci, sigma, a, b, k) -> dict:
    """Launch :func:`_cliff_fused_fwd`: the chunks' shares of every pair's J and of every latent's G and KL
    log-sum-exps (workspaces ``ws`` = (wsj, wsu, wsm), the statistics, the zeroed counters) and the plan."""
    (n, d), m = z.shape, ci.shape[1]
    pl = plan(n, d, m, k, z.dtype, z.device)
    s = pl["S"]
    pl["precision"] = _dot_precision(z.dtype, d * d * n * m * k)
    pl["ws"] = (
        z.new_empty(d * d * s * m * k),
        z.new_empty(d * s * 3 * k),
        z.new_empty(d * d * pl["RB"] * (pl["BLOCK_K"] + 1)),
    )
    pl["stat"], pl["cnt"] = z.new_empty(4 * d), torch.empty(d * d + 1, dtype=torch.int32, device=z.device)
    _cliff_fused_fwd[(d * d, s, pl["KH"])](
        z,
        ci,
        pl["ws"][0],
        pl["ws"][1],
        pl["stat"],
        pl["cnt"],
        n,
        d,
        m,
        k,
        pl["CS"],
        a,
        b,
        1.0 / sigma,
        PRECISION=pl["precision"],
        num_warps=pl["num_warps"],
        BLOCK_K=pl["BLOCK_KJ"],
        BLOCK_S=pl["BLOCK_SF"],
        **{x: pl[x] for x in ("BLOCK_M", "BLOCK_N")},
    )
    return pl


def _reduce_blocks(pl: dict) -> dict:
    """_cliff_reduce's tiles: BLOCK_R rows of J, BLOCK_C chunk shares per load (<= 4096 values: 8192 spilled
    registers in float32 at K = 100, sm_90)."""
    block_c = max(1, min(triton.next_power_of_2(pl["S"]), 4096 // (BLOCK_R * pl["BLOCK_K"])))
    return {"BLOCK_C": block_c, "BLOCK_R": BLOCK_R, "BLOCK_K": pl["BLOCK_K"], "num_warps": pl["num_warps"]}


def _grids(z, a, b, k):
    return (
        torch.linspace(a, b, k, dtype=z.dtype, device=z.device),
        torch.linspace(-SQRT3, SQRT3, k, dtype=z.dtype, device=z.device),
    )


def cliff_loss(
    z: torch.Tensor,
    cond_index: torch.Tensor,
    sigma: float,
    a: float,
    b: float,
    num_points: int,
    lambda_uni: float,
    lambda_biv: float,
    lambda_kl: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    z, ci = z.contiguous(), cond_index.contiguous()
    (n, d), m, k = z.shape, ci.shape[1], num_points
    step = (b - a) / k
    total, uni, biv, kl = (z.new_empty(()) for _ in range(4))
    if fused_fits(n, d, m, k):
        pl = _partials(z, ci, sigma, a, b, k)
        wst = z.new_empty(d * d + 2 * d)
        _cliff_reduce[(d * d, pl["RB"])](
            *pl["ws"],
            wst,
            pl["cnt"],
            total,
            uni,
            biv,
            kl,
            z,
            z,
            z,
            z,
            d,
            m,
            k,
            pl["S"],
            step,
            _log_const(n, sigma),
            lambda_uni,
            lambda_biv,
            lambda_kl,
            BACKWARD=False,
            HAS_T=False,
            HAS_U=False,
            HAS_B=False,
            HAS_K=False,
            **_reduce_blocks(pl),
        )
        return total, uni, biv, kl
    t, v = _grids(z, a, b, k)
    terms = _gemm_terms(standardize(z), t, v, ci, sigma, step)
    for out, term in zip((uni, biv, kl), terms, strict=True):
        out.copy_(term)
    total.copy_(lambda_uni * uni + lambda_biv * biv + lambda_kl * kl)
    return total, uni, biv, kl


def cliff_loss_backward(
    grad_total: torch.Tensor | None,
    grad_uni: torch.Tensor | None,
    grad_biv: torch.Tensor | None,
    grad_kl: torch.Tensor | None,
    z: torch.Tensor,
    cond_index: torch.Tensor,
    sigma: float,
    a: float,
    b: float,
    num_points: int,
    lambda_uni: float,
    lambda_biv: float,
    lambda_kl: float,
) -> torch.Tensor:
    z, ci = z.contiguous(), cond_index.contiguous()
    (n, d), m, k = z.shape, ci.shape[1], num_points
    step = (b - a) / k
    grads = (grad_total, grad_uni, grad_biv, grad_kl)
    if fused_fits(n, d, m, k):
        flags = {f"HAS_{c}": g is not None for c, g in zip("TUBK", grads, strict=True)}  # None: no zeros made
        gs = [z if g is None else g for g in grads]
        pl = _partials(z, ci, sigma, a, b, k)
        wsj, wsu, wsm, stat = pl["ws"][0], pl["ws"][1], pl["ws"][2], pl["stat"]
        _cliff_reduce[(d * d, pl["RB"])](
            wsj,
            wsu,
            wsm,
            z,
            pl["cnt"],
            z,
            z,
            z,
            z,
            *gs,
            d,
            m,
            k,
            pl["S"],
            step,
            0.0,
            lambda_uni,
            lambda_biv,
            lambda_kl,
            BACKWARD=True,
            **flags,
            **_reduce_blocks(pl),
        )
        h = pl["MH"]
        wsd, wsc, wsz = z.new_empty(d * d * h * n), z.new_empty(d * d * h * n), z.new_empty(d * d * pl["S"] * m)
        _cliff_fused_bwd[(d * d, pl["S"], 2 * h)](
            z,
            ci,
            wsj,
            wsu,
            stat,
            wsd,
            wsc,
            wsz,
            gs[0],
            gs[3],
            n,
            d,
            m,
            k,
            pl["CS"],
            a,
            b,
            1.0 / sigma,
            lambda_kl,
            HAS_T=flags["HAS_T"],
            HAS_K=flags["HAS_K"],
            PRECISION=pl["precision"],
            num_warps=pl["num_warps"],
            BLOCK_M=pl["BLOCK_MH"],
            **{x: pl[x] for x in ("BLOCK_S", "BLOCK_K", "BLOCK_KB")},
        )
        gz = torch.empty_like(z)
        _cliff_grad[(d,)](
            z,
            ci,
            stat,
            wsd,
            wsc,
            wsz,
            gz,
            n,
            d,
            m,
            pl["S"],
            h,
            1.0 / n,
            BLOCK_S=64,
            BLOCK_M=pl["BLOCK_M"],
            BLOCK_O=min(32, triton.next_power_of_2(max(d * h, pl["S"]))),
        )
        return gz
    # the GEMM path: terms' gradients and the standardization's backward in torch (large shapes)
    zero = z.new_zeros(())
    g_t, g_u, g_b, g_k = (zero if g is None else g.to(z.dtype).reshape(()) for g in grads)
    t, v = _grids(z, a, b, k)
    x = standardize(z)
    gx = _gemm_terms_backward(
        lambda_uni * g_t + g_u, lambda_biv * g_t + g_b, lambda_kl * g_t + g_k, x, t, v, ci, sigma, step
    )
    var = torch.var(z, 0, correction=0)
    std = var.clamp_min(MIN_VAR).sqrt()
    gxm = torch.where(var >= MIN_VAR, (gx * x).mean(0), 0.0)
    return (gx - gx.mean(0) - x * gxm) / std
