"""The tables that route behaviour, each listed in full (issue 48): a changed entry fails here and says which.

- ``METHOD_PROTOCOL``: each method scored by its own authors' protocol;
- ``AUTO_ORDER``: what ``auto`` runs, per op and device type, on a machine where every backend runs;
- the benchmark variants of every default case, on a CPU and on a CUDA device (``backend_variants``);
- the overhead bench's cases (one per op and CPU backend).

The per-dataset settings (``DATASET_SETTINGS``) are listed by tests/test_fidelity.py (``PER_DATASET``), the data
orders and run lengths there too."""

from __future__ import annotations

import glob
import math
import os
import re

import pytest
import torch

import qkernels
from qkernels import _backend, _ext
from qkernels.bench import backend_variants, hessian, kde, overhead, quantize
from qkernels.metrics import METHOD_PROTOCOL
from qkernels.models.registry import METHODS

# ----------------------------------------------------------------------------- method -> protocol

# The authors' protocol of each method: QLAE's repository (latent_quantization) trains and scores its AE baseline
# with QLAE's metrics; QVAE is FactorQVAE's ablation in the FactorQVAE repository; D-VAE, the VAE baselines and
# Cliff follow disentanglement_lib's (qkernels/metrics/protocols.py's sources).
AUTHORS_PROTOCOL = {
    "ae": "qlae",
    "qlae": "qlae",
    "tripod": "tripod",
    "qvae": "factorqvae",
    "factorqvae": "factorqvae",
    "dvae": "dlib",
    "factordvae": "dlib",
    "beta_vae": "dlib",
    "beta_tcvae": "dlib",
    "factorvae": "dlib",
    "cliff_vae": "dlib",
    "cliff_ae": "dlib",
}


def test_every_method_is_scored_by_its_authors_protocol():
    assert set(AUTHORS_PROTOCOL) == set(METHODS), "a method without a listed protocol (or a listed one gone)"
    for method, protocol in AUTHORS_PROTOCOL.items():
        assert METHOD_PROTOCOL[method] == protocol, method
    assert METHOD_PROTOCOL == AUTHORS_PROTOCOL


# ----------------------------------------------------------------------------- auto's choice per op and device

# A GPU machine with every backend (the cuda backend only where the extension has its kernels): reference
# anywhere, cpu on CPU tensors, triton and cuda on CUDA tensors.
_RUNS_ON = {"reference": ("cpu", "cuda"), "cpu": ("cpu",), "triton": ("cuda",), "cuda": ("cuda",)}


def _every_backend(backend: str, device=None) -> str | None:
    dev = _backend._device_type(device)
    return None if dev is None or dev in _RUNS_ON[backend] else f"{backend} does not run on {dev}"


# the ops with CUDA C++ kernels, read from the extension's sources (their CUDA glue's m.impl lines)
CUDA_OPS = {
    name
    for path in glob.glob(os.path.join(os.path.dirname(__file__), "..", "csrc", "cuda", "*_glue.cpp"))
    for name in re.findall(r'm\.impl\("(\w+)"', open(path).read())
    if not name.endswith("_backward")
}


@pytest.fixture
def gpu_machine(monkeypatch):
    """Backend availability of a machine with a GPU and every backend installed."""
    monkeypatch.setattr(_backend, "unavailable_reason", _every_backend)
    monkeypatch.setattr(_backend, "_SELECTED", {})


@pytest.fixture
def cuda_kernels(gpu_machine, monkeypatch):
    """... with the extension's CUDA kernels: the cuda backend registered for the ops that have them, as such a
    build registers it (stand-ins: auto's choice is tested, not the kernels)."""
    registry = {op: dict(impls) for op, impls in _backend._REGISTRY.items()}
    for op in CUDA_OPS:
        registry[op].setdefault("cuda", registry[op]["reference"])
    monkeypatch.setattr(_backend, "_REGISTRY", registry)


# auto's pick per op: every row of AUTO_ORDER (benchmarks/RESULTS.md measured each), resolved
AUTO_PICKS = {
    "cpu": {
        "cliff_loss": "cpu",
        "klm": "cpu",
        "kde_grid": "cpu",
        "latent_quantize": "cpu",
        "finite_difference_curvature": "cpu",
        "relaxed_categorical": "cpu",
        "gumbel_quantize": "cpu",  # the vectorized kernel (issue 48)
        "curvature_penalty": "reference",
        "perturbed_batch": "reference",  # no cpu kernel
    },
    "cuda": {  # the H200 run of 2026-11-27 22:55 UTC; at the smallest calls (work 0: the first band)
        "cliff_loss": "triton",
        "klm": "cuda",
        "kde_grid": "cuda",
        "latent_quantize": "cuda",
        "finite_difference_curvature": "triton",
        "relaxed_categorical": "cuda",
        "gumbel_quantize": "reference",
        "curvature_penalty": "reference",
        "perturbed_batch": "reference",
    },
}

