"""Hessian hot path: the backends of its ops and the functional API.

The ops (``torch.ops.qkernels.perturbed_batch``, ``finite_difference_curvature``, ``curvature_penalty``, each
with a ``*_backward`` op, and their ``*_triton`` twins) are declared in :mod:`qkernels.decl.hessian`; how an op is
put together: :mod:`qkernels.ops._library`.

The curvature forward reads every stacked activation once and writes ``groups * n`` scalars; its
backward recomputes the per-element means and writes the gradient of the stacked activations in
one pass. Semantics: :mod:`qkernels.reference.hessian`. On the ``triton`` backend every op of the
penalties is one launch forward and one backward, so a penalty's forward + backward costs 7
launches beyond ``fn``'s own (the random draws, then those three ops each way). ``perturbed_batch``
and ``curvature_penalty`` have no C++ kernels: with the ``cpu`` / ``cuda`` curvature op the
penalties use their reference.

Why ``fn`` is never evaluated at ``z``: every second difference of an activation element,
fd_l = (f(z + h_l) - 2 f(z) + f(z - h_l)) / eps^2, contains the same center term -2 f(z) / eps^2,
and a variance over l is invariant to a common shift, so
var_l(fd_l) = var_l(f(z + h_l) + f(z - h_l)) / eps^4 exactly. Both penalties (Tripod's NHP and
Peebles et al.'s) are variances over directions, so the center rows of the stacked batch carry no
information; dropping them saves n of the n * (1 + 2k * groups) rows (1/9 of the decoder work for
NHP at k = 2) and one subtraction whose rounding matches the variance's own mean subtraction.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import torch

from qkernels._args import (
    check_choice,
    check_curvature,
    check_eps,
    check_fd_dtype,
    check_perturbations,
    check_positive,
)
from qkernels._backend import Kernel, implementations, select
from qkernels._precision import compute_dtype, no_autocast, upcast
from qkernels._validation import check_finite, check_same, check_std, check_tensor
from qkernels.decl import hessian as decl
from qkernels.distributed import rank_and_size, rank_rows
from qkernels.ops import _library as lib
from qkernels.reference import hessian as ref

if TYPE_CHECKING or torch.distributed.is_available():  # typing.get_type_hints resolves it at run time
    from torch.distributed import ProcessGroup

# what ``fn`` of the penalties returns: one activation tensor, a list/tuple or a dict of them
Activations: TypeAlias = torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
# ``reduction="none"``: per-sample values (n,) in fn's structure
PerSample: TypeAlias = torch.Tensor | list[torch.Tensor] | dict[str, torch.Tensor]

NHP_DENOM_EPS = ref.NHP_DENOM_EPS  # Tripod: mean(numerator) / (mean(denominator) + 1e-10)
# normalized_hessian_penalty's check of its denominators (_warn_at_floor): "warned" after its one warning; "device"
# after the one check of GPU values (a read-back, never repeated in a training loop: tests/test_launches.py)
_FLOOR_CHECK = {"warned": False, "device": False}

# ----------------------------------------------------------------------------- backends
# (signatures, fake implementations, autograd and raw-argument checks: the declarations in qkernels.decl.hessian)

_tk = lib.triton_kernels("hessian")
lib.define_backends(
    decl.FINITE_DIFFERENCE_CURVATURE,
    reference=ref.finite_difference_curvature,
    triton=None if _tk is None else (_tk.finite_difference_curvature, _tk.finite_difference_curvature_backward),
)
lib.define_backends(
    decl.PERTURBED_BATCH,
    reference=ref.perturbed_batch,
    triton=None if _tk is None else (_tk.perturbed_batch, _tk.perturbed_batch_backward),
)
lib.define_backends(
    decl.CURVATURE_PENALTY,
    reference=ref.curvature_penalty,
    triton=None if _tk is None else (_tk.curvature_penalty, _tk.curvature_penalty_backward),
)


# ----------------------------------------------------------------------------- validation helpers


def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype)


def _backend(t: torch.Tensor) -> str:
    """The backend of the curvature op for ``t``; the penalties' other ops follow it."""
    return select("finite_difference_curvature", t.device, t.dtype)[0]


def _op(op: str, backend: str) -> Kernel:
    """``op``'s implementation on ``backend``, its reference where it has none (cpu, cuda)."""
    impls = implementations(op)
    return impls.get(backend, impls["reference"])


