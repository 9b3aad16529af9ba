"""The declaration types and what is derived from them (:mod:`qkernels.decl` says what and how)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

# tensor roles: "data" (float32 / float64, all of one dtype), "dgrad" (an upstream gradient shaped like an output,
# in the data's dtype), "grad" (a one-element upstream gradient), "index" (int64; int32 or int64 in JAX)
ROLES = ("data", "dgrad", "grad", "index")
SCALAR_TYPES = ("float", "int", "SymInt", "bool", "str")
FLOAT_DTYPES = ("float32", "float64")
# the names a rule or a shape expression may use besides the op's dimensions and arguments
_GLOBALS = {"__builtins__": {}, "inf": math.inf, "tuple": tuple, "len": len}


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor argument.

    Attributes:
        name: the argument's name (the schema's, the C++ binding's, the JAX wrapper's).
        dims: its shape, comma-separated: a dimension's name (bound at its first appearance, compared after) or an
            expression over names bound before (``"n, d + 1"``); ``""``: 0-d. Every dimension is >= 1. A shape that
            depends on a scalar argument is one expression of a tuple, as an output's (``"(n,) if ... else ()"``).
        role: one of :data:`ROLES`.
        optional: may be None (``Tensor?`` in the schema).
        hi: "index" only: the dimension whose size bounds its values (exclusive), for the out-of-range tests.
        example: how the raw-op test fills a valid example: "normal", "uniform" ([0, 1)) or "positive".
    """

    name: str
    dims: str = ""
    role: str = "data"
    optional: bool = False
    hi: str | None = None
    example: str = "normal"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"{self.name}: role must be one of {ROLES}, got {self.role!r}")

    @property
    def shape(self) -> tuple[str, ...]:
        """The dimensions (names or expressions); () for a 0-d tensor or a whole-shape expression."""
        if self.computed or not self.dims.strip():
            return ()
        return tuple(s.strip() for s in self.dims.split(","))

    @property
    def computed(self) -> bool:
        """Whether ``dims`` is one expression of the whole shape."""
        return self.dims.lstrip().startswith("(")

    def schema(self) -> str:
        return f"Tensor{'?' if self.optional else ''} {self.name}"


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A number, bool or string argument: ``type`` one of :data:`SCALAR_TYPES`; ``example`` a valid value."""

    name: str
    type: str
    example: Any

    def __post_init__(self) -> None:
        if self.type not in SCALAR_TYPES:
            raise ValueError(f"{self.name}: type must be one of {SCALAR_TYPES}, got {self.type!r}")

    def schema(self) -> str:
        return f"{self.type} {self.name}"


@dataclasses.dataclass(frozen=True)
class Out:
    """An output: ``shape`` a Python expression of a tuple over the op's dimensions and arguments (``"(n, d + 1)"``,
    ``"(n,) if reduction == 'none' else ()"``); ``dtype`` "data" (the data's dtype) or "index" (int64; JAX: int32
    without x64)."""

    name: str
    shape: str
    dtype: str = "data"


@dataclasses.dataclass(frozen=True)
class Rule:
    """A constraint on the arguments, a Python expression over the op's dimensions and arguments (``"a < b"``), and
    a counterexample for the raw-op test: argument name -> a bad value (a scalar; for a tensor, the shape of a bad
    one; None for a missing optional tensor)."""

    expr: str
    bad: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Op:
    """One op: its arguments in schema order, outputs, rules, the example sizes of its dimensions, and its backward
    op (None: not differentiable). ``unnamed_output``: a single output written ``-> Tensor`` in the schema."""

    name: str
    args: tuple[Tensor | Scalar, ...]
    outputs: tuple[Out, ...]
    rules: tuple[Rule, ...] = ()
    sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    backward: Op | None = None
    unnamed_output: bool = False

    def __post_init__(self) -> None:
        names = [a.name for a in self.args]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: argument names repeat: {names}")
        object.__setattr__(self, "_rules", tuple(compile(r.expr, f"<{self.name} rule>", "eval") for r in self.rules))
        object.__setattr__(
            self, "_shapes", tuple(compile(o.shape, f"<{self.name} {o.name}>", "eval") for o in self.outputs)
        )

    # ------------------------------------------------------------------ schema

    def schema(self, *, name: bool = True) -> str:
        """The ``torch.library`` schema: ``"klm(Tensor z, Tensor? std) -> (Tensor loss, Tensor lse)"``
        (``name=False``: without the op's name, as ``torch.library.custom_op`` takes it)."""
        args = ", ".join(a.schema() for a in self.args)
        if self.unnamed_output:
            outs = "Tensor"
        elif len(self.outputs) == 1:
            outs = f"Tensor {self.outputs[0].name}"
        else:
            outs = "(" + ", ".join(f"Tensor {o.name}" for o in self.outputs) + ")"
        return f"{self.name if name else ''}({args}) -> {outs}"

    @property
    def tensors(self) -> tuple[Tensor, ...]:
        return tuple(a for a in self.args if isinstance(a, Tensor))

    def index(self, name: str) -> int:
        """The position of argument ``name``."""
        return next(i for i, a in enumerate(self.args) if a.name == name)

    # ------------------------------------------------------------------ checks

    def check(self, values: Sequence[Any], fw: Framework, *, op: str | None = None) -> dict[str, Any]:
        """Check one call's arguments (in schema order) against the declaration; return the bindings (dimensions
        and arguments by name). Raises TypeError (a dtype) or ValueError (anything else) starting ``"<op>: "``."""
        op = op or self.name
        if len(values) != len(self.args):
            raise TypeError(f"{op}: takes {len(self.args)} arguments, got {len(values)}")
        env: dict[str, Any] = {a.name: v for a, v in zip(self.args, values, strict=True)}
        data = next((env[t.name] for t in self.tensors if t.role == "data" and env[t.name] is not None), None)
        # upstream gradients last: their shapes are the outputs', written in the inputs' dimensions
        for t in sorted(self.tensors, key=lambda t: t.role in ("dgrad", "grad")):
            x = env[t.name]
            if x is None:
                if not t.optional:
                    raise ValueError(f"{op}: {t.name} is required, got None")
                continue
            if not fw.is_array(x):
                raise TypeError(f"{op}: {t.name} must be a tensor, got {type(x).__name__}")
            self._check_dtype(op, t, x, data, fw)
            if data is not None and x is not data and fw.device(x) != fw.device(data):
                raise ValueError(
                    f"{op}: {t.name} is on {fw.device(x)} but {self.tensors[0].name} is on {fw.device(data)}"
                )
            self._check_shape(op, t, tuple(x.shape), env)
        for rule, code in zip(self.rules, self._rules, strict=True):  # type: ignore[attr-defined]
            if not eval(code, _GLOBALS, env):
                raise ValueError(f"{op}: need {rule.expr}; got {_describe(rule.expr, env)}")
        return env

    def _check_dtype(self, op: str, t: Tensor, x: Any, data: Any, fw: Framework) -> None:
        dtype = fw.dtype(x)
        if t.role == "index":
            if dtype not in fw.index_dtypes:
                raise TypeError(f"{op}: {t.name} must be {' or '.join(fw.index_dtypes)}, got {dtype}")
        elif t.role in ("data", "dgrad"):
            if dtype not in FLOAT_DTYPES:
                raise TypeError(f"{op}: {t.name} must be float32 or float64, got {dtype}")
            if data is not None and dtype != fw.dtype(data):
                raise TypeError(
                    f"{op}: {t.name} has dtype {dtype} but {self.tensors[0].name} has dtype {fw.dtype(data)}"
                )

    def _check_shape(self, op: str, t: Tensor, shape: tuple[int, ...], env: dict[str, Any]) -> None:
        if t.role == "grad":
            if math.prod(shape) != 1:
                raise ValueError(f"{op}: {t.name} must hold one element, got shape {shape}")
            return
        if t.computed:
            whole = tuple(eval(t.dims, _GLOBALS, env))
            if shape != whole:
                raise ValueError(f"{op}: {t.name} must have shape {whole} ({t.dims}), got {shape}")
            return
        want = t.shape
        if len(shape) != len(want) or any(s < 1 for s in shape):
            raise ValueError(f"{op}: {t.name} must be a non-empty ({', '.join(want)}) tensor, got shape {shape}")
        for dim, size in zip(want, shape, strict=True):
            if dim.isidentifier() and dim not in env:
                env[dim] = size
                continue
            expected = eval(dim, _GLOBALS, env) if not dim.isdigit() else int(dim)
            if size != expected:
                bound = ", ".join(f"{d} = {_value(d, env)}" for d in want if d.isidentifier() and d in env)
                raise ValueError(f"{op}: {t.name} must be ({', '.join(want)}) with {bound}, got shape {shape}")

    # ------------------------------------------------------------------ outputs

    def output_shapes(self, env: Mapping[str, Any]) -> tuple[tuple[Any, ...], ...]:
        """Each output's shape, given the bindings of :meth:`bind` (dimensions may be symbolic sizes)."""
        return tuple(tuple(eval(code, _GLOBALS, dict(env))) for code in self._shapes)  # type: ignore[attr-defined]

    def bind(self, values: Sequence[Any]) -> dict[str, Any]:
        """Dimensions and arguments by name, without checks (fake implementations: shapes may be symbolic)."""
        env: dict[str, Any] = {a.name: v for a, v in zip(self.args, values, strict=True)}
        for t in self.tensors:
            x = env[t.name]
            if x is None or t.role == "grad":
                continue
            for dim, size in zip(t.shape, x.shape, strict=False):
                if dim.isidentifier() and dim not in env:
                    env[dim] = size
        return env

    # ------------------------------------------------------------------ examples (the raw-op tests)

    def example_env(self) -> dict[str, Any]:
        """The example call's dimensions and scalars by name."""
        env: dict[str, Any] = dict(self.sizes)
        env.update({a.name: a.example for a in self.args if isinstance(a, Scalar)})
        return env

    def example_shape(self, t: Tensor, env: Mapping[str, Any]) -> tuple[int, ...]:
        """The example shape of tensor argument ``t``."""
        if t.role == "grad":
            return ()
        if t.computed:
            return tuple(eval(t.dims, _GLOBALS, dict(env)))
        return tuple(int(eval(d, _GLOBALS, dict(env))) for d in t.shape)

    def dimension_mismatches(self) -> Iterator[tuple[str, int, str]]:
        """(tensor argument, axis, dimension) for every dimension that a tensor must share with another argument:
        changing that axis alone must be an error."""
        seen: dict[str, int] = {}
        for a in self.args:
            if isinstance(a, Scalar):
                seen[a.name] = seen.get(a.name, 0) + 1
            elif a.role != "grad":
                for d in set(a.shape):
                    if d.isidentifier():
                        seen[d] = seen.get(d, 0) + 1
        for t in self.tensors:
            if t.role == "grad":
                continue
            for axis, d in enumerate(t.shape):
                if not d.isidentifier() or seen.get(d, 0) > 1:
                    yield t.name, axis, d


@dataclasses.dataclass(frozen=True)
class Framework:
    """How :meth:`Op.check` reads a framework's arrays: whether a value is one, its dtype's name, its device, and
    the dtype names an index may have."""

    is_array: Callable[[Any], bool]
    dtype: Callable[[Any], str]
    device: Callable[[Any], Any]
    index_dtypes: tuple[str, ...] = ("int64",)


def _names(expr: str) -> set[str]:
    import ast

    return {n.id for n in ast.walk(ast.parse(expr, mode="eval")) if isinstance(n, ast.Name)}


def _value(name: str, env: Mapping[str, Any]) -> Any:
    v = env[name]
    return tuple(v.shape) if hasattr(v, "shape") else v


def _describe(expr: str, env: Mapping[str, Any]) -> str:
    return ", ".join(f"{n}={_value(n, env)!r}" for n in sorted(_names(expr)) if n in env)


# ---------------------------------------------------------------------------------------------- backward wiring


@dataclasses.dataclass(frozen=True)
class Backward:
    """How a forward op's autograd calls its backward op, derived from the two declarations by name.

    Attributes:
        saved_inputs / saved_outputs: positions of the forward inputs / outputs the backward op reads.
        plan: per backward argument, where its value comes from: ("grad", output position), ("input", position in
            saved_inputs), ("output", position in saved_outputs) or ("scalar", forward input position).
        grad_optional: per upstream gradient argument, in order: whether the backward op takes None for it.
        returns: per forward input, the position of its gradient among the backward op's outputs, or None.
        non_differentiable: forward outputs without a gradient argument (indices, saved statistics).
    """

    saved_inputs: tuple[int, ...]
    saved_outputs: tuple[int, ...]
    plan: tuple[tuple[str, int], ...]
    grad_optional: tuple[bool, ...]
    returns: tuple[int | None, ...]
    non_differentiable: tuple[int, ...]


def backward_wiring(fwd: Op) -> Backward:
    """The :class:`Backward` of ``fwd`` (its declaration and its backward op's)."""
    bwd = fwd.backward
    if bwd is None:
        raise ValueError(f"{fwd.name} declares no backward op")
    inputs = {a.name: i for i, a in enumerate(fwd.args)}
    outputs = {o.name: i for i, o in enumerate(fwd.outputs)}
    saved_in: list[int] = []
    saved_out: list[int] = []
    plan: list[tuple[str, int]] = []
    grad_optional: list[bool] = []
    graded: set[int] = set()
    for a in bwd.args:
        if a.name.startswith("grad_") and a.name[5:] in outputs:
            graded.add(outputs[a.name[5:]])
            plan.append(("grad", outputs[a.name[5:]]))
            grad_optional.append(isinstance(a, Tensor) and a.optional)
        elif a.name in inputs and isinstance(a, Scalar):
            plan.append(("scalar", inputs[a.name]))
        elif a.name in inputs:
            saved_in.append(inputs[a.name])
            plan.append(("input", len(saved_in) - 1))
        elif a.name in outputs:
            saved_out.append(outputs[a.name])
            plan.append(("output", len(saved_out) - 1))
        elif a.name == "grad" and len(fwd.outputs) - sum(o.dtype == "index" for o in fwd.outputs) == 1:
            out = next(i for i, o in enumerate(fwd.outputs) if o.dtype != "index")
            graded.add(out)
            plan.append(("grad", out))
            grad_optional.append(isinstance(a, Tensor) and a.optional)
        else:
            raise ValueError(
                f"{bwd.name}: argument {a.name!r} is neither grad_<output>, an input nor an output of {fwd.name}"
            )
    results = {o.name: i for i, o in enumerate(bwd.outputs)}
    returns = tuple(results.get(f"grad_{a.name}") if isinstance(a, Tensor) else None for a in fwd.args)
    unknown = set(results) - {f"grad_{a.name}" for a in fwd.tensors}
    if unknown:
        raise ValueError(f"{bwd.name}: outputs {sorted(unknown)} are not grad_<input> of {fwd.name}")
    nondiff = tuple(i for i in range(len(fwd.outputs)) if i not in graded)
    return Backward(tuple(saved_in), tuple(saved_out), tuple(plan), tuple(grad_optional), returns, nondiff)
