"""Package layout: no import cycle among qkernels' modules (also through imports inside functions),
and every module imports on its own in a fresh interpreter."""

from __future__ import annotations

import ast
import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a long file: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "qkernels"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> qkernels modules it imports anywhere in its body (function-level imports
    included: a cycle hidden inside a function is still a cycle)."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    # a submodule by that name, else an attribute of base (compiled modules such
                    # as qkernels._C are outside the graph)
                    targets.append(
                        full if full in mods or list(PACKAGE.parent.glob(full.replace(".", "/") + ".*.so")) else base
                    )
            targets += _lazy_imports(node)
            for t in targets:
                r = (
                    resolve(t)
                    if t.startswith("qkernels") and not list(PACKAGE.parent.glob(t.replace(".", "/") + ".*.so"))
                    else None
                )
                if r and r != name:
                    graph[name].add(r)
    return graph


def _lazy_imports(node: ast.AST) -> list[str]:
    """The module an ``importlib.import_module(...)`` call names: a string, or the constant start of an f-string
    (``f"qkernels.triton.{module}"`` -> qkernels.triton)."""
    if not (isinstance(node, ast.Call) and node.args):
        return []
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    if name not in ("import_module", "__import__"):
        return []
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return [str(arg.values[0].value).rstrip(".")]
    return []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    graph = _import_graph(_modules())
    assert "qkernels.ops.kde" in graph["qkernels.nn.kde"]  # the graph sees imports
    assert "qkernels.ops" in graph["qkernels"]  # ... and lazy ones (importlib.import_module)
    assert "qkernels.triton" in graph["qkernels.ops._library"]  # ... by an f-string's constant start
    assert _cycles(graph) == []


def _import(name: str) -> tuple[str, str | None]:
    try:
        importlib.import_module(name)
        return name, None
    except BaseException as exc:  # noqa: BLE001 - reported by the test
        return name, f"{type(exc).__name__}: {exc}"[:500]


def test_every_module_imports_alone_in_a_fresh_interpreter():
    """One process per module, forked from this one before it imported any qkernels module (torch, scikit-learn,
    scipy and jax, already imported, are shared: a fresh interpreter each would take ~4x longer, and the metrics
    and JAX modules spent 2 s each importing scikit-learn or jax)."""
    code = (
        "import sys, json; sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r});"
        "import test_layout as t; print(json.dumps(t.import_each(json.loads(sys.argv[1]))))"
    ).format(root=str(ROOT), tests=str(ROOT / "tests"))
    mods = [m for m in _modules() if m != "qkernels.__main__"]  # __main__ runs the CLI
    res = subprocess.run(
        [sys.executable, "-c", code, json.dumps(mods)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    failed = {n: err for n, err in json.loads(res.stdout.strip().splitlines()[-1]) if err}
    assert not failed, failed


def import_each(mods: list[str]) -> list[tuple[str, str | None]]:
    """In a process that has imported torch but no qkernels module: import each module in its own
    forked child."""
    assert not any(m == "qkernels" or m.startswith("qkernels.") for m in sys.modules)
    import torch  # noqa: F401  (shared by the forked children)

    for heavy in ("sklearn", "scipy", "jax"):  # their top-level packages only: submodules stay each module's to import
        if importlib.util.find_spec(heavy) is not None:
            importlib.import_module(heavy)

    with multiprocessing.get_context("fork").Pool(max(2, os.cpu_count() or 2), maxtasksperchild=1) as pool:
        return pool.map(_import, mods, chunksize=1)


def test_the_prepared_gpu_experiments_still_apply():
    """gpu/cliff_ab.sh (issue 44's GPU A/B) patches a copy of the package with each
    gpu/experiments/*.patch: each must apply to this tree (regenerate it, or delete the experiment, when the
    code it changes changes)."""
    root = Path(__file__).resolve().parents[1]
    patches = sorted((root / "gpu" / "experiments").glob("*.patch"))
    assert patches, "no prepared experiment: delete gpu/cliff_ab.sh and its gpu_check.sh step instead"
    for patch in patches:
        done = subprocess.run(["git", "apply", "--check", "-p1", str(patch)], cwd=root, capture_output=True, text=True)
        assert done.returncode == 0, (patch.name, done.stderr)