def _curvature(a: torch.Tensor, n: int, k: int, eps: float, groups: int, unbiased: bool, reduce: str) -> torch.Tensor:
    _, impl = select("finite_difference_curvature", a.device, a.dtype)
    values: torch.Tensor = impl(a, n, k, eps, groups, unbiased, reduce)[0]
    return values


def _penalty(values: torch.Tensor, ratio: bool, reduction: str) -> torch.Tensor:
    penalty: torch.Tensor = _op("curvature_penalty", _backend(values))(values, ratio, reduction)
    return penalty


def _warn_at_floor(values: torch.Tensor, name: str) -> None:
    """Warn (once per process) when (2, n) numerator / denominator values have positive numerators over
    denominators at or below the constant added to them (NHP_DENOM_EPS): the penalty is then that constant's doing,
    not fn's. Eager calls only; CPU values
    are read in place (NumPy: no kernel, no dispatch) at every call until the warning, GPU values at the first call
    only (one read-back)."""
    if _FLOOR_CHECK["warned"] or torch.compiler.is_compiling():
        return
    pair = values.detach()
    if type(pair) is not torch.Tensor or pair.device.type == "meta":  # fake / meta tensors: nothing to read
        return
    try:
        if pair.device.type != "cpu":
            if _FLOOR_CHECK["device"]:
                return
            _FLOOR_CHECK["device"] = True
            pair = pair.cpu()
        num, den = pair.numpy()
    except (RuntimeError, TypeError, NotImplementedError):  # no storage to read (torch.func transforms)
        return
    floored = int(((den <= NHP_DENOM_EPS) & (num > 0)).sum())  # 0 / floor is 0: no curvature, no harm
    if floored:
        _FLOOR_CHECK["warned"] = True
        warnings.warn(
            f"normalized_hessian_penalty: the denominator of {name} (the curvature along the Gaussian directions) "
            f"is at or below its floor {NHP_DENOM_EPS:g} for {floored} of {den.size} samples, so the penalty "
            "there is the numerator divided by that constant (1e5-1e9 values), not a property of fn. fn is most "
            "likely piecewise linear (ReLU, LeakyReLU) at the scale eps * std: use a smooth activation (GELU, as "
            "Tripod) or a larger eps. (Warned once per process.)",
            RuntimeWarning,
            stacklevel=3,
        )


def _total(per: list[torch.Tensor]) -> torch.Tensor:
    """The sum over fn's entries (no launch for one entry)."""
    total = per[0]
    for p in per[1:]:
        total = total + p
    return total


def finite_difference_curvature(
    stacked: torch.Tensor,
    n: int,
    num_perturbations: int,
    eps: float,
    *,
    groups: int = 2,
    unbiased: bool = False,
    reduce: str = "mean",
) -> torch.Tensor:
    """Fused reduction of a stacked finite-difference batch to per-sample curvature statistics.

    Args:
        stacked: (R, ...) activations of ``fn`` on the stacked batch; trailing dims are flattened
            to M columns. R = n * 2k * groups rows [group 0: f(z + h_1), f(z - h_1), ...,
            f(z + h_k), f(z - h_k); group 1: ...] (blocks of n rows), or n * (1 + 2k * groups) with
            the center rows f(z) first (they cancel from the variance and get a zero gradient).
        n: the batch size (rows per block).
        num_perturbations: k >= 2 directions per group.
        eps: the finite-difference step (> 0): second differences are divided by eps^2.
        groups: 2 for NHP (Rademacher group = numerator, Gaussian group = denominator), 1 for HP.
        unbiased: variance over directions with divisor k - 1 (HP) instead of k (NHP).
        reduce: "mean" or "max" over the M columns of each sample.

    Returns:
        (groups, n) in ``stacked``'s dtype, float32 or float64. Per group and sample,
        reduce_c var_l((f(z+h_l) - 2 f(z) + f(z-h_l)) / eps^2).

    Raises:
        TypeError: float16 / bfloat16 ``stacked``: its rounding is as large as the curvature.
        ValueError: R not n * 2k * groups (or n * (1 + 2k * groups)), k < 2, eps <= 0, or another ``reduce``.

    Examples:
        One sample, k = 2 directions, f(z +- h_1) = 1 and f(z +- h_2) = 3 (f(z) cancels): second
        differences 2 and 6 (times 1 / eps^2 = 1), population variance 4, unbiased 8.

        >>> import torch
        >>> import qkernels
        >>> stacked = torch.tensor([[1.0], [1.0], [3.0], [3.0]])
        >>> qkernels.finite_difference_curvature(stacked, 1, 2, 1.0, groups=1)
        tensor([[4.]])
        >>> qkernels.finite_difference_curvature(stacked, 1, 2, 1.0, groups=1, unbiased=True)
        tensor([[8.]])
    """
    check_tensor("stacked", stacked, min_ndim=1, finite=False)
    check_fd_dtype("stacked", _dtype_name(stacked))
    k, eps = check_curvature(stacked.shape[0], n, num_perturbations, eps, groups, reduce)
    return _curvature(stacked.reshape(stacked.shape[0], -1), n, k, eps, groups, bool(unbiased), reduce)


