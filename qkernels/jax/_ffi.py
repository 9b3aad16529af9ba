"""The XLA FFI library of qkernels.jax: loaded with ctypes, its handlers registered as JAX FFI targets.

``qkernels/jax/_kernels.abi3.so`` (built by setup.py from csrc/jax when jax is importable at build time) exports one
C symbol per handler, ``qk_<target>``; each becomes the CPU FFI target ``qkernels_<target>``. The handlers run the
same C++ CPU kernels as the torch ops (csrc/cpu/*_impl.h) on XLA's intra-op thread pool.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

TARGETS = (
    "kde_grid_fwd",
    "kde_grid_bwd",
    "cliff_fwd",
    "cliff_bwd",
    "klm_fwd",
    "klm_bwd",
    "latent_quantize_fwd",
    "latent_quantize_bwd",
    "fd_curvature_fwd",
    "fd_curvature_bwd",
)
REBUILD = (
    "install jax first, then rebuild: `bash scripts/bootstrap.sh` in a clone, or `pip install "
    "--no-build-isolation -e .` in the source tree (setup.py builds the library only when jax is importable)"
)


def _library_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "_kernels*.so")))
    if not found:
        raise ImportError(
            f"qkernels.jax needs its XLA FFI library qkernels/jax/_kernels.abi3.so, which this install of "
            f"qkernels lacks: {REBUILD}"
        )
    return found[0]


PATH = _library_path()
_LIB = ctypes.cdll.LoadLibrary(PATH)
for _target in TARGETS:
    jax.ffi.register_ffi_target(
        f"qkernels_{_target}", jax.ffi.pycapsule(getattr(_LIB, f"qk_{_target}")), platform="cpu"
    )


def call(target: str, results: Any, *args: jax.Array, **attrs: Any) -> Any:
    """ffi_call of ``qkernels_<target>`` with ``results`` (a ShapeDtypeStruct or a sequence of them).

    Under ``jax.vmap`` the call runs once per batch element (``vmap_method="sequential"``): every op here reduces
    over its whole input (losses, densities over the batch), so a batch of inputs is a batch of separate calls.
    Attributes: Python floats and ints are passed as float64 / int64 (numpy scalars), bools and strings as they are.
    """
    converted = {
        k: np.float64(v)
        if isinstance(v, float)
        else np.int64(v)
        if isinstance(v, int) and not isinstance(v, bool)
        else v
        for k, v in attrs.items()
    }
    return jax.ffi.ffi_call(f"qkernels_{target}", results, vmap_method="sequential")(*args, **converted)


def like(x: jax.Array, shape: Sequence[int] | None = None, dtype: Any = None) -> jax.ShapeDtypeStruct:
    """A result shaped ``shape`` (default x's) of ``dtype`` (default x's)."""
    return jax.ShapeDtypeStruct(tuple(x.shape) if shape is None else tuple(shape), x.dtype if dtype is None else dtype)


def index_dtype() -> Any:
    """The integer dtype of index outputs: int64 with ``jax_enable_x64``, else int32."""
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32
