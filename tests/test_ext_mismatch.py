"""Issue 30, item 3: qkernels._C built against another torch is a one-line warning at import (which torch it was
built for, which is present, how to rebuild), not an undefined-symbol traceback; the cpu/cuda backends are then
unavailable with that reason and reference/triton keep working. The recorded build version is faked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from qkernels import _ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mismatch_reason_is_one_line_naming_both_torches_and_the_rebuild():
    msg = _ext.mismatch_reason("2.99.1+cu130", "2.13.0+cpu")
    assert "\n" not in msg
    assert "built for torch 2.99.1+cu130" in msg and "torch 2.13.0+cpu is installed" in msg
    assert "bash scripts/bootstrap.sh" in msg and "pip install --no-build-isolation -e ." in msg
    assert "reference and triton backends still work" in msg
    # the same release (CPU or CUDA build of it) and an unrecorded build are not a mismatch
    assert _ext.mismatch_reason("2.13.0+cpu", "2.13.0+cu128") is None
    assert _ext.mismatch_reason("2.13.0", "2.13.0") is None
    assert _ext.mismatch_reason(None, "2.13.0") is None


@pytest.mark.skipif(os.environ.get("QKERNELS_NO_EXT") == "1" or not _ext.LOADED, reason="needs a built qkernels._C")
def test_the_recorded_build_is_this_torch():
    assert _ext.built_for() is not None, "setup.py did not write qkernels/_build_info.py"
    assert _ext.mismatch_reason(_ext.built_for(), torch.__version__) is None


def test_a_faked_build_version_leaves_C_unloaded_with_one_warning_and_reference_triton_work():
    script = textwrap.dedent("""
        import sys, types, warnings
        fake = types.ModuleType("qkernels._build_info")
        fake.TORCH_VERSION = "2.99.0+cpu"
        sys.modules["qkernels._build_info"] = fake  # what setup.py would have recorded for another torch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch
            import qkernels
            from qkernels import _ext
        mine = [w for w in caught if issubclass(w.category, _ext.ExtensionMismatchWarning)]
        assert len(mine) == 1, [str(w.message) for w in caught]
        print("WARNING", mine[0].message)
        assert "qkernels._C" not in sys.modules and not _ext.LOADED
        dev = "cuda" if torch.cuda.is_available() else "cpu"  # triton: on the GPU, else in the interpreter
        backends = qkernels.available_backends(dev)
        print("BACKENDS", backends)
        assert "cpu" not in qkernels.available_backends("cpu") and "cuda" not in qkernels.available_backends()
        g = torch.Generator().manual_seed(0)
        z = torch.randn(32, 2, generator=g).to(dev)
        idx = torch.arange(4, device=dev).repeat(2, 1)
        ref = qkernels.cliff_loss(z, cond_index=idx)
        for b in backends:
            with qkernels.use_backend(b):
                out = qkernels.cliff_loss(z, cond_index=idx)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        try:
            with qkernels.use_backend("cpu"):
                qkernels.cliff_loss(z)
        except qkernels.BackendUnavailableError as err:
            print("CPU", err)
        else:
            raise AssertionError("the cpu backend ran without its extension")
    """)
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    env.pop("QKERNELS_NO_EXT", None)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = dict(ln.split(" ", 1) for ln in res.stdout.splitlines() if ln.split(" ", 1)[0] in
                 ("WARNING", "BACKENDS", "CPU"))
    assert lines["WARNING"].startswith(f"qkernels._C was built for torch 2.99.0+cpu but torch {torch.__version__} is")
    assert "rebuild it against this torch" in lines["WARNING"]
    assert "the cpu backend needs the native extension: qkernels._C was built for torch 2.99.0+cpu" in lines["CPU"]
    assert "Traceback" not in res.stderr and "undefined symbol" not in res.stderr
