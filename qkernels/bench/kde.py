"""Benchmark cases of the KDE hot path, forward + backward (float32): the Cliff loss at (n, d, M, K),
KLM at (n, d) and kde_grid at (n, d, K), on every backend for the device, the reference (dense GEMM
form), ``reference_compiled`` (torch.compile of the reference) and the fully materialized formulation where
it fits (<= 2e8 elements). Cases whose reference takes minutes are marked ``slow`` (``qkernels
bench`` skips them unless ``--all``).
"""

from __future__ import annotations

import math

import torch

from qkernels.bench import Case, backend_variants, half_precision_case, variant
from qkernels.ops.kde import cliff_loss, kde_grid, klm_loss
from qkernels.reference import kde as ref

CLIFF = [(64, 10, 10, 100), (1024, 12, 64, 100), (5000, 2, 100, 100), (4096, 32, 128, 128), (16384, 32, 128, 128)]
KLM = [(64, 12), (1024, 32), (4096, 64), (16384, 32)]
KDE_GRID = [(4096, 32, 128)]  # (n, d, K): the derivative grid of every latent, Cliff's univariate term
MATERIALIZED_MAX = 2e8
SLOW = {(4096, 32, 128, 128), (16384, 32, 128, 128), (4096, 64), (16384, 32)}
GPU_ONLY = {(16384, 32, 128, 128), (16384, 32)}  # the GPU targets at scale (minutes per call on a CPU)


def cliff_inputs(n, d, m, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g)
    idx = torch.stack([torch.randperm(n, generator=g)[:m] for _ in range(d)])
    return z, idx


def cliff_materialized(z, idx, k):
    """Cliff with the full (d, d, M, K, n) product tensor of the bivariate term materialized."""
    x = ref.standardize(z)
    n, d = x.shape
    t = torch.linspace(-5, 5, k, dtype=z.dtype, device=z.device)
    v = torch.linspace(-math.sqrt(3), math.sqrt(3), k, dtype=z.dtype, device=z.device)
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
    off = ~torch.eye(d, dtype=torch.bool, device=z.device)
    biv = torch.where(off, jsd, torch.zeros_like(jsd)).sum()
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


def _fits(kind, shape, variant):
    if kind == "cliff":
        n, d, m, k = shape
        return not (variant == "materialized" and d * d * m * k * n > MATERIALIZED_MAX)
    n, d = shape
    # the dense KLM reference saves d (n, n) tensors per intermediate: > 10 GB at (4096, 64)
    return not (variant in ("materialized", "reference") and n * n * d > MATERIALIZED_MAX)


def _cliff_loss(z, idx, kk):
    return cliff_loss(z, cond_index=idx, grid=(-5.0, 5.0, kk))


LEGEND = {
    "triton high": "the triton backend with torch.set_float32_matmul_precision('high') during the run: Cliff's "
    "bivariate products in TF32 on the tensor cores (the default 'highest' runs 3xTF32, about float32's error)",
}


def _matmul_precision(fn, precision: str):
    """``fn`` run with ``torch.set_float32_matmul_precision(precision)`` (restored afterwards)."""

    def run(*inputs):
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(precision)
        try:
            fn(*inputs)
        finally:
            torch.set_float32_matmul_precision(before)

    return run


def _cliff_case(shape, device):
    n, d, m, k = shape

    def make(scale):
        nn_, dd, mm, kk = shape if scale else (8, 2, 2, 10)
        z, idx = cliff_inputs(nn_, dd, mm, kk)
        return z.to(device).requires_grad_(), idx.to(device), kk

    variants = backend_variants(_cliff_loss, device, "cliff_loss")
    if device == "cuda" and "triton" in variants:  # both float32 precisions: "highest" (3xTF32) and "high" (TF32)
        variants["triton high"] = _matmul_precision(variants["triton"], "high")
    variants["materialized"] = variant(cliff_materialized)
    variants = {v: f for v, f in variants.items() if _fits("cliff", shape, v)}
    return Case("kde", f"cliff n={n} d={d} M={m} K={k}", make, variants, slow=shape in SLOW)


def _klm_loss(z):
    return klm_loss(z)


def _klm_case(shape, device):
    n, d = shape

    def make(scale):
        nn_, dd = shape if scale else (8, 2)
        return (torch.randn(nn_, dd, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_(),)

    variants = backend_variants(_klm_loss, device, "klm")
    variants["materialized"] = variant(klm_materialized)
    variants = {v: f for v, f in variants.items() if _fits("klm", shape, v)}
    baseline = "reference" if "reference" in variants else next(iter(variants))
    return Case("kde", f"klm n={n} d={d}", make, variants, baseline=baseline, slow=shape in SLOW)


def _kde_grid_loss(points, samples, upstream):
    return (kde_grid(points, samples, 0.1, derivative=True) * upstream).sum()


def _kde_grid_case(shape, device):
    n, d, k = shape

    def make(scale):
        nn_, dd, kk = shape if scale else (8, 2, 5)
        g = torch.Generator().manual_seed(0)
        samples = torch.randn(nn_, dd, generator=g).to(device).requires_grad_()
        points = torch.linspace(-4, 4, kk).repeat(dd, 1).to(device).requires_grad_()
        return points, samples, torch.randn(dd, kk, generator=g).to(device)

    return Case("kde", f"kde_grid n={n} d={d} K={k}", make, backend_variants(_kde_grid_loss, device, "kde_grid"))


def _plain_cliff(z, idx, kk):
    return ref.cliff_loss(z, idx, 0.1, -5.0, 5.0, kk, 0.5, 1.0, 0.7)[0]


def _plain_klm(z):
    return ref.klm(z, None)[0]


def _plain_kde_grid(points, samples, upstream):
    return (ref.kde_grid(points, samples, 0.1, True) * upstream).sum()


def cases(device: str | None = None) -> list[Case]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    cliff = {s: _cliff_case(s, device) for s in CLIFF if device == "cuda" or s not in GPU_ONLY}
    klm = {s: _klm_case(s, device) for s in KLM if device == "cuda" or s not in GPU_ONLY}
    grid = [_kde_grid_case(s, device) for s in KDE_GRID]
    # bf16: the largest shape that runs in seconds, and the largest (slow, --all)
    half = [
        half_precision_case(cliff[s], _cliff_loss, _plain_cliff) for s in ((1024, 12, 64, 100), (4096, 32, 128, 128))
    ]
    half += [half_precision_case(klm[(1024, 32)], _klm_loss, _plain_klm)]
    half += [half_precision_case(grid[-1], _kde_grid_loss, _plain_kde_grid)]
    return [*cliff.values(), *klm.values(), *grid, *half]