# ----------------------------------------------------------------------------- penalties


def _call_fn(
    fn: Callable[[torch.Tensor], Activations], zs: torch.Tensor, chunk_size: int | None
) -> tuple[Any, list[torch.Tensor]]:
    """fn on the stacked batch (in row chunks when ``chunk_size``): (structure, list of entries)."""
    with no_autocast(zs.device):  # finite differences need float32 activations (qkernels._precision)
        if chunk_size is None:
            return _flatten(fn(zs))
        parts = [_flatten(fn(c)) for c in zs.split(chunk_size)]
    keys = parts[0][0]
    for kp, ep in parts[1:]:
        if kp != keys or len(ep) != len(parts[0][1]):
            raise ValueError("fn must return the same structure (tensor / list / dict) for every chunk")
    entries = [torch.cat([p[1][e] for p in parts]) for e in range(len(parts[0][1]))]
    return keys, entries


def _flatten(out: object) -> tuple[Any, list[torch.Tensor]]:
    if isinstance(out, torch.Tensor):
        return None, [out]
    if isinstance(out, Mapping):
        return tuple(out.keys()), list(out.values())
    if isinstance(out, Sequence) and not isinstance(out, str):
        return len(out), list(out)
    raise TypeError(f"fn must return a tensor, a list/tuple or a dict of tensors, got {type(out).__name__}")


def _unflatten(keys: Any, values: list[torch.Tensor]) -> PerSample:
    if keys is None:
        return values[0]
    if isinstance(keys, tuple):
        return dict(zip(keys, values, strict=True))
    return values


def _check_outputs(keys: Any, entries: list[torch.Tensor], rows: int, z: torch.Tensor) -> list[torch.Tensor]:
    if not entries:
        raise ValueError("fn returned no tensors")
    names = (
        [f"fn output {k!r}" for k in keys]
        if isinstance(keys, tuple)
        else (["fn output"] if keys is None else [f"fn output [{e}]" for e in range(len(entries))])
    )
    out = []
    for name, a in zip(names, entries, strict=True):
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(a).__name__}")
        if not a.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {a.dtype}")
        check_fd_dtype(name, _dtype_name(a))
        if a.dim() == 0 or a.shape[0] != rows:
            raise ValueError(
                f"{name} must have the stacked batch ({rows} rows) as its first dimension, "
                f"got shape {tuple(a.shape)}; fn must map latents (N, d) to activations (N, ...)"
            )
        if a.numel() == 0:
            raise ValueError(f"{name} must not be empty, got shape {tuple(a.shape)}")
        if a.device != z.device:
            raise ValueError(f"{name} is on {a.device} but z is on {z.device}")
        check_finite(name, a)  # a NaN / inf activation would make the penalty NaN (qkernels.jax checks it too)
        out.append(a.reshape(rows, -1))
    return out


def _check_common(
    fn: object, z: torch.Tensor, num_perturbations: int, eps: float, chunk_size: int | None
) -> tuple[int, float]:
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    check_tensor("z", z, ndim=2)
    k, eps = check_perturbations(num_perturbations, eps)
    if chunk_size is not None:
        check_positive("chunk_size", chunk_size, integer=True)
    return k, eps


