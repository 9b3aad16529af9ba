"""How an op is put together — the one way, used by every hot path of :mod:`qkernels.ops`.

An op ``<name>`` (e.g. ``klm``) is declared once in :mod:`qkernels.decl` (arguments, outputs, rules, backward op)
and has up to four implementations, all with the signature and semantics of its reference:

- ``reference``: pure PyTorch (``qkernels/reference/<hotpath>.py``);
- ``cpu`` / ``cuda``: the C++ ops ``qkernels::<name>`` and ``qkernels::<name>_backward`` (schemas in
  ``csrc/schemas.cpp``, equal to the declaration's; CPU and CUDA dispatch keys, present when ``qkernels._C`` has
  them);
- ``triton``: a (forward, backward) pair of launch functions (``qkernels/triton/``), registered here as the custom
  ops ``qkernels::<name>_triton`` and ``qkernels::<name>_backward_triton`` with the declared schemas, behind the
  declaration's raw-argument check.

:func:`define_backends` derives from the declaration what every registered op pair needs: the fake
implementations (output shapes and dtypes) and the autograd formula (which inputs and outputs the backward op
reads, which of its outputs is whose gradient: :func:`qkernels.decl.backward_wiring`). Which backends an op has on
a device is then read from the registry of :mod:`qkernels._backend`.

Call routes. The public functions call an op through :func:`thin_autograd`, the one eager route: a plain
``torch.autograd.Function`` over the op below the autograd dispatch key, a Triton op's launch function called
directly. Raw ``torch.ops.qkernels.*`` calls, ``opcheck`` and ``torch.compile`` go through the dispatcher and the
registered autograd (the same formula). The eager route exists because it was measured cheaper than the dispatcher
route (forward + backward at 8 x 3 inputs: latent_quantize 78 -> 55 us on a CPU; the custom ops' Python dispatch
cost more than the launches of small calls on an H200: benchmarks/HISTORY.md, "Per-call overhead").

Raw-argument checks: the functional API validates user input once; the raw ``torch.ops`` entry points, which users
can call too, must still never read out of bounds. C++ ops check in ``csrc/include/qkernels/*_checks.h``; the
Triton custom ops run :meth:`qkernels.decl.Op.check` (the launchers themselves check nothing).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from qkernels import _ext, decl
from qkernels._backend import Kernel, register, unavailable_reason

# how qkernels.decl reads torch tensors
TORCH = decl.Framework(
    is_array=lambda x: isinstance(x, torch.Tensor),
    dtype=lambda x: str(x.dtype).removeprefix("torch."),
    device=lambda x: x.device,
)


def triton_kernels(module: str) -> ModuleType | None:
    """``qkernels.triton.<module>`` (a hot path's, e.g. ``"quantize"``, or a module of its package, e.g.
    ``"kde.klm"``) where Triton can run (installed, and a GPU or ``TRITON_INTERPRET=1``); None elsewhere,
    so importing qkernels never requires triton."""
    if unavailable_reason("triton") is not None:
        return None
    import importlib

    return importlib.import_module(f"qkernels.triton.{module}")


_CONSTANTS: dict[tuple[object, ...], torch.Tensor] = {}


def constant(name: str, like: torch.Tensor, make: Callable[[], torch.Tensor], *key: object) -> torch.Tensor:
    """A read-only tensor ``make()`` in ``like``'s dtype and device, made once per (name, key,
    dtype, device): no launch per call. Made afresh while compiling (inductor fuses it), for tensor
    subclasses (fake, functional) and while a CUDA graph is captured (its kernels run only when the
    graph does). Never hand one out to the user: it is shared."""
    if torch.compiler.is_compiling() or type(like) not in (torch.Tensor, torch.nn.Parameter):
        return make()
    full_key = (name, *key, like.dtype, like.device)
    t = _CONSTANTS.get(full_key)
    if t is None:
        with torch.inference_mode(False):  # can be saved for backward outside inference mode too
            t = make()
        capturing = like.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if type(t) is torch.Tensor and not capturing:  # not made by a fake-tensor mode
            _CONSTANTS[full_key] = t
    return t


# ----------------------------------------------------------------------------- autograd

# each forward op's (setup_context, backward), as registered by :func:`register_formula`
_FORMULAS: dict[str, tuple[Callable[..., None], Callable[..., Any]]] = {}


# Triton ops' launch functions by qualified op name, for :func:`op_callable`
_LAUNCHERS: dict[str, Kernel] = {}


def _plain(args: tuple[Any, ...]) -> bool:
    """Eager arguments a launch function can take as they are: no compile, fake, functional or functorch tensors."""
    if torch.compiler.is_compiling():
        return False
    return all(
        type(a) in (torch.Tensor, torch.nn.Parameter) and not torch._C._functorch.is_functorch_wrapped_tensor(a)
        for a in args
        if isinstance(a, torch.Tensor)
    )


def op_callable(name: str) -> Kernel:
    """The op ``name`` ("qkernels::...") as the public functions and the autograd formulas call it: a Triton op's
    launch function directly on plain eager tensors (the public functions validated them; the custom op's Python
    dispatch, with its dynamo-disable wrapper, cost more than the launches at small sizes on a GPU), the op
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
    78 -> 55 us; benchmarks/HISTORY.md, "Per-call overhead"), and a Triton op's launch function runs directly
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
        f"{fwd.split('::')[1]}_node",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(node_backward)},
    )

    def run(*args: Any) -> Any:
        if torch.compiler.is_compiling():
            return op(*args)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            return Node.apply(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return eager(*args)

    return run


def _checked(op: decl.Op, launch: Kernel) -> Kernel:
    name = f"{op.name}_triton"

    def run(*args: Any) -> Any:
        op.check(args, TORCH, op=name)
        return launch(*args)

    return run


def register_fake(name: str, op: decl.Op) -> None:
    """The fake implementation of the op ``name`` (qualified) declared by ``op``: outputs of the declared shapes,
    in the data's dtype (int64 for indices), on its device."""
    first = next(i for i, a in enumerate(op.args) if isinstance(a, decl.Tensor) and a.role == "data")
    dtypes = tuple(torch.long if o.dtype == "index" else None for o in op.outputs)

    def fake(*args: Any) -> Any:
        like = args[first]
        shapes = op.output_shapes(op.bind(args))
        outs = tuple(like.new_empty(shape, dtype=dt or like.dtype) for shape, dt in zip(shapes, dtypes, strict=True))
        return outs[0] if len(outs) == 1 else outs

    torch.library.register_fake(name)(fake)


def register_formula(fwd: str, bwd: str, op: decl.Op) -> None:
    """The autograd of the op ``fwd`` (qualified) declared by ``op``, whose backward op is ``bwd``: the forward saves
    what the backward op reads (:func:`qkernels.decl.backward_wiring`); an upstream gradient autograd left out is
    passed as None where the backward op takes None, as zeros otherwise (a 0-d one made once per dtype and device);
    outputs without a gradient argument are non-differentiable. The two functions are generated as straight-line
    code (:func:`formula_source`): per call they cost what hand-written ones do."""
    namespace: dict[str, Any] = {"backward_op": op_callable(bwd), "_zeros": _zeros}
    exec(formula_source(op), namespace)  # noqa: S102 - code generated from the declaration, no user input
    setup_context, backward = namespace["setup_context"], namespace["backward"]
    torch.library.register_autograd(fwd, backward, setup_context=setup_context)
    _FORMULAS[fwd] = (setup_context, backward)


def formula_source(op: decl.Op) -> str:
    """The Python source of ``op``'s ``setup_context(ctx, inputs, output)`` and ``backward(ctx, *grads)``."""
    w = decl.backward_wiring(op)
    assert op.backward is not None
    outs = len(op.outputs)

    def out(j: int) -> str:
        return f"output[{j}]" if outs > 1 else "output"

    saved = [f"inputs[{i}]" for i in w.saved_inputs] + [out(j) for j in w.saved_outputs]
    scalars = [k for kind, k in w.plan if kind == "scalar"]
    # the data tensor whose dtype and device zeros take: the first saved data input
    data = next(
        k for k, i in enumerate(w.saved_inputs) if isinstance(a := op.args[i], decl.Tensor) and a.role == "data"
    )
    grads = [k for kind, k in w.plan if kind == "grad"]
    zeros = [k for k, opt in zip(grads, w.grad_optional, strict=True) if not opt]
    optional_inputs = [
        i for i, r in enumerate(w.returns) if r is not None and isinstance(a := op.args[i], decl.Tensor) and a.optional
    ]
    nondiff = [j for j in w.non_differentiable if op.outputs[j].dtype != "index"]  # int outputs are never
    setup = [f"    ctx.save_for_backward({', '.join(saved)})"]
    if scalars:
        setup.append(f"    ctx.scalars = ({''.join(f'inputs[{i}], ' for i in scalars)})")
    if zeros:
        setup.append(f"    ctx.shapes = ({''.join(f'{out(j)}.shape, ' for j in zeros)})")
    if optional_inputs:
        setup.append(f"    ctx.given = ({''.join(f'inputs[{i}] is not None, ' for i in optional_inputs)})")
    if nondiff:
        setup.append(f"    ctx.mark_non_differentiable({', '.join(out(j) for j in nondiff)})")
    setup.append("    ctx.set_materialize_grads(False)")
    body = ["    s = ctx.saved_tensors"]
    body += [f"    if g{k} is None:\n        g{k} = _zeros(ctx.shapes[{zeros.index(k)}], s[{data}])" for k in zeros]
    n_in = len(w.saved_inputs)
    args = [
        f"g{k}"
        if kind == "grad"
        else f"s[{k}]"
        if kind == "input"
        else f"s[{n_in + k}]"
        if kind == "output"
        else f"ctx.scalars[{scalars.index(k)}]"
        for kind, k in w.plan
    ]
    body.append(f"    r = backward_op({', '.join(args)})")
    single = len(op.backward.outputs) == 1
    results = []
    for i, r in enumerate(w.returns):
        value = "None" if r is None else "r" if single else f"r[{r}]"
        if i in optional_inputs:
            value = f"({value} if ctx.given[{optional_inputs.index(i)}] else None)"
        results.append(value)
    body.append(f"    return ({', '.join(results)},)")
    return "\n".join(
        [
            "def setup_context(ctx, inputs, output):",
            *setup,
            "",
            f"def backward(ctx, {', '.join(f'g{j}' for j in range(outs))}):",
            *body,
            "",
        ]
    )


def _zeros(shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """Zeros in ``like``'s dtype and device (a 0-d one made once per dtype and device: no launch per call)."""
    if len(shape) == 0:
        return constant("zero", like, lambda: like.new_zeros(()))
    return like.new_zeros(shape)


def wire(fwd: str, bwd: str, op: decl.Op) -> None:
    """Fake implementations, autograd and the autocast rule of one (forward, backward) op pair declared by ``op``."""
    assert op.backward is not None
    register_fake(fwd, op)
    register_fake(bwd, op.backward)
    register_formula(fwd, bwd, op)
    compute_in_float32_under_autocast(fwd, bwd)


def define_backends(op: decl.Op, *, reference: Kernel, triton: tuple[Kernel, Kernel] | None) -> None:
    """Register every implementation of the declared op ``op`` that exists on this install.

    Args:
        reference: the reference implementation (always registered).
        triton: the (forward, backward) launch functions of its Triton kernels; None where Triton cannot run.
    """
    assert op.backward is not None
    register(op.name, "reference")(reference)
    if _ext.has_kernel(op.name, "CPU"):
        wire(f"qkernels::{op.name}", f"qkernels::{op.backward.name}", op)
        native = thin_autograd(f"qkernels::{op.name}", getattr(torch.ops.qkernels, op.name))
        register(op.name, "cpu")(native)
        if _ext.has_kernel(op.name, "CUDA"):
            register(op.name, "cuda")(native)
    if triton is not None:
        fwd, bwd = f"qkernels::{op.name}_triton", f"qkernels::{op.backward.name}_triton"
        forward = torch.library.custom_op(fwd, _checked(op, triton[0]), mutates_args=(), schema=op.schema(name=False))
        torch.library.custom_op(
            bwd, _checked(op.backward, triton[1]), mutates_args=(), schema=op.backward.schema(name=False)
        )
        _LAUNCHERS[fwd], _LAUNCHERS[bwd] = triton
        wire(fwd, bwd, op)
        register(op.name, "triton")(thin_autograd(fwd, forward))


def compute_in_float32_under_autocast(*ops: str) -> None:
    """Under ``torch.autocast`` (cpu or cuda) these ops cast their float16 / bfloat16 inputs to
    float32 and run with autocast off (so matmuls inside them stay float32; float64 is left alone):
    the raw-op half of :mod:`qkernels._precision`'s rule."""
    for name in ops:
        for device_type in ("cpu", "cuda"):
            torch.library.register_autocast(name, device_type, torch.float32)
