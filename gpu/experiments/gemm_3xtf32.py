"""Issue 53's Cliff design, step (2) alone: one of its three products, C = A B at Cliff's (4096, 32, 128, 128) size
(4096^3, 137 GFLOP), as 3xTF32 on tensor cores from operands split once beforehand (hi: the value rounded to TF32;
lo: the rest, rounded to TF32; both exact in TF32), so that nothing is converted inside the GEMM loop: a Triton
kernel doing three TF32 ``tl.dot`` a k-step (lo hi, hi lo, then hi hi into one float32 accumulator), against cuBLAS
SGEMM (float32 "highest", what ``torch.compile`` of the reference runs: ~51 TFLOP/s on the H200), one cuBLAS TF32
GEMM (fast, ~200x float32's error in Cliff: ruled out, the speed bound) and three cuBLAS TF32 GEMMs on the same
split (TF32 switched on for those calls only). Each variant's relative error against float64. The split's
accuracy in Cliff's loss and gradient: gpu/experiments/cliff_precision_emulation.py's ``presplit`` mode.

    python gpu/experiments/gemm_3xtf32.py OUT_DIR              # a GPU: well under a minute
    TRITON_INTERPRET=1 python gpu/experiments/gemm_3xtf32.py OUT_DIR --rehearse   # a CPU: 64 x 48 x 80
    python gpu/experiments/gemm_3xtf32.py OUT_DIR --sm90       # a CPU: compile for sm_90 (Triton 3.6 on
                                                               # PYTHONPATH), print registers, spills, wgmma and
                                                               # cvt counts of the k-loop

Rows in OUT_DIR/gemm3.jsonl: ``correct`` (max |C - C64| / max |C64| and the Frobenius relative error) and
``speed`` (median ms over 20 CUDA-event timings, TFLOP/s). Under the interpreter the TF32 products are float32
(the interpreter does not round to TF32): the rehearsal checks the indexing and the split, not the accuracy (that
is gpu/experiments/cliff_precision_emulation.py's, with bit masks).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys

import torch
import triton
import triton.language as tl

SIZES = [(4096, 4096, 4096)]
REHEARSAL = [(64, 48, 80)]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): wgmma wants M tiles of 64 a warp group; four operand tiles a
# stage (hi and lo of A and B), so at most ~196 KB of the 227 KB of shared memory: 3 stages of 128 x 128 x 32, 2 of
# 256-wide tiles (--sm90 prints each config's shared memory)
CONFIGS = [(128, 128, 32, 8, 3), (128, 256, 32, 8, 2), (256, 128, 32, 8, 2), (128, 128, 32, 4, 3)]
TF32_MASK = -8192  # 0xFFFFE000 as int32: sign, exponent and TF32's 10 mantissa bits


@triton.jit
def _gemm_3xtf32(
    ah_ptr, al_ptr, bh_ptr, bl_ptr, c_ptr, M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    """C (M, N) = A (M, K) B (K, N), row-major, A = ah + al and B = bh + bl split beforehand: per k-step
    al bh + ah bl + ah bh in TF32 into a float32 accumulator. Programs in groups of GROUP row tiles (L2 reuse)."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP * tiles_n)
    first = group * GROUP
    rows_in_group = tl.minimum(tiles_m - first, GROUP)
    pm = first + (pid % (GROUP * tiles_n)) % rows_in_group
    pn = (pid % (GROUP * tiles_n)) // rows_in_group
    rm = pm * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pn * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ka, kb = k0 + rk, k0 + rk
        ma = (rm[:, None] < M) & (ka[None, :] < K)
        mb = (kb[:, None] < K) & (rn[None, :] < N)
        a_offs = rm[:, None] * K + ka[None, :]
        b_offs = kb[:, None] * N + rn[None, :]
        ah = tl.load(ah_ptr + a_offs, mask=ma, other=0.0)
        al = tl.load(al_ptr + a_offs, mask=ma, other=0.0)
        bh = tl.load(bh_ptr + b_offs, mask=mb, other=0.0)
        bl = tl.load(bl_ptr + b_offs, mask=mb, other=0.0)
        acc = tl.dot(al, bh, acc, input_precision="tf32")
        acc = tl.dot(ah, bl, acc, input_precision="tf32")
        acc = tl.dot(ah, bh, acc, input_precision="tf32")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _rna(x: torch.Tensor) -> torch.Tensor:
    """x rounded to TF32 (to nearest, ties away: PTX's cvt.rna.tf32.f32), kept in a float32 container."""
    return ((x.contiguous().view(torch.int32) + 0x1000) & TF32_MASK).view(torch.float32)


