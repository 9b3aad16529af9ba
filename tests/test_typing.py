"""Issue 30: the public API is typed (PEP 561 ``py.typed``) and ``mypy --strict`` accepts it, and user code over every
public name (tests/typing/public_api.py) type-checks against those hints and runs."""

from __future__ import annotations

import inspect
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

import qkernels
import qkernels.nn

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = [(f"qkernels.{n}", getattr(qkernels, n)) for n in qkernels.__all__] + [
    (f"qkernels.nn.{n}", getattr(qkernels.nn, n)) for n in qkernels.nn.__all__
]


def _callables(name: str, obj: object) -> list[tuple[str, object]]:
    """The functions a user calls through a public name: itself, or a class's __init__ and forward."""
    if not inspect.isclass(obj):
        return [(name, obj)]
    if issubclass(obj, tuple) or issubclass(obj, BaseException):  # NamedTuples and errors: generated signatures
        return []
    return [(f"{name}.{m}", vars(obj)[m]) for m in ("__init__", "forward") if m in vars(obj)]


@pytest.mark.parametrize(("name", "obj"), PUBLIC, ids=[n for n, _ in PUBLIC])
def test_public_signatures_are_fully_annotated(name, obj):
    for fname, fn in _callables(name, obj):
        sig = inspect.signature(fn)
        missing = [p for p in sig.parameters if p != "self" and sig.parameters[p].annotation is inspect.Parameter.empty]
        assert not missing, f"{fname}: parameters without a type hint: {missing}"
        assert sig.return_annotation is not inspect.Signature.empty, f"{fname}: no return type hint"


def test_py_typed_marker_ships_with_the_package():
    assert (Path(qkernels.__file__).parent / "py.typed").is_file()
    assert 'qkernels = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()  # package data of the wheel


def test_public_api_user_code_runs():
    runpy.run_path(str(ROOT / "tests" / "typing" / "public_api.py"), run_name="__main__")


def test_mypy_strict_accepts_the_public_api():
    require("mypy", "mypy")
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Success: no issues found" in res.stdout
