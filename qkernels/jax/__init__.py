"""qkernels for JAX: the same C++ CPU kernels as the torch ops, as ``jax.custom_vjp`` functions over XLA FFI calls.

Install with ``pip install "qkernels[jax]"`` (JAX and jaxlib; the FFI library ``qkernels/jax/_kernels.abi3.so`` is built
when jax is importable at build time). ``import qkernels`` never imports JAX; ``import qkernels.jax`` does, and
registers the FFI targets (CPU). Every op runs under ``jax.jit``, ``jax.grad``, ``jax.value_and_grad`` and
``jax.vmap``, in float32 and float64 (``jax_enable_x64``). Under ``jax.vmap`` an op is one kernel call on the stacked
batch (folded into the op's own rows or latents: latent_quantize, kde_grid, the curvature reduction and the penalties
built on it), except klm_loss and cliff_loss, whose kernels couple every sample and latent of a problem: XLA loops
over the batch, one kernel call per element.

- :func:`klm_loss` (Tripod's KLM), :func:`normalized_hessian_penalty` (Tripod's NHP; its per-sample terms from
  the caller's directions :func:`hessian_penalty_terms`; its fused reduction :func:`finite_difference_curvature`),
  :func:`fsq` (Tripod's quantizer);
- :func:`latent_quantize` (QLAE's quantizer and its two losses);
- :func:`cliff_loss` (the Cliff criterion) and :func:`kde_grid`.

Bad shapes, dtypes and options raise ValueError / TypeError at trace time, as the torch ops do; bad values (NaN /
inf, indices out of range) are seen by the kernels at run time and raise ``jax.errors.JaxRuntimeError`` with the
torch op's message. CPU only: there is no GPU path yet, and the GPU check (gpu/gpu_check.sh) has no JAX step yet.
"""

from __future__ import annotations

from qkernels._extras import needs

with needs("qkernels.jax", "jax"):
    import jax  # noqa: F401

from qkernels.jax.hessian import finite_difference_curvature, hessian_penalty_terms, normalized_hessian_penalty
from qkernels.jax.kde import CliffTerms, cliff_loss, kde_grid, klm_loss
from qkernels.jax.quantize import Quantized, fsq, latent_quantize

__all__ = [
    "CliffTerms",
    "Quantized",
    "cliff_loss",
    "finite_difference_curvature",
    "fsq",
    "hessian_penalty_terms",
    "kde_grid",
    "klm_loss",
    "latent_quantize",
    "normalized_hessian_penalty",
]
