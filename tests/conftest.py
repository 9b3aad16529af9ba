"""Shared test set-up. Triton kernels run on CPU tensors through the interpreter on machines
without a GPU; the variable must be set before any module defining kernels is imported."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import qkernels  # noqa: E402
import qkernels.ops  # noqa: E402,F401 - registers every op (qkernels._backend's registry imports none of its clients)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# every backend that can run on this machine's test device, reference included
BACKENDS = qkernels.available_backends(DEVICE)
KERNEL_BACKENDS = [b for b in BACKENDS if b != "reference"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Each available backend in turn, forced for the duration of the test."""
    with qkernels.use_backend(request.param):
        yield request.param


def skip_unless_implemented(backend: str, op: str) -> None:
    """Skip when ``backend`` has no implementation of ``op`` (forcing it would raise BackendUnavailableError):
    e.g. the cuda backend has no Cliff since its CUDA C++ kernel was deleted (issue 26)."""
    if backend != "auto" and backend not in qkernels._backend.implementations(op):
        pytest.skip(f"backend {backend!r} implements no {op}")


@pytest.fixture
def all_value_checks(monkeypatch):
    """Value checks (NaN/inf, ranges) on every device, as with QKERNELS_CHECK_FINITE=1: tests of
    those checks pass on a GPU too, where they are off by default (they synchronize)."""
    monkeypatch.setattr(qkernels._validation, "CHECK_VALUES", "1")


def tol(dtype: torch.dtype) -> dict:
    """assert_close tolerances per dtype."""
    return {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}
