"""Cliff on a GPU in one command (issue 44): correctness against float64, speed against the compiled reference,
and one profiler table per shape, for the Triton backend as rebuilt for the GPU.

    python gpu/cliff_gpu_check.py OUT_DIR            # the four benchmark shapes (a GPU: about 3 minutes)
    python gpu/cliff_gpu_check.py OUT_DIR --rehearse  # tiny shapes on the CPU (TRITON_INTERPRET=1)
    python gpu/cliff_gpu_check.py OUT_DIR --triton-only  # triton's rows only (gpu/cliff_ab.sh)

Writes OUT_DIR/cliff.jsonl (one row per measurement, as soon as it is taken) and OUT_DIR/cliff_profiles.txt.
Rows: ``correct`` (float32 "highest" and float64: relative loss and gradient-norm errors of triton and of the
float32 reference against the float64 reference), ``speed`` (fwd + bwd median ms of CUDA-event-timed calls after
two warm-ups: triton "highest", triton "high", reference eager, ``torch.compile`` of the reference).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

import qkernels
from qkernels.reference import kde as ref

SHAPES = [(64, 10, 10, 100), (1024, 12, 64, 100), (5000, 2, 100, 100), (4096, 32, 128, 128)]
REHEARSAL = [(40, 3, 10, 20), (70, 2, 20, 24)]


def inputs(n, d, m, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g)
    idx = torch.stack([torch.randperm(n, generator=g)[:m] for _ in range(d)])
    return z.to(device), idx.to(device)


def loss_fn(backend, k):
    def plain(z, idx):
        return ref.cliff_loss(z, idx, 0.1, -5.0, 5.0, k, 0.5, 1.0, 0.7)[0]

    if backend == "compiled":
        return torch.compile(plain, dynamic=False)
    if backend == "reference":
        return plain

    def kernel(z, idx):
        with qkernels.use_backend(backend):
            return qkernels.cliff_loss(z, cond_index=idx, grid=(-5.0, 5.0, k))

    return kernel


def fwd_bwd(fn, z, idx):
    zz = z.detach().requires_grad_()
    loss = fn(zz, idx)
    loss.backward()
    return loss.detach(), zz.grad


def timed(fn, z, idx, reps):
    for _ in range(2):
        fwd_bwd(fn, z, idx)
    times = []
    for _ in range(reps):
        if z.is_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fwd_bwd(fn, z, idx)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fwd_bwd(fn, z, idx)
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def main(argv):
    out_dir, rehearse, triton_only = argv[0], "--rehearse" in argv, "--triton-only" in argv
    os.makedirs(out_dir, exist_ok=True)
    device = "cpu" if rehearse else "cuda"
    rows = open(os.path.join(out_dir, "cliff.jsonl"), "a")
    profiles = open(os.path.join(out_dir, "cliff_profiles.txt"), "a")

    def emit(row):
        print(json.dumps(row), flush=True)
        rows.write(json.dumps(row) + "\n")
        rows.flush()

    for n, d, m, k in REHEARSAL if rehearse else SHAPES:
        case = f"{n}x{d} M{m} K{k}"
        z, idx = inputs(n, d, m, device)
        want, gwant = fwd_bwd(loss_fn("reference", k), z.double(), idx)
        checked = [("triton", torch.float32), ("reference", torch.float32), ("triton", torch.float64)]
        for backend, dtype in [c for c in checked if c[0] == "triton" or not triton_only]:
            try:
                got, g = fwd_bwd(loss_fn(backend, k), z.to(dtype), idx)
                emit(
                    {
                        "kind": "correct",
                        "case": case,
                        "backend": backend,
                        "dtype": str(dtype)[6:],
                        "loss_rel": abs(got.double() - want).item() / abs(want).item(),
                        "grad_rel": ((g.double() - gwant).norm() / gwant.norm()).item(),
                        "grad_max_rel": ((g.double() - gwant).abs().max() / gwant.abs().max()).item(),
                    }
                )
            except Exception as e:  # noqa: BLE001 (a failure is a row, the run goes on)
                emit({"kind": "correct", "case": case, "backend": backend, "dtype": str(dtype)[6:], "error": repr(e)})
        variants = {
            "triton": ("triton", "highest"),
            "triton_tf32": ("triton", "high"),
            "reference": ("reference", "highest"),
        }
        if triton_only:
            del variants["reference"]
        elif not rehearse:
            variants["reference_compiled"] = ("compiled", "highest")
        for name, (backend, mode) in variants.items():
            torch.set_float32_matmul_precision(mode)
            try:
                emit(
                    {
                        "kind": "speed",
                        "case": case,
                        "variant": name,
                        "qkernels": os.path.dirname(qkernels.__file__),
                        "ms": timed(loss_fn(backend, k), z, idx, 3 if rehearse else 20),
                    }
                )
            except Exception as e:  # noqa: BLE001
                emit({"kind": "speed", "case": case, "variant": name, "error": repr(e)})
            finally:
                torch.set_float32_matmul_precision("highest")
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if z.is_cuda else []
        )
        fn = loss_fn("triton", k)
        fwd_bwd(fn, z, idx)
        with torch.profiler.profile(activities=activities) as prof:
            fwd_bwd(fn, z, idx)
        key = "self_cuda_time_total" if z.is_cuda else "self_cpu_time_total"
        profiles.write(f"===== cliff triton {case}\n{prof.key_averages().table(sort_by=key, row_limit=15)}\n")
        profiles.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
