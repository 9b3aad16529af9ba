"""KDE hot path, forward + backward: Cliff loss at (n, d, M, K) = (64, 10, 10, 100),
(1024, 12, 64, 100), (5000, 2, 100, 100), (4096, 32, 128, 128) and KLM at (n, d) = (64, 12),
(1024, 32), (4096, 64) (float32), for every backend on this machine, the reference (dense GEMM
form) and the fully materialized formulation where it fits (<= 2e8 elements).

Peak memory: the growth of peak RSS of a fresh subprocess across one forward + backward (the
high-water mark VmHWM is reset through /proc/self/clear_refs after the inputs are built, then
compared with the current RSS); torch's CPU allocations
are invisible to tracemalloc. It goes to extra_info["peak_mib"] with the in-subprocess time.

    pytest benchmarks/test_kde.py --benchmark-only --benchmark-group-by=group

Cases that would not fit in memory (the dense KLM reference at (4096, 64) saves 64 (n, n)
tensors per intermediate, > 10 GB) are skipped with the reason.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import qkernels
from qkernels._backend import implementations, unavailable_reason
from qkernels.ops.kde import cliff_loss, klm_loss
from qkernels.reference import kde as ref

CLIFF = [(64, 10, 10, 100), (1024, 12, 64, 100), (5000, 2, 100, 100), (4096, 32, 128, 128)]
KLM = [(64, 12), (1024, 32), (4096, 64)]
MATERIALIZED_MAX = 2e8


def cliff_inputs(n, d, m, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g)
    idx = torch.stack([torch.randperm(n, generator=g)[:m] for _ in range(d)])
    return z, idx


def cliff_materialized(z, idx, k):
    """Cliff with the full (d, d, M, K, n) product tensor of the bivariate term materialized."""
    x = ref.standardize(z)
    n, d = x.shape
    t = torch.linspace(-5, 5, k, dtype=z.dtype)
    v = torch.linspace(-math.sqrt(3), math.sqrt(3), k, dtype=z.dtype)
    step, sigma = 10 / k, 0.1
    xt = x.t()
    ud = (t[None, :, None] - xt[:, None, :]) / sigma
    dker = -ud * torch.exp(-0.5 * ud * ud)
    zeta = torch.gather(xt, 1, idx)
    uz = (zeta[:, :, None] - xt[:, None, :]) / sigma
    ker = torch.exp(-0.5 * uz * uz)
    prod = dker[:, None, None, :, :] * ker[None, :, :, None, :]  # (d, d, M, K, n)
    p = ref.normalize(prod.mean(-1).abs(), step)
    jsd = ref.entropy(p.mean(2), step) - ref.entropy(p, step).mean(-1)
    biv = jsd[~torch.eye(d, dtype=torch.bool)].sum()
    uni = ref.entropy(ref.normalize(dker.mean(-1).abs(), step), step).sum()
    uv = (v[None, :, None] - xt[:, None, :]) / sigma
    logp = torch.logsumexp(-0.5 * uv * uv, -1) - math.log(n * sigma * math.sqrt(2 * math.pi))
    kl = (-math.log(2 * math.sqrt(3)) - logp.mean(-1)).sum()
    return 0.5 * uni + biv + 0.7 * kl


def klm_materialized(z):
    """KLM with the (n, n, d) difference tensor materialized."""
    n, d = z.shape
    std = ref.population_std(z) + 1e-6
    f = ref.silverman_factor(n, d)
    diff2 = ((z[:, None, :] - z[None, :, :]) / std) ** 2  # (n, n, d)
    lj = torch.logsumexp(-0.5 * diff2.sum(-1) / (f * f), 1)
    lm = torch.logsumexp(-0.5 * diff2, 1).sum(-1)
    return (lj - lm).mean() + (d - 1) * math.log(n) - d * math.log(f)


def run_case(kind, shape, variant):
    """One forward + backward of ``variant`` ("materialized" or a backend name)."""
    if kind == "cliff":
        n, d, m, k = shape
        z, idx = cliff_inputs(n, d, m, k)
        z.requires_grad_()
        if variant == "materialized":
            return lambda: cliff_materialized(z, idx, k).backward()

        def fn():
            with qkernels.use_backend(variant):
                cliff_loss(z, cond_index=idx, grid=(-5.0, 5.0, k)).backward()

        return fn
    n, d = shape
    z = torch.randn(n, d, generator=torch.Generator().manual_seed(0)).requires_grad_()
    if variant == "materialized":
        return lambda: klm_materialized(z).backward()

    def fn():
        with qkernels.use_backend(variant):
            klm_loss(z).backward()

    return fn


_CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
sys.path.insert(0, {here!r})
import torch
torch.set_num_threads({threads})
from test_kde import run_case
fn = run_case({kind!r}, tuple({shape!r}), {variant!r})
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1])
try:  # reset the peak-RSS high-water mark (Linux); else fall back to ru_maxrss
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    peak_of = lambda: status("VmHWM:")
except OSError:
    peak_of = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
before = status("VmRSS:")
t = time.perf_counter()
fn()
elapsed = time.perf_counter() - t
print(json.dumps({{"peak_mib": (peak_of() - before) / 1024, "seconds": elapsed}}))
"""


def peak_memory(kind, shape, variant):
    """(peak RSS growth in MiB, seconds) of one forward + backward in a fresh subprocess."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = _CHILD.format(root=os.path.dirname(here), here=here, threads=torch.get_num_threads(), kind=kind,
                         shape=list(shape), variant=variant)
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "0"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return res["peak_mib"], res["seconds"]


def variants(op):
    names = [b for b in implementations(op) if unavailable_reason(b, "cpu") is None and b != "triton"]
    return names + ["materialized"]


def _fits(kind, shape, variant):
    if kind == "cliff":
        n, d, m, k = shape
        if variant == "materialized" and d * d * m * k * n > MATERIALIZED_MAX:
            return "the (d, d, M, K, n) tensor exceeds 2e8 elements"
    else:
        n, d = shape
        if variant == "materialized" and n * n * d > MATERIALIZED_MAX:
            return "the (n, n, d) tensor exceeds 2e8 elements"
        if variant == "reference" and n * n * d > 2e8:
            return "the dense reference saves d (n, n) tensors per intermediate (> 10 GB)"
    return None


PARAMS = [("cliff", s, v) for s in CLIFF for v in variants("cliff_terms")]
PARAMS += [("klm", s, v) for s in KLM for v in variants("klm")]
IDS = [f"{k}-{'x'.join(map(str, s))}-{v}" for k, s, v in PARAMS]


@pytest.mark.parametrize(("kind", "shape", "variant"), PARAMS, ids=IDS)
def test_kde(benchmark, kind, shape, variant):
    reason = _fits(kind, shape, variant)
    if reason:
        pytest.skip(reason)
    benchmark.group = f"{kind}-{'x'.join(map(str, shape))}"
    peak, seconds = peak_memory(kind, shape, variant)
    benchmark.extra_info["peak_mib"] = peak
    benchmark.extra_info["subprocess_seconds"] = seconds
    fn = run_case(kind, shape, variant)
    slow = seconds > 20  # the dense reference at the largest shape: one in-process round only
    benchmark.pedantic(fn, rounds=1 if slow else 3, warmup_rounds=0 if slow else 1)
