"""Benchmark cases of the quantization hot path: latent_quantize forward + backward.

Variants: every backend available for the device, and ``materialized`` — the formulation popular
quantizer libraries use, ``(z[..., None] - values).abs().argmin(-1)`` over an (n, d, n_v) tensor.
"""

from __future__ import annotations

import torch

import qkernels
from qkernels.bench import Case

SHAPES = [(128, 12, 10), (4096, 64, 64), (65536, 64, 64)]  # (n, d, n_v)


def _make(n, d, nv, global_codebook, device):
    def make(scale: int):
        nn_, dd, vv = (n, d, nv) if scale else (4, 3, 5)
        g = torch.Generator().manual_seed(0)
        z = torch.randn(nn_, dd, generator=g).to(device).requires_grad_()
        values = torch.randn((vv,) if global_codebook else (dd, vv), generator=g).to(device).requires_grad_()
        upstream = torch.randn(nn_, dd, generator=g).to(device)
        return z, values, upstream

    return make


def _with_backend(name):
    def run(z, values, upstream):
        with qkernels.use_backend(name):
            out = qkernels.latent_quantize(z, values)
        ((out.z_q * upstream).sum() + 0.01 * out.loss_quantize + 0.01 * out.loss_commit).backward()
        z.grad = values.grad = None

    return run


def materialized(z, values, upstream):
    """Nearest value through an (n, d, n_v) distance tensor, straight-through, QLAE losses."""
    vals = values.expand(z.shape[-1], -1)
    idx = (z.detach()[..., None] - vals.detach()).abs().argmin(-1)
    q = vals[torch.arange(z.shape[-1], device=z.device), idx]
    z_q = z + (q - z).detach()
    loss_q = torch.nn.functional.mse_loss(q, z.detach())
    loss_c = torch.nn.functional.mse_loss(z, q.detach())
    ((z_q * upstream).sum() + 0.01 * loss_q + 0.01 * loss_c).backward()
    z.grad = values.grad = None


def cases(device: str | None = None) -> list[Case]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    backends = [b for b in qkernels.available_backends(device) if not (b == "triton" and device == "cpu")]
    out = []
    for n, d, nv in SHAPES:
        for global_codebook in (False, True):
            variants = {b: _with_backend(b) for b in backends}
            variants["materialized"] = materialized
            kind = "global" if global_codebook else "per-dim"
            out.append(Case("quantize", f"latent_quantize n={n} d={d} n_v={nv} {kind}",
                            _make(n, d, nv, global_codebook, device), variants))
    return out