def _draws(
    count: int, z: torch.Tensor, generator: torch.Generator | None, group: ProcessGroup | None = None
) -> torch.Tensor:
    """(count, n, d) standard normals in ONE draw (the raw numbers of the directions; Rademacher
    signs are the signs of the first ones, taken by :func:`perturbed_batch`), drawn on the
    generator's device (a CPU generator gives the same directions for CPU and CUDA latents) and
    moved to z's device without blocking the host. Under a data-parallel ``group``: this rank's
    rows of the draws of the global batch (world x n rows), as one process would draw them."""
    _, world = rank_and_size(group) if group is not None else (0, 1)
    shape = (count, world * z.shape[0], *z.shape[1:])
    # no generator=None keyword: it fails torch.compile with dynamic shapes
    kw = {"device": z.device} if generator is None else {"device": generator.device, "generator": generator}
    u = torch.randn(shape, dtype=z.dtype, **kw)
    if group is not None:
        u = rank_rows(u, group, dim=1)
    return u.to(z.device, non_blocking=True)


def perturbed_batch(
    z: torch.Tensor,
    draws: torch.Tensor,
    std: torch.Tensor | None = None,
    eps: float = 0.1,
    *,
    signs: int = 0,
    scale: str | None = None,
) -> torch.Tensor:
    """The stacked finite-difference batch of the Hessian penalties, (2 D n, d).

    Rows [z + h_1; z - h_1; ...; z + h_D; z - h_D] (blocks of n rows), h_l = u_l * (eps * s):
    u_l = sign(draws[l]) (+1 where >= 0) for l < ``signs`` (Rademacher), draws[l] otherwise; s = std
    (d,) when given (``scale`` "std", the default then), the population std of z + 1e-6 computed
    in the op and differentiable in z (``scale`` "population", the default without std), or 1
    (``scale`` "one"). z: (n, d); draws: (D, n, d) standard normals (constants). Gradients reach z
    and std. The triton backend makes one launch forward and one backward.
    """
    check_tensor("z", z, ndim=2)
    scale = scale or ("population" if std is None else "std")
    check_choice("scale", scale, ref.SCALES)
    check_tensor("draws", draws, ndim=3)
    check_same("draws", draws, "z", z, dtype=False)
    if tuple(draws.shape[1:]) != tuple(z.shape):
        raise ValueError(f"draws must be (D, n, d) with (n, d) = {tuple(z.shape)}, got {tuple(draws.shape)}")
    if isinstance(signs, bool) or not isinstance(signs, int) or not 0 <= signs <= draws.shape[0]:
        raise ValueError(f"signs must be in [0, D = {draws.shape[0]}], got {signs}")
    eps = check_eps(eps)
    if scale == "std":
        if std is None:
            raise ValueError('scale "std" needs std')
        std = check_std(std, z)
    else:
        std = None
    dtype = compute_dtype(z=z, draws=draws, std=std)
    z, draws = upcast(z, dtype), upcast(draws, dtype)
    std = None if std is None else upcast(std, dtype)
    stacked: torch.Tensor = _op("perturbed_batch", _backend(z))(z, draws, std, eps, signs, scale)
    return stacked


def curvature_penalty(values: torch.Tensor, *, ratio: bool, reduction: str = "mean") -> torch.Tensor:
    """Per-sample curvature values (groups, n) (``finite_difference_curvature``) to the penalty.

    ratio=True (NHP, groups = 2): p_i = values[0, i] / (values[1, i] + 1e-10); ratio=False (HP,
    groups = 1): p_i = values[0, i]. reduction "mean" -> mean_i p_i, "max" -> max_i p_i
    (``Tensor.max()``: NaN if any is, gradient shared evenly by ties), "none" -> p (n,). The triton
    backend makes one launch forward and one backward.
    """
    check_tensor("values", values, ndim=2, finite=False)
    check_fd_dtype("values", _dtype_name(values))
    check_choice("reduction", reduction, ("mean", "max", "none"))
    if values.shape[0] != (2 if ratio else 1) or values.shape[1] < 1:
        raise ValueError(f"values must be ({2 if ratio else 1}, n) with ratio={bool(ratio)}, got {tuple(values.shape)}")
    return _penalty(values, bool(ratio), reduction)


