"""docs/adding-an-op.md, the recipe for a new op: every file and registry it names is the one the code reads, its
Python side is at most 10 files, and a toy op made by its steps 1-4 (a declaration, a reference, one
define_backends line, a Triton pair) is a complete op: registered with the declared schema, opcheck-clean, with
the reference's values and gradients, and the derived raw-argument checks."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import require

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "adding-an-op.md").read_text()


def _paths(text: str) -> list[str]:
    """Repository paths named in backticks: a known top folder, then a file or a folder."""
    return re.findall(r"`((?:qkernels|tests|csrc|docs|benchmarks)/[\w./-]*\w/?)`", text)


def test_every_file_the_recipe_names_exists():
    paths = _paths(DOC)
    assert len(paths) > 15, paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, missing


def test_the_python_side_is_at_most_ten_files():
    python_side = DOC[DOC.index("## The Python side") : DOC.index("## The C++ side")]
    steps = re.findall(r"^\d+\. ", python_side, flags=re.M)
    files = set(_paths(python_side.split("Only if measured")[0]))  # a folder: one new module in it
    files -= {
        "qkernels/decl/__init__.py",
        "qkernels/_args.py",
        "qkernels/_validation.py",
        "qkernels/jax/_ffi.py",
        "tests/test_raw_ops.py",
        "tests/test_decl.py",
        "tests/test_typing.py",
        "benchmarks/test_kde.py",
    }  # read or run, not edited
    assert len(steps) <= 10 and len(files) <= 10, sorted(files)


def test_the_registries_it_names_are_the_ones_the_code_reads():
    import qkernels
    import qkernels.decl.kde
    import qkernels.ops._library as lib
    from qkernels import _backend

    assert "OPS" in DOC and all(op in qkernels.decl.kde.OPS for op in (qkernels.decl.kde.KLM,))
    assert list(inspect.signature(lib.define_backends).parameters) == ["op", "reference", "triton"]
    assert "_MODULES" in DOC and set(qkernels.__all__) == {n for names in qkernels._MODULES.values() for n in names}
    assert "AUTO_ORDER" in DOC and _backend.AUTO_ORDER["cpu"]["*"] == ("cpu", "reference")
    assert _backend.AUTO_ORDER["cuda"]["*"] == ("reference",)
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import test_launches
    finally:
        sys.path.remove(str(ROOT / "tests"))
    assert "BUDGETS" in DOC and isinstance(test_launches.BUDGETS, dict)
    assert "QK_FFI_TARGET" in DOC and "QK_FFI_TARGET" in (ROOT / "csrc" / "jax" / "ffi_common.h").read_text()
    assert "m.def" in DOC and "m.def(" in (ROOT / "csrc" / "schemas.cpp").read_text()


TOY = r"""
import torch, triton, triton.language as tl
from qkernels import decl
from qkernels.decl import Op, Out, Rule, Scalar, Tensor
from qkernels.ops import _library as lib
from qkernels._backend import implementations, use_backend

# step 1: the declaration
TOY = Op("toy_scaled_cube", args=(Tensor("x", "n, d"), Scalar("scale", "float", 2.0)),
         outputs=(Out("y", "(n, d)"),), rules=(Rule("scale > 0", {"scale": 0.0}),), sizes={"n": 5, "d": 3},
         backward=Op("toy_scaled_cube_backward",
                     args=(Tensor("grad_y", "n, d", role="dgrad"), Tensor("x", "n, d"), Scalar("scale", "float", 2.0)),
                     outputs=(Out("grad_x", "(n, d)"),), sizes={"n": 5, "d": 3}))

# step 2: the reference
def reference(x, scale):
    return scale * x ** 3

# step 4: a Triton pair
@triton.jit
def _cube(x_ptr, g_ptr, out_ptr, scale: tl.float64, numel, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if BACKWARD:
        g = tl.load(g_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + offs, g * 3 * scale * x * x, mask=mask)
    else:
        tl.store(out_ptr + offs, scale * x * x * x, mask=mask)

def forward(x, scale):
    x = x.contiguous(); out = torch.empty_like(x)
    _cube[(triton.cdiv(x.numel(), 64),)](x, x, out, scale, x.numel(), BACKWARD=False, BLOCK=64)
    return out

def backward(grad_y, x, scale):
    x, g = x.contiguous(), grad_y.contiguous(); out = torch.empty_like(x)
    _cube[(triton.cdiv(x.numel(), 64),)](x, g, out, scale, x.numel(), BACKWARD=True, BLOCK=64)
    return out

# step 3: one line registers it
lib.define_backends(TOY, reference=reference, triton=(forward, backward))

op = torch.ops.qkernels.toy_scaled_cube_triton
assert str(op.default._schema) == "qkernels::toy_scaled_cube_triton" + TOY.schema(name=False), op.default._schema
x = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
torch.library.opcheck(op, (x, 2.0))
impl = implementations("toy_scaled_cube")["triton"]
y = impl(x, 2.0)
torch.testing.assert_close(y, reference(x, 2.0))
(gx,) = torch.autograd.grad(y.sum(), x)
torch.testing.assert_close(gx, 6.0 * x.detach() ** 2)
assert torch.autograd.gradcheck(lambda t: op(t, 2.0), (x,))
for bad, match in (((x, 0.0), "need scale > 0"), ((x[0], 2.0), "x must be a non-empty"),
                   ((x.long(), 2.0), "must be float32 or float64")):
    try:
        op(*bad)
    except (ValueError, TypeError) as err:
        assert match in str(err), err
    else:
        raise AssertionError(f"accepted {match}")
print("toy op ok")
"""


def test_a_toy_op_made_by_the_recipe_is_complete():
    """In a child process: the toy op's registration must not outlive the test."""
    require("triton", "triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", TOY], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0 and "toy op ok" in res.stdout, res.stderr[-3000:]
