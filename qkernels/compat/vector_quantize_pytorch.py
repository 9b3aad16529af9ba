"""``FSQ`` and ``LatentQuantize`` with the interface of vector-quantize-pytorch 1.32.0, on qkernels' ops.

Switching is one import line::

    from vector_quantize_pytorch import FSQ, LatentQuantize                    # before
    from qkernels.compat.vector_quantize_pytorch import FSQ, LatentQuantize    # after

Constructor arguments, forward signatures, return values ``(quantized, indices)`` (FSQ) and
``(quantized, indices, loss)`` (LatentQuantize), shapes, dtypes, parameter names (state_dicts load both
ways), ``indices_to_codes`` / ``codes_to_indices`` and the axis convention are the package's:

- FSQ: ``(B, N, D)`` channel-last, or ``(B, D, ...)`` channel-first when ``channel_first=True`` or the
  input has 4+ dimensions (images, video); indices ``(B, ...)`` int32 (``(B, ..., num_codebooks)`` with
  ``keep_num_codebooks_dim``).
- LatentQuantize: **always channel-first** ``(B, D, ...)``, sequences included (``(B, D, N)``; the
  package's README shows ``(batch, seq, feat)``, which its code rejects too). Mind this when coming from
  :class:`qkernels.nn.LatentQuantizer`, which quantizes the last axis.

LatentQuantize runs on :func:`qkernels.latent_quantize` (one fused kernel for every latent, where the
package loops over latents in Python). FSQ is elementwise and memory-bound: it runs as one
autograd function with the package's exact arithmetic (the package's FSQ, Mentzer et al., puts even
levels on an asymmetric grid with a 1e-3 margin, which :func:`qkernels.fsq`, Tripod's symmetric
eq. 10, does not express; ``preserve_symmetry=True`` is eq. 10 but for ties, which the package rounds
half up and :func:`qkernels.fsq` half to even) with fewer passes over memory than the package's
autograd graph.

Agreement (tests/test_compat_vqp.py, against the package on identical inputs and parameters): FSQ
outputs, indices and gradients are bitwise the package's (float32, float64, bfloat16 under autocast, and
bfloat16 quantized in bfloat16: ``force_quantization_f32=False`` or ``allowed_dtypes``); LatentQuantize
indices and straight-through gradients bitwise, outputs bitwise where the values are dyadic (see the
table), its loss value to summation order (relative 1e-6) without a projection. The package's own test
cases pass on both (tests/test_compat_vqp_upstream.py). Where the package has a bug we follow the QLAE
paper (shared/papers/qlae-*, eq. 5 and Alg. 1), and for FSQ's noise dropout its stated probability:

================================  ==========================================  ==========================================
what                              vector-quantize-pytorch 1.32.0              qkernels.compat
================================  ==========================================  ==========================================
LatentQuantize loss names         ``quantization_loss`` = mse(sg(codes), z)   QLAE eq. 5: quantization loss mean((sg(z)
                                  trains the latents and ``commitment_loss``  - z_q)^2) trains the values, commitment
                                  = mse(sg(z), codes) the codes: swapped      loss mean((z - sg(z_q))^2) the encoder;
                                  w.r.t. QLAE eq. 5                           each weight weights the loss it names
LatentQuantize loss gradients     taken through the straight-through output:  values: 2 w_q (z_q - z) / n; latents: 2
                                  the values never get a gradient (``.grad``  w_c (z - z_q) / n
                                  None), the latents get 2 (w_c - w_q) (z_q
                                  - z) / n: zero at the default equal
                                  weights, away from the codes when w_c >
                                  w_q
LatentQuantize loss space         module input vs. projected output (the      projected-in latents vs. their codes; the
                                  input space) when ``dim`` != codebook dim   same value as the package's without a
                                                                              projection
``optimize_values=True``          Parameters that never move                  values trained by the quantization loss
LatentQuantize output             z + sg(q - z): up to an ulp off the value   q exactly
                                  q where the values are not dyadic (the
                                  initial values are for L = 2, 3, 4, 5, 8,
                                  9, 16, 17; learned values are not)
LatentQuantize                    through the initial grid (k - L//2) / (2    the current values: nearest value per
``codes_to_indices``,             (L//2)): an ulp off the initial values for  latent; ``indices_to_codes`` is an exact
``indices_to_codes``,             L in {6, 7, 10..15} (its own ``quantized    lookup
``implicit_codebook``             == indices_to_codes(indices)`` fails),
                                  truncated to wrong indices for L = 15, all
                                  wrong once the values move
``in_place_codebook_optimizer``   AttributeError in training                  ValueError at construction
                                  (``optimize_values`` is never set)
half-precision LatentQuantize     output promoted to float32                  output in the input's dtype
input
float64 input, float32            promoted to float64                         TypeError (qkernels: float64 mixes with
LatentQuantize                                                                nothing): ``.double()`` the module
``optimize_values=False`` values  a plain list: ``.to(device)`` leaves it     non-persistent buffers: moved by ``.to``,
                                  behind                                      still not in the state_dict
``implicit_codebook``             a buffer built at construction (levels [8]  a property computed on access
                                  * 8: 512 MiB)
codebooks of 2^31+ codes          construction fails (the product codebook    ValueError naming ``return_indices``; with
                                  is materialized; integer overflow)          ``return_indices=False`` (a keyword
                                                                              LatentQuantize gains) it builds
FSQ indices past 2^24 codes       a float32 sum: wrong indices                exact
FSQ ``noise_dropout`` p           probability 1/2 for every code, whatever p  probability p (at p = 1/2, the package's
                                  (``bernoulli_()`` ignores its tensor of     draws)
                                  p's)
FSQ ``(B, D)`` input              einops error unless ``channel_first``       accepted
bad arguments                     AssertionError, einops errors               ValueError / TypeError naming the argument
                                                                              (an int ``levels`` without
                                                                              ``codebook_dim``: also a RuntimeError, as
                                                                              the package's test expects)
================================  ==========================================  ==========================================

Not provided: the package's internal helper ``LatentQuantize.quantize_and_project`` (einops pack
shapes). FSQ's ``scale`` is stored and unused, as in the package.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkernels._validation import check_finite
from qkernels.ops.quantize import latent_quantize

__all__ = ["FSQ", "LatentQuantize"]

_INDEX_LIMIT = 2**31  # int32 indices
_FLOAT32_EXACT = 2**24  # float32 holds every integer below this


class _ArgumentError(ValueError, RuntimeError):
    """A bad constructor argument where the package raised a RuntimeError (so ``except RuntimeError``
    written against it still catches ours)."""


def _check_levels(levels: object, *, allow_int: bool) -> list[int] | int:
    kinds = "an int or a list of ints" if allow_int else "a list or tuple of ints"
    if allow_int and isinstance(levels, int) and not isinstance(levels, bool):
        values = [levels]
    elif (
        isinstance(levels, (list, tuple))
        and levels
        and all(isinstance(v, int) and not isinstance(v, bool) for v in levels)
    ):
        values = list(levels)
    else:
        raise TypeError(f"levels must be {kinds} (levels per latent), got {levels!r}")
    if min(values) < 2:
        raise ValueError(f"levels must all be >= 2, got {levels}")
    return levels if isinstance(levels, int) else values


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_input(z: object, dim: int, channel_first: bool, kind: str) -> None:
    if not isinstance(z, Tensor):
        raise TypeError(f"z must be a torch.Tensor, got {type(z).__name__}")
    if not z.is_floating_point():
        raise TypeError(f"z must be a floating-point tensor, got dtype {z.dtype}")
    if z.dim() < 2:
        raise ValueError(f"z must have a batch and a feature axis, got shape {tuple(z.shape)}")
    axis = 1 if channel_first else -1
    if z.shape[axis] != dim:
        where = "axis 1 (channel-first: (B, D, ...))" if channel_first else "the last axis ((B, N, D))"
        raise ValueError(f"z must have dim = {dim} features on {where}, got shape {tuple(z.shape)} ({kind})")


def _basis(levels: list[int]) -> list[int]:
    out = [1]
    for level in levels[:-1]:
        out.append(out[-1] * level)
    return out


class _Constants:
    """Small tensors ``make(*args, device)`` derived from the levels, made once per (device, default
    dtype): not buffers, so the module's buffers and state_dict stay the package's (``make``: a
    module-level function, so the module still pickles). Made afresh while torch.compile traces
    (nothing traced is kept)."""

    def __init__(self, make: Callable[..., dict[str, Tensor]], *args) -> None:
        self.make, self.args = make, args
        self.cache: dict[tuple, dict[str, Tensor]] = {}

    def get(self, device: torch.device) -> dict[str, Tensor]:
        if torch.compiler.is_compiling():
            return self.make(*self.args, device)
        key = (device, torch.get_default_dtype())
        out = self.cache.get(key)
        if out is None:
            with torch.inference_mode(False), torch.no_grad():
                out = self.cache[key] = self.make(*self.args, device)
        return out


# ----------------------------------------------------------------------------- FSQ


def _combine(level: Tensor, basis: Tensor, start: int) -> Tensor:
    """Integer levels held in floats (..., d) -> int32 indices sum_j level_j basis_j + start, exact: every
    partial sum is an integer below 2^24 (float32 basis) or 2^53 (float64 basis)."""
    if level.dtype != basis.dtype:
        level = level.to(basis.dtype)
    if level.is_contiguous() and not torch.is_autocast_enabled(level.device.type):
        index = torch.matmul(level, basis)
    else:  # (autocast would run the matmul in half precision)
        index = (level * basis).sum(-1)
    if start:
        index = index.add_(start)
    return index.to(torch.int32)


def _clamp_or_tanh(ctx, t: Tensor, hard: bool) -> Tensor:
    """f(t): a clamp to [-1, 1] (``hard``; keeps where it cut on ``ctx``) or tanh (the caller saves
    its result for the backward)."""
    ctx.hard = hard
    if hard:
        ctx.outside = ~((t >= -1.0) & (t <= 1.0))
        return t.clamp(-1.0, 1.0)
    return torch.tanh(t)


def _clamp_or_tanh_backward(ctx, g: Tensor, y: Tensor | None) -> Tensor:
    """The package's gradient through f, in place in ``g`` (ours): clamp: zero where it cut
    (its where(inside, g, 0)); tanh: g (1 - y^2) (its tanh_backward)."""
    if ctx.hard:
        return g.masked_fill_(ctx.outside, 0.0)
    return torch.ops.aten.tanh_backward.grad_input(g, y, grad_input=g)


class _FSQBound(torch.autograd.Function):
    """The package's ``FSQ.bound`` with a straight-through round, in one autograd node.

    Forward: codes = round(f(z + shift) * half_l - offset) / half_width (f = tanh, or a clamp to
    [-1, 1]), and the int32 indices of the rounded levels (None without ``basis``). Backward: the
    package's chain rule in its order: f'((g / half_width) * half_l). Bitwise the package's values and
    gradients: its ``b + sg(round(b) - b)`` is round(b) exactly, with +0 for zero, which ``0 + r / w``
    reproduces. Two tensors of z's size live in the forward (f(z + shift), and the levels turned
    into the codes in place)."""

    @staticmethod
    def forward(ctx, z, shift, half_l, offset, half_width, zero, hard, basis, start):
        y = _clamp_or_tanh(ctx, z if shift is None else z + shift, hard)
        ctx.save_for_backward(None if hard else y, half_l, half_width)
        level = (y * half_l).sub_(offset).round_()
        index = None if basis is None else _combine(level, basis, start)
        codes = torch.addcdiv(zero, level, half_width, out=level)
        if index is not None:
            ctx.mark_non_differentiable(index)
        return codes, index

    @staticmethod
    def backward(ctx, grad, _grad_index):
        y, half_l, half_width = ctx.saved_tensors
        g = (grad / half_width).mul_(half_l)  # the package's order: (g / half_width) * half_l
        return _clamp_or_tanh_backward(ctx, g, y), None, None, None, None, None, None, None, None


class _FSQSymmetric(torch.autograd.Function):
    """The package's ``FSQ.symmetry_preserving_bound`` (arXiv 2411.19842, 3.2) in one autograd node:
    codes = scale * floor((L - 1) (f(z) + 1) / 2 + 1/2) - 1, scale = 2 / (L - 1) (f = tanh or a clamp),
    straight-through floor, and the int32 indices of the levels floor(...) in [0, L - 1] (None without
    ``basis``). Same arithmetic, in the same order, as the package: bitwise its values and gradients."""

    @staticmethod
    def forward(ctx, z, levels_minus_1, scale, hard, basis):
        y = _clamp_or_tanh(ctx, z, hard)
        ctx.save_for_backward(None if hard else y, levels_minus_1, scale)
        # the package's dtypes: its int32 L - 1 keeps the bracket in f(z)'s dtype (a half-precision z's too, when
        # quantized in it), its float32 scale promotes the codes
        ctx.dtype = y.dtype
        level = (y + 1).mul_(levels_minus_1).div_(2.0).add_(0.5).floor_()
        index = None if basis is None else _combine(level, basis, 0)
        same = level.dtype == torch.promote_types(level.dtype, scale.dtype)
        codes = (level.mul_(scale) if same else level * scale).sub_(1.0)  # scale * level - 1
        if index is not None:
            ctx.mark_non_differentiable(index)
        return codes, index

    @staticmethod
    def backward(ctx, grad, _grad_index):
        y, levels_minus_1, scale = ctx.saved_tensors
        g = (grad * scale).to(ctx.dtype).div_(2.0).mul_(levels_minus_1)  # the package's order and dtypes
        return _clamp_or_tanh_backward(ctx, g, y), None, None, None, None


def _fsq_constants_for(levels: tuple[int, ...], eps: float, device: torch.device) -> dict[str, Tensor]:
    return _fsq_constants(torch.tensor(levels, dtype=torch.int32, device=device), eps)


def _fsq_constants(levels: Tensor, eps: float) -> dict[str, Tensor]:
    """The package's FSQ constants, made with its expressions (its dtypes included: float32 under the
    default dtype, whatever the input's)."""
    half_l = (levels - 1) * (1 + eps) / 2
    offset = torch.where(levels % 2 == 0, 0.5, 0.0)
    ratio = offset / half_l
    return {
        "half_l": half_l,
        "offset": offset,
        "shift": torch.atanh(ratio),
        "shift_hard": ratio,
        "half_width": (levels // 2).to(half_l.dtype),
        "levels_minus_1": (levels - 1).to(half_l.dtype),
        "scale": 2.0 / (levels - 1),
        "zero": torch.zeros((), dtype=half_l.dtype, device=levels.device),
    }


class FSQ(nn.Module):
    """Finite scalar quantization (Mentzer et al. 2023) with vector-quantize-pytorch's interface.

    Args (the package's): ``levels`` (list of ints >= 2, one per latent; 2 needs
    ``preserve_symmetry``), ``dim`` (feature size; a Linear projection in and out when it differs from
    ``len(levels) * num_codebooks``), ``num_codebooks``, ``keep_num_codebooks_dim`` (default
    ``num_codebooks > 1``), ``scale`` (unused, as in the package), ``allowed_dtypes`` and
    ``force_quantization_f32`` (other dtypes quantized in float32), ``channel_first``,
    ``projection_has_bias``, ``return_indices``, ``preserve_symmetry`` (the symmetric grid
    2 k / (L - 1) - 1), ``noise_dropout`` (training: that fraction of codes gets uniform noise in
    [-1/2, 1/2), clamped; needs ``preserve_symmetry``), ``bound_hard_clamp`` (clamp instead of
    tanh), ``orthogonal_rotation`` (a fixed random rotation around the quantizer).

    forward(z) -> (quantized, indices): z (B, N, dim), or (B, dim, ...) when ``channel_first`` or 4+
    dims; quantized shaped like z (codes in [-1, 1] unless projected), straight-through gradient;
    indices (B, N) / (B, ...) int32 (a trailing num_codebooks axis when ``keep_num_codebooks_dim``),
    or None when ``return_indices`` is False.

    Raises:
        RuntimeError: a bad constructor argument (where the package raised one).

    Examples:
        Levels (3, 5): latent 0 on (-1, 0, 1), latent 1 on (-1, -0.5, 0, 0.5, 1); index = i_0 + 3 i_1.

        >>> import torch
        >>> from qkernels.compat.vector_quantize_pytorch import FSQ
        >>> fsq = FSQ([3, 5])
        >>> quantized, indices = fsq(torch.tensor([[[10.0, 0.0], [-10.0, 10.0]]]))  # (B, N, D) = (1, 2, 2)
        >>> quantized
        tensor([[[ 1.,  0.],
                 [-1.,  1.]]])
        >>> indices  # 2 + 3 * 2, 0 + 3 * 4
        tensor([[ 8, 12]], dtype=torch.int32)
        >>> torch.equal(fsq.indices_to_codes(indices), quantized)
        True
    """

    def __init__(
        self,
        levels: list[int] | tuple[int, ...],
        dim: int | None = None,
        num_codebooks: int = 1,
        keep_num_codebooks_dim: bool | None = None,
        scale: float | None = None,
        allowed_dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.float64),
        channel_first: bool = False,
        projection_has_bias: bool = True,
        return_indices: bool = True,
        force_quantization_f32: bool = True,
        preserve_symmetry: bool = False,
        noise_dropout: float = 0.0,
        bound_hard_clamp: bool = False,
        orthogonal_rotation: bool = False,
    ) -> None:
        super().__init__()
        levels = _check_levels(levels, allow_int=False)
        if 2 in levels and not preserve_symmetry:
            raise ValueError(f"levels of 2 need preserve_symmetry=True (or more levels), got levels={levels}")
        num_codebooks = _check_int("num_codebooks", num_codebooks, 1)
        if keep_num_codebooks_dim is None:
            keep_num_codebooks_dim = num_codebooks > 1
        if num_codebooks > 1 and not keep_num_codebooks_dim:
            raise ValueError("keep_num_codebooks_dim must be True (or None) when num_codebooks > 1")
        if (
            isinstance(noise_dropout, bool)
            or not isinstance(noise_dropout, (int, float))
            or not (0 <= noise_dropout <= 1)
        ):
            raise ValueError(f"noise_dropout must be a number in [0, 1], got {noise_dropout!r}")
        if noise_dropout > 0 and not preserve_symmetry:
            raise ValueError("noise_dropout > 0 needs preserve_symmetry=True")
        codebook_dim = len(levels)
        effective = codebook_dim * num_codebooks
        dim = effective if dim is None else _check_int("dim", dim, 1)
        self.codebook_size = math.prod(levels)
        if return_indices and self.codebook_size > _INDEX_LIMIT:
            raise ValueError(
                f"levels={levels} make {self.codebook_size} codes, more than int32 indices hold: pass "
                "return_indices=False, or split the latents into num_codebooks codebooks"
            )

        self.register_buffer("_levels", torch.tensor(levels, dtype=torch.int32), persistent=False)
        # (int32 products wrap past 2^31, as the package's: only used below that many codes)
        self.register_buffer(
            "_basis", torch.cumprod(torch.tensor([1, *levels[:-1]]), 0, dtype=torch.int32), persistent=False
        )
        self.scale = scale
        self.preserve_symmetry = preserve_symmetry
        self.noise_dropout = noise_dropout
        self.codebook_dim = codebook_dim
        self.num_codebooks = num_codebooks
        self.effective_codebook_dim = effective
        self.keep_num_codebooks_dim = keep_num_codebooks_dim
        self.dim = dim
        self.channel_first = channel_first
        self.has_projections = dim != effective
        self.project_in = nn.Linear(dim, effective, bias=projection_has_bias) if self.has_projections else nn.Identity()
        self.project_out = (
            nn.Linear(effective, dim, bias=projection_has_bias) if self.has_projections else nn.Identity()
        )
        self.return_indices = return_indices
        self.allowed_dtypes = allowed_dtypes
        self.force_quantization_f32 = force_quantization_f32
        self.bound_hard_clamp = bound_hard_clamp
        self.orthogonal_rotation = orthogonal_rotation
        if orthogonal_rotation:
            rot = torch.empty(codebook_dim, codebook_dim)
            nn.init.orthogonal_(rot)
            self.register_buffer("orthogonal_rot", rot)
        self._even = any(level % 2 == 0 for level in levels)
        self._const = _Constants(_fsq_constants_for, tuple(levels), 1e-3)
        offsets = [level // 2 for level in levels]
        self._index_offset = sum(o * b for o, b in zip(offsets, _basis(levels), strict=True))

    # -- quantization

    def _basis_for(self, z: Tensor, like: Tensor) -> Tensor:
        """The basis in the dtype the levels of ``z`` are computed in (float64 past 2^24 codes)."""
        dtype = torch.promote_types(z.dtype, like.dtype)
        if dtype != torch.float64 and self.codebook_size > _FLOAT32_EXACT:
            dtype = torch.float64
        c = self._const.get(z.device)
        key = f"basis_{dtype}"
        if key not in c:
            c[key] = self._basis.to(device=z.device, dtype=dtype)
        return c[key]

    def _bound(self, z: Tensor, eps: float, hard_clamp: bool, indices: bool = False) -> tuple[Tensor, Tensor | None]:
        c = self._const.get(z.device) if eps == 1e-3 else _fsq_constants(self._levels, eps)
        shift = c["shift_hard"] if hard_clamp else c["shift"]
        if not self._even and torch.promote_types(z.dtype, shift.dtype) == z.dtype:
            shift = None  # zero; the package's z + 0 only promotes a half-precision z to float32
        basis = self._basis_for(z, c["half_l"]) if indices else None
        return _FSQBound.apply(
            z, shift, c["half_l"], c["offset"], c["half_width"], c["zero"], hard_clamp, basis, self._index_offset
        )

    def _symmetric(self, z: Tensor, hard_clamp: bool, indices: bool = False) -> tuple[Tensor, Tensor | None]:
        c = self._const.get(z.device)
        basis = self._basis_for(z, c["scale"]) if indices else None
        return _FSQSymmetric.apply(z, c["levels_minus_1"], c["scale"], hard_clamp, basis)

    def bound(self, z: Tensor, eps: float = 1e-3, hard_clamp: bool = False) -> Tensor:
        """z (..., codebook_dim) -> codes round(tanh(z + shift) * half_l - offset) / (L // 2),
        straight-through (the package's ``bound``)."""
        return self._bound(z, eps, hard_clamp)[0]

    def symmetry_preserving_bound(self, z: Tensor, hard_clamp: bool = False) -> Tensor:
        """z (..., codebook_dim) -> codes 2 / (L - 1) * floor((L - 1) (tanh(z) + 1) / 2 + 1/2) - 1."""
        return self._symmetric(z, hard_clamp)[0]

    def quantize(self, z: Tensor) -> Tensor:
        """z (..., codebook_dim) -> codes of the same shape (straight-through)."""
        return self._quantize(z)[0]

    def _quantize(self, z: Tensor, indices: bool = False) -> tuple[Tensor, Tensor | None]:
        """(codes, int32 indices or None)."""
        if self.preserve_symmetry:
            return self._symmetric(z, self.bound_hard_clamp, indices)
        return self._bound(z, 1e-3, self.bound_hard_clamp, indices)

    def maybe_apply_noise(self, bounded_z: Tensor) -> Tensor:
        """In training with ``noise_dropout`` p > 0: each code gets uniform noise in [-1/2, 1/2) with
        probability p, then everything is clamped to [-1, 1] (random draws in the package's order; the
        package's own probability is 1/2 whatever p)."""
        if not self.training or self.noise_dropout == 0:
            return bounded_z
        # (the package's full_like(z, p).bernoulli_() draws with probability 1/2 whatever p: bernoulli_'s default)
        mask = torch.empty_like(bounded_z).bernoulli_(self.noise_dropout).bool()
        noise = torch.rand_like(bounded_z) - 0.5
        return torch.where(mask, bounded_z + noise, bounded_z).clamp(-1.0, 1.0)

    # -- indices and codes

    def _scale_and_shift(self, zhat_normalized: Tensor) -> Tensor:
        if self.preserve_symmetry:
            return (zhat_normalized + 1.0) / (2.0 / (self._levels - 1))
        half_width = self._levels // 2
        return zhat_normalized * half_width + half_width

    def _scale_and_shift_inverse(self, zhat: Tensor) -> Tensor:
        if self.preserve_symmetry:
            return zhat * (2.0 / (self._levels - 1)) - 1.0
        half_width = self._levels // 2
        return (zhat - half_width) / half_width

    def indices_to_level_indices(self, indices: Tensor) -> Tensor:
        """indices (...) -> the level index of each latent (..., codebook_dim), in [0, L - 1]."""
        _check_indices(indices)
        return (indices[..., None] // self._basis) % self._levels

    def _indices_to_codes(self, indices: Tensor) -> Tensor:
        return self._scale_and_shift_inverse(self.indices_to_level_indices(indices))

    def codes_to_indices(self, zhat: Tensor) -> Tensor:
        """codes (..., codebook_dim) on the grid -> int32 indices (...): each latent's nearest level,
        combined exactly (the package rounds a float32 sum)."""
        if not isinstance(zhat, Tensor) or zhat.shape[-1:] != (self.codebook_dim,):
            got = tuple(zhat.shape) if isinstance(zhat, Tensor) else type(zhat).__name__
            raise ValueError(f"zhat must be (..., codebook_dim = {self.codebook_dim}), got {got}")
        level = self._scale_and_shift(zhat).round().long()
        return torch.matmul(level, self._basis.long()).to(torch.int32)  # int64: exact

    def indices_to_codes(self, indices: Tensor) -> Tensor:
        """indices (as forward returns them) -> quantized (as forward returns it: projected out,
        channel-first for 3+-dimensional indices or when ``channel_first``)."""
        _check_indices(indices)
        is_img_or_video = indices.dim() >= 3 + int(self.keep_num_codebooks_dim)
        codes = self._indices_to_codes(indices)
        if self.orthogonal_rotation:
            codes = codes @ self.orthogonal_rot.t()
        if self.keep_num_codebooks_dim:
            codes = codes.flatten(-2)
        codes = self.project_out(codes)
        if is_img_or_video or self.channel_first:
            codes = codes.movedim(-1, 1)
        return codes

    @property
    def implicit_codebook(self) -> Tensor:
        """All codebook_size codes (codebook_size, codebook_dim), made on access (a buffer in the package)."""
        if self.codebook_size > _INDEX_LIMIT:
            raise ValueError(f"implicit_codebook: {self.codebook_size} codes are too many to materialize")
        return self._indices_to_codes(torch.arange(self.codebook_size, device=self._levels.device))

    # -- forward

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor | None]:
        """z (B, N, dim), or (B, dim, ...) channel-first -> (quantized shaped like z, indices or None)."""
        move = isinstance(z, Tensor) and (z.dim() >= 4 or self.channel_first)
        _check_input(z, self.dim, move, "FSQ")
        check_finite("z", z)
        if move:
            z = z.movedim(1, -1)
            if self.has_projections:  # the package's layout for the GEMM (the same rounding)
                z = z.contiguous()
        z = self.project_in(z)
        z = z.unflatten(-1, (self.num_codebooks, self.codebook_dim))
        if self.orthogonal_rotation:
            z = z @ self.orthogonal_rot
        force = self.force_quantization_f32
        no_cuda_autocast = force and torch.is_autocast_enabled("cuda")
        with torch.autocast("cuda", enabled=False) if no_cuda_autocast else contextlib.nullcontext():
            dtype = z.dtype
            if force and dtype not in self.allowed_dtypes:
                z = z.float()
            codes, indices = self._quantize(z, self.return_indices)
            codes = self.maybe_apply_noise(codes)
            if self.orthogonal_rotation:
                codes = codes @ self.orthogonal_rot.t()
            codes = codes.flatten(-2).to(dtype)
        out = self.project_out(codes)
        if move:
            out = out.movedim(-1, 1)
        if indices is not None and not self.keep_num_codebooks_dim:
            indices = indices.squeeze(-1)
        return out, indices


def _check_indices(indices: object) -> None:
    if not isinstance(indices, Tensor) or indices.is_floating_point() or indices.is_complex():
        got = indices.dtype if isinstance(indices, Tensor) else type(indices).__name__
        raise TypeError(f"indices must be an integer tensor, got {got}")


# ----------------------------------------------------------------------------- LatentQuantize


class _Values(nn.Module):
    """Fixed values, one non-persistent buffer per latent (``optimize_values=False``): moved by
    ``.to(device)``, left out of the state_dict (the package keeps a plain list)."""

    def __init__(self, values: list[Tensor]) -> None:
        super().__init__()
        for i, v in enumerate(values):
            self.register_buffer(str(i), v, persistent=False)

    def __getitem__(self, i: int) -> Tensor:
        return self._buffers[str(range(len(self))[i])]

    def __len__(self) -> int:
        return len(self._buffers)

    def __iter__(self):
        return iter(self._buffers.values())


def _initial_values(level: int) -> Tensor:
    """The package's initial values: linspace(-1/2, 1/2, L) for odd L, k / L - 1/2 for even L."""
    return torch.linspace(-0.5, 0.5, level) if level % 2 == 1 else torch.arange(level) / level - 0.5


def _pad_index(levels: tuple[int, ...], device: torch.device) -> dict[str, Tensor]:
    """Index into the concatenated values giving a (d, max L) matrix, each row padded with its last
    value (never nearer than the original: ties go to the lowest index)."""
    width, rows, start = max(levels), [], 0
    for level in levels:
        rows.append([start + min(k, level - 1) for k in range(width)])
        start += level
    return {"pad_index": torch.tensor(rows, dtype=torch.long, device=device)}


class LatentQuantize(nn.Module):
    """QLAE latent quantization (Hsu et al. 2023) with vector-quantize-pytorch's interface, on
    :func:`qkernels.latent_quantize`.

    Args (the package's): ``levels`` (an int with ``codebook_dim`` latents, or a list: values per
    latent, each >= 2), ``dim`` (feature size; a Linear projection in and out when it differs from
    ``codebook_dim * num_codebooks``), ``commitment_loss_weight`` and ``quantization_loss_weight``
    (QLAE eq. 5, see the module's table; None: 0), ``num_codebooks`` (codebooks share the values),
    ``codebook_dim``, ``keep_num_codebooks_dim`` (True when ``num_codebooks > 1``),
    ``optimize_values`` (values are Parameters ``values_per_latent.<i>``, trained by the quantization
    loss; else fixed buffers), ``in_place_codebook_optimizer`` (not supported: ValueError).
    ``return_indices`` (keyword, ours): False returns None indices and allows codebooks over 2^31 codes.

    forward(z (B, dim, ...), channel-first) -> (quantized (B, dim, ...), indices (B, ...) int32
    (``(B, ..., num_codebooks)`` with ``keep_num_codebooks_dim``) or None, loss ()): loss =
    commitment_loss_weight * mean((z - sg(z_q))^2) + quantization_loss_weight * mean((sg(z) - z_q)^2)
    over the projected-in latents z and their codes z_q, in training mode; 0 in eval mode.

    Examples:
        Values start at linspace(-0.5, 0.5, 3) per latent; z = (0.9, -0.2) lands on (0.5, 0) = levels (2, 1),
        index 2 + 3 * 1; the loss is 0.1 * 0.1 + 0.1 * 0.1 with mean((0.4^2, 0.2^2)) = 0.1.

        >>> import torch
        >>> from qkernels.compat.vector_quantize_pytorch import LatentQuantize
        >>> lq = LatentQuantize(levels=[3, 3], dim=2, commitment_loss_weight=0.1, quantization_loss_weight=0.1)
        >>> quantized, indices, loss = lq(torch.tensor([[[0.9], [-0.2]]]))  # channel-first (B, D, N)
        >>> quantized.detach(), indices, round(loss.item(), 6)
        (tensor([[[0.5000],
                  [0.0000]]]), tensor([[5]], dtype=torch.int32), 0.02)
    """

    def __init__(
        self,
        levels: list[int] | int,
        dim: int,
        commitment_loss_weight: float | None = 0.1,
        quantization_loss_weight: float | None = 0.1,
        num_codebooks: int = 1,
        codebook_dim: int = -1,
        keep_num_codebooks_dim: bool | None = None,
        optimize_values: bool | None = True,
        in_place_codebook_optimizer: Callable[..., torch.optim.Optimizer] | None = None,
        *,
        return_indices: bool = True,
    ) -> None:
        super().__init__()
        levels = _check_levels(levels, allow_int=True)
        if isinstance(codebook_dim, bool) or not isinstance(codebook_dim, int):
            raise TypeError(f"codebook_dim must be an int, got {codebook_dim!r}")
        if isinstance(levels, int):
            if codebook_dim <= 0:
                raise _ArgumentError(
                    f"levels is an int ({levels}): pass codebook_dim > 0, the number of latents, got {codebook_dim}"
                )
            levels = [levels] * codebook_dim
        elif codebook_dim > 0 and codebook_dim != len(levels):
            raise ValueError(f"codebook_dim ({codebook_dim}) must equal len(levels) ({len(levels)}) or be -1")
        dim = _check_int("dim", dim, 1)
        num_codebooks = _check_int("num_codebooks", num_codebooks, 1)
        weights = {}
        for name, w in (
            ("commitment_loss_weight", commitment_loss_weight),
            ("quantization_loss_weight", quantization_loss_weight),
        ):
            w = 0.0 if w is None else w
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                raise TypeError(f"{name} must be a finite number or None, got {w!r}")
            weights[name] = float(w)
        if in_place_codebook_optimizer is not None:
            raise ValueError(
                "in_place_codebook_optimizer is not supported: in vector-quantize-pytorch 1.32.0 it raises "
                "AttributeError in training; train the values with the returned loss (optimize_values=True)"
            )
        self.codebook_size = math.prod(levels)
        if return_indices and self.codebook_size > _INDEX_LIMIT:
            raise ValueError(
                f"levels={levels} make {self.codebook_size} codes, more than int32 indices hold: pass "
                "return_indices=False, or split the latents into num_codebooks codebooks"
            )

        self.dim = dim
        self.in_place_codebook_optimizer = None
        self.optimize_values = bool(optimize_values)
        self.return_indices = return_indices
        for name, w in weights.items():
            self.register_buffer(name, torch.tensor(w, dtype=torch.float32), persistent=False)
        self.register_buffer("_levels", torch.tensor(levels, dtype=torch.int32), persistent=False)
        # (int64 products wrap past 2^63, as the package's: only used below 2^31 codes)
        self.register_buffer("_basis", torch.cumprod(torch.tensor([1, *levels[:-1]]), 0), persistent=False)
        self.codebook_dim = len(levels)
        self.num_codebooks = num_codebooks
        self.effective_codebook_dim = self.codebook_dim * num_codebooks
        self.keep_num_codebooks_dim = bool(keep_num_codebooks_dim) or num_codebooks > 1
        self.has_projections = dim != self.effective_codebook_dim
        self.project_in = nn.Linear(dim, self.effective_codebook_dim) if self.has_projections else nn.Identity()
        self.project_out = nn.Linear(self.effective_codebook_dim, dim) if self.has_projections else nn.Identity()
        values = [_initial_values(level) for level in levels]
        if self.optimize_values:
            self.values_per_latent = nn.ParameterList([nn.Parameter(v) for v in values])
        else:
            self.values_per_latent = _Values(values)
        self._ragged = len(set(levels)) > 1
        self._const = _Constants(_pad_index, tuple(levels))

    def values_matrix(self) -> Tensor:
        """The codebook values as one (codebook_dim, max L) matrix (rows of fewer levels padded with
        their last value), differentiable in ``values_per_latent``."""
        vals = list(self.values_per_latent)
        if not self._ragged:
            return torch.stack(vals)
        flat = torch.cat(vals)
        return flat[self._const.get(flat.device)["pad_index"]]

    def quantize(self, z: Tensor) -> Tensor:
        """z (..., codebook_dim) -> the nearest value per latent, straight-through gradient to z."""
        return latent_quantize(z, self.values_matrix()).z_q

    def quantization_loss(self, z: Tensor, zhat: Tensor, reduce: str = "mean") -> Tensor:
        """QLAE's quantization loss mse(sg(z), zhat): trains the codes (the package's
        ``commitment_loss``)."""
        return F.mse_loss(zhat, z.detach(), reduction=reduce)

    def commitment_loss(self, z: Tensor, zhat: Tensor, reduce: str = "mean") -> Tensor:
        """QLAE's commitment loss mse(z, sg(zhat)): trains the latents (the package's
        ``quantization_loss``)."""
        return F.mse_loss(z, zhat.detach(), reduction=reduce)

    def _combine(self, level: Tensor) -> Tensor:
        return torch.matmul(level, self._basis).to(torch.int32)  # int64: exact

    def codes_to_indices(self, zhat: Tensor) -> Tensor:
        """codes (..., codebook_dim) -> int32 indices (...): the nearest current value of each latent
        (the package maps them through the initial grid)."""
        if not isinstance(zhat, Tensor) or zhat.shape[-1:] != (self.codebook_dim,):
            got = tuple(zhat.shape) if isinstance(zhat, Tensor) else type(zhat).__name__
            raise ValueError(f"zhat must be (..., codebook_dim = {self.codebook_dim}), got {got}")
        with torch.no_grad():
            return self._combine(latent_quantize(zhat, self.values_matrix()).indices)

    def indices_to_level_indices(self, indices: Tensor) -> Tensor:
        """indices (...) -> each latent's value index (..., codebook_dim)."""
        _check_indices(indices)
        return (indices[..., None] // self._basis) % self._levels

    def indices_to_codes(self, indices: Tensor, project_out: bool = True) -> Tensor:
        """indices (as forward returns them) -> the codes (the current values; projected out unless
        ``project_out`` is False), channel-first (B, D, ...) like forward's output."""
        level = self.indices_to_level_indices(indices)
        with torch.no_grad():
            vals = self.values_matrix()
        codes = vals[torch.arange(self.codebook_dim, device=vals.device), level]
        if self.keep_num_codebooks_dim:
            codes = codes.flatten(-2)
        if project_out:
            codes = self.project_out(codes)
        return codes.movedim(-1, 1)

    @property
    def implicit_codebook(self) -> Tensor:
        """All codebook_size codes (codebook_size, codebook_dim) from the current values, made on access."""
        if self.codebook_size > _INDEX_LIMIT:
            raise ValueError(f"implicit_codebook: {self.codebook_size} codes are too many to materialize")
        indices = torch.arange(self.codebook_size, device=self._levels.device)
        with torch.no_grad():
            vals = self.values_matrix()
        return vals[torch.arange(self.codebook_dim, device=vals.device), self.indices_to_level_indices(indices)]

    def forward(self, z: Tensor) -> tuple[Tensor, Tensor | None, Tensor]:
        """z (B, dim, ...) channel-first -> (quantized (B, dim, ...), indices (B, ...) int32 or None, loss ())."""
        _check_input(z, self.dim, True, "LatentQuantize takes (B, D, ...) channel-first, sequences too")
        x = z.movedim(1, -1)
        if self.has_projections:  # the package's layout for the GEMM (the same rounding)
            x = self.project_in(x.contiguous())
        q = latent_quantize(x.unflatten(-1, (self.num_codebooks, self.codebook_dim)), self.values_matrix())
        out = self.project_out(q.z_q.flatten(-2)).movedim(-1, 1)
        indices = None
        if self.return_indices:
            indices = self._combine(q.indices)
            if not self.keep_num_codebooks_dim:
                indices = indices.squeeze(-1)
        if self.training:
            loss = self.commitment_loss_weight * q.loss_commit + self.quantization_loss_weight * q.loss_quantize
        else:
            loss = torch.zeros((), device=self.commitment_loss_weight.device)
        return out, indices, loss
