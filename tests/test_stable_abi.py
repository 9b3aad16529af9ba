"""Issue 37: the built qkernels._C is one binary for every torch >= its target and every CPython >= 3.10. Checked
on the file itself: torch-abi-audit (PyPI; a dev dependency) finds no unstable libtorch symbol and a CPython abi3
extension, and the dynamic symbol table imports from torch only the C functions of its stable shim. The run under
a second torch release is scripts/cross_torch_check.sh (outside CI: a large download; benchmarks/RESULTS.md)."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys

from conftest import skip_unless

from qkernels import _ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = skip_unless("ext", "needs the built qkernels._C")


def _target() -> tuple[int, int]:
    with open(os.path.join(ROOT, "setup.py")) as fh:
        major, minor = re.search(r'^TORCH_TARGET = "(\d+)\.(\d+)"', fh.read(), re.M).groups()
    return int(major), int(minor)


def _audit_tool() -> str:
    exe = shutil.which("torch-abi-audit") or os.path.join(os.path.dirname(sys.executable), "torch-abi-audit")
    assert os.path.exists(exe), "torch-abi-audit is not installed: pip install torch-abi-audit (in the dev extra)"
    return exe


def _libraries() -> list[str]:
    """qkernels/_C.abi3.so and, when built, the CUDA kernels' qkernels/_C_cuda.abi3.so."""
    return sorted(glob.glob(os.path.join(os.path.dirname(_ext.path()), "_C*.so")))


def test_the_extension_files_are_tagged_abi3():
    names = [os.path.basename(p) for p in _libraries()]
    assert names in (["_C.abi3.so"], ["_C.abi3.so", "_C_cuda.abi3.so"]), names


def test_torch_abi_audit_finds_only_stable_symbols_and_abi3():
    package = os.path.dirname(_ext.path())
    res = subprocess.run([_audit_tool(), "--json", package], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    (module,) = report["extensions"]  # _C; _C_cuda is a plain library (loaded by torch.ops.load_library)
    libraries = [module] + [lib for lib in report["bundled_libs"] if "_C_cuda" in lib["path"]]
    assert sorted(os.path.basename(lib["path"]) for lib in libraries) == [os.path.basename(p) for p in _libraries()]
    for lib in libraries:
        torch_abi = lib["torch"]
        assert lib["error"] is None, lib
        assert torch_abi["uses_torch"] and torch_abi["stable"], lib
        assert torch_abi["unstable_symbols"] == [] and torch_abi["unknown_shim_symbols"] == [], lib
        # the oldest torch whose shim has every symbol imported: at most the target setup.py builds for
        assert tuple(int(p) for p in torch_abi["min_torch_version"].split(".")[:2]) <= _target(), lib
    assert module["cpython"]["intent"] and module["cpython"]["compliant"] and not module["cpython"]["violations"]
    gate = subprocess.run([_audit_tool(), "--check", "both", package], capture_output=True, text=True, timeout=120)
    assert gate.returncode == 0, gate.stdout + gate.stderr


@skip_unless("binutils")
def test_only_c_functions_of_the_stable_shim_are_imported_from_torch():
    """Independent of the audit tool: no mangled at::, c10:: or torch:: C++ symbol (they change with each torch
    release); what _C takes from libtorch is aoti_torch_* / torch_* C functions."""

    def undefined(lib: str, *flags: str) -> list[str]:
        out = subprocess.run(
            ["nm", "-D", "--undefined-only", *flags, lib], capture_output=True, text=True, check=True
        ).stdout
        return [line.split(None, 1)[-1].strip() for line in out.splitlines() if line.strip()]

    for lib in _libraries():
        cxx_torch = [n for n in undefined(lib, "-C") if re.search(r"\b(at|c10|torch|caffe2)::", n)]
        assert not cxx_torch, (lib, cxx_torch[:10])
        names = undefined(lib)
        shim = [n for n in names if n.startswith(("aoti_torch_", "torch_"))]
        assert "torch_library_impl" in shim and "aoti_torch_empty_strided" in shim, (lib, shim)
        python = [n for n in names if n.startswith(("Py", "_Py"))]
        # the module shell of _C: the limited API only; the CUDA kernels' library: no Python at all
        assert python == (["PyModule_Create2"] if lib.endswith("/_C.abi3.so") else []), (lib, python)
