"""Quantizer modules: hold codebooks and hyper-parameters, call the functional ops."""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import nn

from qkernels._args import check_positive
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


def _latent_axis(name: str, x: torch.Tensor, module: nn.Module, d: int, dim: int, *, trailing: int = 0) -> int:
    """The axis of ``x`` that holds the module's ``d`` latents: ``dim`` of the ``x.dim() - trailing`` leading axes
    (``trailing``: axes after the latents, the K of logits; such modules take no ``dim=``). Raises when that axis
    does not have size ``d``, naming the axis that does (a channel-first (B, D, H, W) input: dim=1)."""
    nd = x.dim() - trailing
    kind = type(module).__name__
    if nd < 1:
        raise ValueError(f"{name} must have an axis of {d} latents, got shape {tuple(x.shape)}")
    if not -nd <= dim < nd:
        raise ValueError(f"{kind}(dim={dim}) does not fit {name} of shape {tuple(x.shape)}")
    axis = dim % nd
    if x.shape[axis] == d:
        if (
            nd >= 3
            and axis == nd - 1
            and x.shape[1] == d
            and not getattr(module, "_dim_chosen", True)
            and not getattr(module, "_warned_layout", False)
            and not torch.compiler.is_compiling()
        ):
            object.__setattr__(module, "_warned_layout", True)  # once per module (a flag: not a tensor or module)
            warnings.warn(
                f"{name} of shape {tuple(x.shape)} has {d} entries along axis 1 and along its last axis: "
                f"this {kind} quantizes the last axis (the default, dim=-1); pass dim=1 for a "
                f"channel-first (B, {d}, H, W) input, or dim=-1 to say so and silence this warning",
                stacklevel=4,
            )
        return axis
    others = [a for a in range(nd) if x.shape[a] == d]
    last = -1 - trailing
    if others:
        k = others[0]
        hint = f"the latents look like axis {k}: " + (
            f"move them there with {name}.movedim({k}, {last})"
            if trailing
            else f"pass dim={k} to {kind}" + (f", or move them last with {name}.movedim({k}, -1)" if dim == -1 else "")
        )
    else:
        hint = f"give {name} as (..., {d}, K)" if trailing else f"give {name} as (..., {d}) or pick the axis with dim="
    where = (
        "the second-to-last axis (logits are (..., d, K))"
        if trailing
        else "the last axis"
        if dim == -1
        else f"axis {axis} (dim={dim})"
    )
    raise ValueError(
        f"{name} has shape {tuple(x.shape)}: this {kind} takes its {d} latents along {where}, which "
        f"has size {x.shape[axis]}; {hint}"
    )


def _to_last(t: torch.Tensor, axis: int) -> torch.Tensor:
    return t if axis == t.dim() - 1 else t.movedim(axis, -1)


def _from_last(t: torch.Tensor, axis: int) -> torch.Tensor:
    return t if axis == t.dim() - 1 else t.movedim(-1, axis)


class LatentQuantizer(nn.Module):
    """QLAE latent quantization: a learnable scalar codebook per latent (or one global codebook).

    Args:
        num_latents: d, the number of latents.
        num_values: n_v values per codebook (>= 2).
        global_codebook: one (n_v,) codebook shared by all latents instead of (d, n_v).
        init_range: values initialised to linspace(low, high, n_v) (QLAE: (-0.5, 0.5)).
        dim: the axis of z that holds the d latents (default: the last, z is (..., d); 1 for a channel-first
            (B, d, H, W) feature map). An input whose axis ``dim`` is not of size d is an error (never
            quantized along another axis); by default, an input of 3+ axes whose axis 1 has size d too gets one
            warning (channel-first or channel-last cannot be told apart: pass ``dim``).

    forward(z) -> :class:`~qkernels.Quantized` (z_q and indices shaped like z, z float; indices int64).
    Weight decay should not apply to ``values`` (QLAE decays weights only).

    Raises:
        ValueError: num_latents < 1, num_values < 2, low >= high; in forward, z on another device than
            ``values`` or whose axis ``dim`` is not of size d.
        TypeError: float64 z with float32 values.

    Examples:
        Values start at linspace(-0.5, 0.5, 3) = (-0.5, 0, 0.5) for each of the 2 latents:

        >>> import torch
        >>> from qkernels.nn import LatentQuantizer
        >>> quantizer = LatentQuantizer(2, 3)
        >>> quantizer.values.shape
        torch.Size([2, 3])
        >>> q = quantizer(torch.tensor([[0.4, -0.1]]))
        >>> q.z_q, q.indices
        (tensor([[0.5000, 0.0000]], grad_fn=<...>), tensor([[2, 1]]))
        >>> quantizer.indices_to_values(q.indices)
        tensor([[0.5000, 0.0000]])
    """

    def __init__(
        self,
        num_latents: int,
        num_values: int,
        *,
        global_codebook: bool = False,
        init_range: tuple[float, float] = (-0.5, 0.5),
        dim: int | None = None,
    ) -> None:
        super().__init__()
        check_positive("num_latents", num_latents, integer=True)
        self.dim, self._dim_chosen = _check_dim(dim)
        check_positive("num_values", num_values, integer=True, minimum=2)
        low, high = init_range
        if not low < high:
            raise ValueError(f"init_range must be (low, high) with low < high, got {init_range}")
        line = torch.linspace(low, high, num_values)
        self.num_latents = num_latents
        self.values = nn.Parameter(line if global_codebook else line.repeat(num_latents, 1))

    def forward(self, z: torch.Tensor) -> Quantized:
        _check_input("z", z, self)
        if not isinstance(z, torch.Tensor):
            return latent_quantize(z, self.values)  # the op's own message
        axis = _latent_axis("z", z, self, self.num_latents, self.dim)
        q = latent_quantize(_to_last(z, axis), self.values)
        if axis == z.dim() - 1:
            return q
        return Quantized(_from_last(q.z_q, axis), _from_last(q.indices, axis), q.loss_quantize, q.loss_commit)

    def indices_to_values(self, indices: torch.Tensor) -> torch.Tensor:
        """indices (latents along ``dim``) int64 -> the codebook values, shaped like indices."""
        axis = _latent_axis("indices", indices, self, self.num_latents, self.dim)
        return _from_last(_lookup(self.values.detach(), _to_last(indices, axis)), axis)

    def values_to_indices(self, values: torch.Tensor) -> torch.Tensor:
        """values (latents along ``dim``) -> index of the nearest codebook value (exact inverse of
        :meth:`indices_to_values` when a codebook has no repeated values)."""
        axis = _latent_axis("values", values, self, self.num_latents, self.dim)
        return _from_last(_nearest(_to_last(values, axis), self.values.detach()), axis)


