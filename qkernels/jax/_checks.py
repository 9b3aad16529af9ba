"""Trace-time checks of qkernels.jax's array arguments: shapes and dtypes are known while JAX traces, so a bad
argument raises here (ValueError / TypeError naming it, as the torch ops do), before anything runs. Values (NaN /
inf, index ranges) exist only at run time: the FFI handlers check them (csrc/include/qkernels/*_checks.h, shared with
the torch ops) and XLA raises a failed check as ``jax.errors.JaxRuntimeError`` carrying the same message.
The rules on numbers and shapes are the torch front-end's (:mod:`qkernels._args`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from qkernels._args import check_std_number, check_std_shape

HALF = (jnp.float16, jnp.bfloat16)


def array(name: str, x: Any, *, ndim: int | tuple[int, ...] | None = None, min_ndim: int = 0) -> jax.Array:
    """``x`` as a JAX array (a jax.Array, a tracer or a NumPy array) of float dtype with the given rank."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be a jax.Array, got {type(x).__name__}")
    x = jnp.asarray(x)
    on_cpu(name, x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    ranks = (ndim,) if isinstance(ndim, int) else ndim
    if ranks is not None and x.ndim not in ranks:
        want = " or ".join(f"{r}-d" for r in ranks)
        raise ValueError(f"{name} must be {want}, got shape {tuple(x.shape)}")
    if x.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(x.shape)}")
    if x.size == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(x.shape)}")
    return x


def on_cpu(name: str, x: Any) -> None:
    """The FFI targets are CPU ones: a concrete array on another device is an error naming it (a traced one
    placed elsewhere fails in XLA's lowering: no qkernels_* target for that platform)."""
    if not is_traced(x) and hasattr(x, "devices"):
        other = sorted({d.platform for d in x.devices()} - {"cpu"})
        if other:
            raise ValueError(
                f"{name} is on {other[0]}: qkernels.jax runs on the CPU only; move it with "
                f"jax.device_put({name}, jax.devices('cpu')[0])"
            )


def compute_dtype(*arrays: jax.Array) -> Any:
    """The kernels' dtype for these arrays: float64 if any is, else float32 (float16 / bfloat16 computed in
    float32, as the torch ops do: :mod:`qkernels._precision`)."""
    return jnp.float64 if any(a.dtype == jnp.float64 for a in arrays) else jnp.float32


def same_dtype(name_a: str, a: jax.Array, name_b: str, b: jax.Array) -> None:
    """Two float32 / float64 arguments of one dtype (halves are upcast, never mixed silently with float64)."""
    if a.dtype != b.dtype and not (a.dtype in HALF or b.dtype in HALF):
        raise TypeError(
            f"{name_a} has dtype {a.dtype} but {name_b} has dtype {b.dtype}: convert one "
            f"({name_a}.astype({b.dtype}) or {name_b}.astype({a.dtype}))"
        )


def is_traced(x: Any) -> bool:
    """Whether x is an abstract value (inside jit / grad / vmap): its values cannot be read."""
    return isinstance(x, jax.core.Tracer)


def std_array(std: Any, d: int, dtype: Any) -> jax.Array:
    """Per-latent scales (d,) from a number, a 0-d or a (d,) array (0-d: broadcast, gradient summed); values
    checked > 0 where they are concrete (a traced std's values exist only at run time)."""
    if isinstance(std, bool) or not (isinstance(std, (int, float)) or hasattr(std, "shape")):
        raise TypeError(f"std must be a number or an array of shape (d,), got {type(std).__name__}")
    if isinstance(std, (int, float)):
        return jnp.full((d,), check_std_number(std), dtype)
    s = jnp.asarray(std)
    if not jnp.issubdtype(s.dtype, jnp.floating):
        raise TypeError(f"std must be a floating-point array, got dtype {s.dtype}")
    check_std_shape(s.shape, d)
    if not is_traced(s) and not bool(jnp.all(jnp.isfinite(s) & (s > 0))):
        raise ValueError("std must be finite and > 0 everywhere")
    return jnp.broadcast_to(s.astype(dtype), (d,))
