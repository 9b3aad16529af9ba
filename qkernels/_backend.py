"""Backend selection: ``reference``, ``cpu``, ``triton``, ``cuda`` and ``auto``.

Every op registers one implementation per backend it supports (same signature and semantics as
its reference). ``auto`` (the default) picks the fastest available backend for the tensors'
device and silently falls back to ``reference``; a backend forced with
:func:`use_backend` or ``QKERNELS_BACKEND`` must be usable or the call raises
:class:`BackendUnavailableError` saying why.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch

from qkernels import _ext

# an op's implementation on one backend (the reference's signature)
Kernel = Callable[..., Any]

BACKENDS = ("reference", "cpu", "triton", "cuda")

# auto's order of preference, per device type and op (first available implementation wins); "*" is the order for
# ops without a row of their own. Every row is a measurement: a kernel comes first only where it ran correct and was
# measured faster than the reference on that device; each row links to the note giving its numbers.
# An order may be split in bands by the size of the call: ``((largest work, order), ..., (inf, order))``, the first
# band whose bound is >= the call's work (:data:`WORK`) applies (docs/design/routing.md#how-a-pick-is-made).
Order = tuple[str, ...]
AUTO_ORDER: dict[str, dict[str, Order | tuple[tuple[float, Order], ...]]] = {
    "cpu": {
        "*": ("cpu", "reference"),  # docs/design/routing.md#cpu
    },
    "cuda": {  # docs/design/routing.md#cuda
        # docs/design/routing.md#cliff_loss
        "cliff_loss": ((2e9, ("triton", "reference")), (float("inf"), ("reference",))),
        # docs/design/routing.md#klm
        "klm": ((1e8, ("cuda", "triton", "reference")), (float("inf"), ("triton", "cuda", "reference"))),
        # docs/design/routing.md#latent_quantize
        "latent_quantize": ((1e6, ("cuda", "triton", "reference")), (float("inf"), ("triton", "cuda", "reference"))),
        # docs/design/routing.md#kde_grid
        "kde_grid": ((1e6, ("cuda", "triton", "reference")), (float("inf"), ("triton", "cuda", "reference"))),
        "relaxed_categorical": ("cuda", "triton", "reference"),  # docs/design/routing.md#relaxed_categorical
        # docs/design/routing.md#finite_difference_curvature
        "finite_difference_curvature": ("triton", "cuda", "reference"),
        "*": ("reference",),  # docs/design/routing.md#unmeasured-ops
    },
}

# the size of a call that picks its band (an op without bands ignores it): per op, what select()'s work counts
WORK = {
    "cliff_loss": "d^2 n M K (latents, samples, conditioning rows, grid points)",
    "klm": "n^2 d",
    "latent_quantize": "elements of z",
    "kde_grid": "n d K (samples, latents, points)",
}


def _auto_order(op: str, device_type: str, work: float) -> Order:
    """auto's backends for ``op`` on ``device_type``, in order, for a call of size ``work``."""
    table = AUTO_ORDER.get(device_type, {})
    entry = table.get(op) or table.get("*", ("reference",))
    if isinstance(entry[0], str):
        return entry
    return next(order for bound, order in entry if work <= bound)


class BackendUnavailableError(RuntimeError):
    """A forced backend cannot run the requested op on the given tensors (a RuntimeError saying why).

    Examples:
        The cuda backend never runs on CPU tensors:

        >>> import torch
        >>> import qkernels
        >>> with qkernels.use_backend("cuda"):
        ...     qkernels.latent_quantize(torch.zeros(2, 3), torch.zeros(4))
        Traceback (most recent call last):
            ...
        qkernels._backend.BackendUnavailableError: backend 'cuda' unavailable for latent_quantize: ...
    """


def _check_name(name: str) -> str:
    if name not in BACKENDS + ("auto",):
        raise ValueError(f"backend must be one of {BACKENDS + ('auto',)}, got {name!r}")
    return name


