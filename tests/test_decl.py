"""The op declarations (qkernels.decl) and what is derived from them: the C++ schemas spell them, the JAX FFI
library registers them, the checks name the argument and the rule, the autograd wiring follows the names."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from qkernels import decl
from qkernels.decl import Op, Out, Rule, Scalar, Tensor

ROOT = Path(__file__).resolve().parents[1]
DECLARED = decl.by_name()


def test_the_cpp_schemas_are_the_declared_ones():
    """csrc/schemas.cpp (compiled into qkernels._C) spells every C++ op as its declaration does."""
    defined = re.findall(r'm\.def\("([^"]+)"\)', (ROOT / "csrc" / "schemas.cpp").read_text())
    assert len(defined) >= 10, defined
    for schema in defined:
        name = schema.split("(", 1)[0]
        assert name in DECLARED, f"csrc/schemas.cpp defines {name}, which qkernels.decl does not declare"
        assert schema == DECLARED[name].schema(), f"csrc/schemas.cpp: {schema}\ndeclared: {DECLARED[name].schema()}"


def test_the_jax_library_registers_declared_ops_by_name():
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    from qkernels.jax import _ffi

    assert set(_ffi.TARGETS) <= set(DECLARED), sorted(set(_ffi.TARGETS) - set(DECLARED))
    # every op with a JAX handler has its backward's too (the custom_vjp calls both)
    assert all(
        DECLARED[name].backward is None or DECLARED[name].backward.name in _ffi.TARGETS
        for name in _ffi.TARGETS
        if not name.endswith("_backward")
    )
    assert {"klm", "cliff_loss", "latent_quantize", "finite_difference_curvature", "kde_grid"} <= set(_ffi.TARGETS)


def test_every_backward_is_wired_by_name():
    for op in decl.all_ops():
        w = decl.backward_wiring(op)
        assert any(r is not None for r in w.returns), f"{op.name}: no input gets a gradient"
        for j in w.non_differentiable:
            assert not any(a.name == f"grad_{op.outputs[j].name}" for a in op.backward.args)


# ----------------------------------------------------------------------------- the machinery on a toy op

TOY = Op(
    "toy",
    args=(
        Tensor("x", "n, d"),
        Tensor("w", "d"),
        Tensor("idx", "n", role="index", hi="d"),
        Scalar("a", "float", 0.0),
        Scalar("b", "float", 1.0),
    ),
    outputs=(Out("y", "(n,)"), Out("arg", "(n,)", "index")),
    rules=(Rule("a < b", {"a": 2.0}),),
    sizes={"n": 4, "d": 3},
    backward=Op(
        "toy_backward",
        args=(
            Tensor("grad_y", "n", role="dgrad"),
            Tensor("x", "n, d"),
            Tensor("arg", "n", role="index"),
            Scalar("b", "float", 1.0),
        ),
        outputs=(Out("grad_x", "(n, d)"),),
        sizes={"n": 4, "d": 3},
    ),
)


class Fake:
    """An array as the checks read it: shape, dtype name, device."""

    def __init__(self, shape, dtype="float32", device="cpu"):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device


FAKE = decl.Framework(is_array=lambda x: isinstance(x, Fake), dtype=lambda x: x.dtype, device=lambda x: x.device)


def _call(**changes):
    args = {"x": Fake((4, 3)), "w": Fake((3,)), "idx": Fake((4,), "int64"), "a": 0.0, "b": 1.0, **changes}
    return TOY.check([args[a.name] for a in TOY.args], FAKE)


def test_check_binds_the_dimensions():
    env = _call()
    assert (env["n"], env["d"]) == (4, 3)
    assert TOY.output_shapes(env) == ((4,), (4,))


@pytest.mark.parametrize(
    "changes,error,match",
    [
        ({"w": Fake((4,))}, ValueError, r"toy: w must be \(d\) with d = 3, got shape \(4,\)"),
        ({"x": Fake((4, 3, 1))}, ValueError, r"toy: x must be a non-empty \(n, d\) tensor"),
        ({"x": Fake((0, 3))}, ValueError, "non-empty"),
        ({"w": Fake((3,), "float64")}, TypeError, "toy: w has dtype float64 but x has dtype float32"),
        ({"x": Fake((4, 3), "int64"), "w": Fake((3,), "int64")}, TypeError, "x must be float32 or float64"),
        ({"idx": Fake((4,), "float32")}, TypeError, "toy: idx must be int64"),
        ({"w": Fake((3,), device="cuda")}, ValueError, "w is on cuda but x is on cpu"),
        ({"a": 2.0}, ValueError, r"toy: need a < b; got a=2.0, b=1.0"),
        ({"w": None}, ValueError, "toy: w is required"),
        ({"w": [1.0, 2.0, 3.0]}, TypeError, "w must be a tensor, got list"),
    ],
)
def test_check_names_the_argument_and_the_rule(changes, error, match):
    with pytest.raises(error, match=match):
        _call(**changes)


def test_schema_and_backward_wiring():
    assert TOY.schema() == "toy(Tensor x, Tensor w, Tensor idx, float a, float b) -> (Tensor y, Tensor arg)"
    w = decl.backward_wiring(TOY)
    assert w.saved_inputs == (0,) and w.saved_outputs == (1,)  # x; arg
    assert w.plan == (("grad", 0), ("input", 0), ("output", 0), ("scalar", 4))
    assert w.returns == (0, None, None, None, None)  # grad_x -> x; w gets no gradient
    assert w.non_differentiable == (1,)  # arg has no grad_arg argument


def test_examples_and_mismatches_come_from_the_sizes():
    env = TOY.example_env()
    assert [TOY.example_shape(t, env) for t in TOY.tensors] == [(4, 3), (3,), (4,)]
    # n and d are shared between tensors: changing one alone is a mismatch; nothing else is
    assert sorted(TOY.dimension_mismatches()) == [("idx", 0, "n"), ("w", 0, "d"), ("x", 0, "n"), ("x", 1, "d")]


def test_a_misnamed_backward_argument_is_refused():
    bad = Op(
        "bad",
        args=(Tensor("x", "n"),),
        outputs=(Out("y", "(n,)"),),
        backward=Op("bad_backward", args=(Tensor("grad_z", "n", role="dgrad"),), outputs=(Out("grad_x", "(n,)"),)),
    )
    with pytest.raises(ValueError, match="grad_z"):
        decl.backward_wiring(bad)
