"""Per-call overhead of the functional API (validation, backend selection, autograd wiring) at tiny
shapes, forward + backward: for every backend, the public function (``<backend>``) against the
backend's implementation called directly with already-prepared arguments (``<backend> raw``). The
difference of their times is what qkernels adds per call (benchmarks/HISTORY.md "Per-call overhead"); ``add``
(one bare ``torch.add`` forward + backward) is the scale of a single PyTorch op. One case per op and
backend: the function and its raw call interleave only with ``add``, not with another backend's
variants (run right after the reference's hundreds of small ops, each measured up to twice as slow:
cold caches, not qkernels' overhead).
"""

from __future__ import annotations

import torch

import qkernels
import qkernels.ops  # noqa: F401 - registers the ops' implementations
from qkernels._backend import available_backends, implementations
from qkernels.bench import Case, variant

N, D, K = 8, 3, 6


def _inputs(device):
    def make(scale: int):
        g = torch.Generator().manual_seed(0)
        z = torch.randn(N, D, generator=g).to(device).requires_grad_()
        values = torch.randn(D, K, generator=g).to(device).requires_grad_()
        logits = torch.randn(N, D, K, generator=g).to(device).requires_grad_()
        return z, values, logits

    return make


def _raw(op: str, backend: str):
    return implementations(op)[backend]


def _ops(device: str) -> dict[str, tuple]:
    """op -> (functional loss, raw loss for a backend)."""
    cond = torch.tensor([[0, 5], [2, 3], [4, 1]], device=device)
    return {
        "latent_quantize": (
            lambda z, v, lg: (lambda q: q.z_q.sum() + q.loss_quantize + q.loss_commit)(qkernels.latent_quantize(z, v)),
            lambda b: lambda z, v, lg: (lambda q: q[0].sum() + q[2] + q[3])(_raw("latent_quantize", b)(z, v)),
        ),
        "categorical_latent": (
            lambda z, v, lg: (lambda c: c.z.sum() + c.kl.sum())(qkernels.categorical_latent(lg, v, noise_scale=0.0)),
            lambda b: (
                lambda z, v, lg: (lambda c: c[0].sum() + c[2].sum())(
                    _raw("relaxed_categorical", b)(lg, v, None, 1.0, 0.0, False)
                )
            ),
        ),
        "kde_grid": (
            lambda z, v, lg: qkernels.kde_grid(v, z, 0.3).sum(),
            lambda b: lambda z, v, lg: _raw("kde_grid", b)(v, z, 0.3, False).sum(),
        ),
        "cliff_loss": (
            lambda z, v, lg: qkernels.cliff_loss(z, cond_index=cond, grid=(-4.0, 4.0, 16)),
            lambda b: lambda z, v, lg: _raw("cliff_loss", b)(z, cond, 0.1, -4.0, 4.0, 16, 0.5, 1.0, 0.7)[0],
        ),
        "klm_loss": (
            lambda z, v, lg: qkernels.klm_loss(z),
            lambda b: lambda z, v, lg: _raw("klm", b)(z, None)[0],
        ),
        "finite_difference_curvature": (
            lambda z, v, lg: qkernels.finite_difference_curvature(lg.reshape(2 * 2 * 2 * 2, -1), 2, 2, 0.1).sum(),
            lambda b: (
                lambda z, v, lg: _raw("finite_difference_curvature", b)(
                    lg.reshape(16, -1), 2, 2, 0.1, 2, False, "mean"
                )[0].sum()
            ),
        ),
    }


LEGEND = {
    **{
        b: f"the public function on the {b} backend (validation, backend selection, autograd wrapper)"
        for b in ("reference", "cpu", "triton", "cuda")
    },
    **{
        f"{b} raw": f"the {b} backend's implementation called directly with prepared arguments"
        for b in ("reference", "cpu", "triton", "cuda")
    },
    "add": "one torch.add forward + backward (the baseline): the cost of a single PyTorch op",
}

_RAW_OF = {"categorical_latent": "relaxed_categorical", "klm_loss": "klm"}


def cases(device: str | None = None) -> list[Case]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    backends = [b for b in available_backends(device) if not (b == "triton" and device == "cpu")]
    out = []
    for op, (functional, raw) in _ops(device).items():
        for b in backends:
            if b in implementations(_RAW_OF.get(op, op)):
                variants = {
                    "add": variant(lambda z, v, lg: torch.add(z, z).sum()),
                    b: variant(functional, b),
                    f"{b} raw": variant(raw(b), b),
                }
                out.append(
                    Case("overhead", f"{op} n={N} d={D}, {b}", _inputs(device), variants, baseline="add", memory=False)
                )
    return out
