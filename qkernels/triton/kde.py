"""Triton kernels of the KDE hot path (ops ``qkernels::klm_triton``, ``kde_grid_triton`` and their
``*_backward_triton``).

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

from qkernels._backend import register
from qkernels.ops.kde import wire_kde_grid, wire_klm
from qkernels.reference.kde import silverman_factor

WINDOW = 10.0  # kde_grid drops kernel terms beyond WINDOW sigma (as the cpu backend, see kde.h)
SQRT_2PI = math.sqrt(2.0 * math.pi)


# ----------------------------------------------------------------------------- klm


def _klm_blocks(d: int) -> tuple[int, int, int]:
    """(BLOCK_B rows, BLOCK_A streamed samples, BLOCK_D latents): the pair tile is B x A x D."""
    block_d = triton.next_power_of_2(d)
    block = 32 if block_d <= 4 else 16 if block_d <= 16 else 8  # B * A * D <= 4096 up to d = 64
    return block, block, block_d


@triton.jit
def _klm_pair_tile(y_ptr, yb, rows_a, cols, N, D):
    """Exact differences y_b - y_a of the streamed block (B, A, D) and its row mask."""
    amask = rows_a < N
    ya = tl.load(y_ptr + rows_a[:, None] * D + cols[None, :], mask=amask[:, None] & (cols < D)[None, :], other=0.0)
    return yb[:, None, :] - ya[None, :, :], amask  # masked latents are 0 - 0


@triton.jit
def _klm_fwd(
    y_ptr, lse_ptr, N, D, c_joint,
    BLOCK_B: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # Log-sum-exps over a of exp(c_joint |y_b - y_a|^2) and of exp(-(y_bj - y_aj)^2 / 2). The
    # running maximum of an online log-sum-exp is known up front here: every exponent is <= 0 and
    # the a = b term is exp(0) = 1, so the sums lie in [1, n] and are accumulated directly.
    rows_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_D)
    bmask, cmask = rows_b < N, cols < D
    yb = tl.load(y_ptr + rows_b[:, None] * D + cols[None, :], mask=bmask[:, None] & cmask[None, :], other=0.0)
    jsum = tl.zeros((BLOCK_B,), yb.dtype)
    msum = tl.zeros((BLOCK_B, BLOCK_D), yb.dtype)
    for a0 in range(0, N, BLOCK_A):
        rows_a = a0 + tl.arange(0, BLOCK_A)
        diff, amask = _klm_pair_tile(y_ptr, yb, rows_a, cols, N, D)
        sq = diff * diff
        jsum += tl.sum(tl.where(amask[None, :], tl.exp(c_joint * tl.sum(sq, 2)), 0.0), 1)
        msum += tl.sum(tl.where(amask[None, :, None], tl.exp(-0.5 * sq), 0.0), 1)
    w = D + 1
    tl.store(lse_ptr + rows_b * w, tl.log(jsum), mask=bmask)
    mm = bmask[:, None] & cmask[None, :]
    tl.store(lse_ptr + rows_b[:, None] * w + 1 + cols[None, :], tl.log(tl.where(mm, msum, 1.0)), mask=mm)


@triton.jit
def _klm_bwd(
    y_ptr, lse_ptr, gy_ptr, N, D, c_joint, inv_f2, scale,
    BLOCK_B: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # dLoss/dy_bj = scale * sum_a [-(P_ba + P_ab) / f^2 + (Pj_ba + Pj_ab)] (y_bj - y_aj) with the
    # joint softmax P_ba = exp(J_ba - L_b) and the per-latent ones Pj_ba (the kernel matrices are
    # symmetric, so P_ab = exp(J_ba - L_a)).
    rows_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.arange(0, BLOCK_D)
    bmask, cmask = rows_b < N, cols < D
    mb = bmask[:, None] & cmask[None, :]
    w = D + 1
    yb = tl.load(y_ptr + rows_b[:, None] * D + cols[None, :], mask=mb, other=0.0)
    elb = tl.exp(-tl.load(lse_ptr + rows_b * w, mask=bmask, other=0.0))
    eltb = tl.exp(-tl.load(lse_ptr + rows_b[:, None] * w + 1 + cols[None, :], mask=mb, other=0.0))
    acc = tl.zeros((BLOCK_B, BLOCK_D), yb.dtype)
    for a0 in range(0, N, BLOCK_A):
        rows_a = a0 + tl.arange(0, BLOCK_A)
        diff, amask = _klm_pair_tile(y_ptr, yb, rows_a, cols, N, D)
        ma = amask[:, None] & cmask[None, :]
        ela = tl.exp(-tl.load(lse_ptr + rows_a * w, mask=amask, other=0.0))
        elta = tl.exp(-tl.load(lse_ptr + rows_a[:, None] * w + 1 + cols[None, :], mask=ma, other=0.0))
        sq = diff * diff
        wj = -tl.exp(c_joint * tl.sum(sq, 2)) * (elb[:, None] + ela[None, :]) * inv_f2  # (B, A)
        wm = tl.exp(-0.5 * sq) * (eltb[:, None, :] + elta[None, :, :])  # (B, A, D)
        term = (wj[:, :, None] + wm) * diff
        acc += tl.sum(tl.where(amask[None, :, None], term, 0.0), 1)
    tl.store(gy_ptr + rows_b[:, None] * D + cols[None, :], acc * scale, mask=mb)


def _klm_check(z: torch.Tensor, std: torch.Tensor, op: str) -> None:
    if z.dim() != 2 or z.shape[0] < 1 or z.shape[1] < 1:
        raise ValueError(f"{op}: z must be (n, d), got {tuple(z.shape)}")
    if std.dim() != 1 or std.shape[0] != z.shape[1] or std.dtype != z.dtype:
        raise ValueError(f"{op}: std must be (d,) of z's dtype, got {tuple(std.shape)} {std.dtype}")


@torch.library.custom_op("qkernels::klm_triton", mutates_args=())
def klm_triton(z: torch.Tensor, std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    _klm_check(z, std, "klm_triton")
    n, d = z.shape
    y = (z / std).contiguous()
    f = silverman_factor(n, d)
    lse = z.new_empty(n, d + 1)
    bb, ba, bd = _klm_blocks(d)
    _klm_fwd[(triton.cdiv(n, bb),)](y, lse, n, d, -0.5 / (f * f), BLOCK_B=bb, BLOCK_A=ba, BLOCK_D=bd)
    const = (d - 1) * math.log(n) - d * math.log(f)
    loss = (lse[:, 0] - lse[:, 1:].sum(1)).mean() + const
    return loss, lse


@torch.library.custom_op("qkernels::klm_backward_triton", mutates_args=())
def klm_backward_triton(
    grad_loss: torch.Tensor, z: torch.Tensor, std: torch.Tensor, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    _klm_check(z, std, "klm_backward_triton")
    n, d = z.shape
    if tuple(lse.shape) != (n, d + 1):
        raise ValueError(f"klm_backward_triton: lse must be (n, d + 1) = ({n}, {d + 1}), got {tuple(lse.shape)}")
    y = (z / std).contiguous()
    f = silverman_factor(n, d)
    gy = torch.empty_like(y)
    bb, ba, bd = _klm_blocks(d)
    _klm_bwd[(triton.cdiv(n, bb),)](
        y, lse.contiguous(), gy, n, d, -0.5 / (f * f), 1.0 / (f * f), 1.0 / n,
        BLOCK_B=bb, BLOCK_A=ba, BLOCK_D=bd,
    )
    gy = gy * grad_loss.to(z.dtype)
    # z = y * std: dz = dy / std, dstd_j = -sum_b dy_bj y_bj / std_j (O(n d), left to torch)
    return gy / std, -(gy * y).sum(0) / std


# ----------------------------------------------------------------------------- kde_grid


@triton.jit
def _kde_terms(p, x, inv_sigma, DERIV: tl.constexpr, GRAD: tl.constexpr):
    """Unnormalized kernel terms of points p and samples x (broadcast tiles): N(u) = exp(-u^2/2) or
    D(u) = -u N(u), u = (p - x) / sigma; with GRAD their derivative d/dp. Zero beyond WINDOW."""
    u = (p - x) * inv_sigma
    e = tl.where(tl.abs(u) <= 10.0, tl.exp(-0.5 * u * u), 0.0)
    if GRAD:
        if DERIV:
            return -(1.0 - u * u) * e * inv_sigma
        return -u * e * inv_sigma
    if DERIV:
        return -u * e
    return e


@triton.jit
def _kde_grid_by_points(
    p_ptr, s_ptr, g_ptr, out_ptr, N, D, K, inv_sigma, scale,
    DERIV: tl.constexpr, GRAD: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
):
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
    p_ptr, s_ptr, g_ptr, gs_ptr, N, D, K, inv_sigma, scale,
    DERIV: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
):
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


def _kde_check(points: torch.Tensor, samples: torch.Tensor, sigma: float, op: str) -> None:
    if points.dim() != 2 or samples.dim() != 2 or samples.shape[1] != points.shape[0] or samples.shape[0] < 1:
        raise ValueError(
            f"{op}: points must be (d, K) and samples (n, d), got {tuple(points.shape)} and {tuple(samples.shape)}"
        )
    if points.dtype != samples.dtype:
        raise ValueError(f"{op}: dtype mismatch ({points.dtype} and {samples.dtype})")
    if not sigma > 0:
        raise ValueError(f"{op}: sigma must be > 0, got {sigma}")


def _kde_scale(n: int, sigma: float, derivative: bool) -> float:
    return 1.0 / (n * sigma * SQRT_2PI * (sigma if derivative else 1.0))


@torch.library.custom_op("qkernels::kde_grid_triton", mutates_args=())
def kde_grid_triton(points: torch.Tensor, samples: torch.Tensor, sigma: float, derivative: bool) -> torch.Tensor:
    _kde_check(points, samples, sigma, "kde_grid_triton")
    points, samples = points.contiguous(), samples.contiguous()
    (d, k), n = points.shape, samples.shape[0]
    out = torch.empty_like(points)
    _kde_grid_by_points[(triton.cdiv(k, BLOCK_K_GRID), d)](
        points, samples, points, out, n, d, k, 1.0 / sigma, _kde_scale(n, sigma, derivative),
        DERIV=derivative, GRAD=False, BLOCK_K=BLOCK_K_GRID, BLOCK_S=BLOCK_S_GRID,
    )
    return out


@torch.library.custom_op("qkernels::kde_grid_backward_triton", mutates_args=())
def kde_grid_backward_triton(
    grad: torch.Tensor, points: torch.Tensor, samples: torch.Tensor, sigma: float, derivative: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    _kde_check(points, samples, sigma, "kde_grid_backward_triton")
    if grad.shape != points.shape:
        raise ValueError(f"kde_grid_backward_triton: grad must be {tuple(points.shape)}, got {tuple(grad.shape)}")
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


wire_klm("qkernels::klm_triton", "qkernels::klm_backward_triton")
wire_kde_grid("qkernels::kde_grid_triton", "qkernels::kde_grid_backward_triton")
register("klm", "triton")(klm_triton)
register("kde_grid", "triton")(kde_grid_triton)
