"""The leak detector of tests/conftest.py (tests/global_state.py): each kind of process-wide state a test can leave
behind is seen, named, and put back (issue 58)."""

from __future__ import annotations

import os
import signal

import global_state
import numpy as np
import pytest
import torch

import qkernels
from qkernels import _backend, _validation


def _set_env():
    os.environ["QKERNELS_SOME_LEAK"] = "1"


def _unset_env():
    os.environ.pop("TRITON_INTERPRET", None)  # conftest set it: unset is a change too


_HELD = []  # a context manager entered and never left (left when collected: held here)


def _enter_backend():
    _HELD.append(qkernels.use_backend("reference" if qkernels.current_backend() != "reference" else "auto"))
    _HELD[-1].__enter__()


def _reassign_kernel():
    _backend.implementations("klm")  # the ops registered (by importing qkernels.ops) before the snapshot's compare
    _backend._REGISTRY["klm"] = {**_backend._REGISTRY["klm"], "reference": lambda *a: None}


def _check_values():
    _validation.CHECK_VALUES = "1" if _validation.CHECK_VALUES != "1" else "0"


LEAKS = {
    "qkernels backend": _enter_backend,
    "qkernels value checks": lambda: setattr(
        _validation, "CHECK_VALUES", "1" if _validation.CHECK_VALUES != "1" else "0"
    ),
    "qkernels registered implementations": _reassign_kernel,
    "torch.get_float32_matmul_precision()": lambda: torch.set_float32_matmul_precision(
        "medium" if torch.get_float32_matmul_precision() != "medium" else "highest"
    ),
    "torch.get_num_threads()": lambda: torch.set_num_threads(torch.get_num_threads() + 1),
    "torch.get_default_dtype()": lambda: torch.set_default_dtype(torch.float64),
    "torch.are_deterministic_algorithms_enabled()": lambda: torch.use_deterministic_algorithms(True),
    "torch.is_anomaly_enabled()": lambda: torch.autograd.set_detect_anomaly(True),
    "torch.is_grad_enabled()": lambda: torch.set_grad_enabled(False),
    "torch.is_autocast_enabled('cpu')": lambda: torch.set_autocast_enabled("cpu", True),
    "os.environ: QKERNELS_SOME_LEAK": _set_env,
    "os.environ: TRITON_INTERPRET": _unset_env,
    "os.getcwd()": lambda: os.chdir("/"),
    "signal handlers": lambda: signal.signal(signal.SIGTERM, lambda *a: None),
    "numpy.geterr()": lambda: np.seterr(all="raise"),
}


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_each_leak_is_named_and_put_back(name):
    before = global_state.snapshot()
    LEAKS[name]()
    try:
        found = global_state.changes(before, global_state.snapshot())
        assert any(line.startswith(name) for line in found), found  # (the matmul precision also sets a TF32 flag)
    finally:
        global_state.restore(before)
        while _HELD:
            _HELD.pop().__exit__(None, None, None)  # sets back what it found: the state restore() put back
    assert global_state.changes(before, global_state.snapshot()) == []


def test_tool_variables_and_new_modules_are_not_leaks():
    before = global_state.snapshot()
    os.environ["PYTEST_CURRENT_TEST"] = "x"
    try:
        assert global_state.changes(before, global_state.snapshot()) == []
    finally:
        del os.environ["PYTEST_CURRENT_TEST"]
    after = global_state.snapshot()
    after["qkernels modules in sys.modules"] = {**after["qkernels modules in sys.modules"], "qkernels.new": 1}
    assert global_state.changes(before, after) == []
    after["qkernels modules in sys.modules"]["qkernels._backend"] = 0  # a module re-imported: two copies
    assert global_state.changes(before, after) == [
        "qkernels modules in sys.modules: replaced or removed: qkernels._backend"
    ]


def test_random_generators_are_put_back():
    state = global_state.rng_state()
    a = (torch.rand(3), np.random.rand(3))
    torch.manual_seed(123), np.random.seed(123)
    global_state.set_rng_state(state)
    torch.testing.assert_close(torch.rand(3), a[0], rtol=0, atol=0)
    np.testing.assert_array_equal(np.random.rand(3), a[1])
