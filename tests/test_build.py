"""Native sources: the extension is built, and every CUDA file compiles here although no GPU runs.

Kernel files (csrc/cuda/*.cu) hold no torch: plain ``nvcc -c``. Glue files (csrc/cuda/*_glue.cpp) use only
torch's stable ABI headers (torch/csrc/stable, torch/headeronly; the CUDA part of the stable shim behind
USE_CUDA), which the CPU wheel ships too: they are syntax-checked against them, for setup.py's stable-ABI target.
"""

import glob
import os
import re
import shutil
import subprocess

import pytest
import torch
from conftest import skip_unless

from qkernels import _ext

pytestmark = pytest.mark.slow  # a long file: scheduled first (tests/conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
CU_FILES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
GLUE_FILES = sorted(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*_glue.cpp")))
NATIVE_FILES = sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*.*"), recursive=True))
CUDA_INC = next(
    (
        os.path.join(home, "include")
        for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda")
        if home and os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h"))
    ),
    None,
)


def target_version_macro() -> str:
    """-DTORCH_TARGET_VERSION=... for setup.py's TORCH_TARGET, as setup.py passes it."""
    with open(os.path.join(ROOT, "setup.py")) as fh:
        major, minor = re.search(r'^TORCH_TARGET = "(\d+)\.(\d+)"', fh.read(), re.M).groups()
    return f"-DTORCH_TARGET_VERSION=0x{int(major):02x}{int(minor):02x}000000000000"


def test_native_sources_use_only_the_stable_abi():
    """No ATen, c10 or torch/library.h include anywhere in csrc (their C++ symbols change with every torch
    release); files that use torch reach it through qkernels/stable.h, which requires the target version."""
    unstable = re.compile(
        r'#include\s*[<"](ATen/|c10/|torch/library\.h|torch/extension\.h|torch/torch\.h|'
        r"torch/csrc/api/|torch/csrc/(?!stable/|inductor/aoti_torch/c/))"
    )
    for path in NATIVE_FILES:
        with open(path) as fh:
            text = fh.read()
        bad = [line for line in text.splitlines() if unstable.search(line)]
        assert not bad, f"{os.path.relpath(path, ROOT)}: {bad}"
        assert not re.search(r"\bat::|\bc10::|TORCH_CHECK\(", text), f"{os.path.relpath(path, ROOT)} uses ATen/c10"


def test_extension_loaded_unless_disabled():
    if os.environ.get("QKERNELS_NO_EXT") == "1":
        assert not _ext.LOADED and "QKERNELS_NO_EXT" in _ext.REASON
    else:
        assert _ext.LOADED, _ext.REASON
        assert _ext.has_kernel("latent_quantize", "CPU")


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("path", CU_FILES, ids=os.path.basename)
def test_cuda_kernel_compiles(path, tmp_path):
    res = subprocess.run(
        [NVCC, "-c", path, "-std=c++17", "-I", os.path.join(ROOT, "csrc", "include"), "-o", str(tmp_path / "k.o")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.skipif(CUDA_INC is None or shutil.which("g++") is None, reason="CUDA headers or g++ not installed")
@pytest.mark.parametrize("path", GLUE_FILES, ids=os.path.basename)
def test_cuda_glue_compiles(path):
    inc = os.path.join(os.path.dirname(torch.__file__), "include")
    res = subprocess.run(
        [
            "g++",
            "-std=c++17",
            "-fsyntax-only",
            "-Werror",
            "-fvisibility=hidden",
            target_version_macro(),
            "-DUSE_CUDA",
            "-I",
            os.path.join(ROOT, "csrc", "include"),
            "-I",
            inc,
            "-I",
            CUDA_INC,
            path,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr


@skip_unless("ext")
@skip_unless("binutils")
def test_extension_uses_the_shared_cpp_runtime():
    """_C links libstdc++.so.6 dynamically and carries no private copy of its iostreams: a static
    copy (what the CUDA image's compiler wrapper produced) formats numbers with the system
    library's locale tables and crashed every TORCH_CHECK message with a size in it."""
    so = _ext.path()
    needed = subprocess.run(["readelf", "-d", so], capture_output=True, text=True, check=True).stdout
    assert "libstdc++.so.6" in needed, needed
    defined = subprocess.run(["nm", "-C", "--defined-only", so], capture_output=True, text=True, check=True).stdout
    embedded = [line for line in defined.splitlines() if "std::basic_ostream<char" in line and "_M_insert" in line]
    assert not embedded, embedded[:5]


def test_bootstrap_second_run_is_a_no_op(source_tree_build):
    """After a bootstrap (the README's set-up, as CI runs it first), running it again installs and builds
    nothing: it reports the venv up to date and leaves the extension file untouched."""
    if not os.path.exists(os.path.join(ROOT, ".venv", ".qkernels-build-stamp")):
        pytest.skip("this venv was not set up by scripts/bootstrap.sh")

    def bootstrap():
        r = subprocess.run(
            ["bash", os.path.join(ROOT, "scripts", "bootstrap.sh")],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout

    so = glob.glob(os.path.join(ROOT, "qkernels", "_C*.so"))
    before = [os.stat(p).st_mtime_ns for p in so]
    out = bootstrap()
    if "up to date" not in out:  # sources changed since the last bootstrap (not in CI): that run rebuilt
        so = glob.glob(os.path.join(ROOT, "qkernels", "_C*.so"))
        before = [os.stat(p).st_mtime_ns for p in so]
        out = bootstrap()
    assert "up to date" in out and "qkernels" in out.splitlines()[-1]
    assert [os.stat(p).st_mtime_ns for p in so] == before
