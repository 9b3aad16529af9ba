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


def test_forced_backend_kernels_take_float32_and_half_inputs_compute_in_it():
    if "cpu" not in BACKENDS:
        pytest.skip("native extension not built")
    z, v = torch.randn(3, 2, dtype=torch.bfloat16), torch.randn(2, 4, dtype=torch.bfloat16)
    with qkernels.use_backend("cpu"):
        # the kernels themselves take float32 / float64 only ...
        with pytest.raises(qkernels.BackendUnavailableError, match="float32"):
            _backend.select("latent_quantize", torch.device("cpu"), torch.bfloat16)
        # ... and the public function casts half inputs to float32 for them (qkernels._precision)
        out = qkernels.latent_quantize(z, v)
    assert out.z_q.dtype == torch.bfloat16 and out.loss_quantize.dtype == torch.float32


def test_auto_picks_kernel():
    expected = "cpu" if "cpu" in qkernels.available_backends("cpu") else "reference"
    assert _backend.select("latent_quantize", torch.device("cpu"), torch.float32)[0] == expected
    # select() offers kernels for float32 / float64 only; public functions pass the compute dtype
    assert _backend.select("latent_quantize", torch.device("cpu"), torch.bfloat16)[0] == "reference"


def test_per_op_auto_order():
    # the cpu categorical kernel is measured faster than the reference since issue 48: auto picks it on a CPU (every
    # op's row, on every device: tests/test_routing_tables.py); forcing the reference still works
    expected = "cpu" if "cpu" in qkernels.available_backends("cpu") else "reference"
    assert _backend.select("relaxed_categorical", torch.device("cpu"), torch.float32)[0] == expected
    with qkernels.use_backend("reference"):
        assert _backend.select("relaxed_categorical", torch.device("cpu"), torch.float32)[0] == "reference"


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
    """Value checks run on CPU tensors by default, on other devices only with
    QKERNELS_CHECK_FINITE=1 (a read-back would synchronize a GPU), nowhere with 0, and never on
    tensors without data (meta, fake)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from qkernels import _validation

    cpu, meta = torch.zeros(3), torch.empty(3, device="meta")
    gpu = torch.zeros(3, device="cuda") if torch.cuda.is_available() else None
    with FakeTensorMode():
        fake = torch.zeros(3)
    assert _validation.value_checks(cpu) and not _validation.value_checks(meta)
    assert not _validation.value_checks(fake) and not _validation.value_checks(torch.nn.Parameter(meta))
    assert gpu is None or not _validation.value_checks(gpu)
    monkeypatch.setattr(_validation, "CHECK_VALUES", "1")
    assert not _validation.value_checks(meta) and not _validation.value_checks(fake)
    assert gpu is None or _validation.value_checks(gpu)
    with FakeTensorMode(allow_non_fake_inputs=True):  # a real tensor's read-back fails here too
        assert not _validation.value_checks(cpu)
    monkeypatch.setattr(_validation, "CHECK_VALUES", "0")
    assert not _validation.value_checks(cpu)
    with pytest.raises(ValueError, match="z contains NaN"):
        monkeypatch.setattr(_validation, "CHECK_VALUES", "auto")
        qkernels.klm_loss(torch.tensor([[0.0, 1.0], [float("nan"), 2.0], [1.0, 0.5]]))


def _public_calls(randn):
    """(name, call, expected output shapes) of every public function on tensors from ``randn``."""
    n, d, k = 8, 3, 5
    z, v, pts = randn(n, d), randn(d, k), randn(d, 7)
    std = randn(d).abs() + 1
    fn = torch.tanh
    return [
        ("latent_quantize", lambda: qkernels.latent_quantize(z, v), [(n, d), (n, d), (), ()]),
        (
            "latent_quantize 3-d",
            lambda: qkernels.latent_quantize(randn(2, n, d), randn(k)),
            [(2, n, d), (2, n, d), (), ()],
        ),
        ("fsq", lambda: qkernels.fsq(z, [3, 5, 7]), [(n, d), (n, d), (), ()]),
        ("gumbel_quantize", lambda: qkernels.gumbel_quantize(z, randn(k), 0.5), [(n, d), (n, d, k), (n, d, k), (n, d)]),
        ("categorical_latent", lambda: qkernels.categorical_latent(randn(n, d, k)), [(n, d), (n, d, k), (n, d)]),
        ("cliff_loss", lambda: qkernels.cliff_loss(z, num_cond=4, return_terms=True), [(), (), (), ()]),
        ("klm_loss", lambda: qkernels.klm_loss(z), [()]),
        ("klm_loss std", lambda: qkernels.klm_loss(z, std=std), [()]),
        ("klm_loss scalar std", lambda: qkernels.klm_loss(z, std=0.5), [()]),
        ("kde_grid", lambda: qkernels.kde_grid(pts, z, 0.1), [(d, 7)]),
        ("normalized_hessian_penalty", lambda: qkernels.normalized_hessian_penalty(fn, z), [()]),
        (
            "normalized_hessian_penalty none",
            lambda: qkernels.normalized_hessian_penalty(fn, z, std, reduction="none"),
            [(n,)],
        ),
        ("hessian_penalty", lambda: qkernels.hessian_penalty(fn, z), [()]),
    ]


def _check_public_calls(randn, device):
    for name, call, shapes in _public_calls(randn):
        out = call()
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        assert [tuple(o.shape) for o in outs] == shapes, name
        assert all(o.device.type == device for o in outs), name
    z = randn(4, 3)  # shape and dtype checks still run without data
    with pytest.raises(ValueError, match="values"):
        qkernels.latent_quantize(z, randn(4, 5))
    with pytest.raises(TypeError, match="dtype"):
        qkernels.klm_loss(z, std=randn(3).double())
    with pytest.raises(ValueError, match="std"):
        qkernels.klm_loss(z, std=-1.0)


@pytest.mark.parametrize("mode", ["auto", "1"])
def test_public_functions_on_meta_and_fake_tensors(mode, monkeypatch):
    """Tensors without data (meta device, FakeTensorMode) pass validation: value checks are
    skipped, shapes come out right, metadata checks still raise."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from qkernels import _validation

    monkeypatch.setattr(_validation, "CHECK_VALUES", mode)
    _check_public_calls(lambda *shape: torch.randn(*shape, device="meta"), "meta")
    with FakeTensorMode():
        _check_public_calls(torch.randn, "cpu")


