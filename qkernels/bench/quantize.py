"""Benchmark cases of the quantization hot path, forward + backward.

latent_quantize: every backend available for the device, ``reference_compiled`` (torch.compile of the
reference), ``materialized`` — the formulation popular quantizer libraries use,
``(z[..., None] - values).abs().argmin(-1)`` over an (n, d, n_v) tensor — and ``materialized
compiled`` (what torch.compile makes of it). categorical_latent (D-VAE) and gumbel_quantize
(FactorQVAE's quantizer: logits from z and a global codebook, then the same relaxed sample): every
backend and ``reference_compiled``.
"""

from __future__ import annotations

import torch

import qkernels
from qkernels.bench import Case, backend_variants, half_precision_case, variant
from qkernels.reference import quantize as ref

# (n, d, n_v); 256 values: the Triton backward's codebook sums in 4 passes of 64 values over its rows
SHAPES = [(128, 12, 10), (4096, 64, 64), (65536, 64, 64), (4096, 32, 256)]
SLOW_N = 65536  # seconds per run and GBs of memory (materialized): ``slow`` (behind ``--all`` / ``--bench-all``)
CATEGORICAL_SHAPES = [(64, 10, 64), (4096, 10, 64)]  # (n, d, K): D-VAE uses d = 10, K = 64
GUMBEL_SHAPES = [(256, 12, 64)]  # (n, d, K): FactorQVAE's batch, 2 x 6 latents and 64 values on Shapes3D


def _make(n, d, nv, global_codebook, device):
    def make(scale: int):
        nn_, dd, vv = (n, d, nv) if scale else (4, 3, 5)
        g = torch.Generator().manual_seed(0)
        z = torch.randn(nn_, dd, generator=g).to(device).requires_grad_()
        values = torch.randn((vv,) if global_codebook else (dd, vv), generator=g).to(device).requires_grad_()
        upstream = torch.randn(nn_, dd, generator=g).to(device)
        return z, values, upstream

    return make


def _loss(z, values, upstream):
    out = qkernels.latent_quantize(z, values)
    return (out.z_q * upstream).sum() + 0.01 * out.loss_quantize + 0.01 * out.loss_commit


def materialized_outputs(z, values):
    """Nearest value through an (n, d, n_v) distance tensor, straight-through: (z_q, loss_quantize,
    loss_commit) as QLAE defines them."""
    vals = values.expand(z.shape[-1], -1)
    idx = (z.detach()[..., None] - vals.detach()).abs().argmin(-1)
    q = vals[torch.arange(z.shape[-1], device=z.device), idx]
    z_q = z + (q - z).detach()
    return z_q, torch.nn.functional.mse_loss(q, z.detach()), torch.nn.functional.mse_loss(z, q.detach())


def materialized_loss(z, values, upstream):
    """:func:`materialized_outputs` in the benchmark's loss."""
    z_q, loss_q, loss_c = materialized_outputs(z, values)
    return (z_q * upstream).sum() + 0.01 * loss_q + 0.01 * loss_c


def _make_categorical(n, d, k, device):
    def make(scale: int):
        nn_, dd, kk = (n, d, k) if scale else (2, 3, 4)
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(nn_, dd, kk, generator=g).to(device).requires_grad_()
        return logits, torch.rand(nn_, dd, kk, generator=g).to(device), torch.randn(nn_, dd, generator=g).to(device)

    return make


def _categorical_loss(logits, uniform, upstream):
    out = qkernels.categorical_latent(logits, uniform=uniform)
    return (out.z * upstream).sum() + out.kl.sum()


def _make_gumbel(n, d, k, device):
    def make(scale: int):
        nn_, dd, kk = (n, d, k) if scale else (2, 3, 4)
        g = torch.Generator().manual_seed(0)
        z = torch.randn(nn_, dd, generator=g).to(device).requires_grad_()
        values = torch.randn(kk, generator=g).to(device).requires_grad_()
        return z, values, torch.rand(nn_, dd, kk, generator=g).to(device), torch.randn(nn_, dd, generator=g).to(device)

    return make


def _gumbel_loss(z, values, uniform, upstream):
    out = qkernels.gumbel_quantize(z, values, 0.5, uniform=uniform)
    return (out.z_q * upstream).sum() + out.kl_uniform.sum()


def cases(device: str | None = None) -> list[Case]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = []
    for n, d, nv in SHAPES:
        for global_codebook in (False, True):
            variants = backend_variants(_loss, device, "latent_quantize")
            variants["materialized"] = variant(materialized_loss)
            variants["materialized compiled"] = variant(materialized_loss, compiled=True)
            kind = "global" if global_codebook else "per-dim"
            out.append(
                Case(
                    "quantize",
                    f"latent_quantize n={n} d={d} n_v={nv} {kind}",
                    _make(n, d, nv, global_codebook, device),
                    variants,
                    slow=n >= SLOW_N and device == "cpu",
                )
            )
    for n, d, k in CATEGORICAL_SHAPES:
        out.append(
            Case(
                "quantize",
                f"categorical_latent n={n} d={d} K={k}",
                _make_categorical(n, d, k, device),
                backend_variants(_categorical_loss, device, "relaxed_categorical"),
            )
        )
    for n, d, k in GUMBEL_SHAPES:
        out.append(
            Case(
                "quantize",
                f"gumbel_quantize n={n} d={d} K={k}",
                _make_gumbel(n, d, k, device),
                backend_variants(_gumbel_loss, device, "gumbel_quantize"),
            )
        )
    # bf16: the largest shape of each op
    per_latent = next(c for c in out if c.name.startswith("latent_quantize n=65536 d=64 n_v=64"))
    categorical = next(c for c in out if c.name.startswith(f"categorical_latent n={CATEGORICAL_SHAPES[-1][0]}"))
    out.append(half_precision_case(per_latent, _loss, _plain_quantize))
    out.append(half_precision_case(categorical, _categorical_loss, _plain_categorical))
    return out


def _plain_quantize(z, values, upstream):
    z_q, _, loss_q, loss_c = ref.latent_quantize(z, values)
    return (z_q * upstream).sum() + 0.01 * loss_q + 0.01 * loss_c


def _plain_categorical(logits, uniform, upstream):
    k = logits.shape[-1]
    values = torch.linspace(-1, 1, k, device=logits.device, dtype=logits.dtype)[None]
    z, _, kl = ref.relaxed_categorical(logits, values, uniform, 1.0, 1.0, False)
    return (z * upstream).sum() + kl.sum()
