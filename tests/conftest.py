"""Shared test set-up. Triton kernels run on CPU tensors through the interpreter on machines
without a GPU; the variable must be set before any module defining kernels is imported.

Every test runs inside :func:`_no_leaked_state`: a test that leaves process-wide state changed (a backend, a
precision mode, an environment variable, a thread count, ...: tests/global_state.py lists it) fails at its teardown
with what changed, and the state is put back; the global random number generators are put back after every test.

Optional parts (the native extension, Triton, JAX, ...: :data:`PARTS`) are skipped where they are missing, through
:func:`require` / :func:`missing` / :func:`skip_unless`; ``QKERNELS_CI_REQUIRE`` (a comma-separated list of part
names, ``all`` for every one; .ci/run sets it) makes a named part's absence fail instead: the run stops before the
first test, and a test that would skip for it fails."""

import importlib
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    # `pytest -n N` (the README's command): the workers share the cores instead of each starting one torch thread per
    # core (N x oversubscribed), and a training run's automatic thread count (qkernels.train.threads) no longer
    # depends on what the other workers are doing at its start (a run and its resumed twin could differ in bits)
    _per_worker = max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_per_worker)  # child processes: torch reads it at import
    torch.set_num_threads(_per_worker)

import global_state  # noqa: E402 - a helper module beside this file

import qkernels  # noqa: E402
import qkernels.ops  # noqa: E402,F401 - registers every op (qkernels._backend's registry imports none of its clients)
from qkernels import _ext  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# every backend that can run on this machine's test device, reference included
BACKENDS = qkernels.available_backends(DEVICE)
KERNEL_BACKENDS = [b for b in BACKENDS if b != "reference"]


# ----------------------------------------------------------------------------- optional parts


def _modules(*names: str) -> Callable[[], str | None]:
    def check() -> str | None:
        absent = [n for n in names if importlib.util.find_spec(n) is None]
        return f"{', '.join(absent)} not installed" if absent else None

    return check


def _jax() -> str | None:
    try:
        importlib.import_module("qkernels.jax")
    except ImportError as err:
        return f"qkernels.jax does not import: {err}"
    return None


def _gloo() -> str | None:
    import torch.distributed as dist

    return None if dist.is_available() and dist.is_gloo_available() else "torch.distributed without gloo"


# every optional part a test skips without, by name: () -> None where present, else why it is missing
PARTS: dict[str, Callable[[], str | None]] = {
    "ext": lambda: None if _ext.LOADED else f"the native extension qkernels._C is not loaded: {_ext.REASON}",
    "triton": lambda: qkernels._backend.unavailable_reason("triton", DEVICE),
    "jax": _jax,
    "vqp": _modules("vector_quantize_pytorch"),
    "docs": _modules("mkdocs", "mkdocstrings", "material", "griffe"),
    "mypy": _modules("mypy"),
    "build": _modules("build"),
    "gloo": _gloo,
    "binutils": lambda: None if shutil.which("nm") and shutil.which("readelf") else "nm / readelf not on PATH",
    "ray": _modules("ray"),  # qkernels sweep --ray (the dev extra installs it)
    "equinox": _modules("equinox"),  # the authors' JAX code (tests/test_jax_baselines.py, with their checkouts)
    "tomllib": _modules("tomllib"),  # Python >= 3.11
}
REQUIRED = {p.strip() for p in os.environ.get("QKERNELS_CI_REQUIRE", "").split(",") if p.strip()}
if "all" in REQUIRED:
    REQUIRED = set(PARTS)


def pytest_configure(config: Any) -> None:
    """pytest-xdist's ``--dist loadfile`` hands out the files with the most tests first unless told not to: the
    order of pytest_collection_modifyitems (below) instead."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session: Any, config: Any, items: list) -> None:
    """The files marked ``slow`` first (their order kept): under `pytest -n --dist loadfile` a long file that starts
    last keeps one worker busy while the others have nothing left (test_wheel's 70 s and test_bench_step's 35 s
    ran last while xdist reordered the files by their number of tests)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_sessionstart(session: Any) -> None:
    """Under QKERNELS_CI_REQUIRE: every named part is present, or the run stops here saying which is not."""
    unknown = REQUIRED - set(PARTS)
    if unknown:
        raise pytest.UsageError(f"QKERNELS_CI_REQUIRE names unknown parts {sorted(unknown)}; known: {sorted(PARTS)}")
    absent = {p: why for p in sorted(REQUIRED) if (why := PARTS[p]()) is not None}
    if absent:
        raise pytest.UsageError(
            "QKERNELS_CI_REQUIRE: required parts are missing: " + "; ".join(f"{p}: {w}" for p, w in absent.items())
        )


