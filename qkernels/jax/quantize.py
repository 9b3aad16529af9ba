"""Quantization for JAX: :func:`latent_quantize` (QLAE) and :func:`fsq` (Tripod).

:func:`latent_quantize` is a ``jax.custom_vjp`` whose forward and backward are XLA FFI calls of the C++ CPU
kernel the torch op uses (csrc/cpu/quantize_impl.h through csrc/jax/quantize_ffi.cpp). :func:`fsq` is elementwise
and has no kernel in either front-end (the torch op is PyTorch elementwise code, :func:`qkernels.fsq`): here it is
jax.numpy, which XLA fuses with the ops around it (an FFI call would be a fusion barrier at memory speed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from qkernels._args import check_codebook, check_levels
from qkernels.decl import quantize as decl
from qkernels.jax import _checks
from qkernels.jax._ffi import call, check_values, index_dtype


class Quantized(NamedTuple):
    """Output of :func:`latent_quantize` and :func:`fsq` (a named tuple, a JAX pytree).

    Attributes:
        z_q: (..., d) straight-through quantized latents in z's dtype.
        indices: (..., d) codebook indices (int32; int64 with ``jax_enable_x64``).
        loss_quantize: scalar codebook loss (QLAE eq. 5; zero for FSQ).
        loss_commit: scalar commitment loss (QLAE eq. 5; zero for FSQ).
    """

    z_q: jax.Array
    indices: jax.Array
    loss_quantize: jax.Array
    loss_commit: jax.Array


@jax.custom_vjp
def _latent_quantize(z: jax.Array, values: jax.Array) -> tuple[jax.Array, ...]:
    return _latent_quantize_fwd(z, values)[0]


def _latent_quantize_fwd(z, values):
    z_q, idx, loss_q, loss_c = call(decl.LATENT_QUANTIZE, {"z": z, "values": values})
    return (z_q, idx, loss_q, loss_c), (z, values, idx)


def _latent_quantize_bwd(res, grads):
    z, values, idx = res
    g_zq, _g_idx, g_lq, g_lc = grads
    return call(
        decl.LATENT_QUANTIZE.backward,
        {
            "grad_z_q": g_zq,
            "grad_loss_quantize": g_lq,
            "grad_loss_commit": g_lc,
            "z": z,
            "values": values,
            "indices": idx,
        },
    )


_latent_quantize.defvjp(_latent_quantize_fwd, _latent_quantize_bwd)


def latent_quantize(z: jax.Array, values: jax.Array) -> Quantized:
    """Nearest-codebook scalar quantization with straight-through gradients (QLAE, Alg. 1), as
    :func:`qkernels.latent_quantize`.

    Args:
        z: (..., d) float latents.
        values: (d, n_v), one scalar codebook per latent (QLAE), or (n_v,), a global codebook.

    Returns:
        :class:`Quantized`: z_q (..., d), the nearest value (ties -> lowest index) with the gradient passed
        straight through to z; indices (..., d); loss_quantize = mean((sg(z) - z_q)^2) (gradient to values only);
        loss_commit = mean((z - sg(z_q))^2) (gradient to z only). Half-precision inputs: computed in float32,
        z_q in z's dtype, the losses float32.

    Raises:
        ValueError / TypeError: a misshaped codebook or mixed float32 / float64, at trace time; NaN / inf values
            raise ``jax.errors.JaxRuntimeError`` at run time.
    """
    z = _checks.array("z", z, min_ndim=1)
    values = _checks.array("values", values, ndim=(1, 2))
    dt = _checks.compute_dtype(z=z, values=values)
    d = z.shape[-1]
    check_codebook("values", values.shape, d, z.shape)
    vals = (values[None] if values.ndim == 1 else values).astype(dt)
    z_q, idx, loss_q, loss_c = _latent_quantize(z.reshape(-1, d).astype(dt), vals)
    return Quantized(z_q.reshape(z.shape).astype(z.dtype), idx.reshape(z.shape), loss_q, loss_c)


def fsq(z: jax.Array, levels: int | Sequence[int]) -> Quantized:
    """Finite scalar quantization (Tripod eq. 10) with a straight-through round, as :func:`qkernels.fsq`.

    z_q = 2 round((tanh(z) + 1) / 2 (L - 1)) / (L - 1) - 1 in [-1, 1], with gradient 1 - tanh(z)^2.

    Args:
        z: (..., d) float latents.
        levels: L, an int or one int per latent (a sequence of d ints), each >= 2.

    Returns:
        :class:`Quantized`: z_q (..., d) in z's dtype, indices (..., d) in [0, L - 1], zero auxiliary losses.

    Raises:
        TypeError: levels not integers. ValueError: a level < 2, or neither 1 nor d levels. NaN / inf values raise
            ``jax.errors.JaxRuntimeError`` at run time.
    """
    z = _checks.array("z", z, min_ndim=1)
    top = jnp.asarray([v - 1 for v in check_levels(levels, z.shape[-1])], z.dtype)
    # NaN / inf raise at run time, as the torch op's check (half precision checked in float32: an exact round trip)
    z = check_values(z.astype(_checks.compute_dtype(z=z)), "fsq", "z").astype(z.dtype)
    q = (jnp.tanh(z) + 1) / 2 * top
    rounded = jnp.round(q)  # half to even, as torch.round
    z_q = 2 * (rounded + (q - jax.lax.stop_gradient(q))) / top - 1
    zero = jnp.zeros((), z.dtype)
    return Quantized(z_q, rounded.astype(index_dtype()), zero, zero)
