"""Loading of the native extension ``qkernels._C`` and why it may be missing."""

from __future__ import annotations

import os

import torch

LOADED = False
REASON: str | None = None

if os.environ.get("QKERNELS_NO_EXT", "0") == "1":
    REASON = "QKERNELS_NO_EXT=1 is set"
else:
    try:
        from qkernels import _C  # noqa: F401  (import registers the qkernels:: C++ ops)

        LOADED = True
    except ImportError as exc:  # pragma: no cover - depends on how the package was installed
        REASON = (
            f"qkernels._C is not built ({exc}); reinstall with "
            "`pip install --no-build-isolation -e .` without QKERNELS_NO_EXT=1"
        )


def path() -> str | None:
    """File of the loaded native extension (None when not loaded)."""
    if not LOADED:
        return None
    from qkernels import _C

    return _C.__file__


# the C++ ops qkernels._C defined (csrc/schemas.cpp), read from the dispatcher once it is loaded
NATIVE: frozenset[str] = frozenset(
    n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if LOADED and n.startswith("qkernels::")
)


def has_kernel(op: str, dispatch_key: str) -> bool:
    """Whether the C++ op ``qkernels::<op>`` has a kernel for ``dispatch_key`` ("CPU", "CUDA")."""
    return op in NATIVE and torch._C._dispatch_has_kernel_for_dispatch_key(f"qkernels::{op}", dispatch_key)


def cuda_built() -> bool:
    """Whether qkernels._C contains CUDA kernels."""
    return any(has_kernel(op, "CUDA") for op in NATIVE)