def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo): hi = x rounded to TF32, lo = x - hi (exact in float32) rounded to TF32: both exact in TF32, so the
    tensor cores read them whole (they drop a float32 operand's 13 low bits), and hi + lo = x within 2^-22 |x|."""
    hi = _rna(x)
    return hi, _rna(x - hi)


def triton_3xtf32(a_split, b_split, config):
    (ah, al), (bh, bl) = a_split, b_split
    m, k = ah.shape
    n = bh.shape[1]
    bm, bn, bk, warps, stages = config
    c = ah.new_empty(m, n)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _gemm_3xtf32[grid](
        ah, al, bh, bl, c, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=8, num_warps=warps, num_stages=stages
    )
    return c


def cublas(a, b, tf32: bool):
    """torch.matmul with TF32 on or off for this call only (the caller's setting restored)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        return a @ b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def cublas_3xtf32(a_split, b_split):
    (ah, al), (bh, bl) = a_split, b_split
    return cublas(al, bh, True) + cublas(ah, bl, True) + cublas(ah, bh, True)


def _median_ms(fn, reps):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            import time

            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(out_dir: str, rehearse: bool) -> None:
    os.makedirs(out_dir, exist_ok=True)
    device = "cpu" if rehearse else "cuda"
    rows = open(os.path.join(out_dir, "gemm3.jsonl"), "a")

    def emit(row):
        print(json.dumps(row), flush=True)
        rows.write(json.dumps(row) + "\n")
        rows.flush()

    for m, n, k in REHEARSAL if rehearse else SIZES:
        _size(m, n, k, device, rehearse, emit)


def _size(m, n, k, device, rehearse, emit):
    g = torch.Generator().manual_seed(0)
    # Cliff's operands: Gaussians and their derivatives at grid points, values in [-1, 1], many near 0
    a = (torch.randn(m, k, generator=g) * torch.rand(m, k, generator=g)).to(device)
    b = (torch.randn(k, n, generator=g) * torch.rand(k, n, generator=g)).to(device)
    want = a.double() @ b.double()
    a_split, b_split = split(a), split(b)
    variants = {
        "cublas_sgemm": lambda: cublas(a, b, False),
        "cublas_tf32x1": lambda: cublas(a, b, True),
        "cublas_3xtf32": lambda: cublas_3xtf32(a_split, b_split),
        "split_both": lambda: (split(a), split(b)),
    }
    for cfg in CONFIGS[:1] if rehearse else CONFIGS:
        variants[f"triton_3xtf32 {cfg}"] = lambda cfg=cfg: triton_3xtf32(a_split, b_split, cfg)
    for name, fn in variants.items():
        try:
            got = fn()
            if name != "split_both":
                err = got.double() - want
                emit(
                    {
                        "kind": "correct",
                        "shape": [m, n, k],
                        "variant": name,
                        "max_rel": (err.abs().max() / want.abs().max()).item(),
                        "fro_rel": (err.norm() / want.norm()).item(),
                    }
                )
            ms = _median_ms(fn, 3 if rehearse else 20)
            emit({"kind": "speed", "shape": [m, n, k], "variant": name, "ms": ms, "tflops": 2 * m * n * k / ms / 1e9})
        except Exception as exc:  # noqa: BLE001 - a failure is a row, the run goes on
            emit({"kind": "error", "shape": [m, n, k], "variant": name, "error": repr(exc)[:300]})


def sm90() -> None:
    """Compile each config for sm_90 (no GPU: a stub driver, tests/sm90/sm90_compile.py's) and print the k-loop's
    tensor-core and conversion instructions (PTX), registers and spills (ptxas)."""
    import contextlib
    import io

    from triton import knobs
    from triton.runtime.driver import driver

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "sm90"))
    from sm90_compile import StubDriver, Tensor

    driver.set_active(StubDriver())
    knobs.nvidia.dump_ptxas_log = True
    t = [Tensor("float32", True) for _ in range(5)]
    for bm, bn, bk, warps, stages in CONFIGS:
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            kern = _gemm_3xtf32.warmup(
                *t, 4096, 4096, 4096, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP=8, num_warps=warps,
                num_stages=stages, grid=(1,),
            )  # fmt: skip
        ptx = kern.asm["ptx"]
        loop = ptx[ptx.find("wgmma") - 4000 : ptx.rfind("wgmma") + 200] if "wgmma" in ptx else ""
        print(
            json.dumps(
                {
                    "config": [bm, bn, bk, warps, stages],
                    "regs": int(re.search(r"Used (\d+) registers", log.getvalue()).group(1)),
                    "spill_bytes": sum(int(x) for x in re.findall(r"(\d+) bytes spill", log.getvalue())),
                    "shared": kern.metadata.shared,
                    "wgmma_mma_async": ptx.count("wgmma.mma_async"),
                    "wgmma_tf32": len(re.findall(r"wgmma\.mma_async\S*\.tf32", ptx)),
                    "cvt_tf32_in_loop": len(re.findall(r"cvt\.rna\.tf32", loop)),
                    "cvt_tf32_anywhere": len(re.findall(r"cvt\.rna\S*\.tf32", ptx)),
                }
            )
        )


if __name__ == "__main__":
    if "--sm90" in sys.argv:
        os.environ.pop("TRITON_INTERPRET", None)
        sm90()
    else:
        run(sys.argv[1], "--rehearse" in sys.argv)
