"""Cliff's float32 error against float64 with a GPU kernel's arithmetic emulated in the reference (issue 44).

    .venv/bin/python gpu/experiments/cliff_precision_emulation.py N D M K MODE [MODE ...]

Runs ``qkernels.reference.kde.cliff_loss`` (forward + backward) on randn latents (seed 0, as the benchmark's
inputs) in float64 and in float32 under each MODE, and prints the float32 errors: the loss's, the gradient's
norm (relative) and its largest element (relative to the largest). A MODE joins with "+" any of:

- ``fp32``: the reference as it is (CPU sgemm products, correctly rounded exp);
- ``tf32x3``: the bivariate products (forward and both backward products) as Triton 3.6 computes
  ``tl.dot(..., input_precision="tf32x3")``: hi = cvt.rna.tf32(a), lo = a - hi read as a TF32 tensor core
  reads a float32 register (the low 13 bits dropped), hi @ hi + (hi @ lo + lo @ hi) accumulated in float32;
- ``presplit``: the products as gpu/experiments/gemm_3xtf32.py computes them (issue 53's design): each operand
  split once beforehand into hi = rna(a) and lo = rna(a - hi), both exact in TF32 (so the tensor cores read them
  whole), lo @ hi + hi @ lo + hi @ hi accumulated in float32;
- ``triton3``: not an emulation: the products run gpu/experiments/gemm_3xtf32.py's Triton kernel on the
  ``presplit`` operands (a GPU, or the interpreter; gpu/cliff_split3.py's ``triton3`` variant);
- ``tf32``: the products with both operands truncated to TF32 (one TF32 MMA);
- ``split3``: the products as three matmuls on the operands split as for ``tf32x3``, at torch's matmul precision
  (gpu/cliff_split3.py: three cuBLAS TF32 GEMMs on a GPU under "high"; exact on a CPU);
- ``ex2``: every float32 exp as ``tl.exp``: ex2.approx.f32(fl32(x log2 e)), the argument's rounding exact and
  ex2.approx's own error (<= 2^-22.5 relative, PTX ISA) as a uniform random factor of that size;
- ``div``: the standardized latents perturbed by a uniform relative 2^-23 (div.full.f32 and sqrt.approx.f32
  in the standardization instead of correctly rounded ones).

Gradient errors (norm / largest element) at (4096, 32, 128, 128) on the development CPU: fp32 1.03e-3 / 5.8e-3,
tf32x3 1.05e-3 / 5.8e-3, ex2 1.02e-3 / 5.8e-3, div 1.33e-3 / 5.6e-3, tf32x3+ex2+div 5.5e-3 / 3.8e-2; at (1024, 12, 64,
100): fp32 4.8e-4, tf32x3 5.1e-4, tf32 9.5e-2, ex2 4.9e-4 and 5.5e-4 (two draws), ex2+div 1.7e-3: perturbations
of a few float32 ulps move the gradient by up to 5x float32's own error (benchmarks/HISTORY.md, "Cliff, GPU-shaped").
Re-run on 2026-11-29 (the same command, this tree), gradient norm errors fp32 / tf32x3 / presplit: (64, 10, 10, 100)
2.73e-4 / 2.70e-4 / 2.75e-4; (1024, 12, 64, 100) 4.83e-4 / 5.06e-4 / 4.96e-4 (tf32 9.47e-2); (5000, 2, 100, 100)
2.71e-5 / 2.83e-5 / 2.85e-5; (4096, 32, 128, 128) 6.84e-3 / 6.81e-3 / 6.75e-3 (largest element 1.31e-2 each): the
float32 error at the largest shape now reads 6.8e-3, not the 1.03e-3 above (not traced); the split's is float32's at
every shape.
"""

from __future__ import annotations

import math
import sys
import time

import torch

from qkernels.reference import kde as ref

MODES: set[str] = set()
GEN = torch.Generator().manual_seed(123)