_forced: str = _check_name(os.environ.get("QKERNELS_BACKEND", "auto") or "auto")
_REGISTRY: dict[str, dict[str, Kernel]] = {}
# unavailable_reason per (backend, device type or None), filled by warm() at import: selection
# inside torch.compile must be plain dict lookups (probing triton or the dispatcher while dynamo
# traces breaks fullgraph compilation).
_REASONS: dict[tuple[str, str | None], str | None] = {}


def triton_interpret() -> bool:
    """True when Triton kernels run on CPU tensors through the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _triton_reason() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'qkernels[triton]')"
    if not (torch.cuda.is_available() or triton_interpret()):
        return "no CUDA device (set TRITON_INTERPRET=1 to run Triton kernels on CPU tensors)"
    return None


def _device_type(device: torch.device | str | None) -> str | None:
    if device is None:
        return None
    return device.type if isinstance(device, torch.device) else torch.device(device).type


def unavailable_reason(backend: str, device: torch.device | str | None = None) -> str | None:
    """Why ``backend`` cannot run on ``device`` (None: it can). ``device=None``: on any device."""
    key = (backend, _device_type(device))
    if key not in _REASONS:
        _REASONS[key] = _probe(*key)
    return _REASONS[key]


def _probe(backend: str, dev: str | None) -> str | None:
    _check_name(backend)
    if backend == "reference":
        return None
    if backend == "cpu":
        if not _ext.LOADED:
            return f"the cpu backend needs the native extension: {_ext.REASON}"
        if dev not in (None, "cpu"):
            return f"the cpu backend runs on CPU tensors, got {dev} tensors"
        return None
    if backend == "cuda":
        if not _ext.LOADED:
            return f"the cuda backend needs the native extension: {_ext.REASON}"
        if not _ext.cuda_built():
            return f"the cuda backend needs the CUDA kernels: {_ext.CUDA_REASON or 'none are registered'}"
        if not torch.cuda.is_available():
            return "no CUDA device is available"
        if dev not in (None, "cuda"):
            return f"the cuda backend runs on CUDA tensors, got {dev} tensors"
        return None
    # triton
    reason = _triton_reason()
    if reason is not None:
        return reason
    if dev == "cpu" and not triton_interpret():
        return "the triton backend runs on CPU tensors only under TRITON_INTERPRET=1"
    if dev not in (None, "cpu", "cuda"):
        return f"the triton backend does not support {dev} tensors"
    return None


def available_backends(device: torch.device | str | None = None) -> list[str]:
    """Backends usable on this machine (for tensors on ``device`` when given).

    Args:
        device: a device or its name ("cpu", "cuda"); None: usable on any device.

    Returns:
        A list of names from ("reference", "cpu", "triton", "cuda"), in that order; "reference" is always there.

    Examples:
        >>> import qkernels
        >>> backends = qkernels.available_backends("cpu")
        >>> backends[0], "cuda" in backends
        ('reference', False)
    """
    return [b for b in BACKENDS if unavailable_reason(b, device) is None]


def current_backend() -> str:
    """The forced backend name, or ``"auto"`` (the default, also set by ``QKERNELS_BACKEND``).

    Returns:
        One of "auto", "reference", "cpu", "triton", "cuda".

    Examples:
        >>> import qkernels
        >>> with qkernels.use_backend("reference"):
        ...     qkernels.current_backend()
        'reference'
    """
    return _forced


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Force backend ``name`` (or ``"auto"``) inside the ``with`` block (a context manager).

    Args:
        name: "reference", "cpu", "triton", "cuda" or "auto". A forced backend that cannot run an op
            makes the op raise :class:`BackendUnavailableError`.

    Raises:
        ValueError: an unknown name.

    Examples:
        >>> import qkernels
        >>> import torch
        >>> before = qkernels.current_backend()
        >>> with qkernels.use_backend("reference"):
        ...     q = qkernels.fsq(torch.zeros(2, 3), 5)
        >>> qkernels.current_backend() == before
        True
        >>> qkernels.use_backend("gpu").__enter__()
        Traceback (most recent call last):
            ...
        ValueError: backend must be one of ('reference', 'cpu', 'triton', 'cuda', 'auto'), got 'gpu'
    """
    global _forced
    previous, _forced = _forced, _check_name(name)
    try:
        yield
    finally:
        _forced = previous


