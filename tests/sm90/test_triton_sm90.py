"""The GPU properties of every Triton kernel, proven without a GPU (issue 44, part 2): each launch of the
public functions at every benchmark shape (qkernels/bench/), float32 and float64, compiled for an H100 / H200
(sm_90) with Triton 3.6 (torch 2.11's; bootstrap installs it into ``.venv/triton36``, or
``QKERNELS_SM90_TRITON=DIR``; without either, the installed Triton).

Under ``TRITON_INTERPRET=1`` a kernel runs as Python: what only the compiler and the hardware check passes
there (an H200 run failed on shared memory, tile shapes and a float64 accumulator that every interpreter test
had passed). Here the launches are recorded without running them (tests/sm90/sm90_launches.py: host code as on a
GPU, kernels skipped) and compiled ahead of time (tests/sm90/sm90_compile.py: Triton's own specialization, down to
a cubin with Triton's bundled ptxas), and per case and kernel:

- ``compiles``: every launch compiles for sm_90;
- ``shared_memory``: each kernel's shared memory fits one block's 232,448 bytes (227 KB);
- ``dot_tiles``: every ``tl.dot`` has tiles of at least 16 in each dimension, and a kernel whose products are
  meant for the tensor cores (TF32, 3xTF32, bf16 inputs) has ``mma`` / ``wgmma`` in its PTX;
- ``no_spills``: ptxas spills no registers;
- ``grid``: the heaviest kernels of the op (sm90_launches.HEAVIEST) launch at least 2 x 132 programs, unless
  the op's whole GPU work is estimated under 5 us (launch-bound: its grid does not decide its time).

Compiling is not running: a GPU run still has to confirm values and speed. Results are cached by the
kernel's source hash and specialization (tests/sm90/sm90_cache.json, committed; ~/.cache/qkernels-sm90): a changed
kernel is compiled again. ``python tests/sm90/sm90_launches.py`` refreshes the committed cache and prints the table.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import skip_unless

import qkernels

pytestmark = [
    pytest.mark.skipif(
        torch.cuda.is_available(),
        reason="records launches under the Triton interpreter (CPU only; a GPU compiles them for real)",
    ),
    skip_unless("triton"),
]

import sm90_launches as sm90  # noqa: E402 - a helper module beside this file

PROPERTIES = ("compiles", "shared_memory", "dot_tiles", "no_spills", "grid")

# (case name, property) -> why it fails today, strict so that a fix is reported. What is left of issue 44's Cliff
# rewrite (qkernels/triton/kde/cliff_*.py): spills of a few bytes, stored and loaded once per loop, none of them in
# an inner product loop. _cliff_fused_fwd's: ptxas's calling convention around the slow-path subroutine of the IEEE
# division (CALL.REL in the SASS), which standardizes each tile's samples as torch rounds them; precomputing the
# standardized samples in a launch of their own removed every fused spill but added two launches per forward +
# backward; an H200 A/B (2026-11-27, HISTORY.md "GPU") measured it 3-9% faster at (4096, 32, 128, 128) and slower
# at the small shapes (1024 x 12 "high": 1.24-1.52 ms against 1.02-1.49), so it was not merged.
CLIFF = "issue 44 (qkernels/triton/kde/cliff_*.py)"
DIVISION = "ptxas's calling convention around the IEEE division's slow-path subroutine"
GRAD = "_cliff_grad spills 20 bytes at 40 registers (loop-carried sums; no division or call left in it)"
KNOWN: dict[tuple[str, str], str] = {
    (
        "cliff n=64 d=10 M=10 K=100 float32 highest",
        "no_spills",
    ): f"_cliff_fused_fwd (FMA products) spills 8 bytes at 64 registers: {DIVISION}; {GRAD}; {CLIFF}",
    ("cliff n=64 d=10 M=10 K=100 float32 high", "no_spills"): f"{GRAD}; {CLIFF}",
    (
        "cliff n=1024 d=12 M=64 K=100 float64",
        "no_spills",
    ): f"_cliff_fused_fwd 64 x 64 float64 FMA tiles spill 56 bytes at 128 registers (pressure, and {DIVISION}); "
    f"{CLIFF}",
    (
        "cliff GEMM path 16-wide tiles n=40 d=3 float64",
        "no_spills",
    ): f"_biv_dkz float64 at test_kde's 16 x 16 x 16 tiles and 4 warps spills 12 bytes at 72 registers (none at 2 or "
    f"8 warps, none at the GEMM path's own 64 x 32 x 32 tiles); {CLIFF}",
    # issue 53's KLM (qkernels/triton/kde/klm.py): one value live across the pair loop, stored before it and loaded
    # after it (SASS: one STL, one LDL), none in the loop; float32 and the float64 backward spill nothing
    **{
        (f"klm n=4096 d=64{std} float64", "no_spills"): "_klm_pairs float64 forward spills 4 + 4 bytes at 168 "
        "registers: one value kept across the pair loop (stored once before, loaded once after it)"
        for std in ("", " given std")
    },
    # the forward curvature kernel is one program per (sample, group), 128 at n = 64; a column split needs its
    # reduction in a second launch per activation (host-bound at n = 64) or in curvature_penalty's kernel (an
    # op-boundary change, for after a GPU run has timed _fdc_fwd: ~21 / 41 us of HBM work here)
    ("nhp conv n=64 d=12 k=2 float32", "grid"): "_fdc_fwd: 128 programs (n x groups) at n = 64",
    ("nhp conv n=64 d=12 k=2 float64", "grid"): "_fdc_fwd: 128 programs (n x groups) at n = 64",
}


def _cases() -> list:
    names = [
        c.name
        for dtype in (torch.float32, torch.float64)
        for c in sm90.cases(dtype) + sm90.budget_scenarios(dtype) + sm90.edge_scenarios(dtype)
    ]
    out = []
    for name in names:
        for prop in PROPERTIES:
            reason = KNOWN.get((name, prop))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(name, prop, marks=marks, id=f"{name}-{prop}"))
    return out


@pytest.fixture(scope="module")
def table():
    return sm90.properties()


def _programs(launch: dict) -> int:
    return math.prod(launch["grid"])


def _failures(case: sm90.Case, launches: list[tuple[dict, dict]], prop: str) -> list[str]:
    bad = []
    heavy = sm90.HEAVIEST.get(case.op, set())
    for launch, res in launches:
        name = f"{launch['kernel']} {launch['kwargs']}"
        if "error" in res:
            bad.append(f"{name}: {res['error'][-400:]}") if prop == "compiles" else None
            continue
        if prop == "shared_memory" and res["shared"] > sm90.SHARED_MAX:
            bad.append(f"{name}: {res['shared']} bytes of shared memory > {sm90.SHARED_MAX}")
        if prop == "dot_tiles":
            small = [d for d in res["dots"] if min(d["m"], d["n"], d["k"]) < sm90.MIN_DOT]
            tensor_cores = any(
                d["precision"] in ("tf32", "tf32x3") or d["dtype"] in ("bf16", "f16") for d in res["dots"]
            )
            if small:
                bad.append(f"{name}: tl.dot tiles under {sm90.MIN_DOT}: {small}")
            if tensor_cores and not res["mma"]:
                bad.append(f"{name}: tensor-core products but no mma / wgmma in the PTX: {res['dots']}")
        if prop == "no_spills" and res["spill_bytes"]:
            bad.append(f"{name}: {res['spill_bytes']} bytes of register spills ({res['regs']} registers)")
        if (
            prop == "grid"
            and launch["kernel"] in heavy
            and case.gpu_us >= sm90.LAUNCH_BOUND_US
            and _programs(launch) < sm90.MIN_PROGRAMS
        ):
            bad.append(
                f"{name}: grid {launch['grid']} = {_programs(launch)} programs < {sm90.MIN_PROGRAMS} "
                f"(the op is ~{case.gpu_us:.0f} us of GPU work)"
            )
    return bad


@pytest.mark.parametrize("name,prop", _cases())
def test_sm90_property(table, name, prop):
    case, launches = table[name]
    assert launches, f"{name}: no Triton launch recorded"
    if prop == "grid" and case.op in sm90.HEAVIEST and case.gpu_us >= sm90.LAUNCH_BOUND_US:
        assert any(launch["kernel"] in sm90.HEAVIEST[case.op] for launch, _ in launches), (
            f"{name}: none of {sorted(sm90.HEAVIEST[case.op])} launched: {[launch['kernel'] for launch, _ in launches]}"
        )
    bad = _failures(case, launches, prop)
    assert not bad, "\n".join(dict.fromkeys(bad))


def test_cliff_precisions_reach_the_products(table):
    """Each float32 matmul precision reaches Cliff's products as its tl.dot input precision (3xTF32, TF32, bf16
    inputs in a TF32 product), and each of those runs on the tensor cores."""
    seen = {}
    for name, (_, launches) in table.items():
        if name.startswith("cliff GEMM path n=") and "float32" in name:
            for launch, res in launches:
                if launch["kernel"] == "_biv_fwd":
                    seen[name.rsplit(" ", 1)[1]] = ({d["precision"] for d in res.get("dots", [])}, res.get("mma"))
    assert seen == {"highest": ({"tf32x3"}, True), "high": ({"tf32"}, True), "medium": ({"tf32"}, True)}, seen


def test_launches_compile_apart_when_their_constexprs_differ():
    """The harness compiles one launch per key: runtime ints of one Triton specialization (1, divisible by 16,
    other) share it, constexprs and launch options do not (tile sizes 16 / 32 / 64 and num_warps 4 / 8 were one
    key, and 30 launches were reported with another launch's compile). Read from real recorded launches."""

    def launch(tiles, n):
        z = torch.randn(n, 3, dtype=torch.float64, requires_grad=True)
        with sm90.cliff_gemm_path(tiles):
            runs = sm90.record(lambda: qkernels.cliff_loss(z, num_cond=5, grid=(-3.0, 3.0, 20)).backward())
        return next(x for x in runs if x["kernel"] == "_biv_dkz")

    small = {"R": 16, "S": 16, "K": 16, "warps": 4}
    wide, narrow = launch(None, 40), launch(small, 40)
    assert wide["args"] == narrow["args"] and wide["kwargs"]["BLOCK_R"] == 64 and narrow["kwargs"]["BLOCK_R"] == 16
    assert sm90.key(wide) != sm90.key(narrow)
    other, d16 = launch(None, 56), launch(None, 48)
    assert other["args"] != wide["args"] and sm90.key(other) == sm90.key(wide)  # n = 40 and 56: both "other"
    assert sm90.key(d16) != sm90.key(wide)  # n = 48: divisible by 16
