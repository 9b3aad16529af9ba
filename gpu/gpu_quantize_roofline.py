"""Where latent_quantize's time goes on a GPU, against the HBM-bound limit (issue 18).

    python gpu/gpu_quantize_roofline.py [--n 65536] [--d 64] [--nv 64] [--dry-run]

For the op alone (forward + backward of z_q, loss_quantize and loss_commit; no loss around it),
per variant and codebook kind (per-latent (d, n_v), global (n_v,)), float32:

- wall ms: median of CUDA-event-timed runs (what a training step pays, launches included);
- kernel ms and launches: GPU kernel time and kernel count per run from torch.profiler;
- floor ms: the bytes the op's API forces through HBM divided by the bandwidth of a measured
  device-to-device copy: forward reads z and writes z_q and the int64 indices (16 B per element),
  backward reads grad z_q and z, recomputes the nearest value (or reads the indices) and writes
  grad z (12 B per element): 28 B per element, the codebooks are negligible.

Variants: every backend, ``triton_4launch`` (the Triton kernels before the two-launch ones:
gpu/experiments/latent_quantize_4launch.py) where Triton runs, the materialized formulation and the compiled
ones. Prints one markdown table. Needs a CUDA device; ``--dry-run``: each variant's forward + backward once at a
tiny shape on the CPU (no times; Triton variants with TRITON_INTERPRET=1), a rehearsal of the code paths.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

import qkernels
from qkernels.bench.quantize import materialized_outputs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "experiments"))
import latent_quantize_4launch as lq4  # noqa: E402 - beside this file

BYTES_PER_ELEMENT = 28


def copy_bandwidth(device) -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write counted)."""
    x = torch.empty(2**28, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        y.copy_(x)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return 2 * x.numel() * 4 / min(times[2:])


def op_outputs(backend: str):
    def run(z, values):
        with qkernels.use_backend(backend):
            out = qkernels.latent_quantize(z, values)
        return out.z_q, out.loss_quantize, out.loss_commit

    return run


def four_launch(z, values):
    with lq4.patched(), qkernels.use_backend("triton"):
        out = qkernels.latent_quantize(z, values)
    return out.z_q, out.loss_quantize, out.loss_commit


def fwd_bwd(fn, z, values, upstream):
    z_q, lq, lc = fn(z, values)
    one = torch.ones((), device=z.device)
    torch.autograd.backward([z_q, lq, lc], [upstream, one, one])


def wall_ms(fn, args, reps=30) -> float:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fwd_bwd(fn, *args)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def kernel_ms(fn, args, reps=10) -> tuple[float, float, list[tuple[str, float]]]:
    """(GPU kernel ms, kernel launches, [(kernel name, ms)] largest first) per forward + backward."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fwd_bwd(fn, *args)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.time_range.elapsed_us() / 1e3 / reps
    top = sorted(by_name.items(), key=lambda kv: -kv[1])
    return sum(by_name.values()), len(kernels) / reps, top


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=65536)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--nv", type=int, default=64)
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, no times: rehearse the variants")
    a = p.parse_args()
    if a.dry_run:
        dry_run()
        return
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    floor_ms = a.n * a.d * BYTES_PER_ELEMENT / bw * 1e3
    print(f"# latent_quantize n={a.n} d={a.d} n_v={a.nv}, fp32, {torch.cuda.get_device_name()}")
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s; HBM floor ({BYTES_PER_ELEMENT} B/element) {floor_ms:.3f} ms\n")
    print("| codebook | variant | wall ms | kernel ms | launches | kernel ms / floor |")
    print("|---|---|---:|---:|---:|---:|")
    variants = all_variants("cuda")
    breakdown = []
    for kind in ("per-latent", "global"):
        g = torch.Generator(device=dev).manual_seed(0)
        z = torch.randn(a.n, a.d, device=dev, generator=g).requires_grad_()
        shape = (a.d, a.nv) if kind == "per-latent" else (a.nv,)
        values = torch.randn(shape, device=dev, generator=g).requires_grad_()
        upstream = torch.randn(a.n, a.d, device=dev, generator=g)
        args = (z, values, upstream)
        for name, fn in variants.items():
            try:
                for _ in range(3):
                    fwd_bwd(fn, *args)
                torch.cuda.synchronize()
                w = wall_ms(fn, args)
                k, launches, top = kernel_ms(fn, args)
                breakdown.append((kind, name, top[:4]))
                print(f"| {kind} | {name} | {w:.3f} | {k:.3f} | {launches:.0f} | {k / floor_ms:.1f} |")
            except Exception as e:  # noqa: BLE001 - report the failure in the table and go on
                print(f"| {kind} | {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} | | | |")
            z.grad = values.grad = None
    print("\nLargest kernels per forward + backward (ms):\n")
    for kind, name, top in breakdown:
        print(f"- {kind} {name}: " + "; ".join(f"{k[:60]} {ms:.3f}" for k, ms in top))


def all_variants(device: str) -> dict:
    variants = {b: op_outputs(b) for b in qkernels.available_backends(device)}
    if "triton" in variants:
        variants["triton_4launch"] = four_launch
    variants["materialized"] = materialized_outputs
    variants["materialized compiled"] = torch.compile(materialized_outputs, dynamic=False)
    variants["reference compiled"] = torch.compile(op_outputs("reference"), dynamic=False)
    return variants


def dry_run() -> None:
    """Each variant's forward + backward once at (5, 3, 4) on the CPU: a row per variant, its loss."""
    print("| codebook | variant | loss (dry run, CPU) |")
    print("|---|---|---:|")
    for kind in ("per-latent", "global"):
        g = torch.Generator().manual_seed(0)
        z = torch.randn(5, 3, generator=g).requires_grad_()
        values = torch.randn((3, 4) if kind == "per-latent" else (4,), generator=g).requires_grad_()
        upstream = torch.randn(5, 3, generator=g)
        for name, fn in all_variants("cpu").items():
            try:
                fwd_bwd(fn, z, values, upstream)
                print(f"| {kind} | {name} | {float(fn(z.detach(), values.detach())[1]):.6f} |")
            except Exception as e:  # noqa: BLE001 - report the failure in the table and go on
                print(f"| {kind} | {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} |")
            z.grad = values.grad = None


if __name__ == "__main__":
    main()