def normalized_hessian_penalty(
    fn: Callable[[torch.Tensor], Activations],
    z: torch.Tensor,
    std: torch.Tensor | float | None = None,
    *,
    num_perturbations: int = 2,
    eps: float = 0.1,
    generator: torch.Generator | None = None,
    reduction: str = "mean",
    chunk_size: int | None = None,
    group: ProcessGroup | None = None,
) -> PerSample:
    """Tripod's normalized Hessian penalty (Section 3.3, Prop. 3.2, Algorithm 1).

    Directions v_l = eps * std * r_l (r Rademacher) and w_l = eps * std * g_l (g ~ N(0, 1)), k of
    each per sample; second differences fd = (f(z + h) - 2 f(z) + f(z - h)) / eps^2; numerator =
    population variance over the k Rademacher fds, denominator likewise over the Gaussian ones;
    per entry and sample mean(numerator) / (mean(denominator) + 1e-10) (means over the entry's
    activation elements); batch mean; summed over entries.

    ``fn`` is called ONCE on the stacked batch [z + v_1; z - v_1; ...; z + v_k; z - v_k; z + w_1;
    z - w_1; ...; z + w_k; z - w_k] of 4k n rows (in row chunks of ``chunk_size`` when given) and
    never on z itself: f(z) cancels exactly from a variance over directions (see the module doc),
    so there is no center pass to share with the model's own forward.
    fn must be deterministic across the stacked rows (no dropout, no noise, eval-mode batch
    norm): rows are compared with each other. The estimator assumes fn is smooth at the scale
    eps * std (Tripod's decoder is GELU throughout): with piecewise-linear activations (ReLU,
    LeakyReLU) the finite differences straddle kinks, the Gaussian denominator can nearly vanish
    and values of 1e5-1e6 occur (measured at initialisation: 13-959 per entry with ReLU vs
    1.2-1.8 with GELU).

    Args:
        fn: maps latents (N, d) to one activation tensor (N, ...) or a list/tuple or dict of them.
        z: (n, d) latents (Tripod: the quantized ones). Gradients reach z, std and fn's parameters.
        std: (d,) positive per-latent scales, or one scale (a number or 0-d tensor) for every
            latent. Default: the population std of z itself, z.std(0, correction=0) + 1e-6
            (differentiable in z); Tripod passes the std of the continuous (pre-quantization)
            latents plus 1e-6 instead.
        num_perturbations: k >= 2 Rademacher and k Gaussian directions per sample.
        eps: the finite-difference step (> 0), relative to each latent's std.
        generator: draws ONE (2k, n, d) block of standard normals (None: the global RNG): the signs
            of the first k are the Rademacher directions r (+1 where >= 0: +-1 with probability 1/2
            each, as a randint draw), the other k the Gaussian ones g.
        reduction: "mean" (a scalar) or "none": per-entry, per-sample values (n,), in fn's
            structure (a tensor, a list, or a dict).
        chunk_size: at most this many rows per fn call (bounds the per-call batch).
        group: a data-parallel ``torch.distributed`` group whose ranks hold equal shards of one batch
            and share their RNG state: the directions are this rank's rows of those one process
            would draw for the whole batch (the value stays this rank's mean).

    Returns:
        A scalar ("mean") or per-entry (n,) values ("none"), in fn's activations' dtype.

    Raises:
        TypeError: half-precision activations.
        ValueError: k < 2, eps <= 0, a misshaped ``std`` or another ``reduction``.

    Precision: fn is called on float32 latents (half-precision z is cast) with autocast off;
    half-precision activations are a TypeError (:mod:`qkernels._precision`).

    Examples:
        A separable fn (elementwise z^2, diagonal Hessian) has penalty 0; z_1 z_2 does not.

        >>> import torch
        >>> import qkernels
        >>> _ = torch.manual_seed(0)
        >>> z = torch.randn(8, 2, dtype=torch.float64)
        >>> float(qkernels.normalized_hessian_penalty(lambda x: x**2, z)) < 1e-12
        True
        >>> float(qkernels.normalized_hessian_penalty(lambda x: x[:, :1] * x[:, 1:], z)) > 0
        True
        >>> qkernels.normalized_hessian_penalty(lambda x: x**2, z, reduction="none").shape
        torch.Size([8])
    """
    k, eps = _check_common(fn, z, num_perturbations, eps, chunk_size)
    z = upcast(z, compute_dtype(z=z))
    if std is not None:
        std = check_std(std, z)
        std = upcast(std, compute_dtype(z=z, std=std))
    check_choice("reduction", reduction, ("mean", "none"))
    n = z.shape[0]
    draws = _draws(2 * k, z, generator, group)  # signs of the first k: the Rademacher directions
    scale = "population" if std is None else "std"  # population: std(z) + 1e-6 inside the op
    stacked = _op("perturbed_batch", _backend(z))(z, draws, std, eps, k, scale)
    keys, entries = _call_fn(fn, stacked, chunk_size)
    names = (
        ["fn's output"]
        if keys is None
        else [f"fn's entry {e!r}" for e in (keys if isinstance(keys, tuple) else range(keys))]
    )
    per = []
    for name, a in zip(names, _check_outputs(keys, entries, 4 * k * n, z), strict=True):
        values = _curvature(a, n, k, eps, 2, False, "mean")
        _warn_at_floor(values, name)
        per.append(_penalty(values, True, reduction))
    if reduction == "none":
        return _unflatten(keys, per)
    return _total(per)