def test_modules_have_real_signatures():
    """help() and inspect show every module's parameters, not (*args, **kwargs)."""
    import inspect

    from qkernels import nn as qnn

    varargs = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    for name in qnn.__all__:
        cls = getattr(qnn, name)
        for sig in (inspect.signature(cls), inspect.signature(cls.__init__), inspect.signature(cls.forward)):
            assert not any(p.kind in varargs for p in sig.parameters.values()), (name, sig)
    assert list(inspect.signature(qnn.KLMLoss.forward).parameters) == ["self", "z", "std", "group"]


def test_all_finite_one_reduction_and_its_overflow_fallback():
    from qkernels._validation import all_finite

    assert all_finite(torch.tensor([3e38, 3e38]))  # the float32 sum overflows: re-checked exactly
    assert not all_finite(torch.tensor([1.0, float("inf")]))
    assert not all_finite(torch.tensor([float("inf"), float("-inf")]))  # sum NaN
    assert not all_finite(torch.tensor([0.0, float("nan")]))


def _nan_at(t: torch.Tensor, i: int = 0) -> torch.Tensor:
    out = t.clone()
    out.view(-1)[i] = float("nan")
    return out


@pytest.mark.skipif("cpu" not in BACKENDS, reason="native extension not built")
@pytest.mark.parametrize("backend", ["cpu", "reference"])
def test_bad_values_raise_naming_the_argument_on_both_cpu_backends(backend):
    """The cpu kernels check input values themselves while reading them (csrc/include/qkernels/checks.h),
    and the functional API skips its own read-backs for them (_backend.SELF_CHECKING): NaN, a
    non-positive std or an out-of-range row is still a ValueError naming the argument, on the cpu
    backend as on the reference."""
    g = torch.Generator().manual_seed(0)
    z, v, pts = torch.randn(8, 3, generator=g), torch.randn(3, 5, generator=g), torch.randn(3, 7, generator=g)
    lg = torch.randn(8, 3, 5, generator=g)
    cases = [
        ("z contains NaN", lambda: qkernels.latent_quantize(_nan_at(z, 4), v)),
        ("values contains NaN", lambda: qkernels.latent_quantize(z, _nan_at(v, 7))),
        ("points contains NaN", lambda: qkernels.kde_grid(_nan_at(pts), z, 0.3)),
        ("samples contains NaN", lambda: qkernels.kde_grid(pts, _nan_at(z, 23), 0.3)),
        ("z contains NaN", lambda: qkernels.cliff_loss(_nan_at(z, 5), num_cond=4)),
        ("cond_index must hold", lambda: qkernels.cliff_loss(z, cond_index=torch.tensor([[0, 8]] * 3))),
        ("z contains NaN", lambda: qkernels.klm_loss(_nan_at(z, 2))),
        ("std contains NaN", lambda: qkernels.klm_loss(z, std=torch.tensor([1.0, float("nan"), 1.0]))),
        ("std must be > 0", lambda: qkernels.klm_loss(z, std=torch.tensor([1.0, 0.0, 1.0]))),
        ("logits contains NaN", lambda: qkernels.categorical_latent(_nan_at(lg, 11), v)),
        ("values contains NaN", lambda: qkernels.categorical_latent(lg, _nan_at(v))),
    ]
    with qkernels.use_backend(backend):
        for match, call in cases:
            with pytest.raises(ValueError, match=match):
                call()


