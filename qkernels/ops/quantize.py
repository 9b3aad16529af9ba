"""Quantization hot path: op registration (fake + autograd), dispatch and the functional API.

Ops (``torch.ops.qkernels``; the ``*_triton`` twins wrap the launchers of
:mod:`qkernels.triton.quantize`; how an op is put together: :mod:`qkernels.ops._library`):

- ``latent_quantize(z (N, d), values (G, n_v)) -> (z_q, indices, loss_quantize, loss_commit)``
- ``relaxed_categorical(logits (N, d, K), values (G, K), uniform?, tau, noise_scale, hard)
  -> (z (N, d), y (N, d, K), kl (N, d))``
- ``gumbel_quantize(z (N, d), values (G, K), uniform?, tau, hard) -> (z_q (N, d), y (N, d, K),
  logits (N, d, K), kl (N, d))``: relaxed_categorical of logits = -(z - values)^2 (reference and
  triton only; ``cpu`` / ``cuda`` compose torch logits with their relaxed_categorical kernel)

with G = 1 (a global codebook) or G = d (one codebook per latent), each with a ``*_backward`` op
that recomputes instead of saving (N, d, n_v) intermediates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from qkernels._backend import SELF_CHECKING, implementations, register, select
from qkernels._precision import compute_dtype, no_autocast, upcast
from qkernels._validation import check_finite, check_levels, check_positive, check_same, check_tensor, value_checks
from qkernels.ops import _library as lib
from qkernels.ops._library import zeros_if_none
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


_CONSTANTS: dict[tuple[object, ...], torch.Tensor] = {}


def _constant(name: str, like: torch.Tensor, make: Callable[[], torch.Tensor], *key: object) -> torch.Tensor:
    """A read-only tensor ``make()`` in ``like``'s dtype and device, made once per (name, key,
    dtype, device): no launch per call. Made afresh while compiling (inductor fuses it), for tensor
    subclasses (fake, functional) and while a CUDA graph is captured (its kernels run only when the
    graph does). Never hand one out to the user: it is shared."""
    if torch.compiler.is_compiling() or type(like) not in (torch.Tensor, torch.nn.Parameter):
        return make()
    full_key = (name, *key, like.dtype, like.device)
    t = _CONSTANTS.get(full_key)
    if t is None:
        with torch.inference_mode(False):  # can be saved for backward outside inference mode too
            t = make()
        capturing = like.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if type(t) is torch.Tensor and not capturing:  # not made by a fake-tensor mode
            _CONSTANTS[full_key] = t
    return t


# ----------------------------------------------------------------------------- op definitions
# One block per op: fake + autograd (wire_*), raw-argument checks of its Triton ops, backends.

_tk = lib.triton_kernels("quantize")


def _check_codebook(x: torch.Tensor, values: torch.Tensor, name: str, op: str) -> None:
    """x (N, d) (latent_quantize) or (N, d, K) (relaxed_categorical); values (1 or d, n_v)."""
    if x.dim() not in (2, 3) or x.numel() == 0:
        lib.fail(op, f"{name} must be a non-empty (N, d{', K' if x.dim() == 3 else ''}), got {tuple(x.shape)}")
    lib.floating(x, name, op)
    d = x.shape[1]
    if values.dim() != 2 or values.shape[0] not in (1, d) or values.shape[1] < 1 or (
        x.dim() == 3 and values.shape[1] != x.shape[2]
    ):
        lib.fail(op, f"values must be (1, n_v) or (d, n_v) with d = {d} (n_v = K for logits), "
                 f"got {tuple(values.shape)}")
    lib.like(values, "values", x, name, op)


# ------------------------------ latent_quantize


def wire_latent_quantize(fwd: str, bwd: str) -> None:
    """Register fake implementations and autograd for a latent_quantize op pair."""

    @torch.library.register_fake(fwd)
    def _(z, values):
        return z.new_empty(z.shape), z.new_empty(z.shape, dtype=torch.long), z.new_empty(()), z.new_empty(())

    @torch.library.register_fake(bwd)
    def _(grad_zq, grad_lq, grad_lc, z, values, indices):
        return torch.empty_like(z), torch.empty_like(values)

    backward_op = lib.op_callable(bwd)

    def setup_context(ctx, inputs, output):
        z, values = inputs
        ctx.save_for_backward(z, values, output[1])
        ctx.set_materialize_grads(False)  # no zeros for the indices' (int64) gradient

    def backward(ctx, grad_zq, _grad_indices, grad_lq, grad_lc):
        z, values, indices = ctx.saved_tensors
        # nothing launches here when every upstream gradient is given; a missing loss gradient
        # is a zero scalar made once per (dtype, device)
        return backward_op(
            zeros_if_none(grad_zq, z),
            _constant("zero", z, lambda: z.new_zeros(())) if grad_lq is None else grad_lq,
            _constant("zero", z, lambda: z.new_zeros(())) if grad_lc is None else grad_lc,
            z,
            values,
            indices,
        )

    lib.register_autograd(fwd, backward, setup_context)


def check_latent_quantize(z, values, op="latent_quantize_triton"):
    _check_codebook(z, values, "z", op)


def check_latent_quantize_backward(grad_zq, grad_lq, grad_lc, z, values, indices, op="latent_quantize_backward_triton"):
    _check_codebook(z, values, "z", op)
    if grad_zq.shape != z.shape or indices.shape != z.shape:
        lib.fail(op, f"grad_zq and indices must be shaped like z {tuple(z.shape)}, got "
                 f"{tuple(grad_zq.shape)} and {tuple(indices.shape)}")
    lib.like(grad_zq, "grad_zq", z, "z", op)
    lib.index(indices, "indices", z, op)
    lib.scalar_grad(grad_lq, "grad_loss_quantize", z, op)
    lib.scalar_grad(grad_lc, "grad_loss_commit", z, op)


lib.define_backends(
    "latent_quantize", reference=ref.latent_quantize, wire=wire_latent_quantize,
    triton=_tk, checks=(check_latent_quantize, check_latent_quantize_backward),
)


# ------------------------------ relaxed_categorical


def wire_relaxed_categorical(fwd: str, bwd: str) -> None:
    """Register fake implementations and autograd for a relaxed_categorical op pair."""

    @torch.library.register_fake(fwd)
    def _(logits, values, uniform, tau, noise_scale, hard):
        n, d, _k = logits.shape
        return logits.new_empty(n, d), torch.empty_like(logits), logits.new_empty(n, d)

    @torch.library.register_fake(bwd)
    def _(grad_z, grad_y, grad_kl, logits, values, uniform, y, tau, noise_scale):
        return torch.empty_like(logits), torch.empty_like(values)

    backward_op = lib.op_callable(bwd)

    def setup_context(ctx, inputs, output):
        logits, values, uniform, tau, noise_scale, _hard = inputs
        ctx.save_for_backward(logits, values, uniform, output[1])
        ctx.tau, ctx.noise_scale = tau, noise_scale
        ctx.set_materialize_grads(False)

    def backward(ctx, grad_z, grad_y, grad_kl):
        logits, values, uniform, y = ctx.saved_tensors
        row = logits[..., 0]
        grads = backward_op(
            zeros_if_none(grad_z, row),
            zeros_if_none(grad_y, logits),
            zeros_if_none(grad_kl, row),
            logits,
            values,
            uniform,
            y,
            ctx.tau,
            ctx.noise_scale,
        )
        return grads[0], grads[1], None, None, None, None

    lib.register_autograd(fwd, backward, setup_context)


def check_relaxed_categorical(logits, values, uniform, tau, noise_scale, hard, op="relaxed_categorical_triton"):
    if logits.dim() != 3:
        lib.fail(op, f"logits must be (N, d, K), got {tuple(logits.shape)}")
    _check_codebook(logits, values, "logits", op)
    if uniform is not None:
        if uniform.shape != logits.shape:
            lib.fail(op, f"uniform must be shaped like logits {tuple(logits.shape)}, got {tuple(uniform.shape)}")
        lib.like(uniform, "uniform", logits, "logits", op)


def check_relaxed_categorical_backward(grad_z, grad_y, grad_kl, logits, values, uniform, y, tau, noise_scale):
    op = "relaxed_categorical_backward_triton"
    check_relaxed_categorical(logits, values, uniform, tau, noise_scale, False, op)
    if grad_z.shape != logits.shape[:2] or grad_kl.shape != logits.shape[:2]:
        lib.fail(op, f"grad_z and grad_kl must be (N, d) = {tuple(logits.shape[:2])}")
    if grad_y.shape != logits.shape or y.shape != logits.shape:
        lib.fail(op, f"grad_y and y must be shaped like logits {tuple(logits.shape)}")
    for name, t in (("grad_z", grad_z), ("grad_y", grad_y), ("grad_kl", grad_kl), ("y", y)):
        lib.like(t, name, logits, "logits", op)


lib.define_backends(
    "relaxed_categorical", reference=ref.relaxed_categorical, wire=wire_relaxed_categorical,
    triton=_tk, checks=(check_relaxed_categorical, check_relaxed_categorical_backward),
)


# ------------------------------ gumbel_quantize


def wire_gumbel_quantize(fwd: str, bwd: str) -> None:
    """Register fake implementations and autograd for a gumbel_quantize op pair."""

    @torch.library.register_fake(fwd)
    def _(z, values, uniform, tau, hard):
        n, d = z.shape
        k = values.shape[1]
        return z.new_empty(n, d), z.new_empty(n, d, k), z.new_empty(n, d, k), z.new_empty(n, d)

    @torch.library.register_fake(bwd)
    def _(grad_zq, grad_y, grad_logits, grad_kl, z, values, uniform, y, tau):
        return torch.empty_like(z), torch.empty_like(values)

    backward_op = lib.op_callable(bwd)

    def setup_context(ctx, inputs, output):
        z, values, uniform, tau, _hard = inputs
        ctx.save_for_backward(z, values, uniform, output[1])
        ctx.tau = tau
        ctx.set_materialize_grads(False)

    def backward(ctx, grad_zq, grad_y, grad_logits, grad_kl):
        z, values, uniform, y = ctx.saved_tensors
        # upstream gradients stay None for unused outputs: the kernel skips them (no zeros made)
        grads = backward_op(grad_zq, grad_y, grad_logits, grad_kl, z, values, uniform, y, ctx.tau)
        return grads[0], grads[1], None, None, None

    lib.register_autograd(fwd, backward, setup_context)


def check_gumbel_quantize(z, values, uniform, tau, hard, op="gumbel_quantize_triton"):
    if z.dim() != 2:
        lib.fail(op, f"z must be (N, d), got {tuple(z.shape)}")
    _check_codebook(z, values, "z", op)
    if not tau > 0:
        lib.fail(op, f"tau must be > 0, got {tau}")
    if uniform is not None:
        want = (*z.shape, values.shape[1])
        if tuple(uniform.shape) != want:
            lib.fail(op, f"uniform must be (N, d, K) = {want}, got {tuple(uniform.shape)}")
        lib.like(uniform, "uniform", z, "z", op)


def check_gumbel_quantize_backward(grad_zq, grad_y, grad_logits, grad_kl, z, values, uniform, y, tau):
    op = "gumbel_quantize_backward_triton"
    check_gumbel_quantize(z, values, uniform, tau, False, op)
    rows, cats = tuple(z.shape), (*z.shape, values.shape[1])
    for name, t, want in (("grad_zq", grad_zq, rows), ("grad_y", grad_y, cats), ("grad_logits", grad_logits, cats),
                          ("grad_kl", grad_kl, rows), ("y", y, cats)):
        if t is None:  # an upstream gradient left out: zero
            continue
        if tuple(t.shape) != want:
            lib.fail(op, f"{name} must have shape {want}, got {tuple(t.shape)}")
        lib.like(t, name, z, "z", op)


lib.define_backends(
    "gumbel_quantize", reference=ref.gumbel_quantize, wire=wire_gumbel_quantize,
    triton=_tk, checks=(check_gumbel_quantize, check_gumbel_quantize_backward),
)
# no C++ kernel of its own: a forced cpu / cuda backend composes torch logits with its
# relaxed_categorical kernel (auto picks it on a CPU, as for relaxed_categorical)
for _name, _relaxed_impl in implementations("relaxed_categorical").items():
    if _name in ("cpu", "cuda"):
        register("gumbel_quantize", _name)(functools.partial(ref.gumbel_quantize, relaxed=_relaxed_impl))


# ----------------------------------------------------------------------------- functional API


def _codebook(name: str, values: torch.Tensor, d: int, *, finite: bool = True, z: torch.Tensor | None = None
              ) -> torch.Tensor:
    """(n_v,) or (d, n_v) -> (G, n_v) (values checked unless ``finite`` is False); ``z``: the (..., d) latents,
    blamed when 1-D (one sample, most likely a batch without its latent dimension)."""
    check_tensor(name, values, ndim=(1, 2), finite=finite)
    if values.dim() == 1:
        return values[None]
    if values.shape[0] != d and z is not None and z.dim() == 1:
        g = values.shape[0]
        raise ValueError(
            f"z must be (..., d) with d = {g}, the number of per-latent codebooks in {name} {tuple(values.shape)}; "
            f"got a 1-D z of shape {tuple(z.shape)}, which reads as one sample of {d} latents (n samples of {g} "
            f"latents: shape (n, {g}); one latent per sample: z[:, None] with a (1, n_v) or (n_v,) {name})"
        )
    if values.shape[0] != d:
        raise ValueError(
            f"{name} must be (n_v,) or (d, n_v) with d = {d} (the last dimension of the latents), "
            f"got shape {tuple(values.shape)}"
        )
    return values


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
        raise ValueError(f"{err}; z has shape {tuple(z.shape)} and d is its last axis: if its {n} latents are "
                         f"along axis {k}, move them last with z.movedim({k}, -1) or use "
                         f"qkernels.nn.FSQ(levels, dim={k})") from None
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
        values = _constant("linspace", logits, lambda: torch.linspace(
            -1, 1, k, device=logits.device, dtype=logits.dtype), k)
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
        z, y, kl = impl(upcast(lg, dt), upcast(vals, dt), None if u is None else upcast(u, dt), float(tau),
                        float(noise_scale), bool(hard))
    z, y = upcast(z, logits.dtype), upcast(y, logits.dtype)  # kl in the compute dtype
    if logits.dim() == 3:
        return CategoricalSample(z, y, kl)
    lead = logits.shape[:-1]
    return CategoricalSample(z.reshape(lead), y.reshape(logits.shape), kl.reshape(lead))

