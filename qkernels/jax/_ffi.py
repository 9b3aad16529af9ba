"""The XLA FFI libraries of qkernels.jax: loaded with ctypes, their handlers registered as JAX FFI targets.

``qkernels/jax/_kernels.abi3.so`` (built by setup.py from csrc/jax when jax is importable at build time) exports one
C symbol, ``qk_ffi_targets``: its registration table, one handler per op, named as the op's declaration
(:mod:`qkernels.decl`), each with its platform; each becomes the FFI target ``qkernels_<op>`` of that platform. The CPU
handlers run the same C++ CPU kernels as the torch ops (csrc/cpu/*_impl.h) on XLA's intra-op thread pool. A build with
the CUDA kernels adds ``qkernels/jax/_kernels_cuda.abi3.so`` (csrc/jax/cuda): CUDA handlers of the ops whose torch
CUDA kernels exist (csrc/cuda/*.cu), on the stream XLA gives them, registered for JAX's "CUDA" platform. A table
entry that is no op is a helper of the front-end (:func:`check_values`). :func:`call` derives an FFI call's results
from the op's declaration.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from qkernels import decl

REBUILD = (
    "install jax first, then rebuild: `bash scripts/bootstrap.sh` in a clone, or `pip install "
    "--no-build-isolation -e .` in the source tree (setup.py builds the library only when jax is importable)"
)


def _library_path(name: str) -> str | None:
    """qkernels/jax/<name>.<abi tag>.so, or None."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, f"{name}.*so")))
    return found[0] if found else None


def _table(lib: ctypes.CDLL) -> list[tuple[str, str, bool, int]]:
    """The library's registration table: (name, platform, whether it runs an op, handler address) per entry."""
    read = lib.qk_ffi_targets
    read.restype = ctypes.c_int64
    read.argtypes = [
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_int32),
        ctypes.c_int64,
    ]
    count = read(None, None, None, None, 0)
    names, handlers = (ctypes.c_char_p * count)(), (ctypes.c_void_p * count)()
    platforms, ops = (ctypes.c_char_p * count)(), (ctypes.c_int32 * count)()
    read(names, handlers, platforms, ops, count)
    return [(names[i].decode(), platforms[i].decode(), bool(ops[i]), handlers[i]) for i in range(count)]


PATH = _library_path("_kernels")
if PATH is None:
    raise ImportError(
        f"qkernels.jax needs its XLA FFI library qkernels/jax/_kernels.abi3.so, which this install of qkernels lacks: "
        f"{REBUILD}"
    )
TABLE = _table(ctypes.cdll.LoadLibrary(PATH))
# the CUDA handlers, where built (CUDA_MISSING says why not when they are absent)
CUDA_PATH = _library_path("_kernels_cuda")
CUDA_MISSING = "this install of qkernels was built without its CUDA kernels" if CUDA_PATH is None else None
if CUDA_PATH is not None:
    try:
        TABLE += _table(ctypes.cdll.LoadLibrary(CUDA_PATH))
    except OSError as err:  # a broken CUDA install must not take the CPU ops with it
        CUDA_MISSING = f"{CUDA_PATH} did not load: {err}"
for _name, _platform, _, _handler in TABLE:
    jax.ffi.register_ffi_target(f"qkernels_{_name}", jax.ffi.pycapsule(_handler), platform=_platform)
# the ops with a CPU handler (named as their declarations), and every target's platforms
TARGETS = {name: handler for name, platform, op, handler in TABLE if op and platform == "cpu"}
PLATFORMS = {name: {p for n, p, _, _ in TABLE if n == name} for name, _, _, _ in TABLE}


@partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def check_values(x: jax.Array, op: str, name: str, positive: bool = False) -> jax.Array:
    """``x`` (float32 / float64), checked at run time: a NaN or inf value (with ``positive``, a value <= 0) raises
    ``jax.errors.JaxRuntimeError`` with the message "<op>: <name> contains NaN or inf" (or "must be > 0
    everywhere"), as the torch op's check would (the handler runs csrc/include/qkernels/checks.h's check;
    QKERNELS_CHECK_FINITE=0 turns it off). For values that reach no kernel's own checks; the identity for the
    derivatives."""
    return jax.ffi.ffi_call(
        "qkernels_check_values",
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        vmap_method="expand_dims",
        input_output_aliases={0: 0},
    )(x, op=op, name=name, positive=bool(positive))