# the ops whose pick on CUDA depends on the call's size (_backend.WORK): (work, pick) at the measured shapes
AUTO_BANDS_CUDA = {
    "cliff_loss": [(6.4e6, "triton"), (2.0e8, "triton"), (9.4e8, "triton"), (6.9e10, "reference")],
    "klm": [(192, "cuda"), (3.4e7, "cuda"), (1.1e9, "triton")],
    "latent_quantize": [(24, "cuda"), (2.6e5, "cuda"), (4.2e6, "triton")],
    "kde_grid": [(1.7e7, "triton")],
}


def test_the_cuda_kernels_are_read_from_the_sources():
    assert CUDA_OPS == {"klm", "kde_grid", "latent_quantize", "relaxed_categorical", "finite_difference_curvature"}


def test_auto_picks_per_op_and_device(cuda_kernels):
    assert set(_backend._REGISTRY) == set(AUTO_PICKS["cpu"]) == set(AUTO_PICKS["cuda"]), "an op without a row"
    for device, picks in AUTO_PICKS.items():
        for op, want in picks.items():
            assert _backend._select(op, torch.device(device), torch.float32)[0] == want, (device, op)
            assert _backend._select(op, torch.device(device), torch.float64)[0] == want, (device, op)
            # kernels take float32 / float64: half precision is computed by the reference (or upcast by the
            # public function first: qkernels._precision)
            assert _backend._select(op, torch.device(device), torch.bfloat16)[0] == "reference", (device, op)


def test_auto_picks_by_the_size_of_the_call_on_cuda(cuda_kernels):
    assert set(AUTO_BANDS_CUDA) == set(_backend.WORK), "an op with bands without a WORK entry (or the reverse)"
    for op, picks in AUTO_BANDS_CUDA.items():
        for work, want in picks:
            assert _backend._select(op, torch.device("cuda"), torch.float32, work)[0] == want, (op, work)
            assert _backend.select(op, torch.device("cuda"), torch.float32, work)[0] == want, (op, work)
    # the bands' orders fall back like the others: without triton and cuda, the reference at every size
    assert _backend._select("cliff_loss", torch.device("cpu"), torch.float32, 1e12)[0] == "cpu"


def _banded():
    """(device type, op, bands) of every banded entry of AUTO_ORDER."""
    return [
        (device, op, entry)
        for device, table in _backend.AUTO_ORDER.items()
        for op, entry in table.items()
        if not isinstance(entry[0], str)
    ]


def test_a_call_at_a_bands_bound_takes_that_band(cuda_kernels):
    """The rule of every band of every banded entry, read from the table (a new band is covered as it is added):
    the first band whose bound is >= the call's work applies, so work == bound takes the band it bounds and the
    next representable work above it the next band; the bounds increase and the last is inf."""
    assert _banded(), "no banded entry left: this test and AUTO_BANDS_AT_BOUNDS are stale"
    for device, op, bands in _banded():
        bounds = [bound for bound, _ in bands]
        assert bounds == sorted(set(bounds)) and bounds[-1] == math.inf, (device, op, bounds)
        for (bound, order), (_, above) in zip(bands, bands[1:], strict=False):
            assert order != above, (device, op, bound)  # two equal neighbours would make this test vacuous
            for work in (math.nextafter(bound, -math.inf), bound, int(bound)):
                assert _backend._auto_order(op, device, work) == order, (device, op, work)
            assert _backend._auto_order(op, device, math.nextafter(bound, math.inf)) == above, (device, op, bound)
            assert _backend._auto_order(op, device, int(bound) + 1) == above, (device, op, bound)
            for work, want in ((bound, order), (int(bound) + 1, above)):
                dev = torch.device(device)
                # the pick: the first backend of the band's order that runs (select caches it per band)
                runs = [b for b in want if b in _backend._REGISTRY[op] and _backend.unavailable_reason(b, dev) is None]
                pick = runs[0]
                assert _backend._select(op, dev, torch.float32, work)[0] == pick, (device, op, work)
                assert _backend.select(op, dev, torch.float32, work)[0] == pick, (device, op, work)


# today's bounds and auto's pick at and just above each (the H200 run of 2026-11-27): a changed bound, or a changed
# rule (work < bound), fails here
AUTO_BANDS_AT_BOUNDS = {
    ("cuda", "cliff_loss"): (2_000_000_000, "triton", "reference"),
    ("cuda", "klm"): (100_000_000, "cuda", "triton"),
    ("cuda", "latent_quantize"): (1_000_000, "cuda", "triton"),
    ("cuda", "kde_grid"): (1_000_000, "cuda", "triton"),
}