def _rna(x):  # cvt.rna.tf32.f32
    return ((x.contiguous().view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def _trunc(x):  # a raw float32 operand as a TF32 MMA reads it
    return (x.contiguous().view(torch.int32) & ~0x1FFF).view(torch.float32)


def _mm(a, b):
    if a.dtype == torch.float64 or not MODES & {"tf32", "tf32x3", "split3", "presplit", "triton3"}:
        return a @ b
    if "triton3" in MODES:
        from gemm_3xtf32 import CONFIGS, split, triton_3xtf32  # beside this file

        return triton_3xtf32(split(a), split(b), CONFIGS[0])
    if "presplit" in MODES:  # both parts exact in TF32: their products exact in float32, float32 accumulation
        ah, bh = _rna(a), _rna(b)
        al, bl = _rna(a - ah), _rna(b - bh)
        return (al @ bh + ah @ bl) + ah @ bh
    if "tf32" in MODES:
        return _trunc(a) @ _trunc(b)
    ah, bh = _rna(a), _rna(b)
    if "split3" in MODES:  # the split only: the three products at the matmuls' own precision
        return ah @ bh + (ah @ (b - bh) + (a - ah) @ bh)
    return (_trunc(a - ah) @ bh + ah @ _trunc(b - bh)) + ah @ bh


class _Product(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _mm(a, b)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return _mm(g, b.t().contiguous()), _mm(a.t().contiguous(), g)


class _Ex2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        r = torch.exp2((x * torch.tensor(math.log2(math.e), dtype=torch.float32)).double())
        r = r * (1 + (torch.rand(r.shape, generator=GEN, dtype=torch.float64) * 2 - 1) * 2**-22.5)
        ctx.save_for_backward(r.float())
        return r.float()

    @staticmethod
    def backward(ctx, g):
        return g * ctx.saved_tensors[0]


class _Perturbed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return (x.double() * (1 + (torch.rand(x.shape, generator=GEN, dtype=torch.float64) * 2 - 1) * 2**-23)).float()

    @staticmethod
    def backward(ctx, g):
        return g


class _Torch:
    """The reference module's ``torch`` with einsum (its bivariate product) and exp emulated per MODES."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def einsum(eq, *ops):
        if eq != "ikn,jmn->ijmk":
            return torch.einsum(eq, *ops)
        dker, ker = ops
        (d, k, n), m = dker.shape, ker.shape[1]
        out = _Product.apply(ker.reshape(d * m, n), dker.reshape(d * k, n).t())  # (j m, i k)
        return out.reshape(d, m, d, k).permute(2, 0, 1, 3)

    @staticmethod
    def exp(x):
        return _Ex2.apply(x) if x.dtype == torch.float32 and "ex2" in MODES else torch.exp(x)


_STANDARDIZE = ref.standardize


def _standardize(z):
    x = _STANDARDIZE(z)
    return _Perturbed.apply(x) if z.dtype == torch.float32 and "div" in MODES else x


def run(z, idx, k, dtype, sigma=0.1, grid=(-5.0, 5.0)):
    """(loss, gradient) of the reference Cliff (lambdas 0.5, 1, 0.7) in ``dtype`` under MODES."""
    zz = z.to(dtype).clone().requires_grad_()
    out = ref.cliff_loss(zz, idx, sigma, grid[0], grid[1], k, 0.5, 1.0, 0.7)
    out[0].backward()
    return out[0].detach().double(), zz.grad.double()


def main(argv):
    n, d, m, k = map(int, argv[:4])
    ref.torch, ref.standardize = _Torch(), _standardize
    g = torch.Generator().manual_seed(0)
    z = torch.randn(n, d, generator=g, dtype=torch.float64)
    idx = torch.stack([torch.randperm(n, generator=g)[:m] for _ in range(d)])
    MODES.clear()
    want, gw = run(z, idx, k, torch.float64)
    for mode in argv[4:]:
        MODES.clear()
        MODES.update(mode.split("+"))
        t0 = time.time()
        got, gg = run(z, idx, k, torch.float32)
        print(
            f"({n}, {d}, {m}, {k}) {mode}: loss {abs(got - want).item() / abs(want).item():.2e}, gradient norm "
            f"{((gg - gw).norm() / gw.norm()).item():.3e}, largest element "
            f"{((gg - gw).abs().max() / gw.abs().max()).item():.3e} ({time.time() - t0:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