def register(op: str, backend: str) -> Callable[[Kernel], Kernel]:
    """Decorator: register ``fn`` as ``backend``'s implementation of functional op ``op``."""
    _check_name(backend)

    def deco(fn: Kernel) -> Kernel:
        _REGISTRY.setdefault(op, {})[backend] = fn
        _SELECTED.clear()
        return fn

    return deco


def implementations(op: str) -> dict[str, Kernel]:
    """``{backend: implementation}`` registered for ``op`` (by its hot path's module in :mod:`qkernels.ops`;
    nothing before ``import qkernels.ops``: this registry imports none of its clients)."""
    return dict(_REGISTRY.get(op, {}))


def kernels(op: str, device: torch.device | str | None = None) -> list[str]:
    """Backends that have an implementation of ``op`` registered and can run on ``device``."""
    return [b for b in implementations(op) if unavailable_reason(b, device) is None]


def warm() -> None:
    """Probe every backend now (called once by ``import qkernels.ops``), so that backend selection is
    a table lookup, also while torch.compile traces."""
    for backend in BACKENDS:
        for dev in (None, "cpu", "cuda"):
            unavailable_reason(backend, dev)


# dtypes the kernels of the cpu, triton and cuda backends are written for
KERNEL_DTYPES = (torch.float32, torch.float64)

# backends whose kernels check their inputs' values themselves (NaN / inf, index ranges, std > 0,
# noise in [0, 1]: csrc/include/qkernels/checks.h) while reading them, on CPU tensors: the functional
# API skips its own value checks for them (a read-back each, 5-18 us of a call's 30 at small shapes)
SELF_CHECKING = frozenset({"cpu"})


# select()'s answers per (op, device type, dtype, forced backend, band): one dict lookup per eager call (the
# registry and AUTO_ORDER are fixed once the ops are registered; register() clears it). Not while
# torch.compile traces: a global dict that grows between traces would fail dynamo's guards and
# recompile the graph at the next batch size
_SELECTED: dict[tuple[str, str, torch.dtype, str, Order], tuple[str, Kernel]] = {}


def select(op: str, device: torch.device, dtype: torch.dtype, work: float = 0) -> tuple[str, Kernel]:
    """``(backend, implementation)`` of ``op`` for ``dtype`` tensors on ``device``; ``work``: the call's size as
    :data:`WORK` counts it, for the ops whose order on the device depends on it."""
    if torch.compiler.is_compiling():
        return _select(op, device, dtype, work)
    key = (op, device.type, dtype, _forced, _auto_order(op, device.type, work))
    hit = _SELECTED.get(key)
    if hit is None:
        hit = _SELECTED[key] = _select(op, device, dtype, work)
    return hit


def _select(op: str, device: torch.device, dtype: torch.dtype, work: float = 0) -> tuple[str, Kernel]:
    impls = _REGISTRY.get(op, {})
    if _forced != "auto":
        reason = unavailable_reason(_forced, device)
        if reason is None and _forced not in impls:
            reason = f"it does not implement this op (implemented by: {sorted(impls)})"
        if reason is None and _forced != "reference" and dtype not in KERNEL_DTYPES:
            reason = f"its kernels take float32/float64 tensors, got {dtype}"
        if reason is not None:
            raise BackendUnavailableError(f"backend {_forced!r} unavailable for {op}: {reason}")
        return _forced, impls[_forced]
    for name in _auto_order(op, device.type, work):
        if name != "reference" and dtype not in KERNEL_DTYPES:
            continue
        if name in impls and unavailable_reason(name, device) is None:
            return name, impls[name]
    return "reference", impls["reference"]
