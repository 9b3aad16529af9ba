"""Loading of the native extension ``qkernels._C`` and why it may be missing.

``qkernels._C`` uses only PyTorch's stable C ABI, which torch keeps from the release the extension
targets onwards: it loads into every torch at or above that target (2.11), whichever torch it was compiled
against. ``setup.py`` records the target in ``qkernels/_build_info.py``; under an older torch ``_C`` is not
imported (its stable symbols would not resolve): one :class:`ExtensionMismatchWarning` line says which torch it
needs, which is present and what to do, the ``cpu`` and ``cuda`` backends are unavailable with that reason, and
``reference`` and ``triton`` work as before.

The CUDA kernels are a library of their own, ``qkernels/_C_cuda.abi3.so`` (built when torch has CUDA and nvcc is
found), loaded after ``_C`` only under a torch with CUDA: it links torch's CUDA libraries, which a CPU build of torch
lacks, so one wheel serves both. Why it is not loaded: :data:`CUDA_REASON`.
"""

from __future__ import annotations

import os
import re
import warnings

import torch

LOADED = False
REASON: str | None = None
CUDA_REASON: str | None = "qkernels._C is not loaded"
REBUILD = "`bash scripts/bootstrap.sh` in a clone, or `pip install --no-build-isolation -e .` in the source tree"


class ExtensionMismatchWarning(RuntimeWarning):
    """qkernels._C needs a newer torch than the one imported: it is not loaded."""


def target() -> str | None:
    """The oldest torch ``qkernels._C`` loads into, "major.minor" (None: not recorded, e.g. no native build)."""
    try:
        from qkernels import _build_info
    except ImportError:
        return None
    return getattr(_build_info, "TORCH_TARGET", None)


def _release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version: "2.14.1+cpu", "2.12.0a0+git1234" and "2.11" alike."""
    major, minor = (re.match(r"\d+", part) for part in version.split(".")[:2])
    return int(major.group()) if major else 0, int(minor.group()) if minor else 0


def mismatch_reason(needs: str | None, present: str) -> str | None:
    """The one-line reason ``qkernels._C`` (for torch >= ``needs``) cannot load in torch ``present``."""
    if needs is None or _release(present) >= _release(needs):
        return None
    return (
        f"qkernels._C needs torch >= {needs} (the stable ABI it is built for) but torch {present} is installed, "
        f"so it is not loaded (the reference and triton backends still work); install torch>={needs}"
    )


if os.environ.get("QKERNELS_NO_EXT", "0") == "1":
    REASON = "QKERNELS_NO_EXT=1 is set"
elif (REASON := mismatch_reason(target(), torch.__version__)) is not None:
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


def _load_cuda_kernels() -> str | None:
    """Loads qkernels/_C_cuda.abi3.so (its STABLE_TORCH_LIBRARY_IMPL(qkernels, CUDA) registrations); why not."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} has no CUDA"
    lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_C_cuda.abi3.so")
    if not os.path.exists(lib):
        return "qkernels was built without CUDA kernels (torch without CUDA, no nvcc, or no TORCH_CUDA_ARCH_LIST)"
    try:
        torch.ops.load_library(lib)
    except OSError as exc:  # e.g. the CUDA runtime of another CUDA major version than the kernels were built for
        return f"qkernels/_C_cuda.abi3.so could not be loaded ({str(exc).splitlines()[0]})"
    return None


if LOADED:
    CUDA_REASON = _load_cuda_kernels()


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
    """Whether the CUDA kernels (qkernels/_C_cuda.abi3.so) are loaded."""
    return any(has_kernel(op, "CUDA") for op in NATIVE)
