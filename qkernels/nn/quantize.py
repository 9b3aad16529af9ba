"""Quantizer modules: hold codebooks and hyper-parameters, call the functional ops."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from qkernels._validation import check_positive
from qkernels.ops.quantize import (
    CategoricalSample,
    GumbelQuantized,
    Quantized,
    _levels,
    categorical_latent,
    fsq,
    gumbel_quantize,
    latent_quantize,
)


def _nearest(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Index of the nearest codebook value (ties -> lowest index): x (..., d), values (d, n) or (n,)."""
    with torch.no_grad():
        return latent_quantize(x, values).indices


def _lookup(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Codebook values at ``indices`` (..., d): values (d, n) per latent or (n,) global."""
    if values.dim() == 1:
        return values[indices]
    return values[torch.arange(values.shape[0], device=indices.device), indices]


def _check_input(name: str, x: object, module: nn.Module, *, dtype: bool = True) -> None:
    """``x`` on the device of ``module.values`` (and, when ``dtype``, a dtype that mixes with theirs:
    the same, or half precision with float32, :mod:`qkernels._precision`); the error says how to
    convert either side. Anything else is left to the functional op's checks."""
    if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
        return
    kind, values = type(module).__name__, module.values
    if x.device != values.device:
        raise ValueError(
            f"{name} is on device {x.device} but the {kind}'s values are on device {values.device}: "
            f"move {name} with {name}.to({str(values.device)!r}) or the module with "
            f"quantizer.to({str(x.device)!r})"
        )
    if dtype and x.dtype != values.dtype and torch.float64 in (x.dtype, values.dtype):
        raise TypeError(
            f"{name} has dtype {x.dtype} but the {kind}'s values have dtype {values.dtype}: convert "
            f"{name} with {name}.to({values.dtype}) or the module with quantizer.to({x.dtype})"
        )


class LatentQuantizer(nn.Module):
    """QLAE latent quantization: a learnable scalar codebook per latent (or one global codebook).

    Args:
        num_latents: d. num_values: n_v values per codebook.
        global_codebook: one (n_v,) codebook shared by all latents instead of (d, n_v).
        init_range: values initialised to linspace(low, high, n_v) (QLAE: (-0.5, 0.5)).
    forward(z (..., d)) -> :class:`~qkernels.Quantized`. Weight decay should not apply to
    ``values`` (QLAE decays weights only).
    """

    def __init__(
        self,
        num_latents: int,
        num_values: int,
        *,
        global_codebook: bool = False,
        init_range: tuple[float, float] = (-0.5, 0.5),
    ) -> None:
        super().__init__()
        check_positive("num_latents", num_latents, integer=True)
        check_positive("num_values", num_values, integer=True, minimum=2)
        low, high = init_range
        if not low < high:
            raise ValueError(f"init_range must be (low, high) with low < high, got {init_range}")
        line = torch.linspace(low, high, num_values)
        self.num_latents = num_latents
        self.values = nn.Parameter(line if global_codebook else line.repeat(num_latents, 1))

    def forward(self, z: torch.Tensor) -> Quantized:
        _check_input("z", z, self)
        return latent_quantize(z, self.values)

    def indices_to_values(self, indices: torch.Tensor) -> torch.Tensor:
        """indices (..., d) int64 -> the codebook values (..., d)."""
        return _lookup(self.values.detach(), indices)

    def values_to_indices(self, values: torch.Tensor) -> torch.Tensor:
        """values (..., d) -> index of the nearest codebook value (exact inverse of
        :meth:`indices_to_values` when a codebook has no repeated values)."""
        return _nearest(values, self.values.detach())


class FSQ(nn.Module):
    """Finite scalar quantization (Tripod): ``levels`` an int or one int per latent (each >= 2).

    forward(z (..., d)) -> :class:`~qkernels.Quantized` with values in [-1, 1] and zero losses.
    """

    def __init__(self, levels: int | Sequence[int]) -> None:
        super().__init__()
        n = 1 if isinstance(levels, int) else len(levels)
        self.register_buffer("levels", _levels(levels, n, "cpu"), persistent=False)

    def forward(self, z: torch.Tensor) -> Quantized:
        return fsq(z, self.levels)

    def _top(self, like: torch.Tensor) -> torch.Tensor:
        return (self.levels.to(like.device) - 1).to(torch.float32 if not like.is_floating_point() else like.dtype)

    def indices_to_values(self, indices: torch.Tensor) -> torch.Tensor:
        """indices (..., d) in [0, L-1] -> values 2 i / (L - 1) - 1 (float32)."""
        top = self._top(indices)
        return 2 * indices.to(top.dtype) / top - 1

    def values_to_indices(self, values: torch.Tensor) -> torch.Tensor:
        """values (..., d) on the FSQ grid -> int64 indices (nearest grid point)."""
        return torch.round((values + 1) / 2 * self._top(values)).long()


class GumbelQuantizer(nn.Module):
    """FactorQVAE's quantizer: a global codebook of ``num_values`` scalars (init N(0, 1)).

    forward(z (..., d), tau) -> :class:`~qkernels.GumbelQuantized`. In training mode the
    relaxed Gumbel-softmax sample (``hard`` for straight-through one-hots); in eval mode the hard
    nearest value (FactorQVAE's evaluation), with one-hot weights.
    """

    def __init__(self, num_values: int, *, hard: bool = False) -> None:
        super().__init__()
        check_positive("num_values", num_values, integer=True, minimum=2)
        self.hard = hard
        self.values = nn.Parameter(torch.randn(num_values))

    def forward(
        self, z: torch.Tensor, tau: float = 1.0, *, generator: torch.Generator | None = None
    ) -> GumbelQuantized:
        _check_input("z", z, self)
        if self.training:
            return gumbel_quantize(z, self.values, tau, hard=self.hard, generator=generator)
        # noiseless hard sample: the one-hot of the nearest value (ties -> lowest index)
        logits = -((z[..., None] - self.values) ** 2)
        s = categorical_latent(logits, self.values, tau=tau, noise_scale=0.0, hard=True)
        return GumbelQuantized(s.z, s.y, logits, s.kl)

    def indices_to_values(self, indices: torch.Tensor) -> torch.Tensor:
        """indices (...) -> codebook values (...)."""
        return _lookup(self.values.detach(), indices)

    def values_to_indices(self, values: torch.Tensor) -> torch.Tensor:
        """values (...) -> index of the nearest codebook value."""
        return _nearest(values, self.values.detach())


class CategoricalLatent(nn.Module):
    """D-VAE's categorical latents over fixed values (default linspace(-1, 1, K)).

    forward(logits (..., d, K), noise_scale=None, *, generator=None) ->
    :class:`~qkernels.CategoricalSample`; ``noise_scale`` defaults to 1 in training and 0 in eval
    mode (the evaluation representation softmax(logits) @ values).
    """

    def __init__(
        self, num_latents: int, num_values: int, *, values: torch.Tensor | None = None, tau: float = 1.0
    ) -> None:
        super().__init__()
        check_positive("num_latents", num_latents, integer=True)
        check_positive("num_values", num_values, integer=True, minimum=2)
        check_positive("tau", tau)
        self.num_latents, self.tau = num_latents, tau
        vals = torch.linspace(-1, 1, num_values) if values is None else torch.as_tensor(values)
        if vals.shape not in ((num_values,), (num_latents, num_values)):
            raise ValueError(f"values must be (K,) or (d, K), got {tuple(vals.shape)}")
        self.register_buffer("values", vals.clone())

    def forward(
        self,
        logits: torch.Tensor,
        noise_scale: float | None = None,
        *,
        hard: bool = False,
        generator: torch.Generator | None = None,
    ) -> CategoricalSample:
        _check_input("logits", logits, self, dtype=False)  # values are cast to logits' dtype
        if noise_scale is None:
            noise_scale = 1.0 if self.training else 0.0
        return categorical_latent(
            logits, self.values.to(logits.dtype), tau=self.tau, noise_scale=noise_scale,
            hard=hard, generator=generator,
        )

    def indices_to_values(self, indices: torch.Tensor) -> torch.Tensor:
        """indices (..., d) -> values (..., d)."""
        return _lookup(self.values, indices)

    def values_to_indices(self, values: torch.Tensor) -> torch.Tensor:
        """values (..., d) -> index of the nearest value."""
        return _nearest(values, self.values.to(values.dtype))