def _check_dim(dim: object) -> tuple[int, bool]:
    """(the latents' axis, whether the user chose it): None is the default, the last axis."""
    if dim is None:
        return -1, False
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"dim must be an int (the axis of the latents, e.g. -1 or 1), got {dim!r}")
    return int(dim), True


def _fsq_levels(levels: object) -> int | list[int] | torch.Tensor:
    """FSQ's ``levels`` as the op takes them, or a TypeError that says what they must be."""
    what = (
        "FSQ levels must be an int >= 2 (the same number of levels for every latent, e.g. FSQ(5)) or a "
        "sequence of ints >= 2, one per latent (e.g. FSQ([8, 5, 5]))"
    )
    if isinstance(levels, torch.Tensor):
        return levels
    if isinstance(levels, numbers.Integral) and not isinstance(levels, bool):
        return int(levels)
    if (
        isinstance(levels, Sequence)
        and not isinstance(levels, (str, bytes))
        and len(levels)
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in levels)
    ):
        return [int(v) for v in levels]
    hint = f"; use FSQ({int(levels)})" if isinstance(levels, float) and levels.is_integer() else ""
    raise TypeError(f"{what}, got {levels!r} ({type(levels).__name__}){hint}")


class FSQ(nn.Module):
    """Finite scalar quantization (Tripod): ``levels`` an int (every latent) or one int per latent (each >= 2).

    Args:
        levels: L, the number of levels: an int (every latent) or a sequence of d ints (one per latent),
            each >= 2.
        dim: the axis of z that holds the latents (default: the last, z is (..., d); 1 for a channel-first
            (B, d, H, W) feature map); with one int per latent, that axis must have their number of entries (by
            default, one warning when axis 1 of a 3+-axis input has that size too: pass ``dim`` to say which).

    forward(z) -> :class:`~qkernels.Quantized` with values in [-1, 1] and zero losses (shaped like z).

    Raises:
        TypeError: levels neither an int nor a sequence of ints.
        ValueError: a level < 2.

    Examples:
        >>> import torch
        >>> from qkernels.nn import FSQ
        >>> fsq = FSQ([3, 5])  # latent 0 on (-1, 0, 1), latent 1 on (-1, -0.5, 0, 0.5, 1)
        >>> q = fsq(torch.tensor([[10.0, 0.0]]))
        >>> q.z_q, q.indices
        (tensor([[1., 0.]]), tensor([[2, 2]]))
        >>> fsq.indices_to_values(torch.tensor([[0, 1]]))
        tensor([[-1.0000, -0.5000]])
    """

    levels: torch.Tensor  # (d,) or (1,) int64 buffer

    def __init__(self, levels: int | Sequence[int], *, dim: int | None = None) -> None:
        super().__init__()
        checked = _fsq_levels(levels)
        n = checked.numel() if isinstance(checked, torch.Tensor) else 1 if isinstance(checked, int) else len(checked)
        self.dim, self._dim_chosen = _check_dim(dim)
        self.register_buffer("levels", _levels(checked, n, torch.device("cpu")), persistent=False)

    def forward(self, z: torch.Tensor) -> Quantized:
        if not isinstance(z, torch.Tensor) or self.levels.numel() == 1:
            return fsq(z, self.levels)  # one level count: elementwise, the same in any layout
        axis = _latent_axis("z", z, self, self.levels.numel(), self.dim)
        q = fsq(_to_last(z, axis), self.levels)
        if axis == z.dim() - 1:
            return q
        return Quantized(_from_last(q.z_q, axis), _from_last(q.indices, axis), q.loss_quantize, q.loss_commit)

    def _top(self, like: torch.Tensor) -> torch.Tensor:
        return (self.levels.to(like.device) - 1).to(torch.float32 if not like.is_floating_point() else like.dtype)

    def _along(self, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.levels.numel() == 1:
            return fn(x)
        axis = _latent_axis("input", x, self, self.levels.numel(), self.dim)
        return _from_last(fn(_to_last(x, axis)), axis)

    def indices_to_values(self, indices: torch.Tensor) -> torch.Tensor:
        """indices (latents along ``dim``) in [0, L-1] -> values 2 i / (L - 1) - 1 (float32)."""

        def f(i: torch.Tensor) -> torch.Tensor:
            top = self._top(i)
            return 2 * i.to(top.dtype) / top - 1

        return self._along(indices, f)

    def values_to_indices(self, values: torch.Tensor) -> torch.Tensor:
        """values (latents along ``dim``) on the FSQ grid -> int64 indices (nearest grid point)."""
        return self._along(values, lambda v: torch.round((v + 1) / 2 * self._top(v)).long())


class GumbelQuantizer(nn.Module):
    """FactorQVAE's quantizer: a global codebook of ``num_values`` scalars (init N(0, 1)).

    forward(z (..., d), tau) -> :class:`~qkernels.GumbelQuantized`. In training mode the
    relaxed Gumbel-softmax sample (``hard`` for straight-through one-hots); in eval mode the hard
    nearest value (FactorQVAE's evaluation), with one-hot weights.

    Args:
        num_values: n_v, the codebook's size (>= 2); ``values`` is a learnable (n_v,) parameter.
        hard: in training mode, straight-through one-hot weights (z_q a codebook value, relaxed gradients)
            instead of the relaxed sample.

    Raises:
        ValueError: num_values < 2.

    Examples:
        >>> import torch
        >>> from qkernels.nn import GumbelQuantizer
        >>> _ = torch.manual_seed(0)
        >>> quantizer = GumbelQuantizer(4)
        >>> out = quantizer(torch.randn(5, 3), tau=0.5)  # training mode: relaxed
        >>> out.z_q.shape, out.weights.shape
        (torch.Size([5, 3]), torch.Size([5, 3, 4]))
        >>> out = quantizer.eval()(torch.randn(5, 3))  # eval mode: the nearest value
        >>> bool(torch.isin(out.z_q, quantizer.values).all())
        True
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
    mode (the evaluation representation softmax(logits) @ values). Logits whose second-to-last axis
    is not of size d (num_latents) are an error.

    Args:
        num_latents: d, the number of latents.
        num_values: K values per latent (>= 2).
        values: the fixed values (a buffer, not learned): (K,) for every latent or (d, K), one set per latent;
            None: linspace(-1, 1, K).
        tau: the softmax temperature (> 0).

    Raises:
        ValueError: num_latents < 1, num_values < 2, tau <= 0, or ``values`` neither (K,) nor (d, K).

    Examples:
        >>> import torch
        >>> from qkernels.nn import CategoricalLatent
        >>> latent = CategoricalLatent(3, 5).eval()  # values linspace(-1, 1, 5)
        >>> s = latent(torch.zeros(2, 3, 5))  # equal logits: z = mean of the values (0, up to rounding)
        >>> s.z.shape, s.y.shape, bool(s.z.abs().max() < 1e-7)
        (torch.Size([2, 3]), torch.Size([2, 3, 5]), True)
        >>> latent.indices_to_values(torch.tensor([[0, 2, 4]]))
        tensor([[-1.,  0.,  1.]])
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
        self.values: torch.Tensor
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
        if isinstance(logits, torch.Tensor) and logits.dim() >= 2:
            _latent_axis("logits", logits, self, self.num_latents, -1, trailing=1)
        if noise_scale is None:
            noise_scale = 1.0 if self.training else 0.0
        return categorical_latent(
            logits,
            self.values.to(logits.dtype),
            tau=self.tau,
            noise_scale=noise_scale,
            hard=hard,
            generator=generator,
        )

    def indices_to_values(self, indices: torch.Tensor) -> torch.Tensor:
        """indices (..., d) -> values (..., d)."""
        return _lookup(self.values, indices)

    def values_to_indices(self, values: torch.Tensor) -> torch.Tensor:
        """values (..., d) -> index of the nearest value."""
        return _nearest(values, self.values.to(values.dtype))