@pytest.mark.skipif("cpu" not in BACKENDS, reason="native extension not built")
def test_cpu_kernels_value_checks_follow_the_switch():
    """QKERNELS_CHECK_FINITE=0 turns the C++ kernels' value checks off too (read once per process)."""
    code = (
        "import torch, qkernels.ops\n"  # the raw ops: registered by qkernels.ops (`import qkernels` is light)
        "z = torch.tensor([[0.2, float('nan')], [0.5, 1.0]])\n"
        "out = torch.ops.qkernels.latent_quantize(z, torch.tensor([[0.0, 1.0]]))\n"
        "print(out[1].tolist())\n"
    )
    res = _run(code, QKERNELS_CHECK_FINITE="0", TRITON_INTERPRET="0")
    assert res.returncode == 0 and res.stdout.strip().startswith("[[0, "), res.stderr
    res = _run(code, TRITON_INTERPRET="0")
    assert res.returncode != 0 and "ValueError: latent_quantize: z contains NaN or inf" in res.stderr


@pytest.mark.skipif("cpu" not in qkernels.available_backends("cpu"), reason="needs the cpu kernels")
def test_kernels_run_behind_the_thin_autograd_node_and_the_registered_op_stays_for_raw_calls():
    """Issue 37 item 5: in eager code the public functions' kernels run behind a plain autograd.Function (the op
    called below the autograd key: no Python autograd kernel per call), with the registered op's formula; a raw
    torch.ops call keeps the registered autograd (opcheck, torch.compile)."""
    z = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(3, 5, dtype=torch.float64)
    with qkernels.use_backend("cpu"):
        q = qkernels.latent_quantize(z, v)
    assert type(q.z_q.grad_fn).__name__ == "latent_quantize_nodeBackward"
    raw = torch.ops.qkernels.latent_quantize(z, v)
    assert type(raw[0].grad_fn).__name__ != "latent_quantize_nodeBackward"
    g = torch.randn(8, 3, dtype=torch.float64)
    (a,) = torch.autograd.grad((q.z_q * g).sum() + q.loss_commit, z)
    (b,) = torch.autograd.grad((raw[0] * g).sum() + raw[3], z)
    assert torch.equal(a, b)
    with torch.no_grad():  # no gradient wanted: no node at all
        assert qkernels.latent_quantize(z, v).z_q.grad_fn is None
