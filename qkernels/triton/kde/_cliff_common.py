"""What both Cliff paths (:mod:`~qkernels.triton.kde.cliff_fused`, :mod:`~qkernels.triton.kde.cliff_gemm`)
share: the jit helpers of the entropy terms (x log x, normalization over the grid and its backward),
the derivative-kernel tile, the tensor-core product at a precision and the rule picking that precision,
and the constants of the standardization and of the KL-uni points.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

# the fused kernels spell these two as literals (_column, _kl_points)
MIN_VAR = 1e-12  # standardization: the variance is clamped here (std >= 1e-6), as reference.standardize
SQRT3 = math.sqrt(3.0)


@triton.jit
def _xlogx(p):
    pos = p > 0
    return tl.where(pos, p * tl.log(tl.where(pos, p, 1.0)), 0.0)


@triton.jit
def _dxlogx(p):
    pos = p > 0
    return tl.where(pos, tl.log(tl.where(pos, p, 1.0)) + 1.0, 0.0)


@triton.jit
def _div(a, b):
    """a / b rounded to nearest as torch divides. Triton's float32 ``/`` is div.full.f32 on a GPU (up to 2 ulp): the
    fused path's grid step divided so put the float32 gradient 4-6x float32's error on an H200 at sigma 0.1
    (tests/test_kde.py::test_triton_cliff_divides_as_torch_does)."""
    if a.dtype == tl.float32:
        return tl.div_rn(a, b)
    else:
        return a / b


@triton.jit
def _normalized(g, step):
    """|g| / (step * sum_k |g|) per column (axis 0) of a (BK, BM) tile, its normalizer and mask."""
    c = step * tl.sum(tl.abs(g), 0)
    cpos = c > 0
    cs = tl.where(cpos, c, 1.0)
    return tl.where(cpos[None, :], _div(tl.abs(g), cs[None, :]), 0.0), cs, cpos


@triton.jit
def _column_backward(g, p, gp, cs, cpos, step):
    """dLoss/dg of p = |g| / c given gp = dLoss/dp (columns along axis 0)."""
    dot = tl.sum(gp * p, 0)
    sgn = tl.where(g > 0, 1.0, tl.where(g < 0, -1.0, 0.0))
    return tl.where(cpos[None, :], _div(sgn * (gp - step * dot[None, :]), cs[None, :]), 0.0)


@triton.jit
def _dker_tile(t, kmask, xs, smask, inv_sigma):
    """D(u), u = (t_k - x_s) / sigma, and dD/dx_s: (BK, BS) tiles, 0 outside the masks."""
    u = (t[:, None] - xs[None, :]) * inv_sigma
    m = kmask[:, None] & smask[None, :]
    e = tl.where(m, tl.exp(-0.5 * u * u), 0.0)
    return -u * e, (1.0 - u * u) * e * inv_sigma


@triton.jit
def _mma(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b at PRECISION: "ieee" (exact FMA; float64, and small float32 products), "tf32x3" (each
    float32 operand split into a TF32 head and tail, three TF32 tensor-core products: about float32's error;
    Triton 3.6 adds their sum to ``acc`` on the CUDA cores, so no chain of MMAs accumulates in the tensor
    cores) or "tf32". ``out_dtype`` is the accumulator's: Triton 3.6 (torch 2.11's) defaults it to float32
    and rejects a float64 accumulator (seen on an H200; Triton 3.9 infers it)."""
    return tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=acc.dtype)


# float32 products below this many multiply-adds per call (d^2 n M K) run as exact FMA products: a tensor core
# saves nothing there, and 3xTF32's rounding (up to 3 2^-22 per product against float32's 2^-24) is not free
IEEE_MAX_WORK = 1 << 28


def _dot_precision(dtype: torch.dtype, work: int = 0) -> str:
    """tl.dot's input precision (:func:`_mma`) for Cliff's bivariate products of ``work`` multiply-adds:
    float64 exact; float32 per torch.get_float32_matmul_precision() as torch.matmul on CUDA does it:
    "highest" 3xTF32 ("tf32x3", about float32's own error, on the tensor cores; exact FMA below
    :data:`IEEE_MAX_WORK`), "high" and "medium" TF32 (PyTorch's "medium" means bf16 only where such a
    kernel exists; on CUDA its float32 matmuls run in TF32, as measured on an H200: docs/design/precision.md)."""
    if dtype == torch.float64:
        return "ieee"
    if torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return "ieee" if work < IEEE_MAX_WORK else "tf32x3"
