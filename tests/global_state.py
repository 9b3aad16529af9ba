"""The process-wide state a test can leave behind, read in one call (:func:`snapshot`), compared (:func:`changes`)
and put back (:func:`restore`). tests/conftest.py checks it around every test: a test that changes any of it and does
not restore it fails at its teardown with the names of what changed (and the state is put back, so that the tests
after it run as they would alone).

What is read: qkernels' forced backend, value-check switch and backend tables; torch's float32 matmul precision,
intra-op thread count, default dtype and device, deterministic and anomaly modes, grad and inference modes, CPU
autocast, the cuDNN / TF32 flags; the environment (every variable), the working directory, the SIGINT / SIGTERM
handlers, a torch.distributed process group, NumPy's floating-point error handling, the identity of every loaded
qkernels module (a test that re-imports one leaves two copies), and, when they are loaded, jax's x64 switch and
inductor's ``fallback_random``. The random number generators (torch's default one, NumPy's and Python's global ones)
are put back after every test without a check: most tests draw from them, and each test then starts from the same
state whatever ran before it.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from typing import Any

import numpy as np
import torch

# environment variables set by the tools themselves, not by a test: pytest around each phase of a test, inductor at
# its first compilation (its cache directory, a pointer it passes to its subprocesses), jax, scikit-learn (joblib)
# and ray at their import
_OWN_ENV = (
    "PYTEST_CURRENT_TEST",
    "TORCHINDUCTOR_CACHE_DIR",
    "_TORCHINDUCTOR_",
    "TF_CPP_MIN_LOG_LEVEL",
    "TPU_SKIP_MDS_QUERY",
    "KMP_DUPLICATE_LIB_OK",
    "KMP_INIT_AT_FORK",
    "RAY_CLIENT_MODE",
)


def _checked(var: str) -> bool:
    return not var.startswith(_OWN_ENV)


_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# state read only once its module is loaded: its value before that
_DEFAULTS = {"jax.config.jax_enable_x64": False, "torch._inductor.config.fallback_random": False}


# tables that grow as modules load and backends are probed: an entry added is no change, one replaced or removed is
_ADDED_IS_NO_CHANGE = (
    "qkernels modules in sys.modules",
    "qkernels backend availability (_backend._REASONS)",
    "qkernels registered implementations (_backend._REGISTRY)",
)


_NAMES: list = [0, []]  # (len(sys.modules) when the qkernels names were listed, those names)


def _qkernels_modules() -> dict[str, int]:
    """id of every loaded qkernels module (the names listed again only when modules were added or removed: a scan of
    sys.modules is most of a snapshot's time)."""
    if _NAMES[0] != len(sys.modules):
        _NAMES[:] = [len(sys.modules), [n for n in list(sys.modules) if n == "qkernels" or n.startswith("qkernels.")]]
    return {name: id(sys.modules.get(name)) for name in _NAMES[1]}


def snapshot() -> dict[str, Any]:
    """Every checked piece of state, by a name that says how to read it."""
    from qkernels import _backend, _validation

    b = torch.backends
    state: dict[str, Any] = {
        "qkernels backend (qkernels.use_backend / QKERNELS_BACKEND)": _backend._forced,
        "qkernels value checks (qkernels._validation.CHECK_VALUES)": _validation.CHECK_VALUES,
        "qkernels backend availability (_backend._REASONS)": dict(_backend._REASONS),
        "qkernels registered implementations (_backend._REGISTRY)": {
            op: dict(impls) for op, impls in _backend._REGISTRY.items()
        },
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.get_num_threads()": torch.get_num_threads(),
        "torch.get_default_dtype()": torch.get_default_dtype(),
        "torch.get_default_device()": torch.get_default_device(),
        "torch.are_deterministic_algorithms_enabled() (warn_only)": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "torch.is_anomaly_enabled()": torch.is_anomaly_enabled(),
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
        "torch.is_inference_mode_enabled()": torch.is_inference_mode_enabled(),
        "torch.is_autocast_enabled('cpu') (dtype)": (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
        "torch.backends cudnn.benchmark / deterministic / allow_tf32, cuda.matmul.allow_tf32": (
            b.cudnn.benchmark,
            b.cudnn.deterministic,
            b.cudnn.allow_tf32,
            b.cuda.matmul.allow_tf32,
        ),
        "os.environ": {k: v for k, v in os.environ.items() if _checked(k)},
        "os.getcwd()": os.getcwd(),
        "signal handlers (SIGINT, SIGTERM)": tuple(signal.getsignal(s) for s in _SIGNALS),
        "torch.distributed.is_initialized()": torch.distributed.is_available() and torch.distributed.is_initialized(),
        "numpy.geterr()": np.geterr(),
        "qkernels modules in sys.modules": _qkernels_modules(),
    }
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "config"):
        state["jax.config.jax_enable_x64"] = bool(jax.config.jax_enable_x64)
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        state["torch._inductor.config.fallback_random"] = inductor.fallback_random
    return state


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs, one line per piece of state (modules and cache entries added since are not changes)."""
    out = []
    for name in before.keys() | after.keys():
        was, now = before.get(name, _DEFAULTS.get(name)), after.get(name, _DEFAULTS.get(name))
        if name == "os.environ":
            diff = sorted(
                f"{k}: {was.get(k, '<unset>')!r} -> {now.get(k, '<unset>')!r}"
                for k in was.keys() | now.keys()
                if was.get(k) != now.get(k)
            )
            if diff:
                out.append(f"os.environ: {', '.join(diff)}")
        elif name in _ADDED_IS_NO_CHANGE:
            diff = sorted(str(k) for k in was if now.get(k, was[k]) != was[k] or k not in now)
            if diff:
                out.append(f"{name}: replaced or removed: {', '.join(diff)}")
        elif was != now:
            out.append(f"{name}: {was!r} -> {now!r}")
    return sorted(out)


def restore(before: dict[str, Any]) -> None:
    """Put back what :func:`snapshot` read (modules stay as they are loaded; entries added to qkernels' tables stay)."""
    from qkernels import _backend, _validation

    _backend._forced = before["qkernels backend (qkernels.use_backend / QKERNELS_BACKEND)"]
    _validation.CHECK_VALUES = before["qkernels value checks (qkernels._validation.CHECK_VALUES)"]
    _backend._REASONS.update(before["qkernels backend availability (_backend._REASONS)"])
    for op, impls in before["qkernels registered implementations (_backend._REGISTRY)"].items():
        if _backend._REGISTRY.get(op) != impls:
            _backend._REGISTRY[op] = dict(impls)
            _backend._SELECTED.clear()
    torch.set_float32_matmul_precision(before["torch.get_float32_matmul_precision()"])
    torch.set_num_threads(before["torch.get_num_threads()"])
    torch.set_default_dtype(before["torch.get_default_dtype()"])
    torch.set_default_device(before["torch.get_default_device()"])
    det, warn_only = before["torch.are_deterministic_algorithms_enabled() (warn_only)"]
    torch.use_deterministic_algorithms(det, warn_only=warn_only)
    torch.autograd.set_detect_anomaly(before["torch.is_anomaly_enabled()"])
    torch.set_grad_enabled(before["torch.is_grad_enabled()"])
    torch.set_autocast_enabled("cpu", before["torch.is_autocast_enabled('cpu') (dtype)"][0])
    torch.set_autocast_dtype("cpu", before["torch.is_autocast_enabled('cpu') (dtype)"][1])
    b = torch.backends
    (b.cudnn.benchmark, b.cudnn.deterministic, b.cudnn.allow_tf32, b.cuda.matmul.allow_tf32) = before[
        "torch.backends cudnn.benchmark / deterministic / allow_tf32, cuda.matmul.allow_tf32"
    ]
    env = before["os.environ"]
    for k in [k for k in os.environ if k not in env and _checked(k)]:
        del os.environ[k]
    os.environ.update(env)
    os.chdir(before["os.getcwd()"])
    for s, handler in zip(_SIGNALS, before["signal handlers (SIGINT, SIGTERM)"], strict=True):
        if handler is not None:
            signal.signal(s, handler)
    np.seterr(**before["numpy.geterr()"])
    if not before["torch.distributed.is_initialized()"] and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    jax, inductor = sys.modules.get("jax"), sys.modules.get("torch._inductor.config")
    if jax is not None and hasattr(jax, "config"):
        jax.config.update("jax_enable_x64", before.get("jax.config.jax_enable_x64", False))
    if inductor is not None:
        inductor.fallback_random = before.get("torch._inductor.config.fallback_random", False)


def rng_state() -> tuple[Any, ...]:
    """The global random number generators' states: torch's default CPU generator, NumPy's and Python's."""
    return torch.random.get_rng_state(), np.random.get_state(), random.getstate()


def set_rng_state(state: tuple[Any, ...]) -> None:
    torch.random.set_rng_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])
