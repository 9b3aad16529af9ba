"""Quantization hot path: the backends of its ops and the functional API (:func:`latent_quantize`, :func:`fsq`,
:func:`gumbel_quantize`, :func:`categorical_latent`).

The ops (``torch.ops.qkernels.latent_quantize``, ``relaxed_categorical``, ``gumbel_quantize``, each with a
``*_backward`` op, and their ``*_triton`` twins) are declared in :mod:`qkernels.decl.quantize`; how an op is put
together: :mod:`qkernels.ops._library`; semantics: :mod:`qkernels.reference.quantize`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import torch

from qkernels._args import check_codebook, check_levels, check_positive
from qkernels._backend import SELF_CHECKING, implementations, register, select
from qkernels._precision import compute_dtype, no_autocast, upcast
from qkernels._validation import check_finite, check_same, check_tensor, value_checks
from qkernels.decl import quantize as decl
from qkernels.ops import _library as lib
from qkernels.reference import quantize as ref


class Quantized(NamedTuple):
    """Output of :func:`latent_quantize` and :func:`fsq` (a named tuple).

    Attributes:
        z_q: (..., d) straight-through quantized latents in z's dtype.
        indices: (..., d) int64 codebook indices.
        loss_quantize: scalar codebook loss (QLAE eq. 5; zero for FSQ).
        loss_commit: scalar commitment loss (QLAE eq. 5; zero for FSQ).

    Examples:
        >>> import torch
        >>> import qkernels
        >>> q = qkernels.fsq(torch.zeros(2, 3), 5)
        >>> q._fields
        ('z_q', 'indices', 'loss_quantize', 'loss_commit')
        >>> z_q, indices, *_ = q  # unpacks like a tuple
        >>> indices
        tensor([[2, 2, 2],
                [2, 2, 2]])
    """

    z_q: torch.Tensor
    indices: torch.Tensor
    loss_quantize: torch.Tensor
    loss_commit: torch.Tensor


class GumbelQuantized(NamedTuple):
    """Output of :func:`gumbel_quantize` (a named tuple).

    Attributes:
        z_q: (..., d) relaxed quantized latents.
        weights: (..., d, K) relaxed one-hots.
        logits: (..., d, K) = -(z - values)^2.
        kl_uniform: (..., d) = sum_k p log(p K), p = softmax(logits).

    Examples:
        >>> import torch
        >>> import qkernels
        >>> out = qkernels.gumbel_quantize(torch.zeros(4, 2), torch.tensor([-1.0, 1.0]), 1.0)
        >>> out._fields
        ('z_q', 'weights', 'logits', 'kl_uniform')
        >>> out.weights.shape, out.kl_uniform.shape
        (torch.Size([4, 2, 2]), torch.Size([4, 2]))
    """

    z_q: torch.Tensor
    weights: torch.Tensor
    logits: torch.Tensor
    kl_uniform: torch.Tensor


class CategoricalSample(NamedTuple):
    """Output of :func:`categorical_latent` (a named tuple).

    Attributes:
        z: (..., d) = sum_k y_k values_k.
        y: (..., d, K) the relaxed sample.
        kl: (..., d) = KL(softmax(logits) || Uniform(K)).

    Examples:
        >>> import torch
        >>> import qkernels
        >>> s = qkernels.categorical_latent(torch.zeros(4, 2, 3))
        >>> s._fields
        ('z', 'y', 'kl')
        >>> s.z.shape, s.y.shape, s.kl.shape
        (torch.Size([4, 2]), torch.Size([4, 2, 3]), torch.Size([4, 2]))
    """

    z: torch.Tensor
    y: torch.Tensor
    kl: torch.Tensor


# ----------------------------------------------------------------------------- backends
# (signatures, fake implementations, autograd and raw-argument checks: the declarations in qkernels.decl.quantize)

_tk = lib.triton_kernels("quantize")
lib.define_backends(
    decl.LATENT_QUANTIZE,
    reference=ref.latent_quantize,
    triton=None if _tk is None else (_tk.latent_quantize, _tk.latent_quantize_backward),
)
lib.define_backends(
    decl.RELAXED_CATEGORICAL,
    reference=ref.relaxed_categorical,
    triton=None if _tk is None else (_tk.relaxed_categorical, _tk.relaxed_categorical_backward),
)
lib.define_backends(
    decl.GUMBEL_QUANTIZE,
    reference=ref.gumbel_quantize,
    triton=None if _tk is None else (_tk.gumbel_quantize, _tk.gumbel_quantize_backward),
)
# no C++ kernel of its own: a forced cpu / cuda backend composes torch logits with its
# relaxed_categorical kernel (auto picks it on a CPU, as for relaxed_categorical)
for _name, _relaxed_impl in implementations("relaxed_categorical").items():
    if _name in ("cpu", "cuda"):
        register("gumbel_quantize", _name)(functools.partial(ref.gumbel_quantize, relaxed=_relaxed_impl))


# ----------------------------------------------------------------------------- functional API


def _codebook(
    name: str, values: torch.Tensor, d: int, *, finite: bool = True, z: torch.Tensor | None = None
) -> torch.Tensor:
    """(n_v,) or (d, n_v) -> (G, n_v) (values checked unless ``finite`` is False); ``z``: the (..., d) latents,
    blamed when 1-D (one sample, most likely a batch without its latent dimension)."""
    check_tensor(name, values, ndim=(1, 2), finite=finite)
    check_codebook(name, values.shape, d, None if z is None else z.shape)
    return values[None] if values.dim() == 1 else values


def latent_quantize(z: torch.Tensor, values: torch.Tensor) -> Quantized:
    """Nearest-codebook scalar quantization with straight-through gradients (QLAE, Alg. 1).

    Args:
        z: (..., d) float latents (float16 / bfloat16 / float32 / float64).
        values: (d, n_v), one scalar codebook per latent (QLAE), or (n_v,), a global codebook; on z's device.

    Returns:
        :class:`Quantized`: z_q (..., d) holds the nearest value (ties -> lowest index) with the
        gradient passed straight through to z; indices (..., d) int64; loss_quantize =
        mean((sg(z) - z_q)^2) (gradient to ``values`` only); loss_commit = mean((z - sg(z_q))^2)
        (gradient to ``z`` only).

    Raises:
        ValueError: values not (n_v,) or (d, n_v), z and values on different devices, or NaN / inf values.

    Launches on the triton backend, forward + backward: 4 (a tile kernel and a fixed-order
    reduction for the losses; the same for the gradients).

    float16 / bfloat16 z or values: computed in float32; z_q in z's dtype, losses float32
    (:mod:`qkernels._precision`).

    Examples:
        >>> import torch
        >>> import qkernels
        >>> q = qkernels.latent_quantize(torch.tensor([[0.2, -0.9]]), torch.tensor([-1.0, 0.0, 1.0]))
        >>> q.z_q, q.indices
        (tensor([[ 0., -1.]]), tensor([[1, 0]]))
        >>> q.loss_quantize  # mean(0.2^2, 0.1^2)
        tensor(0.0250)
    """
    check_tensor("z", z, min_ndim=1, finite=False)
    vals = _codebook("values", values, z.shape[-1], finite=False, z=z)
    check_same("z", z, "values", values, dtype=False)
    dt = compute_dtype(z=z, values=values)
    backend, impl = select("latent_quantize", z.device, dt, z.numel())
    if backend not in SELF_CHECKING:
        check_finite("z", z)
        check_finite("values", values)
    # no reshape for 2-D z: each one is an autograd node, and the per-call cost counts at small n
    z2 = upcast(z if z.dim() == 2 else z.reshape(-1, z.shape[-1]), dt)
    with no_autocast(z.device):
        z_q, indices, loss_q, loss_c = impl(z2, upcast(vals, dt))
    if z.dim() != 2:
        z_q, indices = z_q.reshape(z.shape), indices.reshape(z.shape)
    return Quantized(upcast(z_q, z.dtype), indices, loss_q, loss_c)


def _levels(levels: int | Sequence[int] | torch.Tensor, d: int, device: torch.device) -> torch.Tensor:
    """(d,) int64 levels on ``device``; no host-device synchronization for ints and sequences."""
    if isinstance(levels, torch.Tensor):
        if levels.is_floating_point() or levels.dtype == torch.bool:
            raise TypeError(f"levels must hold integers, got dtype {levels.dtype}")
        lv = levels.to(device=device, dtype=torch.long, non_blocking=True).reshape(-1)
        if lv.numel() not in (1, d):
            raise ValueError(f"levels must give 1 or d = {d} values, got {lv.numel()}")
        if value_checks(lv) and (lv < 2).any():
            raise ValueError(f"levels must all be >= 2, got {lv.tolist()}")
        return lv.expand(d)
    values = check_levels(levels, d)
    # built on the host, copied without blocking it (a plain copy to CUDA synchronizes)
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True).expand(d)


def fsq(z: torch.Tensor, levels: int | Sequence[int] | torch.Tensor) -> Quantized:
    """Finite scalar quantization (Tripod eq. 10) with a straight-through round.

    z_q = 2 round((tanh(z) + 1) / 2 * (L - 1)) / (L - 1) - 1 in [-1, 1], with gradient
    1 - tanh(z)^2. FSQ is elementwise and memory-bound; it has no fused kernel (PyTorch's
    elementwise ops, or torch.compile, already run it at memory speed).

    Args:
        z: (..., d) float latents.
        levels: L, an int or one int per latent (a sequence or an integer tensor of d entries), each >= 2.

    Returns:
        :class:`Quantized`: z_q (..., d) in z's dtype, indices (..., d) int64 in [0, L - 1], zero
        auxiliary losses.

    Raises:
        TypeError: levels not integers.
        ValueError: a level < 2, or neither 1 nor d levels.

    Examples:
        >>> import torch
        >>> import qkernels
        >>> q = qkernels.fsq(torch.tensor([[-10.0, 0.0, 10.0]]), 3)  # tanh -> -1, 0, 1
        >>> q.z_q, q.indices
        (tensor([[-1.,  0.,  1.]]), tensor([[0, 1, 2]]))
    """
    check_tensor("z", z, min_ndim=1)
    try:
        lv = _levels(levels, z.shape[-1], z.device)
    except ValueError as err:  # as many levels as another axis has entries: say how to use that axis
        if "levels must give" not in str(err):
            raise
        n = levels.numel() if isinstance(levels, torch.Tensor) else len(levels)  # type: ignore[arg-type]
        axes = [k for k in range(z.dim() - 1) if z.shape[k] == n]
        if not axes:
            raise
        k = 1 if 1 in axes else axes[-1]
        raise ValueError(
            f"{err}; z has shape {tuple(z.shape)} and d is its last axis: if its {n} latents are "
            f"along axis {k}, move them last with z.movedim({k}, -1) or use "
            f"qkernels.nn.FSQ(levels, dim={k})"
        ) from None
    z_q, indices = ref.fsq(z.reshape(-1, z.shape[-1]), lv)
    zero = z.new_zeros(())
    return Quantized(z_q.reshape(z.shape), indices.reshape(z.shape), zero, zero.clone())


def _uniform(
    uniform: torch.Tensor | None,
    shape: tuple[int, ...],
    like: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Uniform [0, 1) noise shaped like ``like`` (N, d, K): drawn from ``generator``, or the
    user's ``uniform`` checked against the public shape ``shape`` (..., d, K) (its values:
    :func:`_check_noise_values`)."""
    if uniform is None:
        if generator is None:  # (a generator=None keyword fails torch.compile with dynamic shapes)
            return torch.rand_like(like)
        return torch.rand(like.shape, generator=generator, device=like.device, dtype=like.dtype)
    check_tensor("uniform", uniform, finite=False)
    check_same("uniform", uniform, "logits", like, dtype=False)
    if tuple(uniform.shape) != tuple(shape):
        raise ValueError(f"uniform must have shape {tuple(shape)}, got {tuple(uniform.shape)}")
    return uniform.reshape(like.shape)


