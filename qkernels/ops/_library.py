"""How an op is put together — the one way, used by every block of :mod:`qkernels.ops`.

A functional op ``<name>`` (e.g. ``klm``) has up to four implementations, all with the signature
and semantics of its reference:

- ``reference``: pure PyTorch (``qkernels/reference/<hotpath>.py``);
- ``cpu`` / ``cuda``: the C++ ops ``qkernels::<name>`` and ``qkernels::<name>_backward`` (schemas in
  ``csrc/schemas.cpp``; CPU and CUDA dispatch keys, present when ``qkernels._C`` has them);
- ``triton``: launch functions of ``qkernels/triton/<hotpath>.py`` (or of one module of the package
  ``qkernels/triton/<hotpath>/``, one per kernel family), registered here as the custom ops
  ``qkernels::<name>_triton`` and ``qkernels::<name>_backward_triton`` (schemas from their
  annotations), behind the op's raw-argument check.

Every pair (forward, backward) of a family gets the op's one fake implementation and one autograd
formula from its ``wire`` function. :func:`define_backends` registers whatever exists; which backends
an op has on a device is then read from that registry (:func:`qkernels._backend.kernels`).

Raw-argument checks: the functional API validates user input once; the raw ``torch.ops`` entry
points, which users can call too, must still never read out of bounds. C++ ops check in
``csrc/include/qkernels/*_checks.h``; the Triton custom ops run the Python check given to
:func:`define_backends`, written with the helpers below (the launchers themselves check nothing).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from qkernels import _ext
from qkernels._backend import Kernel, register, unavailable_reason


def zeros_if_none(g: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """An upstream gradient autograd left out (None) as zeros shaped like ``like``."""
    return torch.zeros_like(like) if g is None else g


def triton_kernels(module: str) -> ModuleType | None:
    """``qkernels.triton.<module>`` (a hot path's, e.g. ``"quantize"``, or a module of its package, e.g.
    ``"kde.klm"``) where Triton can run (installed, and a GPU or ``TRITON_INTERPRET=1``); None elsewhere,
    so importing qkernels never requires triton."""
    if unavailable_reason("triton") is not None:
        return None
    return importlib.import_module(f"qkernels.triton.{module}")


# ----------------------------------------------------------------------------- autograd

# each forward op's (setup_context, backward), as registered by :func:`register_autograd`
_FORMULAS: dict[str, tuple[Callable[..., None], Callable[..., Any]]] = {}


def register_autograd(fwd: str, backward: Callable[..., Any], setup_context: Callable[..., None]) -> None:
    """``torch.library.register_autograd`` of the op ``fwd`` (what a raw ``torch.ops`` call, ``opcheck`` and
    ``torch.compile`` use), the formula kept for :func:`thin_autograd`."""
    torch.library.register_autograd(fwd, backward, setup_context=setup_context)
    _FORMULAS[fwd] = (setup_context, backward)


# Triton ops' launch functions by qualified op name, for :func:`op_callable`
_LAUNCHERS: dict[str, Kernel] = {}


def _plain(args: tuple[Any, ...]) -> bool:
    """Eager arguments a launch function can take as they are: no compile, fake, functional or functorch tensors."""
    if torch.compiler.is_compiling():
        return False
    return all(type(a) in (torch.Tensor, torch.nn.Parameter) and not torch._C._functorch.is_functorch_wrapped_tensor(a)
               for a in args if isinstance(a, torch.Tensor))


def op_callable(name: str) -> Kernel:
    """The op ``name`` ("qkernels::...") as the public functions and the autograd formulas call it: a Triton op's
    launch function directly on plain eager tensors (the public functions validated them; the custom op's Python
    dispatch, with its dynamo-disable wrapper, cost more than the launches at small sizes: issue 44), the op
    through the dispatcher otherwise (torch.compile, fake tensors, C++ ops, raw ``torch.ops`` calls)."""
    op: Kernel = getattr(torch.ops.qkernels, name.split("::")[1])
    launcher = _LAUNCHERS.get(name)
    if launcher is None:
        return op

    def run(*args: Any) -> Any:
        return launcher(*args) if _plain(args) else op(*args)

    return run


def thin_autograd(fwd: str, op: Kernel) -> Kernel:
    """``op`` (the op ``fwd``) behind a plain ``torch.autograd.Function`` with the same formula, for the eager
    public functions: the op runs below the autograd dispatch key, which skips the Python autograd kernel
    that ``register_autograd`` installs (on 8 x 3 inputs, 1 CPU thread: latent_quantize forward + backward
    78 -> 55 us; benchmarks/RESULTS.md "Per-call overhead"), and a Triton op's launch function runs directly
    (:func:`op_callable`). Without gradients the op runs below autograd directly; under ``torch.compile``
    the registered op is traced as before."""
    setup_context, backward = _FORMULAS[fwd]
    eager = op_callable(fwd)

    def forward(ctx: Any, *args: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            out = eager(*args)
        setup_context(ctx, args, out)
        return out

    def node_backward(ctx: Any, *grads: Any) -> Any:
        if torch.is_grad_enabled():  # create_graph: the backward op's own autograd kernel says what it supports
            return backward(ctx, *grads)
        with torch._C._AutoDispatchBelowAutograd():  # as the forward: no Python autograd kernel of the backward op
            return backward(ctx, *grads)

    # named after the op: its backward node shows as "<op>_nodeBackward" in grad_fn and profiles
    Node: type[torch.autograd.Function] = type(
        f"{fwd.split('::')[1]}_node", (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(node_backward)})

    def run(*args: Any) -> Any:
        if torch.compiler.is_compiling():
            return op(*args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return Node.apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return eager(*args)

    return run


def _checked(check: Callable[..., None], launch: Kernel) -> Kernel:
    @functools.wraps(launch)  # keeps the annotations the custom op's schema is inferred from
    def run(*args: Any) -> Any:
        check(*args)
        return launch(*args)

    return run


def define_backends(
    op: str,
    *,
    reference: Kernel,
    wire: Callable[[str, str], None],
    checks: tuple[Callable[..., None], Callable[..., None]],
    triton: ModuleType | None,
) -> None:
    """Register every implementation of functional op ``op`` that exists on this install.

    Args:
        reference: the reference implementation (always registered).
        wire: ``wire(forward_op, backward_op)`` registers the fake implementations and the
            autograd of one (forward, backward) op pair given by qualified name.
        checks: the raw-argument checks of the Triton (forward, backward) ops (the launchers'
            arguments; raise ValueError / TypeError).
        triton: the op's Triton module (:func:`triton_kernels`), whose launch functions are
            named ``<op>`` and ``<op>_backward``; None where Triton cannot run.
    """
    register(op, "reference")(reference)
    if _ext.has_kernel(op, "CPU"):
        wire(f"qkernels::{op}", f"qkernels::{op}_backward")
        compute_in_float32_under_autocast(f"qkernels::{op}", f"qkernels::{op}_backward")
        native = thin_autograd(f"qkernels::{op}", getattr(torch.ops.qkernels, op))
        register(op, "cpu")(native)
        if _ext.has_kernel(op, "CUDA"):
            register(op, "cuda")(native)
    if triton is not None:
        fwd, bwd = f"qkernels::{op}_triton", f"qkernels::{op}_backward_triton"
        forward = torch.library.custom_op(fwd, _checked(checks[0], getattr(triton, op)), mutates_args=())
        torch.library.custom_op(bwd, _checked(checks[1], getattr(triton, f"{op}_backward")), mutates_args=())
        _LAUNCHERS[fwd], _LAUNCHERS[bwd] = getattr(triton, op), getattr(triton, f"{op}_backward")
        wire(fwd, bwd)
        compute_in_float32_under_autocast(fwd, bwd)
        register(op, "triton")(thin_autograd(fwd, forward))


def compute_in_float32_under_autocast(*ops: str) -> None:
    """Under ``torch.autocast`` (cpu or cuda) these ops cast their float16 / bfloat16 inputs to
    float32 and run with autocast off (so matmuls inside them stay float32; float64 is left alone):
    the raw-op half of :mod:`qkernels._precision`'s rule."""
    for name in ops:
        for device_type in ("cpu", "cuda"):
            torch.library.register_autocast(name, device_type, torch.float32)