def hessian_penalty(
    fn: Callable[[torch.Tensor], Activations],
    z: torch.Tensor,
    *,
    num_perturbations: int = 2,
    eps: float = 0.1,
    generator: torch.Generator | None = None,
    reduction: str = "max",
    chunk_size: int | None = None,
) -> PerSample:
    """Peebles et al.'s Hessian penalty (their eqs. 7-9).

    Directions h_l = eps * r_l (r Rademacher, k per sample); fd = (f(z + h) - 2 f(z) + f(z - h)) /
    eps^2; UNBIASED variance over the k directions of every activation element, reduced over all
    elements of the entry (batch included) by ``reduction``: "max" (the authors' default) or
    "mean"; summed over entries. "none": per-entry, per-sample means over the entry's elements (n,).

    ``fn`` is called ONCE on the stacked batch [z + h_1; z - h_1; ...; z + h_k; z - h_k] (2k n
    rows; chunked by ``chunk_size``), never on z (the center cancels). Arguments as in
    :func:`normalized_hessian_penalty`; the generator draws (k, n, d) standard normals whose signs
    are the directions.

    Args:
        fn: maps latents (N, d) to an activation tensor (N, ...) or a list/tuple or dict of them.
        z: (n, d) float latents.
        num_perturbations: k >= 2 Rademacher directions per sample.
        eps: the finite-difference step (> 0).
        generator: draws the (k, n, d) standard normals whose signs are the directions (None: the
            global RNG).
        reduction: "max", "mean" or "none".
        chunk_size: at most this many stacked rows per fn call (None: one call).

    Returns:
        A scalar ("max" / "mean") or per-entry (n,) values ("none").

    Raises:
        TypeError: half-precision activations.
        ValueError: k < 2, eps <= 0 or another ``reduction``.

    Examples:
        fn = z_1 z_2: every second difference is 2 r_1 r_2 = +-2; the unbiased variance of two +2 and
        two -2 is 16 / 3, the largest over the batch. A separable fn gets 0.

        >>> import torch
        >>> import qkernels
        >>> _ = torch.manual_seed(0)
        >>> z = torch.randn(16, 2, dtype=torch.float64)
        >>> qkernels.hessian_penalty(lambda x: x[:, :1] * x[:, 1:], z, num_perturbations=4)
        tensor(5.3333, dtype=torch.float64)
        >>> qkernels.hessian_penalty(lambda x: x**2, z, num_perturbations=4)
        tensor(0., dtype=torch.float64)
    """
    k, eps = _check_common(fn, z, num_perturbations, eps, chunk_size)
    check_choice("reduction", reduction, ("max", "mean", "none"))
    z = upcast(z, compute_dtype(z=z))
    n = z.shape[0]
    draws = _draws(k, z, generator)  # their signs are the Rademacher directions
    stacked = _op("perturbed_batch", _backend(z))(z, draws, None, eps, k, "one")
    keys, entries = _call_fn(fn, stacked, chunk_size)
    reduce = "max" if reduction == "max" else "mean"
    values = [_curvature(a, n, k, eps, 1, True, reduce) for a in _check_outputs(keys, entries, 2 * k * n, z)]
    if reduction == "none":
        return _unflatten(keys, [v[0] for v in values])
    return _total([_penalty(v, False, reduction) for v in values])