def _check_noise_values(uniform: torch.Tensor | None, backend: str) -> None:
    """The user's noise holds values in [0, 1], unless ``backend``'s kernels check that themselves
    (SELF_CHECKING: a second pass over the noise here cost the cpu categorical kernel a fifth of its
    instructions)."""
    if uniform is None or backend in SELF_CHECKING:
        return
    check_finite("uniform", uniform)
    if value_checks(uniform) and ((uniform < 0) | (uniform > 1)).any():
        raise ValueError("uniform must hold values in [0, 1]")


def gumbel_quantize(
    z: torch.Tensor,
    values: torch.Tensor,
    tau: float,
    *,
    hard: bool = False,
    generator: torch.Generator | None = None,
    uniform: torch.Tensor | None = None,
) -> GumbelQuantized:
    """FactorQVAE's relaxed quantizer over a codebook of scalars.

    logits = -(z - values)^2 (K = n_v categories); weights = softmax((logits + Gumbel) / tau)
    (straight-through one-hot of its argmax when ``hard``); z_q = weights @ values.

    Args:
        z: (..., d) float latents.
        values: (n_v,) global codebook, or (d, n_v): one codebook per latent.
        tau: the softmax temperature (> 0).
        hard: straight-through one-hot weights (of the noisy logits' argmax): z_q is a codebook value,
            the gradients are the relaxed ones.
        generator: the source of the Gumbel noise (None: the global RNG); unused with ``uniform``.
        uniform: (..., d, n_v) explicit uniform noise in [0, 1) (Gumbel = -log(-log(u))) replacing the
            draw, so that every backend computes the same sample.

    Returns:
        :class:`GumbelQuantized` (z_q (..., d), weights (..., d, n_v), logits (..., d, n_v),
        kl_uniform (..., d)); half-precision z: computed in float32, z_q / weights / logits in z's
        dtype, kl_uniform float32.

    Raises:
        ValueError: tau <= 0, a misshaped codebook or ``uniform``, or ``uniform`` outside [0, 1].

    Launches on the triton backend, forward + backward: 4 (the noise draw, one forward kernel
    computing the logits, sample and KL, one backward kernel, one codebook-gradient reduction).

    Examples:
        >>> import torch
        >>> import qkernels
        >>> _ = torch.manual_seed(0)
        >>> z, values = torch.randn(4, 2), torch.tensor([-1.0, 0.0, 1.0])
        >>> out = qkernels.gumbel_quantize(z, values, 0.5, hard=True)
        >>> bool(torch.isin(out.z_q, values).all())  # hard: z_q is a codebook value
        True
        >>> torch.allclose(out.logits, -(z[..., None] - values) ** 2)
        True
    """
    check_tensor("z", z, min_ndim=1)
    vals = _codebook("values", values, z.shape[-1], z=z)
    check_same("z", z, "values", values, dtype=False)
    check_positive("tau", tau)
    if uniform is not None:
        check_tensor("uniform", uniform, finite=False)  # a tensor (its dtype decides the compute dtype)
    dt = compute_dtype(z=z, values=values, uniform=uniform)
    backend, impl = select("gumbel_quantize", z.device, dt)
    z2 = upcast(z if z.dim() == 2 else z.reshape(-1, z.shape[-1]), dt)
    k = vals.shape[-1]
    # the noise's (N, d, K) shape, dtype and device, as a view (nothing is materialized)
    u = upcast(_uniform(uniform, (*z.shape, k), z2[:, :, None].expand(-1, -1, k), generator), dt)
    _check_noise_values(uniform, backend)
    with no_autocast(z.device):
        z_q, y, logits, kl = impl(z2, upcast(vals, dt), u, float(tau), bool(hard))
    z_q, y, logits = upcast(z_q, z.dtype), upcast(y, z.dtype), upcast(logits, z.dtype)
    if z.dim() == 2:
        return GumbelQuantized(z_q, y, logits, kl)
    return GumbelQuantized(
        z_q.reshape(z.shape), y.reshape(*z.shape, k), logits.reshape(*z.shape, k), kl.reshape(z.shape)
    )