# ----------------------------------------------------------------------------- raw-argument checks


def fail(op: str, msg: str) -> None:
    raise ValueError(f"{op}: {msg}")


def floating(t: torch.Tensor, name: str, op: str) -> None:
    """float32 or float64 (the kernels' dtypes)."""
    if t.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{op}: {name} must be float32 or float64, got {t.dtype}")


def like(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str, op: str) -> None:
    """``t`` on ``ref``'s device with ``ref``'s dtype (a kernel must never get a host pointer)."""
    if t.device != ref.device:
        fail(op, f"{name} is on {t.device} but {ref_name} is on {ref.device}")
    if t.dtype != ref.dtype:
        raise TypeError(f"{op}: {name} has dtype {t.dtype} but {ref_name} has dtype {ref.dtype}")


def index(t: torch.Tensor, name: str, ref: torch.Tensor, op: str) -> None:
    """An int64 index tensor on ``ref``'s device (its values are guarded in the kernels)."""
    if t.dtype != torch.long:
        raise TypeError(f"{op}: {name} must be int64, got {t.dtype}")
    if t.device != ref.device:
        fail(op, f"{name} is on {t.device} but the data is on {ref.device}")


def scalar_grad(g: torch.Tensor, name: str, ref: torch.Tensor, op: str) -> None:
    """A one-element upstream gradient on ``ref``'s device."""
    if g.numel() != 1:
        fail(op, f"{name} must hold one element, got shape {tuple(g.shape)}")
    if g.device != ref.device:
        fail(op, f"{name} is on {g.device} but the data is on {ref.device}")


def matrix(t: torch.Tensor, name: str, op: str) -> None:
    """A non-empty 2-D floating tensor."""
    if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        fail(op, f"{name} must be a non-empty 2-D tensor, got shape {tuple(t.shape)}")
    floating(t, name, op)
