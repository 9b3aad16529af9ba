"""Backend selection: forced backends, auto fallback, environment variable, pure-Python installs."""

import os
import subprocess
import sys

import pytest
import torch
from conftest import BACKENDS

import qkernels
from qkernels import _backend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": ROOT, **env}
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)


def test_reference_always_available():
    assert "reference" in qkernels.available_backends()
    assert "reference" in qkernels.available_backends("cpu")


def test_use_backend_restores_and_rejects_unknown_names():
    assert qkernels.current_backend() == "auto"
    with qkernels.use_backend("reference"):
        assert qkernels.current_backend() == "reference"
        with qkernels.use_backend("auto"):
            assert qkernels.current_backend() == "auto"
        assert qkernels.current_backend() == "reference"
    assert qkernels.current_backend() == "auto"
    with pytest.raises(ValueError, match="backend"):
        with qkernels.use_backend("fast"):
            pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")
def test_forced_unavailable_backend_raises_with_reason():
    z, v = torch.randn(3, 2), torch.randn(2, 4)
    with qkernels.use_backend("cuda"):
        with pytest.raises(qkernels.BackendUnavailableError, match="cuda"):
            qkernels.latent_quantize(z, v)


def test_forced_backend_rejects_unsupported_dtype():
    if "cpu" not in BACKENDS:
        pytest.skip("native extension not built")
    with qkernels.use_backend("cpu"):
        with pytest.raises(qkernels.BackendUnavailableError, match="float32"):
            qkernels.latent_quantize(torch.randn(3, 2, dtype=torch.bfloat16), torch.randn(2, 4, dtype=torch.bfloat16))


def test_auto_picks_kernel_and_falls_back_for_other_dtypes():
    expected = "cpu" if "cpu" in qkernels.available_backends("cpu") else "reference"
    assert _backend.select("latent_quantize", torch.device("cpu"), torch.float32)[0] == expected
    # bfloat16 has no kernel: auto falls back to the reference, which still computes it
    assert _backend.select("latent_quantize", torch.device("cpu"), torch.bfloat16)[0] == "reference"
    out = qkernels.latent_quantize(torch.randn(3, 2, dtype=torch.bfloat16), torch.randn(2, 4, dtype=torch.bfloat16))
    assert out.z_q.dtype == torch.bfloat16


def test_per_op_auto_order():
    # measured slower on CPU than the reference: auto keeps the reference, forcing still works
    assert _backend.select("relaxed_categorical", torch.device("cpu"), torch.float32)[0] == "reference"
    if "cpu" in qkernels.available_backends("cpu"):
        with qkernels.use_backend("cpu"):
            assert _backend.select("relaxed_categorical", torch.device("cpu"), torch.float32)[0] == "cpu"


def test_triton_needs_interpreter_on_cpu():
    reason = _backend.unavailable_reason("triton", "cpu")
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert reason is None or "not installed" in reason
    else:
        assert reason is not None


def test_env_variable_forces_backend():
    code = (
        "import torch, qkernels; print(qkernels.current_backend());"
        "qkernels.latent_quantize(torch.randn(2, 2), torch.randn(2, 3))"
    )
    res = _run(code, QKERNELS_BACKEND="reference")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "reference"
    bad = _run(code, QKERNELS_BACKEND="nonsense")
    assert bad.returncode != 0 and "backend must be one of" in bad.stderr


def test_pure_python_mode_falls_back_to_reference():
    code = (
        "import torch, qkernels\n"
        "print(qkernels.available_backends('cpu'))\n"
        "out = qkernels.latent_quantize(torch.tensor([[0.2, 0.9]]), torch.tensor([0.0, 1.0]))\n"
        "print(out.indices.tolist())\n"
        "with qkernels.use_backend('cpu'):\n"
        "    try:\n"
        "        qkernels.latent_quantize(torch.zeros(1, 2), torch.zeros(3))\n"
        "    except qkernels.BackendUnavailableError as e:\n"
        "        print('raised', e)\n"
    )
    res = _run(code, QKERNELS_NO_EXT="1", TRITON_INTERPRET="0")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert lines[0] == "['reference']"
    assert lines[1] == "[[0, 1]]"
    assert lines[2].startswith("raised") and "QKERNELS_NO_EXT" in lines[2]


def test_value_checks_by_device_and_switch(monkeypatch):
    """Value checks run on CPU tensors by default, never on other devices (a read-back would
    synchronize a GPU; a meta tensor stands in for one here), everywhere with
    QKERNELS_CHECK_FINITE=1, nowhere with 0."""
    from qkernels import _validation

    cpu, other = torch.zeros(3), torch.empty(3, device="meta")
    assert _validation.value_checks(cpu) and not _validation.value_checks(other)
    monkeypatch.setattr(_validation, "CHECK_VALUES", "1")
    assert _validation.value_checks(other)
    monkeypatch.setattr(_validation, "CHECK_VALUES", "0")
    assert not _validation.value_checks(cpu)
    with pytest.raises(ValueError, match="z contains NaN"):
        monkeypatch.setattr(_validation, "CHECK_VALUES", "auto")
        qkernels.klm_loss(torch.tensor([[0.0, 1.0], [float("nan"), 2.0], [1.0, 0.5]]))


def test_all_finite_one_reduction_and_its_overflow_fallback():
    from qkernels._validation import all_finite

    assert all_finite(torch.tensor([3e38, 3e38]))  # the float32 sum overflows: re-checked exactly
    assert not all_finite(torch.tensor([1.0, float("inf")]))
    assert not all_finite(torch.tensor([float("inf"), float("-inf")]))  # sum NaN
    assert not all_finite(torch.tensor([0.0, float("nan")]))
