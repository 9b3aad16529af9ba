"""Every thresholded rule outside auto's bands (those: tests/test_routing_tables.py) pinned at its bound (issue 58): a
value exactly at a threshold is where "<" and "<=" differ, and a test on both sides of it never tells them apart.

- Cliff on Triton: the fused path vs the GEMM path (``fused_fits``: the padded M x K tile <= 128 x 128), the
  products' precision (exact FMA below 2^28 multiply-adds), the fused path's warps;
- KLM on Triton: the pair tile's rows per latent count (32 / 16 / 8 at 4 / 16 latents) and the float64 backward's
  halved tile (above 2048 values);
- the launch grid: the largest row block whose grid reaches two programs per SM (>=);
- the trainer's threads: the busy-core hint (>= 0.5 core), the free count (busy rounded half up), the collapse watch
  (strictly more than ``factor`` times slower; the first ``skip`` steps ignored), the cgroup quota (rounded up);
- InfoMEC's inactive latents: the authors' strict ">" against max range / 20 (QLAE, FactorQVAE) and max IQR / 10
  (Tripod), with their division (x / 20 and x * (1 / 20) differ in the last bit).

The launch-shape rules are read through private helpers of qkernels/triton: a refactor that renames them fails here
by name, and the pins move with it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import skip_unless

from qkernels.metrics import infomec
from qkernels.train import threads as T
from qkernels.train.throughput import CollapseWatch, fewer_threads

triton_only = skip_unless("triton")


# ----------------------------------------------------------------------------- Triton launch rules


@triton_only
def test_cliff_fused_path_up_to_a_128_by_128_tile():
    from qkernels.triton.kde import cliff_fused as cf

    assert cf.FUSED_MAX_TILE == 128 * 128
    # M and K are padded to powers of two >= 16; the fused path holds one padded M x K tile: at the bound it fits
    for m, k in ((128, 128), (128, 100), (256, 64), (64, 256), (16, 1024), (1, 1024), (1024, 9)):
        assert cf.fused_fits(50, 3, m, k), (m, k)
    for m, k in ((129, 128), (128, 129), (257, 64), (16, 1025), (1025, 16), (512, 64)):
        assert not cf.fused_fits(50, 3, m, k), (m, k)
    # generated from the constant: every padded tile of exactly FUSED_MAX_TILE fits, one more row or column does not
    for p in range(4, int(math.log2(cf.FUSED_MAX_TILE)) - 3):
        m, k = 1 << p, cf.FUSED_MAX_TILE >> p
        assert cf.fused_fits(50, 3, m, k) and not cf.fused_fits(50, 3, m + 1, k) and not cf.fused_fits(50, 3, m, k + 1)


@triton_only
def test_cliff_product_precision_switches_at_2_to_the_28(monkeypatch):
    from qkernels.triton.kde import _cliff_common as cc

    assert cc.IEEE_MAX_WORK == 1 << 28
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")
    assert [cc._dot_precision(torch.float32, w) for w in ((1 << 28) - 1, 1 << 28)] == ["ieee", "tf32x3"]
    assert cc._dot_precision(torch.float64, 1 << 40) == "ieee"


@triton_only
def test_cliff_fused_warps_at_their_bounds():
    from qkernels.triton.kde import cliff_fused as cf

    def warps(m, k):
        return cf.plan(1000, 3, m, k, torch.float32, torch.device("cpu"))["num_warps"]

    # 8 warps from a 128-wide K block, or from an M x K block of 8192 values
    shapes = ((16, 128), (16, 64), (16, 65), (128, 64), (64, 64), (65, 64))
    assert [warps(m, k) for m, k in shapes] == [8, 4, 8, 8, 4, 8]


@triton_only
def test_cliff_gemm_epilogue_warps_from_256_rows():
    from qkernels.triton.kde import cliff_gemm as cg

    assert [cg._uni_kl_blocks(100, 4, m)["ew"] for m in (128, 129, 256, 257)] == [4, 8, 8, 8]


@triton_only
def test_klm_plan_rows_threads_and_ranges():
    from qkernels.triton.kde import klm

    def plan(n, d):
        return klm._klm_plan(torch.zeros(n, d), False)

    # a warp per program: 32 rows of one thread up to 32 latents (padded), then 16 rows of 2 threads, 8 of 4 ...
    assert [plan(4096, d)[:2] for d in (1, 32, 33, 64, 65, 128, 2048)] == [
        (32, 1),
        (32, 32),
        (16, 64),
        (16, 64),
        (8, 128),
        (8, 128),
        (2, 2048),
    ]
    # half as many latents a thread in float64 (two registers each) and backward (five (d,) arrays a row, not three)
    z = torch.zeros(4096, 64)
    assert [klm._klm_plan(z.to(dt), bw)[:2] for dt in (torch.float32, torch.float64) for bw in (False, True)] == [
        (16, 64),
        (8, 64),
        (8, 64),
        (4, 64),
    ]
    # ranges of samples a: ~16 one-warp programs per SM (132 SMs off a GPU), unless that leaves a range under 64
    # samples (the last may be shorter)
    for n, d in ((64, 12), (1024, 32), (4096, 64), (16384, 32), (130, 3)):
        block_b, _, split, ranges = plan(n, d)
        blocks = -(-n // block_b)
        assert (ranges - 1) * split < n <= ranges * split
        assert ranges == 1 or split >= 64
        assert ranges == max(1, n // 64) or blocks * (ranges - 1) < 16 * 132 <= blocks * ranges
    assert [plan(n, d)[3] for n, d in ((64, 12), (1024, 32), (4096, 64), (16384, 32), (130, 3))] == [1, 16, 9, 5, 2]


@triton_only
def test_row_block_reaches_two_programs_per_sm():
    from qkernels.triton import _grid

    t = torch.zeros(1)  # a CPU tensor: the grid of an H100 / H200 (132 SMs)
    need = _grid.min_programs(t)
    assert need == 2 * 132
    choices = (256, 128, 64, 32)
    # exactly `need` programs with 128-row blocks: 128 (>=); one block of rows fewer: the next smaller block
    assert _grid.rows_per_program(need * 128, 1, t, choices) == 128
    assert _grid.rows_per_program((need - 1) * 128, 1, t, choices) == 64
    assert _grid.rows_per_program(need * 64, 2, t, choices) == 128  # columns multiply the grid
    assert _grid.rows_per_program(10, 1, t, choices) == 32  # none reaches it: the smallest


# ----------------------------------------------------------------------------- the trainer's threads


@pytest.fixture
def four_cores(monkeypatch):
    monkeypatch.setattr(T, "_affinity", lambda: [0, 1, 2, 3])
    monkeypatch.setattr(T, "cpu_quota", lambda: None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_auto_threads_hint_from_half_a_busy_core(four_cores, monkeypatch):
    def auto(busy):
        monkeypatch.setattr(T, "busy_cores", lambda interval=0.5: busy)
        return T.auto_threads()

    assert auto(math.nextafter(0.5, 0.0)) == (4, "auto: 4 usable cores; --threads N to choose")
    # from 0.5 on, the free cores: busy rounded half up (0.5 -> 1, 1.5 -> 2, 2.5 -> 3), said with the reason
    for busy, free in ((0.5, 3), (1.49, 3), (1.5, 2), (2.5, 1), (3.5, 1)):
        n, why = auto(busy)
        assert n == free and f"so {free} instead of 4; --threads N to choose" in why, (busy, why)


def test_auto_threads_environment_at_its_bounds(four_cores, monkeypatch):
    monkeypatch.setattr(T, "busy_cores", lambda interval=0.5: 0.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert T.auto_threads() == (1, "OMP_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "0")  # not a count: the machine's
    assert T.auto_threads()[0] == 4
    monkeypatch.delenv("OMP_NUM_THREADS")
    for procs, want in (("0", 4), ("1", 4), ("3", 1), ("4", 1), ("5", 1)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", procs)
        assert T.auto_threads()[0] == want, procs


def test_cpu_quota_rounds_up(monkeypatch):
    monkeypatch.setattr(T, "_affinity", lambda: list(range(8)))
    for quota, want in ((1.0, 1), (math.nextafter(1.0, 2.0), 2), (0.25, 1), (7.5, 8), (8.0, 8), (12.0, 8)):
        monkeypatch.setattr(T, "cpu_quota", lambda q=quota: q)
        assert T.usable_cores() == want, quota


def test_fewer_threads_at_its_bounds():
    assert fewer_threads(4, 4, math.nextafter(0.5, 0.0)) is None
    assert fewer_threads(4, 4, 0.5) == 3  # 0.5 busy core rounds up to one
    assert fewer_threads(4, 4, 1.5) == 2 and fewer_threads(4, 4, 2.5) == 1  # half up
    assert fewer_threads(4, 8, 0.5) == 3  # never more than threads - 1
    assert fewer_threads(2, 2, 4.0) == 1 and fewer_threads(1, 2, 4.0) is None


def test_collapse_watch_at_exactly_factor_times_slower():
    w = CollapseWatch(window=3, skip=2, factor=3.0)
    # the first `skip` steps are ignored, the next `window` are the reference (median 0.5)
    assert not any(w.observe(t) for t in (100.0, 100.0, 0.5, 0.5, 0.5))
    assert w.reference == 0.5
    assert [w.observe(t) for t in (1.5, 1.5, 1.5)] == [False, False, False]  # exactly 3x: no collapse
    assert w.observe(math.nextafter(1.5, 2.0)) is False  # the median of the last 3 is still 1.5
    assert w.observe(1.6) is True  # median 1.5000000000000002 > 1.5
    w = CollapseWatch(window=2, skip=1, factor=2.0)
    assert [w.observe(t) for t in (9.0, 1.0, 1.0)] == [False] * 3 and w.reference == 1.0  # step 2 is the first kept


# ----------------------------------------------------------------------------- InfoMEC's inactive latents


def _iqr_column(iqr: float, n: int = 100) -> np.ndarray:
    """A latent whose IQR (linear quantiles) is exactly ``iqr``: q1 = 0, q3 = iqr."""
    return np.where(np.arange(n) < n // 2, 0.0, iqr)


def test_range_rule_is_the_authors_strict_comparison():
    # latent_quantization and FactorQVAE disentangle/metrics/infomec.py: active iff range > max range / 20
    s = np.repeat(np.arange(4), 25)[:, None]
    base = (s[:, 0] % 2).astype(float)
    for top, edge in ((1.0, 0.05), (3.0, 3.0 / 20)):
        z = np.stack([top * base, edge * base, np.nextafter(edge, 1.0) * base], 1)
        assert infomec(s, z, discrete_latents=False)["active"].tolist() == [True, False, True], top
    # x * (1 / 20) rounds up where x / 20 does not: 3 / 20 = 0.15, 3 * 0.05 = 0.15000000000000002
    assert 3.0 / 20 < 3.0 * (1 / 20)
    z = np.stack([3.0 * base, 3.0 * (1 / 20) * base], 1)
    assert infomec(s, z, discrete_latents=False)["active"].tolist() == [True, True]


def test_iqr_rule_is_the_authors_division():
    # tripod disentangle/metrics/infomec.py: a continuous latent is active iff IQR > max IQR / 10; 3 / 10 = 0.3 but
    # 3 * 0.1 = 0.30000000000000004: a latent of IQR 0.30000000000000004 is active there
    s = np.repeat(np.arange(4), 25)[:, None]
    edge = np.nextafter(0.3, 1.0)
    assert 3.0 / 10 < edge == 3.0 * 0.1
    z = np.stack([_iqr_column(3.0), _iqr_column(edge), _iqr_column(0.3)], 1)
    assert infomec(s, z, discrete_latents=False, prune="iqr")["active"].tolist() == [True, True, False]