def categorical_latent(
    logits: torch.Tensor,
    values: torch.Tensor | None = None,
    *,
    tau: float = 1.0,
    noise_scale: float = 1.0,
    hard: bool = False,
    generator: torch.Generator | None = None,
    uniform: torch.Tensor | None = None,
) -> CategoricalSample:
    """D-VAE's categorical latent over fixed scalar values.

    y = softmax((logits + noise_scale * Gumbel) / tau) (straight-through one-hot when ``hard``),
    z = sum_k y_k values_k, kl = KL(softmax(logits) || Uniform(K)).

    Args:
        logits: (..., d, K) float: K categories per latent.
        values: (K,) values shared by all latents, or (d, K): one set per latent; None: linspace(-1, 1, K).
        tau: the softmax temperature (> 0).
        noise_scale: the Gumbel noise's factor (>= 0; 0: no noise, the evaluation setting).
        hard: straight-through one-hot y (of its argmax): z is one of the values, the gradients are the
            relaxed ones.
        generator: the source of the Gumbel noise (None: the global RNG), as in :func:`gumbel_quantize`;
            unused with ``uniform`` or ``noise_scale`` 0.
        uniform: (..., d, K) explicit uniform noise in [0, 1) replacing the draw (as in
            :func:`gumbel_quantize`); unused with ``noise_scale`` 0.

    Returns:
        :class:`CategoricalSample` (z (..., d), y (..., d, K), kl (..., d)); half-precision logits:
        computed in float32, z and y in the logits' dtype, kl float32.

    Raises:
        ValueError: values without K entries, tau <= 0 or noise_scale < 0.

    Launches on the triton backend, forward + backward: 3 without noise, 4 with (the noise draw;
    one forward kernel; one backward kernel and one codebook-gradient reduction). The default
    values are made once per (K, dtype, device).

    Examples:
        Equal logits without noise: y is uniform, z the mean of linspace(-1, 1, K) (0 up to float32
        rounding: the cpu kernel sums in another order than the reference) and kl zero.

        >>> import torch
        >>> import qkernels
        >>> s = qkernels.categorical_latent(torch.zeros(1, 2, 5), noise_scale=0.0)
        >>> s.y[0, 0], bool(s.z.abs().max() < 1e-7), s.kl.abs().max()
        (tensor([0.2000, 0.2000, 0.2000, 0.2000, 0.2000]), True, tensor(0.))
    """
    check_tensor("logits", logits, min_ndim=2, finite=False)
    k = logits.shape[-1]
    given = values is not None
    if values is None:
        # made once per (K, dtype, device)
        values = lib.constant(
            "linspace", logits, lambda: torch.linspace(-1, 1, k, device=logits.device, dtype=logits.dtype), k
        )
    vals = _codebook("values", values, logits.shape[-2], finite=False)
    check_same("logits", logits, "values", values, dtype=False)
    if vals.shape[-1] != k:
        raise ValueError(f"values must have K = {k} entries (logits' last dim), got {tuple(values.shape)}")
    check_positive("tau", tau)
    check_positive("noise_scale", noise_scale, minimum=0)
    lg = logits if logits.dim() == 3 else logits.reshape(-1, logits.shape[-2], k)
    noise = uniform if noise_scale > 0 else None
    if noise is not None:
        check_tensor("uniform", noise, finite=False)  # a tensor (its dtype decides the compute dtype)
    dt = compute_dtype(logits=lg, values=vals, uniform=noise)  # qkernels._precision
    backend, impl = select("relaxed_categorical", lg.device, dt)
    u = None
    if noise_scale > 0:
        u = _uniform(uniform, tuple(logits.shape), lg, generator)
        _check_noise_values(uniform, backend)
    if backend not in SELF_CHECKING:
        check_finite("logits", logits)
        if given:  # the default values are ours
            check_finite("values", values)
    with no_autocast(lg.device):
        z, y, kl = impl(
            upcast(lg, dt),
            upcast(vals, dt),
            None if u is None else upcast(u, dt),
            float(tau),
            float(noise_scale),
            bool(hard),
        )
    z, y = upcast(z, logits.dtype), upcast(y, logits.dtype)  # kl in the compute dtype
    if logits.dim() == 3:
        return CategoricalSample(z, y, kl)
    lead = logits.shape[:-1]
    return CategoricalSample(z.reshape(lead), y.reshape(logits.shape), kl.reshape(lead))
