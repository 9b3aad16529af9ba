"""Issue 30, item 3, as issue 37 changed it: qkernels._C is built on torch's stable ABI for a target release and
loads into every torch at or above it; below it, import gives a one-line warning (the torch needed, the torch
present, what to install), not an undefined-symbol traceback; the cpu/cuda backends are then unavailable with that
reason and reference/triton keep working. The recorded target is faked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

from qkernels import _ext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_only_a_torch_below_the_target_is_a_mismatch():
    for older in ("2.10.2+cpu", "2.10.0", "1.13.1", "2.9.0a0+git1234"):
        msg = _ext.mismatch_reason("2.11", older)
        assert msg is not None and "\n" not in msg, older
        assert "needs torch >= 2.11" in msg and f"torch {older} is installed" in msg
        assert "install torch>=2.11" in msg and "reference and triton backends still work" in msg
    # the target itself, any newer release (CPU or CUDA build, patch or pre-release), a newer major: loads
    for newer in ("2.11.0", "2.11.0+cu130", "2.12.1", "2.14.1+cpu", "2.15.0a0+git1234", "2.100.0", "3.0.0"):
        assert _ext.mismatch_reason("2.11", newer) is None, newer
    assert _ext.mismatch_reason(None, "2.13.0") is None  # unrecorded: no native build


@pytest.mark.skipif(os.environ.get("QKERNELS_NO_EXT") == "1" or not _ext.LOADED, reason="needs a built qkernels._C")
def test_the_recorded_target_is_setup_pys_and_this_torch_meets_it():
    with open(os.path.join(ROOT, "setup.py")) as fh:
        wanted = re.search(r'^TORCH_TARGET = "([\d.]+)"', fh.read(), re.M).group(1)
    assert _ext.target() == wanted, "qkernels/_build_info.py does not record setup.py's TORCH_TARGET"
    assert _ext.mismatch_reason(_ext.target(), torch.__version__) is None


def test_a_faked_build_version_leaves_C_unloaded_with_one_warning_and_reference_triton_work():
    script = textwrap.dedent("""
        import sys, types, warnings
        fake = types.ModuleType("qkernels._build_info")
        fake.TORCH_TARGET = "2.99"
        sys.modules["qkernels._build_info"] = fake  # what setup.py would record for a build that needs torch 2.99
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
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = dict(
        ln.split(" ", 1) for ln in res.stdout.splitlines() if ln.split(" ", 1)[0] in ("WARNING", "BACKENDS", "CPU")
    )
    assert lines["WARNING"].startswith(
        f"qkernels._C needs torch >= 2.99 (the stable ABI it is built for) but torch {torch.__version__} is installed"
    )
    assert "install torch>=2.99" in lines["WARNING"]
    assert "the cpu backend needs the native extension: qkernels._C needs torch >= 2.99" in lines["CPU"]
    assert "Traceback" not in res.stderr and "undefined symbol" not in res.stderr
