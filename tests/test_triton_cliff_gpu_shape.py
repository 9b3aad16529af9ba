"""The Triton Cliff loss shaped for an H100 / H200 (issue 44), checked without a GPU.

- Values and gradients of the fused path against the reference with tiles small enough that every
  split crosses a boundary (chunks of samples with a partial last one, column and row blocks, the
  reduction's blocks of chunk shares and row blocks), under the interpreter.
- At the four benchmark shapes, the launches of one forward + backward (recorded, not run): six kernels,
  and the heavy ones with at least 2 programs per SM of an H100 (132) from the off-diagonal pairs alone.
- Those launches compiled for sm_90 (``QKERNELS_SM90_TRITON=DIR``: with the Triton in DIR, e.g. torch
  2.11's 3.6, as tests/test_triton_sm90.py): shared memory within an H100's 227 KB per block, no register
  spills in float32, the products on the tensor cores (``wgmma`` in the PTX; float64 ``mma``), and the GEMM
  path with the small tiles of tests/test_kde.py compiles (``tl.dot`` rejects a tile dimension under 16).
Compiling is not running: speed, and the memory ordering of the reduction's atomic counters, need a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import qkernels

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or "triton" not in qkernels.available_backends("cpu"),
    reason="runs and records launches under the Triton interpreter (CPU only)",
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = [(64, 10, 10, 100), (1024, 12, 64, 100), (5000, 2, 100, 100), (4096, 32, 128, 128)]  # (n, d, M, K)
H100_SMS = 132
SMEM_LIMIT = 232448  # bytes of shared memory per block on an H100 / H200 (the H200's OutOfResources message)
HEAVY = ("_cliff_fused_fwd", "_cliff_fused_bwd")


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


def _record(shape, dtype, *, gemm_blocks=None):
    """The Triton launches of one Cliff forward + backward at ``shape`` (n, d, M, K), recorded and not run:
    (kernel, module, signature, constexprs, num_warps, grid) each."""
    from test_triton_sm90 import _signature
    from triton.runtime import interpreter

    cliff, fused, gemm = _modules()
    seen = []

    def spy(self, *args, grid, warmup, **kwargs):
        sig, consts = _signature(self.fn, args, kwargs)
        seen.append(
            {
                "module": self.fn.__module__,
                "kernel": self.fn.__name__,
                "signature": sig,
                "constexprs": consts,
                "num_warps": kwargs.get("num_warps", 4),
                "grid": list(grid) + [1] * (3 - len(grid)),
            }
        )

    n, d, m, k = shape
    g = torch.Generator().manual_seed(0)
    z = torch.randn(n, d, generator=g, dtype=dtype)
    idx = torch.stack([torch.randperm(n, generator=g)[:m] for _ in range(d)])
    one = torch.ones((), dtype=dtype)
    original, tile, blocks = interpreter.InterpretedFunction.run, fused.FUSED_MAX_TILE, gemm.GEMM_BLOCKS
    interpreter.InterpretedFunction.run = spy
    if gemm_blocks:
        fused.FUSED_MAX_TILE, gemm.GEMM_BLOCKS = 0, gemm_blocks
    try:
        cliff.cliff_loss(z, idx, 0.1, -5.0, 5.0, k, 0.5, 1.0, 0.7)
        cliff.cliff_loss_backward(one, None, None, one, z, idx, 0.1, -5.0, 5.0, k, 0.5, 1.0, 0.7)
    finally:
        interpreter.InterpretedFunction.run = original
        fused.FUSED_MAX_TILE, gemm.GEMM_BLOCKS = tile, blocks
    return seen


@pytest.mark.parametrize("shape", BENCH, ids=["x".join(map(str, s)) for s in BENCH])
def test_fused_grids_fill_an_h100(shape, monkeypatch):
    """Six launches per forward + backward (two _cliff_fused_fwd, two _cliff_reduce, _cliff_fused_bwd,
    _cliff_grad), and each heavy kernel's off-diagonal pairs alone make >= 2 x 132 programs on an H100's 132
    SMs (the plan reads the device's count; off a GPU it plans for one SM unless told otherwise, as here)."""
    monkeypatch.setattr(_modules()[1], "_sm_count", lambda device: H100_SMS)
    launches = _record(shape, torch.float32)
    names = [e["kernel"] for e in launches]
    assert names == [
        "_cliff_fused_fwd",
        "_cliff_reduce",
        "_cliff_fused_fwd",
        "_cliff_reduce",
        "_cliff_fused_bwd",
        "_cliff_grad",
    ], names
    d = shape[1]
    for e in launches:
        if e["kernel"] in HEAVY:
            pairs, *rest = e["grid"]
            assert pairs == d * d
            off_diagonal = d * (d - 1) * rest[0] * rest[1]
            assert off_diagonal >= 2 * H100_SMS, (e["kernel"], e["grid"])


def _compile(launches):
    unique = {
        json.dumps(
            {x: e[x] for x in ("module", "kernel", "signature", "constexprs", "num_warps")}, sort_keys=True, default=str
        ): e
        for e in launches
    }
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("QKERNELS_SM90_TRITON"), ROOT]))
    from test_triton_sm90 import COMPILE  # shared memory, spills and the PTX's mma instructions per kernel

    res = subprocess.run(
        [sys.executable, "-c", COMPILE],
        input=json.dumps(list(unique.values()), default=str),
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_fused_kernels_fit_an_h100_at_the_largest_tiles(dtype):
    """(4096, 32, 128, 128), the largest tiles of the fused path (128 x 128 pair grids): every kernel
    within 227 KB of shared memory (the H200 needed 295 KB for float64 before); no register spills; the
    products on the tensor cores: float32 "highest" = 3xTF32 ``wgmma`` (and no ``mma.sync`` fallback),
    float64 ``mma`` (DMMA). Prints the table for benchmarks/RESULTS.md (-s)."""
    launches = [e for e in _record(BENCH[-1], dtype) if dtype == torch.float32 or e["kernel"] in HEAVY]
    built = _compile(launches)
    print(json.dumps(built))
    for b in built:
        assert b["shared"] <= SMEM_LIMIT, b
        assert b["spill_bytes"] in (None, 0), b
        if b["kernel"] in HEAVY:
            assert (b["wgmma"] > 0 and b["mma"] == 0) if dtype == torch.float32 else b["mma"] > 0, b


def test_gemm_path_small_tiles_compile():
    """The GEMM path with tests/test_kde.py's 16-wide tiles compiles for sm_90: on an H200 _biv_dx's 8-wide
    row block failed ``tl.dot``'s K >= 16 (the interpreter does not check it)."""
    launches = [
        e
        for e in _record((160, 3, 20, 48), torch.float32, gemm_blocks={"R": 16, "S": 16, "K": 16, "warps": 4})
        if e["kernel"] in ("_biv_fwd", "_biv_dx", "_biv_dkz")
    ]
    assert {e["kernel"] for e in launches} == {"_biv_fwd", "_biv_dx", "_biv_dkz"}
    assert all(b["shared"] <= SMEM_LIMIT for b in _compile(launches))


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
