"""Benchmark cases of the Hessian hot path: the normalized Hessian penalty's forward + backward.

A decoder-shaped ``fn`` (an MLP or a small transposed-conv decoder; 3 regularized hidden layers),
n = 64, d = 12, k = 2 (Tripod's setting), float32. Variants: ``sequential`` — the authors'
formulation, one fn call per perturbation (1 + 4k calls on n rows) and torch ops — and qkernels'
batched penalty on every available backend (one fn call on the 4k n stacked rows + the fused
``finite_difference_curvature`` reduction).
"""

from __future__ import annotations

import torch
from torch import nn

from qkernels._backend import use_backend
from qkernels.bench import Case, backend_variants, variant
from qkernels.ops.hessian import normalized_hessian_penalty

N, D, K, EPS = 64, 12, 2, 0.1
IMG = 32  # decoder output: 1 x 32 x 32 logits


class MLPDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.ModuleList([nn.Linear(D, 256), nn.Linear(256, 256), nn.Linear(256, 256)])
        self.out = nn.Linear(256, IMG * IMG)

    def activations(self, z):
        acts, h = [], z
        for layer in self.hidden:
            h = torch.nn.functional.silu(layer(h))
            acts.append(h)
        return acts

    def forward(self, z):
        return self.out(self.activations(z)[-1]).reshape(-1, 1, IMG, IMG)


class ConvDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, 64 * 4 * 4)
        self.up1 = nn.ConvTranspose2d(64, 32, 4, 2, 1)  # 8 x 8
        self.up2 = nn.ConvTranspose2d(32, 32, 4, 2, 1)  # 16 x 16
        self.out = nn.ConvTranspose2d(32, 1, 4, 2, 1)  # 32 x 32

    def activations(self, z):
        h1 = torch.nn.functional.silu(self.fc(z)).reshape(-1, 64, 4, 4)
        h2 = torch.nn.functional.silu(self.up1(h1))
        h3 = torch.nn.functional.silu(self.up2(h2))
        return [h1, h2, h3]

    def forward(self, z):
        return self.out(self.activations(z)[-1])


DECODERS = {"mlp": MLPDecoder, "conv": ConvDecoder}


LEGEND = {
    **{
        b: f"qkernels' batched penalty (one decoder call on the 4k n stacked rows), curvature reduction on "
        f"the {b} backend"
        for b in ("reference", "cpu", "triton", "cuda")
    },
    "reference_compiled": "torch.compile of qkernels' batched penalty on the reference backend (decoder included)",
    "sequential": "the authors' penalty: one decoder call per perturbation (1 + 4k calls on n rows), torch "
    "ops (training steps: the step plus that penalty)",
    # training steps (benchmarks/test_hessian.py)
    "none": "training step without the penalty (reconstruction only)",
    "stacked": "training step plus one forward + backward of the regularized layers on the 4k n stacked "
    "rows: the unavoidable work of any batched penalty",
    "fused": "training step plus qkernels' batched penalty (backend auto)",
}


def sequential_nhp(fn, z, std, k=K, eps=EPS, generator=None):
    """The authors' formulation: one fn call per perturbation, then torch ops."""
    f0 = fn(z)
    r = (2 * torch.randint(0, 2, (k, *z.shape), generator=generator, device=z.device) - 1).to(z.dtype)
    g = torch.randn((k, *z.shape), generator=generator, dtype=z.dtype, device=z.device)
    fds = {"num": [], "den": []}
    for key, dirs in (("num", r), ("den", g)):
        for h in dirs * (eps * std):
            fp, fm = fn(z + h), fn(z - h)
            fds[key].append([(a - 2 * c + b) / eps**2 for a, b, c in zip(fp, fm, f0, strict=True)])
    total = 0.0
    for e in range(len(f0)):
        num = torch.stack([f[e] for f in fds["num"]]).var(0, correction=0)
        den = torch.stack([f[e] for f in fds["den"]]).var(0, correction=0)
        num, den = num.reshape(z.shape[0], -1).mean(1), den.reshape(z.shape[0], -1).mean(1)
        total = total + (num / (den + 1e-10)).mean()
    return total


def batched_nhp(backend):
    """qkernels' NHP (one fn call on the stacked rows + the fused reduction) on ``backend``."""

    def penalty(fn, z, std, generator=None):
        with use_backend(backend):
            return normalized_hessian_penalty(fn, z, std, num_perturbations=K, eps=EPS, generator=generator)

    return penalty


def _make(model: str, device: str):
    def make(scale: int):
        torch.manual_seed(0)
        dec = DECODERS[model]().to(device)
        z = torch.randn(N if scale else 2, D, device=device)
        return dec, z, z.std(0, correction=0) + 1e-6

    return make


def _loss(penalty):
    def loss(dec, z, std):
        return penalty(dec.activations, z, std, generator=torch.Generator(z.device).manual_seed(0))

    return loss


def _nhp_loss(dec, z, std):
    """qkernels' NHP, directions from the global generator (torch.compile does not trace a
    Generator object)."""
    return normalized_hessian_penalty(dec.activations, z, std, num_perturbations=K, eps=EPS)


def cases(device: str | None = None) -> list[Case]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = []
    for model in DECODERS:
        variants = backend_variants(_nhp_loss, device, "finite_difference_curvature")
        variants["sequential"] = variant(_loss(sequential_nhp))
        out.append(
            Case("hessian", f"nhp {model} n={N} d={D} k={K}", _make(model, device), variants, baseline="sequential")
        )
    return out
