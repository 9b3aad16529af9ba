"""Trace-time checks of qkernels.jax's array arguments: shapes and dtypes are known while JAX traces, so a bad
argument raises here (ValueError / TypeError naming it, as the torch ops do), before anything runs. Values (NaN /
inf, index ranges) exist only at run time: the FFI handlers check them (csrc/include/qkernels/*_checks.h, shared with
the torch ops) and XLA raises a failed check as ``jax.errors.JaxRuntimeError`` carrying the same message.
The rules on numbers and shapes are the torch front-end's (:mod:`qkernels._args`)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from qkernels._args import check_std_number, check_std_shape
from qkernels._args import compute_dtype as shared_compute_dtype
from qkernels.jax._ffi import CUDA_MISSING, PLATFORMS, check_values


def array(
    name: str, x: Any, *, ndim: int | tuple[int, ...] | None = None, min_ndim: int = 0, op: str | None = None
) -> jax.Array:
    """``x`` as a JAX array (a jax.Array, a tracer or a NumPy array) of float dtype with the given rank, on a device
    where the FFI target ``op`` runs (:func:`on_device`)."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name} must be a jax.Array, got {type(x).__name__}")
    if not isinstance(x, jax.Array):  # (a jax.Array or tracer as it is: a concrete one stays concrete in jit)
        x = jnp.asarray(x)
    on_device(name, x, op)
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


def on_device(name: str, x: Any, op: str | None) -> None:
    """A concrete array on a device where the FFI target ``op`` has a handler (the CPU; a GPU where the CUDA handlers
    are built and ``op`` has one), else a ValueError naming it (a traced one placed elsewhere fails in XLA's lowering:
    no qkernels_<op> target for that platform)."""
    if is_traced(x) or not hasattr(x, "devices"):
        return
    cuda = op is not None and "CUDA" in PLATFORMS.get(op, set())
    other = sorted({d.platform for d in x.devices()} - {"cpu", *(("gpu", "cuda") if cuda else ())})
    if other:
        why = CUDA_MISSING or f"{op} has no CUDA handler (no CUDA kernel)" if other[0] in ("gpu", "cuda") else None
        raise ValueError(
            f"{name} is on {other[0]}: qkernels.jax runs {op or 'this op'} on the CPU only"
            + (f" ({why})" if why else "")
            + f"; move it with jax.device_put({name}, jax.devices('cpu')[0])"
        )


def compute_dtype(**arrays: Any) -> Any:
    """The kernels' dtype for these arrays (None entries ignored): float64 if all are float64, else float32
    (float16 / bfloat16 computed in float32); float64 mixed with another dtype is a TypeError naming both. The rule of
    both front-ends: :func:`qkernels._args.compute_dtype`."""
    dtypes = {name: jnp.dtype(a.dtype).name for name, a in arrays.items() if a is not None}
    return jnp.float64 if shared_compute_dtype(dtypes, "{name}.astype(jnp.{dtype})") == "float64" else jnp.float32


def is_traced(x: Any) -> bool:
    """Whether x is an abstract value (inside jit / grad / vmap): its values cannot be read."""
    return isinstance(x, jax.core.Tracer)


def concrete(x: Any) -> np.ndarray | None:
    """x's values on the host when it has them now (a NumPy array, or a jax.Array that is no tracer: also one that a
    jitted function closes over), else None (a traced value: its values exist at run time only)."""
    return None if is_traced(x) else np.asarray(x)


def std_array(std: Any, d: int, dtype: Any, op: str, *, kernel_checks: bool) -> jax.Array:
    """Per-latent scales (d,) in ``dtype`` from a number, a 0-d or a (d,) array (0-d: broadcast, gradient summed).
    Values must be finite and > 0: checked now where they are concrete; a traced std is checked at run time, by the
    op's kernel where it reads std (``kernel_checks``), else by :func:`qkernels.jax._ffi.check_values`."""
    if isinstance(std, bool) or not (isinstance(std, (int, float)) or hasattr(std, "shape")):
        raise TypeError(f"std must be a number or an array of shape (d,), got {type(std).__name__}")
    if isinstance(std, (int, float)):
        return jnp.full((d,), check_std_number(std), dtype)
    if not jnp.issubdtype(std.dtype, jnp.floating):
        raise TypeError(f"std must be a floating-point array, got dtype {std.dtype}")
    check_std_shape(std.shape, d)
    values = concrete(std)
    if values is not None and not bool(np.all(np.isfinite(values) & (values > 0))):
        raise ValueError("std must be finite and > 0 everywhere")
    s = jnp.asarray(std).astype(dtype)
    if values is None and not kernel_checks:
        s = check_values(s, op, "std", positive=True)
    return jnp.broadcast_to(s, (d,))