@check_values.defjvp
def _check_values_jvp(op, name, positive, primals, tangents):
    return check_values(primals[0], op, name, positive), tangents[0]


# a batching rule of an op's FFI call: (batch size, which tensors are batched, the tensors by declared name; a batched
# one has the batch as its leading axis) -> (the call's outputs, which of them are batched)
VmapRule = Callable[[int, dict[str, bool], dict[str, jax.Array]], tuple[Sequence[jax.Array], Sequence[bool]]]


def call(op: decl.Op, tensors: Mapping[str, jax.Array | None], *, vmap: VmapRule | None = None, **scalars: Any) -> Any:
    """ffi_call of ``qkernels_<op>`` on the tensor arguments ``tensors`` (by declared name; an optional one may be
    None or left out) and the scalar arguments ``scalars`` (by declared name, every one).

    Operands: the required tensors in declared order, then the optional ones given. Results: the declared outputs'
    shapes, in the data's dtype (indices: :func:`index_dtype`); one output is returned as it is, several as a tuple.
    Scalars: Python floats and ints are passed as float64 / int64 attributes (numpy scalars), bools and strings as
    they are. Under ``jax.vmap``: ``vmap(batch size, batched, tensors)`` computes the batch (typically one call of
    the op with the batch folded into its own rows or latents, :func:`batched`), else the call runs once per batch
    element (``vmap_method="sequential"``).
    """
    declared = {a.name for a in op.args}
    missing = {a.name for a in op.args if isinstance(a, decl.Scalar)} - set(scalars)
    if (set(tensors) | set(scalars)) - declared or missing:
        raise TypeError(
            f"{op.name}: call with the declared arguments {sorted(declared)}, got {sorted({*tensors, *scalars})}"
        )
    names = [t.name for t in op.tensors if not t.optional]
    names += [t.name for t in op.tensors if t.optional and tensors.get(t.name) is not None]
    env = op.bind([tensors.get(a.name) if isinstance(a, decl.Tensor) else scalars[a.name] for a in op.args])
    data = next(tensors[t.name] for t in op.tensors if t.role == "data")
    results = tuple(
        jax.ShapeDtypeStruct(tuple(shape), index_dtype() if o.dtype == "index" else data.dtype)
        for o, shape in zip(op.outputs, op.output_shapes(env), strict=True)
    )
    attrs = {
        k: np.float64(v)
        if isinstance(v, float)
        else np.int64(v)
        if isinstance(v, int) and not isinstance(v, bool)
        else v
        for k, v in scalars.items()
    }

    def run(*operands: jax.Array) -> tuple[jax.Array, ...]:
        return tuple(jax.ffi.ffi_call(f"qkernels_{op.name}", results, vmap_method="sequential")(*operands, **attrs))

    if vmap is None:
        out = run(*(tensors[name] for name in names))
    else:
        rule = vmap
        custom = jax.custom_batching.custom_vmap(run)

        @custom.def_vmap
        def _rule(size: int, in_batched: Sequence[bool], *operands: jax.Array) -> tuple[tuple, tuple]:
            outs, out_batched = rule(
                size, dict(zip(names, in_batched, strict=True)), dict(zip(names, operands, strict=True))
            )
            return tuple(outs), tuple(out_batched)

        out = custom(*(tensors[name] for name in names))
    return out[0] if len(results) == 1 else out


def batched(size: int, in_batched: Mapping[str, bool], tensors: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The tensors of a batching rule, each with the batch as its leading axis (an unbatched one broadcast)."""
    return {name: x if in_batched[name] else jnp.broadcast_to(x, (size, *x.shape)) for name, x in tensors.items()}


def index_dtype() -> Any:
    """The integer dtype of index outputs: int64 with ``jax_enable_x64``, else int32."""
    return jnp.int64 if jax.config.jax_enable_x64 else jnp.int32