def test_todays_bands_at_their_bounds(cuda_kernels):
    assert {(device, op) for device, op, _ in _banded()} == set(AUTO_BANDS_AT_BOUNDS), "a band added or removed"
    for (device, op), (bound, at, above) in AUTO_BANDS_AT_BOUNDS.items():
        assert [b for b, _ in _backend.AUTO_ORDER[device][op]] == [bound, math.inf], (device, op)
        for work, want in ((bound - 1, at), (bound, at), (bound + 1, above)):
            assert _backend._select(op, torch.device(device), torch.float32, work)[0] == want, (op, work)
            assert _backend.select(op, torch.device(device), torch.float32, work)[0] == want, (op, work)


def test_the_bands_hold_under_torch_compile_with_symbolic_sizes():
    """Under torch.compile(dynamic=True) the call's size is symbolic: a band is a guard, so the compiled function
    changes its pick where the eager one does (here Cliff's band on CUDA, at 2e9)."""

    def pick(x):
        order = _backend._auto_order("cliff_loss", "cuda", x.shape[0] * 1_000_000)
        return x * (1.0 if order[0] == "triton" else 2.0)

    compiled = torch.compile(pick, dynamic=True, fullgraph=True)
    for n in (10, 20, 1999, 2000, 2001, 5000, 30):  # 2000: work == the bound, the lower band
        x = torch.ones(n)
        assert compiled(x)[0].item() == pick(x)[0].item() == (1.0 if n <= 2000 else 2.0), n


def test_the_public_functions_give_select_their_work(monkeypatch):
    """Each banded op's public function passes the size _backend.WORK names."""
    seen = {}
    real = _backend.select

    def spy(op, device, dtype, work=0):
        seen[op] = work
        return real(op, device, dtype, work)

    for module in ("qkernels.ops.kde", "qkernels.ops.quantize"):
        monkeypatch.setattr(f"{module}.select", spy)
    z = torch.randn(40, 3)
    qkernels.cliff_loss(z, cond_index=torch.stack([torch.arange(7)] * 3), grid=(-3.0, 3.0, 11))
    qkernels.klm_loss(z)
    qkernels.latent_quantize(z, torch.linspace(-1, 1, 5))
    qkernels.kde_grid(torch.zeros(3, 9), z, 0.5)
    assert seen == {
        "cliff_loss": 3 * 3 * 40 * 7 * 11,
        "klm": 40 * 40 * 3,
        "latent_quantize": 40 * 3,
        "kde_grid": 40 * 3 * 9,
    }


def test_auto_falls_back_to_the_reference_where_its_choice_cannot_run(monkeypatch):
    # no extension, no triton: auto runs the reference everywhere, never raises
    monkeypatch.setattr(_backend, "unavailable_reason", lambda b, d=None: None if b == "reference" else "absent")
    for op in _backend._REGISTRY:
        for device in ("cpu", "cuda"):
            assert _backend._select(op, torch.device(device), torch.float32)[0] == "reference", (device, op)


# ----------------------------------------------------------------------------- benchmark variants

