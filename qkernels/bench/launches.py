"""Count the GPU kernel launches of a callable, on any device.

At the papers' batch sizes (64-256 rows, 10-32 latents) an op's time on a GPU is its number of
kernel launches times the cost of one (~5 us of GPU time plus the host's Python and dispatch
cost), not its arithmetic. :func:`count_launches` counts, for one call of a callable (typically
an op's forward and backward), what a GPU would launch:

- every Triton kernel launch (``kernel[grid](...)``; under ``TRITON_INTERPRET=1`` the interpreter's
  own host copies are not counted);
- every aten op that runs a kernel, seen by a ``TorchDispatchMode``: views, allocations and
  metadata ops (:data:`FREE`) launch nothing and are not counted; every other op counts once.
  qkernels' Python custom ops (the ``*_triton`` ops) are entered: what their implementation runs
  is counted, not the op itself. A C++ op (``cpu`` / ``cuda`` backends) counts once: what it
  launches inside is only visible to a GPU profiler (:func:`profiler_kernels`).

Value checks (NaN / range checks that read data back) are switched off while counting, as they
are on a GPU by default (:mod:`qkernels._validation`). Reads back to the host
(``aten._local_scalar_dense``: ``.item()``, ``bool(t)``) are counted apart as ``syncs``.

The count is a model of a GPU: an aten op may launch more than one kernel there (a cuBLAS GEMM
with split-K, ``topk`` on long rows, ``randperm``) or none (a CPU scalar). On a GPU,
:func:`profiler_kernels` counts what really ran (``torch.profiler``), and the tests compare the
two (tests/test_launches.py).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that launch no kernel: allocation, aliasing and metadata (views are recognized by their
# schema, OpOverload.is_view)
FREE = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "detach",
        "alias",
        "lift_fresh",
        "set_",
        "resize_",
        "is_same_size",
        "is_nonzero",
        "_has_compatible_shallow_copy_type",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "_local_scalar_dense",
        "record_stream",
    }
)


@dataclasses.dataclass
class Launches:
    """What one call launched: ``total`` kernels (``triton`` of them Triton kernels, the rest aten
    ops), ``syncs`` reads back to the host, and ``names`` (kernel or aten op name -> count)."""

    total: int = 0
    triton: int = 0
    syncs: int = 0
    names: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    _inside_kernel: int = 0

    def add(self, name: str, *, triton: bool = False) -> None:
        self.total += 1
        self.triton += triton
        self.names[name] += 1

    def __str__(self) -> str:
        listed = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in self.names.most_common())
        return f"{self.total} launches ({self.triton} Triton; {self.syncs} syncs): {listed}"


def _python_custom_op(func) -> Callable | None:
    """The Python implementation of a qkernels custom op (torch.library.custom_op), or None."""
    from torch._library.custom_ops import OPDEFS

    name = func._schema.name
    if not name.startswith("qkernels::"):
        return None
    opdef = OPDEFS.get(name)
    return None if opdef is None else opdef._init_fn


class _Counter(TorchDispatchMode):
    def __init__(self, tally: Launches):
        super().__init__()
        self.tally = tally

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.tally._inside_kernel:
            return func(*args, **kwargs)
        impl = _python_custom_op(func)
        if impl is not None:  # enter it: count what it runs
            with _Counter(self.tally):
                return impl(*args, **kwargs)
        name = func._schema.name.split("::")[-1]
        if name == "_local_scalar_dense":
            self.tally.syncs += 1
        elif not (func.is_view or name in FREE):
            self.tally.add(name)
        return func(*args, **kwargs)


@contextlib.contextmanager
def _triton_launches(tally: Launches) -> Iterator[None]:
    """Count every Triton kernel launch (compiled or interpreted) while inside."""
    try:
        from triton.runtime import interpreter, jit
    except ImportError:
        yield
        return
    patched = [(cls, cls.run) for cls in (jit.JITFunction, interpreter.InterpretedFunction)]

    def wrap(original):
        def run(self, *args, grid, warmup, **kwargs):
            if warmup:
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            tally.add(getattr(self, "__name__", None) or self.fn.__name__, triton=True)
            tally._inside_kernel += 1
            try:
                return original(self, *args, grid=grid, warmup=warmup, **kwargs)
            finally:
                tally._inside_kernel -= 1

        return run

    for cls, original in patched:
        cls.run = wrap(original)
    try:
        yield
    finally:
        for cls, original in patched:
            cls.run = original


@contextlib.contextmanager
def counting() -> Iterator[Launches]:
    """Count the launches of everything run inside the ``with`` block (value checks off)."""
    from qkernels import _validation

    tally = Launches()
    previous, _validation.CHECK_VALUES = _validation.CHECK_VALUES, "0"
    try:
        with _triton_launches(tally), _Counter(tally):
            yield tally
    finally:
        _validation.CHECK_VALUES = previous


def count_launches(fn: Callable[[], object]) -> Launches:
    """The launches of one call ``fn()`` (run it once before, so that lazy set-up is not counted)."""
    with counting() as tally:
        fn()
    return tally


def profiler_kernels(fn: Callable[[], object]) -> collections.Counter:
    """GPU kernels (and memsets / copies) that one call ``fn()`` ran on a CUDA device, by name, as
    ``torch.profiler`` records them: what :func:`count_launches` estimates."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names: collections.Counter = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            names[event.name] += 1
    return names
