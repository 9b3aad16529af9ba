"""Modules of the Hessian hot path: Tripod's normalized Hessian penalty and Peebles et al.'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from qkernels.ops.hessian import Activations, PerSample, hessian_penalty, normalized_hessian_penalty


class _Penalty(nn.Module):
    """Holds the finite-difference settings shared by both penalties."""

    def __init__(self, num_perturbations: int, eps: float, reduction: str, chunk_size: int | None) -> None:
        super().__init__()
        self.num_perturbations, self.eps = num_perturbations, eps
        self.reduction, self.chunk_size = reduction, chunk_size

    def _settings(self, generator: torch.Generator | None) -> dict[str, Any]:
        return dict(
            num_perturbations=self.num_perturbations,
            eps=self.eps,
            generator=generator,
            reduction=self.reduction,
            chunk_size=self.chunk_size,
        )

    def extra_repr(self) -> str:
        return f"num_perturbations={self.num_perturbations}, eps={self.eps}, reduction={self.reduction!r}"


class NormalizedHessianPenalty(_Penalty):
    """Tripod's NHP as a module: ``penalty(fn, z, std)`` -> scalar (or per-sample values).

    Args:
        num_perturbations: k >= 2 Rademacher and k Gaussian directions per sample (Tripod: 2).
        eps: finite-difference step relative to each latent's std (Tripod: 0.1).
        reduction: "mean" or "none" (see :func:`qkernels.ops.hessian.normalized_hessian_penalty`).
        chunk_size: at most this many stacked rows per ``fn`` call (None: one call).

    ``forward(fn, z, std=None, generator=None)``: ``fn`` maps latents (N, d) to the regularized
    activations (N, ...) (a tensor, list or dict; e.g. the decoder's hidden layers, not its output
    logits) and must be deterministic across rows. ``std``: per-latent scales (d,) or one number,
    default the population std of z + 1e-6, as in the functional (Tripod computes it on the
    continuous latents before quantization: pass it when ``z`` is quantized). z: (n, d) float.

    Examples:
        >>> import torch
        >>> from qkernels.nn import NormalizedHessianPenalty
        >>> _ = torch.manual_seed(0)
        >>> decoder = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.GELU())
        >>> penalty = NormalizedHessianPenalty()(decoder, torch.randn(16, 3))
        >>> penalty.shape, bool(penalty >= 0)
        (torch.Size([]), True)
        >>> NormalizedHessianPenalty(reduction="none")(decoder, torch.randn(16, 3)).shape
        torch.Size([16])
    """

    def __init__(
        self,
        num_perturbations: int = 2,
        eps: float = 0.1,
        reduction: str = "mean",
        chunk_size: int | None = None,
    ) -> None:
        super().__init__(num_perturbations, eps, reduction, chunk_size)

    def forward(
        self,
        fn: Callable[[torch.Tensor], Activations],
        z: torch.Tensor,
        std: torch.Tensor | float | None = None,
        generator: torch.Generator | None = None,
    ) -> PerSample:
        return normalized_hessian_penalty(fn, z, std, **self._settings(generator))


class HessianPenalty(_Penalty):
    """Peebles et al.'s Hessian penalty as a module: ``penalty(fn, z)`` -> scalar.

    Args:
        num_perturbations: k >= 2 Rademacher directions per sample.
        eps: finite-difference step (0.1).
        reduction: "max", "mean" or "none" (see :func:`qkernels.hessian_penalty`).
        chunk_size: at most this many stacked rows per ``fn`` call (None: one call).

    ``forward(fn, z, generator=None)``: z (n, d) float.

    Examples:
        >>> import torch
        >>> from qkernels.nn import HessianPenalty
        >>> _ = torch.manual_seed(0)
        >>> z = torch.randn(8, 2)
        >>> HessianPenalty()(lambda x: x**2, z)  # elementwise: no cross terms
        tensor(0.)
        >>> bool(HessianPenalty()(lambda x: x[:, :1] * x[:, 1:], z) >= 0)
        True
    """

    def __init__(
        self,
        num_perturbations: int = 2,
        eps: float = 0.1,
        reduction: str = "max",
        chunk_size: int | None = None,
    ) -> None:
        super().__init__(num_perturbations, eps, reduction, chunk_size)

    def forward(
        self, fn: Callable[[torch.Tensor], Activations], z: torch.Tensor, generator: torch.Generator | None = None
    ) -> PerSample:
        return hessian_penalty(fn, z, **self._settings(generator))