def missing(part: str, reason: str) -> NoReturn:
    """Skip the calling test (or module, at import) for ``reason``; fail where ``part`` is required. The reason
    names the test file that asked (a skip raised here is reported at this line)."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; known: {sorted(PARTS)}")
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    reason = f"{os.path.basename(frame.f_code.co_filename)}: {reason}"
    if part in REQUIRED:
        pytest.fail(f"{reason}, and QKERNELS_CI_REQUIRE requires {part!r}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module: str, part: str, reason: str | None = None) -> Any:
    """``import module`` and return it, or :func:`missing` (``part``) when it does not import; the one
    ``pytest.importorskip`` of the suite, at module level or in a test."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        missing(part, reason or f"needs {module} ({err})")


def skip_unless(part: str, reason: str | None = None) -> pytest.MarkDecorator:
    """A ``skipif`` marker: skip where ``part`` is missing; fail (at collection) where it is also required."""
    why = PARTS[part]()
    if why is not None and part in REQUIRED:
        missing(part, reason or why)
    return pytest.mark.skipif(why is not None, reason=reason or f"needs {part}: {why}")


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


def unless_interpreted(cases: list, *left_out: tuple) -> list:
    """``cases`` (parametrize tuples) without ``left_out`` where Triton runs under its CPU interpreter (no GPU):
    the slow cases there whose code path another case covers (the caller says which)."""
    return cases if DEVICE == "cuda" else [c for c in cases if c not in left_out]


def assert_graph_replays_match(step: Callable[[], Any], want: list) -> None:
    """Capture ``step()`` (a forward + backward returning its outputs and the gradients it made, the tensors ``want``
    holds from an eager run) in a CUDA graph after a warm-up on a side stream, with host synchronization an error
    during the capture, then replay it twice: each replay must give ``want`` bit for bit."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            outs = step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(want, outs, strict=True):
            assert torch.equal(a, b.detach())


def tol(dtype: torch.dtype) -> dict:
    """assert_close tolerances per dtype."""
    return {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-12}


@pytest.fixture
def source_tree_build():
    """Held by a test that builds in the source tree (build/temp.*: scripts/bootstrap.sh, python -m build): one at
    a time across `pytest -n` workers, so that two ninja runs never share the object directory."""
    import fcntl

    os.makedirs(os.path.join(ROOT, "build"), exist_ok=True)
    with open(os.path.join(ROOT, "build", ".tests.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
        fcntl.flock(lock, fcntl.LOCK_UN)


_BASELINE: dict = {}  # the state every test starts from: read at the first test's set-up, after collection
_RNG: list = []
_LAST = ["collection"]  # the test whose teardown ran last


@pytest.fixture(autouse=True)
def _no_leaked_state(request):
    """Fails a test that leaves global state changed (at its teardown, naming what changed), or a test whose
    state was changed before it started (by a module- or session-scoped fixture, naming the test before it); puts
    the state back either way, and the global random number generators after every test."""
    if not _BASELINE:
        _BASELINE.update(global_state.snapshot())
        _RNG.append(global_state.rng_state())
    else:
        diff = global_state.changes(_BASELINE, global_state.snapshot())
        if diff:
            global_state.restore(_BASELINE)
            pytest.fail(
                f"global state changed between the end of {_LAST[0]} and the start of this test (a module- or "
                "session-scoped fixture?): " + "; ".join(diff) + " (put back)",
                pytrace=False,
            )
    yield
    _LAST[0] = request.node.nodeid
    global_state.set_rng_state(_RNG[0])
    diff = global_state.changes(_BASELINE, global_state.snapshot())
    if diff:
        global_state.restore(_BASELINE)
        pytest.fail(
            "this test left global state changed: " + "; ".join(diff) + " (put back; restore it in the test: "
            "monkeypatch, a fixture, try/finally)",
            pytrace=False,
        )