_LQ = ("reference", "{k}", "reference_compiled", "materialized", "materialized compiled")
_HALF = ("float32", "bf16", "plain autocast")
# every default case's variants ({k}: the device's kernel backend, cpu or triton; cuda's kernels join the triton
# ones where the extension has them)
BENCH_VARIANTS = {
    "quantize": {
        **{
            f"latent_quantize n={n} d={d} n_v={v} {kind}": _LQ
            for n, d, v in quantize.SHAPES
            for kind in ("per-dim", "global")
        },
        "categorical_latent n=64 d=10 K=64": ("reference", "{k}", "reference_compiled"),
        "categorical_latent n=4096 d=10 K=64": ("reference", "{k}", "reference_compiled"),
        "gumbel_quantize n=256 d=12 K=64": ("reference", "{k}", "reference_compiled"),
        "latent_quantize n=65536 d=64 n_v=64 per-dim bf16": _HALF,
        "categorical_latent n=4096 d=10 K=64 bf16": _HALF,
    },
    "kde": {
        "cliff n=64 d=10 M=10 K=100": ("reference", "{k}", "reference_compiled", "{high}", "materialized"),
        "cliff n=1024 d=12 M=64 K=100": ("reference", "{k}", "reference_compiled", "{high}"),
        "cliff n=5000 d=2 M=100 K=100": ("reference", "{k}", "reference_compiled", "{high}", "materialized"),
        "cliff n=4096 d=32 M=128 K=128": ("reference", "{k}", "reference_compiled", "{high}"),
        "cliff n=16384 d=32 M=128 K=128": ("reference", "{k}", "reference_compiled", "{high}"),  # GPU only
        "klm n=64 d=12": ("reference", "{k}", "reference_compiled", "materialized"),
        "klm n=1024 d=32": ("reference", "{k}", "reference_compiled", "materialized"),
        "klm n=4096 d=64": ("{k}", "reference_compiled"),  # the reference's (n, n, d) tensor does not fit
        "klm n=16384 d=32": ("{k}", "reference_compiled"),  # GPU only
        "kde_grid n=4096 d=32 K=128": ("reference", "{k}", "reference_compiled"),
        "cliff n=1024 d=12 M=64 K=100 bf16": _HALF,
        "cliff n=4096 d=32 M=128 K=128 bf16": _HALF,
        "klm n=1024 d=32 bf16": _HALF,
        "kde_grid n=4096 d=32 K=128 bf16": _HALF,
    },
    "hessian": {
        "nhp mlp n=64 d=12 k=2": ("reference", "{k}", "reference_compiled", "sequential"),
        "nhp conv n=64 d=12 k=2": ("reference", "{k}", "reference_compiled", "sequential"),
    },
}
GPU_ONLY = {"cliff n=16384 d=32 M=128 K=128", "klm n=16384 d=32"}
_HOTPATHS = {"quantize": quantize, "kde": kde, "hessian": hessian}
_OPS = {
    "quantize": ("latent_quantize", "relaxed_categorical", "gumbel_quantize"),
    "kde": ("cliff_loss", "klm", "kde_grid"),
    "hessian": ("finite_difference_curvature",),
}


@pytest.fixture
def no_compile(monkeypatch):
    """Variants are built, never run: torch.compile (whose first call imports dynamo, seconds) is not needed."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)


def _expected(hotpath: str, device: str) -> dict[str, list[str]]:
    out = {}
    for name, variants in BENCH_VARIANTS[hotpath].items():
        if name in GPU_ONLY and device == "cpu":
            continue
        want = []
        for v in variants:
            if v == "{k}":
                want += ["cpu"] if device == "cpu" else ["triton"] + (["cuda"] if _ext.cuda_built() else [])
            elif v == "{high}":  # Cliff with TF32 products (issue 26): a GPU variant
                want += ["triton high"] if device == "cuda" else []
            else:
                want.append(v)
        out[name] = want
    return out


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("hotpath", sorted(BENCH_VARIANTS))
def test_bench_variants_of_every_default_case(gpu_machine, no_compile, hotpath, device):
    got = {c.name: list(c.variants) for c in _HOTPATHS[hotpath].cases(device)}
    assert got == _expected(hotpath, device)
    # every op of the hot path has its kernel variants
    for op in _OPS[hotpath]:
        assert ("cpu" if device == "cpu" else "triton") in backend_variants(lambda *a: None, device, op), op


def test_overhead_cases_one_per_op_and_cpu_backend(gpu_machine, no_compile):
    got = {c.name: list(c.variants) for c in overhead.cases("cpu")}
    ops = ("latent_quantize", "categorical_latent", "kde_grid", "cliff_loss", "klm_loss", "finite_difference_curvature")
    assert got == {f"{op} n=8 d=3, {b}": ["add", b, f"{b} raw"] for op in ops for b in ("reference", "cpu")}


@pytest.mark.skipif(torch.cuda.is_available() or not _backend.triton_interpret(), reason="the interpreter's view")
def test_backend_variants_list_triton_on_cuda_and_not_on_cpu(no_compile):
    """Issue 48 (6): Triton kernels on a CPU run only in the interpreter (slow, not a backend to time): the
    variants for CPU tensors leave triton out, those for CUDA tensors keep it (the interpreter stands in for a GPU
    here; the cuda backend needs a GPU and is absent)."""
    loss = lambda *a: None  # noqa: E731
    for op in (
        "latent_quantize",
        "relaxed_categorical",
        "klm",
        "cliff_loss",
        "kde_grid",
        "finite_difference_curvature",
    ):
        on_cpu, on_cuda = backend_variants(loss, "cpu", op), backend_variants(loss, "cuda", op)
        assert list(on_cuda) == ["reference", "triton", "reference_compiled"], op
        want = (
            ["reference", "cpu", "reference_compiled"]
            if "cpu" in qkernels.available_backends("cpu")
            else ["reference", "reference_compiled"]
        )
        assert list(on_cpu) == want, op
