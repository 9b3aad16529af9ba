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
from qkernels.jax._ffi import batched, call, check_values, index_dtype


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
    z_q, idx, loss_q, loss_c = call(decl.LATENT_QUANTIZE, {"z": z, "values": values}, vmap=_forward_vmap)
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
        vmap=_backward_vmap,
    )


# Under jax.vmap (a batch of B problems z (N, d), values (G, n_v)) each direction is ONE kernel call. Quantization is
# per row and per latent: a batch with one codebook is B N rows; a batch of codebooks is B d latents (z (N, B d),
# values (B d, n_v)), which also keeps each problem's codebook gradient apart. The per-problem losses (means over each
# problem's N d entries) come from z and z_q; their gradients are the kernel's for unit loss gradients, scaled per
# problem (the backward is linear in them). With one codebook, each problem's codebook gradient (what vmap of a
# backward returns, before JAX sums it for a codebook outside the vmap) is a one-hot contraction of its own entries.


def _as_latents(z: jax.Array, values: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(B, N, d) latents and (B, G, n_v) codebooks as one problem of B d latents: (N, B d), (B d, n_v)."""
    b, n, d = z.shape
    codebooks = jnp.broadcast_to(values, (b, d, values.shape[-1])).reshape(b * d, -1)
    return jnp.moveaxis(z, 0, 1).reshape(n, b * d), codebooks


def _from_latents(x: jax.Array, b: int) -> jax.Array:
    """(N, B d) -> (B, N, d)."""
    return jnp.moveaxis(x.reshape(x.shape[0], b, -1), 1, 0)


def _forward_vmap(size, in_batched, t):
    if in_batched["values"]:
        t = batched(size, in_batched, t)
        z, values = _as_latents(t["z"], t["values"])
        z_q, idx, _, _ = call(decl.LATENT_QUANTIZE, {"z": z, "values": values}, vmap=_forward_vmap)
        z_q, idx = _from_latents(z_q, size), _from_latents(idx, size)
    else:  # more rows
        z = t["z"]
        z_q, idx, _, _ = call(
            decl.LATENT_QUANTIZE, {"z": z.reshape(-1, z.shape[-1]), "values": t["values"]}, vmap=_forward_vmap
        )
        z_q, idx = z_q.reshape(z.shape), idx.reshape(z.shape)
    loss = jnp.mean(jnp.square(t["z"] - z_q), axis=(1, 2))
    return (z_q, idx, loss, loss), (True, True, True, True)


def _backward_vmap(size, in_batched, t):
    values = t.pop("values")  # (G, n_v), or (B, G, n_v) batched
    t = batched(size, in_batched, t)
    b, n, d = t["z"].shape
    one = jnp.ones((), t["z"].dtype)
    unit = {"grad_loss_quantize": one, "grad_loss_commit": one}  # the backward is linear in the loss gradients
    if in_batched["values"]:  # more latents: the kernel keeps each problem's codebook gradient apart
        z, folded = _as_latents(t["z"], values)
        rows = {"z": z, "values": folded, "indices": _as_latents(t["indices"], values)[0]}
        unit_z, unit_v = call(
            decl.LATENT_QUANTIZE.backward, {"grad_z_q": jnp.zeros_like(z), **unit, **rows}, vmap=_backward_vmap
        )
        unit_z, unit_v = _from_latents(unit_z, b), b * unit_v.reshape(b, d, -1)
    else:  # more rows; each problem's codebook gradient 2 (z_q - z) / (N d) from its own entries
        z, indices = t["z"].reshape(-1, d), t["indices"].reshape(-1, d)
        rows = {"z": z, "values": values, "indices": indices}
        unit_z = call(
            decl.LATENT_QUANTIZE.backward, {"grad_z_q": jnp.zeros_like(z), **unit, **rows}, vmap=_backward_vmap
        )[0].reshape(b, n, d)
        z_q = jnp.broadcast_to(values, (d, values.shape[-1]))[jnp.arange(d), t["indices"]]
        entries = jax.nn.one_hot(t["indices"], values.shape[-1], dtype=z_q.dtype)
        unit_v = (entries * (2 * (z_q - t["z"]) / (n * d))[..., None]).sum(1)  # (B, d, n_v)
    if values.shape[-2] == 1 and d != 1:  # one codebook per problem
        unit_v = unit_v.sum(1, keepdims=True)
    # the kernel's loss is a mean over the B N d entries of all problems, each problem's over its N d: scaled by B
    g_lq, g_lc = (t[name].astype(unit_z.dtype)[:, None, None] for name in ("grad_loss_quantize", "grad_loss_commit"))
    return (t["grad_z_q"] + b * g_lc * unit_z, g_lq * unit_v), (True, True)


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
    z = _checks.array("z", z, min_ndim=1, op="latent_quantize")
    values = _checks.array("values", values, ndim=(1, 2), op="latent_quantize")
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
    z = _checks.array("z", z, min_ndim=1, op="check_values")  # (FSQ is jax.numpy and this check)
    top = jnp.asarray([v - 1 for v in check_levels(levels, z.shape[-1])], z.dtype)
    # NaN / inf raise at run time, as the torch op's check (half precision checked in float32: an exact round trip)
    z = check_values(z.astype(_checks.compute_dtype(z=z)), "fsq", "z").astype(z.dtype)
    q = (jnp.tanh(z) + 1) / 2 * top
    rounded = jnp.round(q)  # half to even, as torch.round
    z_q = 2 * (rounded + (q - jax.lax.stop_gradient(q))) / top - 1
    zero = jnp.zeros((), z.dtype)
    return Quantized(z_q, rounded.astype(index_dtype()), zero, zero)
