"""The Triton Cliff loss shaped for an H100 / H200 (issue 44), checked without a GPU: what the sm_90 property
harness (tests/sm90/test_triton_sm90.py: every launch compiles; shared memory; ``tl.dot`` tiles >= 16 and tensor-core
instructions; spills; >= 2 x 132 programs of the heaviest kernels) does not check of Cliff.

- Values and gradients of the fused path against the reference with tiles small enough that every split crosses
  a boundary (chunks of samples with a partial last one, column and row blocks, the reduction's blocks of chunk
  shares and row blocks), under the interpreter.
- At the benchmark shapes, recorded as the harness records them (tests/sm90/sm90_launches.py: the host code as on an
  H100's 132 SMs, no kernel run): the six launches of a forward + backward in order, the d^2 pairs on the grid's
  first axis, and each heavy kernel with >= 2 x 132 programs from the off-diagonal pairs alone (the harness
  counts every program; a diagonal one does a small share of a pair's work).
- Their sm_90 compiles (the harness's, cached): the products at the precision torch asks for and where they run:
  float32 "highest" 3xTF32 (exact FMA below IEEE_MAX_WORK multiply-adds), "high" TF32, on Hopper's ``wgmma``
  without an ``mma.sync`` fallback where the tiles allow it (64 rows); float64 exact, on the DMMA tensor cores
  (the harness asks for tensor-core instructions only of TF32 / 3xTF32 products).
- The GEMM path's scenario with tests/test_kde.py's 16-wide tiles (an H200 failed its ``tl.dot`` K >= 16; the
  harness compiles it) launches the three product kernels.
Compiling is not running: speed, and the memory ordering of the reduction's atomic counters, need a GPU.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import skip_unless

import qkernels
from qkernels.bench import kde as bench_kde

pytestmark = [
    pytest.mark.skipif(
        torch.cuda.is_available(), reason="runs and records launches under the Triton interpreter (CPU only)"
    ),
    skip_unless("triton"),
]

import sm90_launches as sm90  # noqa: E402 - a helper module beside this file

HEAVY = ("_cliff_fused_fwd", "_cliff_fused_bwd")
SIX = ["_cliff_fused_fwd", "_cliff_reduce", "_cliff_fused_fwd", "_cliff_reduce", "_cliff_fused_bwd", "_cliff_grad"]
MODES = ("float32 highest", "float32 high", "float64")


def _modules():
    from qkernels.triton.kde import cliff, cliff_fused, cliff_gemm

    return cliff, cliff_fused, cliff_gemm


def _cliff_terms(z, idx, k, sigma=0.3):
    return torch.stack(
        list(qkernels.cliff_loss(z, cond_index=idx, sigma=sigma, grid=(-3.0, 3.0, k), return_terms=True))
    )


def test_fused_tiles_cross_every_boundary(monkeypatch):
    """n = 37 in chunks of 16 (3 chunks, the last of 5 samples), K = 20 in column blocks of 16 (forward) and
    of 16 (backward's dJ), M = 20 in row blocks of 16 (backward products and reduction), the reduction's
    chunk shares 2 per load (one partial): float64 against the reference, values and the gradient of a
    weighted sum of the four outputs (each term's gradient enters)."""
    cliff, fused, _ = _modules()
    original = fused.plan

    def small(n, d, m, k, dtype, device):
        pl = original(n, d, m, k, dtype, device)
        pl.update(
            BLOCK_S=16,
            BLOCK_SF=16,
            CS=16,
            S=-(-n // 16),
            BLOCK_KJ=16,
            KH=-(-k // 16),
            BLOCK_MH=16,
            MH=-(-m // 16),
            BLOCK_KB=16,
        )
        return pl

    monkeypatch.setattr(cliff, "plan", small)
    monkeypatch.setattr(
        cliff,
        "_reduce_blocks",
        lambda pl: {"BLOCK_C": 2, "BLOCK_R": fused.BLOCK_R, "BLOCK_K": pl["BLOCK_K"], "num_warps": 4},
    )
    n, d, m, k = 37, 2, 20, 20
    g = torch.Generator().manual_seed(0)
    z0 = torch.rand(n, d, generator=g, dtype=torch.float64) + (torch.rand(n, d, generator=g) < 0.3).double()
    z0 = z0 + 0.3 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    idx = torch.stack([torch.randperm(n, generator=g)[:m] for _ in range(d)])
    up = torch.tensor([0.4, 0.3, 1.1, 0.7], dtype=torch.float64)
    res = {}
    for name in ("reference", "triton"):
        z = z0.clone().requires_grad_()
        with qkernels.use_backend(name):
            out = _cliff_terms(z, idx, k)
        (out * up).sum().backward()
        res[name] = (out.detach(), z.grad)
    assert res["reference"][0][2] > 0 and res["reference"][1].abs().max() > 0
    for a, b, what in zip(res["triton"], res["reference"], ("terms", "grad"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=what)


def _case_name(shape, mode: str) -> str:
    n, d, m, k = shape
    return f"cliff n={n} d={d} M={m} K={k} {mode}"


@pytest.fixture(scope="module")
def bench_launches() -> dict[str, list[dict]]:
    """The harness's Cliff cases at the benchmark shapes (float32 "highest" / "high", float64) -> their
    recorded launches, not run."""
    cases = {c.name: c for dt in (torch.float32, torch.float64) for c in sm90.cases(dt) if c.op == "cliff_loss"}
    names = [_case_name(s, mode) for s in bench_kde.CLIFF for mode in MODES]
    return {name: sm90.record(cases[name].run) for name in names}


@pytest.mark.parametrize("shape", bench_kde.CLIFF, ids=["x".join(map(str, s)) for s in bench_kde.CLIFF])
def test_fused_grids_fill_an_h100(bench_launches, shape):
    """Six launches per forward + backward (two _cliff_fused_fwd, two _cliff_reduce, _cliff_fused_bwd,
    _cliff_grad), and each heavy kernel's off-diagonal pairs alone make >= 2 x 132 programs on an H100's 132
    SMs (the plan reads the device's count; off a GPU it plans for one SM, recorded for 132)."""
    d = shape[1]
    for mode in MODES:
        launches = bench_launches[_case_name(shape, mode)]
        assert [e["kernel"] for e in launches] == SIX, (mode, [e["kernel"] for e in launches])
        for e in launches:
            if e["kernel"] in HEAVY:
                pairs, *rest = e["grid"]
                assert pairs == d * d, (mode, e["kernel"], e["grid"])
                assert d * (d - 1) * math.prod(rest) >= sm90.MIN_PROGRAMS, (mode, e["kernel"], e["grid"])


@pytest.fixture(scope="module")
def heavy_compiled(bench_launches) -> dict[str, list[tuple[dict, dict]]]:
    """The heavy launches of :func:`bench_launches` with their sm_90 compile results: from the harness's table
    (``sm90.properties``, made once per process and shared with test_triton_sm90.py), the same launches."""
    table = sm90.properties()
    out = {}
    for name, launches in bench_launches.items():
        compiled = [(e, res) for e, res in table[name][1] if e["kernel"] in HEAVY]
        assert [sm90.key(e) for e, _ in compiled] == [sm90.key(e) for e in launches if e["kernel"] in HEAVY], name
        out[name] = compiled
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", bench_kde.CLIFF, ids=["x".join(map(str, s)) for s in bench_kde.CLIFF])
def test_fused_products_on_the_tensor_cores(heavy_compiled, shape, mode):
    """The heavy kernels' tl.dot products: float32 "highest" 3xTF32 at >= IEEE_MAX_WORK multiply-adds per call
    (d^2 n M K: (1024, 12) and the d = 32 shapes), exact FMA below ((64, 10), (5000, 2)); "high" TF32; each
    TF32 / 3xTF32 product on Hopper's wgmma where it has >= 64 rows (one warp group's MMA), else on
    mma.sync; float64 exact, on the tensor cores (DMMA: mma.sync ... f64)."""
    from qkernels.triton.kde._cliff_common import IEEE_MAX_WORK

    n, d, m, k = shape
    want = {"float32 highest": "tf32x3" if d * d * n * m * k >= IEEE_MAX_WORK else "ieee", "float32 high": "tf32"}
    want = want.get(mode, "ieee")
    for launch, res in heavy_compiled[_case_name(shape, mode)]:
        what = (launch["kernel"], res)
        assert "error" not in res and res["dots"], what
        assert {dot["precision"] for dot in res["dots"]} == {want}, what
        assert {dot["dtype"] for dot in res["dots"]} == {"f64" if mode == "float64" else "f32"}, what
        if mode == "float64":
            assert res["mma_sync"] and not res["wgmma"], what
        elif want != "ieee":
            rows = {dot["m"] >= 64 for dot in res["dots"]}
            assert (res["wgmma"], res["mma_sync"]) == (True in rows, False in rows), what
        else:
            assert not res["mma"], what


def test_gemm_path_small_tiles_are_compiled():
    """The harness's GEMM-path scenario with tests/test_kde.py's 16-wide tiles launches _biv_fwd, _biv_dx and
    _biv_dkz (so that its compile checks cover the tiles an H200 rejected: _biv_dx's row block was 8)."""
    for dtype in (torch.float32, torch.float64):
        (case,) = [c for c in sm90.budget_scenarios(dtype) if c.name.startswith("cliff GEMM path 16-wide tiles")]
        kernels = {e["kernel"] for e in sm90.record(case.run)}
        assert {"_biv_fwd", "_biv_dx", "_biv_dkz"} <= kernels, kernels


def test_product_precision_follows_torch():
    """tl.dot's input precision: float64 exact; float32 "highest" 3xTF32 on the tensor cores, exact FMA where
    the products are below IEEE_MAX_WORK multiply-adds; "high" and "medium" TF32 (torch.matmul on CUDA runs
    float32 in TF32 under both: no bf16 float32 GEMM exists there)."""
    from qkernels.triton.kde._cliff_common import IEEE_MAX_WORK, _dot_precision

    before = torch.get_float32_matmul_precision()
    try:
        got = {}
        for mode in ("highest", "high", "medium"):
            torch.set_float32_matmul_precision(mode)
            got[mode] = [
                _dot_precision(dt, w)
                for dt in (torch.float32, torch.float64)
                for w in (IEEE_MAX_WORK - 1, IEEE_MAX_WORK)
            ]
    finally:
        torch.set_float32_matmul_precision(before)
    assert got == {
        "highest": ["ieee", "tf32x3", "ieee", "ieee"],
        "high": ["tf32", "tf32", "ieee", "ieee"],
        "medium": ["tf32", "tf32", "ieee", "ieee"],
    }
