"""Loading of the native extension ``qkernels._C`` and why it may be missing.

``qkernels._C`` is C++ compiled against one torch: its symbols only resolve in that torch. ``setup.py`` records it
in ``qkernels/_build_info.py``; when the torch present differs, ``_C`` is not imported (no undefined-symbol
traceback): one :class:`ExtensionMismatchWarning` line says which torch it was built for, which is present and how
to rebuild, the ``cpu`` and ``cuda`` backends are unavailable with that reason, and ``reference`` and ``triton``
work as before.
"""

from __future__ import annotations

import os
import warnings

import torch

LOADED = False
REASON: str | None = None
REBUILD = "`bash scripts/bootstrap.sh` in a clone, or `pip install --no-build-isolation -e .` in the source tree"


class ExtensionMismatchWarning(RuntimeWarning):
    """qkernels._C was built against another torch than the one imported: it is not loaded."""


def built_for() -> str | None:
    """The torch version ``qkernels._C`` was compiled against (None: not recorded, e.g. no native build)."""
    try:
        from qkernels import _build_info
    except ImportError:
        return None
    return getattr(_build_info, "TORCH_VERSION", None)


def _release(version: str) -> str:
    return version.split("+", 1)[0]  # "2.13.0+cpu" and "2.13.0+cu128" share their C++ symbols


def mismatch_reason(built: str | None, present: str) -> str | None:
    """The one-line reason ``qkernels._C`` (built against torch ``built``) cannot load in torch ``present``."""
    if built is None or _release(built) == _release(present):
        return None
    return (f"qkernels._C was built for torch {built} but torch {present} is installed, so it is not loaded "
            f"(the reference and triton backends still work); rebuild it against this torch: {REBUILD}, "
            f"or install torch {_release(built)}")


if os.environ.get("QKERNELS_NO_EXT", "0") == "1":
    REASON = "QKERNELS_NO_EXT=1 is set"
elif (REASON := mismatch_reason(built_for(), torch.__version__)) is not None:
    warnings.warn(REASON, ExtensionMismatchWarning, stacklevel=2)
else:
    try:
        from qkernels import _C  # noqa: F401  (import registers the qkernels:: C++ ops)

        LOADED = True
    except ImportError as exc:  # pragma: no cover - depends on how the package was installed
        REASON = (
            f"qkernels._C could not be imported ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
            f"rebuild it against this torch ({torch.__version__}): {REBUILD}, without QKERNELS_NO_EXT=1"
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
