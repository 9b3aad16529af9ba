"""Tripod's normalized Hessian penalty for JAX: :func:`normalized_hessian_penalty` and its fused reduction
:func:`finite_difference_curvature`.

The penalty builds the stacked finite-difference batch [z + v_1; z - v_1; ...; z + w_k; z - w_k] (jax.numpy,
differentiable in z and std), calls ``fn`` ONCE on it, and reduces each activation to per-sample curvature values
with :func:`finite_difference_curvature`: a ``jax.custom_vjp`` whose forward and backward are XLA FFI calls of the
C++ CPU kernel the torch op uses (csrc/cpu/hessian_impl.h through csrc/jax/hessian_ffi.cpp). ``fn`` is never called
on z itself: f(z) cancels from a variance over directions (:mod:`qkernels.ops.hessian` says why).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from qkernels._args import check_choice, check_curvature, check_fd_dtype, check_perturbations, check_positive
from qkernels.decl import hessian as decl
from qkernels.jax import _checks
from qkernels.jax._ffi import batched, call, check_values

NHP_DENOM_EPS = 1e-10  # Tripod: mean(numerator) / (mean(denominator) + 1e-10)
STD_EPS = 1e-6  # the default scale: population std of z + 1e-6
OP = decl.FINITE_DIFFERENCE_CURVATURE.name  # the FFI target of every function here: where it runs, they do


@partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5, 6))
def _curvature(stacked: jax.Array, n: int, k: int, eps: float, groups: int, unbiased: bool, reduce: str) -> jax.Array:
    return _curvature_fwd(stacked, n, k, eps, groups, unbiased, reduce)[0]


def _attrs(n, k, eps, groups, unbiased, reduce):
    return dict(n=n, num_perturbations=k, eps=eps, groups=groups, unbiased=unbiased, reduce=reduce)


def _curvature_fwd(stacked, n, k, eps, groups, unbiased, reduce):
    values, argmax = call(
        decl.FINITE_DIFFERENCE_CURVATURE,
        {"stacked": stacked},
        vmap=partial(_forward_vmap, n, k, eps, groups, unbiased, reduce),
        **_attrs(n, k, eps, groups, unbiased, reduce),
    )
    return values, (stacked, argmax)


def _curvature_bwd(n, k, eps, groups, unbiased, reduce, res, grad):
    stacked, argmax = res
    return (
        call(
            decl.FINITE_DIFFERENCE_CURVATURE.backward,
            {"grad": grad, "stacked": stacked, "argmax": argmax},
            vmap=partial(_backward_vmap, n, k, eps, groups, unbiased, reduce),
            **_attrs(n, k, eps, groups, unbiased, reduce),
        ),
    )


# Under jax.vmap (B stacked batches (R, M) of n samples) each direction is ONE kernel call on a stacked batch of B n
# samples: each block of n rows (a group's direction, plus or minus) becomes a block of B n rows; the center rows, which
# the kernel does not read, are left out (their gradient is zero).


def _samples(stacked: jax.Array, n: int, k: int, groups: int) -> jax.Array:
    """(B, R, M) -> (2 k groups B n, M), without the center rows."""
    b, rows, m = stacked.shape
    blocks = stacked[:, rows - 2 * k * groups * n :].reshape(b, 2 * k * groups, n, m)
    return jnp.moveaxis(blocks, 0, 1).reshape(-1, m)


def _per_problem(x: jax.Array, b: int) -> jax.Array:
    """(groups, B n) -> (B, groups, n)."""
    return jnp.moveaxis(x.reshape(x.shape[0], b, -1), 1, 0)


def _forward_vmap(n, k, eps, groups, unbiased, reduce, size, in_batched, t):
    stacked = batched(size, in_batched, t)["stacked"]
    values, argmax = call(
        decl.FINITE_DIFFERENCE_CURVATURE,
        {"stacked": _samples(stacked, n, k, groups)},
        vmap=partial(_forward_vmap, size * n, k, eps, groups, unbiased, reduce),
        **_attrs(size * n, k, eps, groups, unbiased, reduce),
    )
    return (_per_problem(values, size), _per_problem(argmax, size)), (True, True)


def _backward_vmap(n, k, eps, groups, unbiased, reduce, size, in_batched, t):
    t = batched(size, in_batched, t)
    stacked = t["stacked"]
    flat = {name: jnp.moveaxis(t[name], 0, 1).reshape(groups, -1) for name in ("grad", "argmax")}
    g = call(
        decl.FINITE_DIFFERENCE_CURVATURE.backward,
        {**flat, "stacked": _samples(stacked, n, k, groups)},
        vmap=partial(_backward_vmap, size * n, k, eps, groups, unbiased, reduce),
        **_attrs(size * n, k, eps, groups, unbiased, reduce),
    )
    g = jnp.moveaxis(g.reshape(2 * k * groups, size, n, -1), 1, 0).reshape(size, -1, stacked.shape[-1])
    center = stacked.shape[1] - g.shape[1]
    return (jnp.pad(g, ((0, 0), (center, 0), (0, 0))),), (True,)


_curvature.defvjp(_curvature_fwd, _curvature_bwd)


def _activation(name: str, a: Any) -> jax.Array:
    """A float32 / float64 activation (finite differences of half-precision ones lose the curvature)."""
    a = _checks.array(name, a, min_ndim=1, op=OP)
    check_fd_dtype(name, a.dtype.name)
    return a


def finite_difference_curvature(
    stacked: jax.Array,
    n: int,
    num_perturbations: int,
    eps: float,
    *,
    groups: int = 2,
    unbiased: bool = False,
    reduce: str = "mean",
) -> jax.Array:
    """Fused reduction of a stacked finite-difference batch to per-sample curvature values, as
    :func:`qkernels.finite_difference_curvature`.

    Args:
        stacked: (R, ...) activations (trailing dims flattened to M columns), R = n 2k groups rows [group 0:
            f(z + h_1), f(z - h_1), ..., f(z + h_k), f(z - h_k); group 1: ...] in blocks of n rows, or n (1 + 2k
            groups) with the center rows f(z) first (they cancel).
        n: the batch size; num_perturbations: k >= 2; eps: the step (> 0); groups: 2 (NHP) or 1 (HP); unbiased:
            divisor k - 1; reduce: "mean" or "max" over the M columns.

    Returns:
        (groups, n) in stacked's dtype: the mean (or max) over columns of the variance over the k directions of
        the second differences (f(z + h) + f(z - h) - 2 f(z)) / eps^2. Differentiable in stacked.
    """
    stacked = _activation("stacked", stacked)
    rows = stacked.shape[0]
    k, eps = check_curvature(rows, n, num_perturbations, eps, groups, reduce)
    return _curvature(stacked.reshape(rows, -1), n, k, eps, groups, bool(unbiased), reduce)


def _population_std(z: jax.Array) -> jax.Array:
    """z.std(0) with a zero (not NaN) gradient where a column is constant."""
    var = jnp.var(z, axis=0)
    pos = var > 0
    return jnp.sqrt(jnp.where(pos, var, 1.0)) * pos


def _std(std: Any) -> Any:
    """std as given: None, a number or an array (validated as one, for the dtype rule)."""
    return std if std is None or isinstance(std, (int, float)) else _checks.array("std", std, ndim=(0, 1), op=OP)


def _array_or_none(x: Any) -> Any:
    return None if x is None or isinstance(x, (int, float)) else x


def _curvatures(
    op: str,
    fn: Callable[[jax.Array], Any],
    z: jax.Array,
    std: Any,
    draws: jax.Array,
    eps: float,
    chunk_size: int | None,
) -> tuple[list[jax.Array], Any]:
    """Per activation of fn (its pytree leaves), the (2, n) curvature values [Rademacher group; Gaussian group] of
    the stacked batch built from ``draws`` (2k, n, d): the signs of the first k, the other k as they are. z, a
    traced std and fn's outputs are checked for NaN / inf at run time (:func:`qkernels.jax._ffi.check_values`: the
    torch op checks them when called), each before what is computed from it."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if chunk_size is not None:
        check_positive("chunk_size", chunk_size, integer=True)
    n, d = z.shape
    k = draws.shape[0] // 2
    z = check_values(z, op, "z")
    s = _population_std(z) + STD_EPS if std is None else _checks.std_array(std, d, z.dtype, op, kernel_checks=False)
    u = jnp.concatenate([jnp.where(draws[:k] >= 0, 1.0, -1.0).astype(z.dtype), draws[k:]])
    h = u * (eps * s)
    stacked = jnp.stack([z + h, z - h], axis=1).reshape(-1, d)  # [z + h_1; z - h_1; ...] in blocks of n rows
    rows = stacked.shape[0]
    if chunk_size is None:
        out = fn(stacked)
    else:
        parts = [fn(stacked[i : i + chunk_size]) for i in range(0, rows, chunk_size)]
        if any(jax.tree_util.tree_structure(p) != jax.tree_util.tree_structure(parts[0]) for p in parts):
            raise ValueError("fn must return the same structure (array / list / dict) for every chunk")
        out = jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *parts)
    leaves, tree = jax.tree_util.tree_flatten_with_path(out)
    if not leaves:
        raise ValueError("fn returned no arrays")
    values = []
    for path, a in leaves:
        name = f"fn output {jax.tree_util.keystr(path)}" if path else "fn output"
        a = _activation(name, a)
        if a.shape[0] != rows:
            raise ValueError(
                f"{name} must have the stacked batch ({rows} rows) as its first dimension, got "
                f"shape {tuple(a.shape)}; fn must map latents (N, d) to activations (N, ...)"
            )
        a = check_values(a.reshape(rows, -1), op, name)
        values.append(_curvature(a, n, k, eps, 2, False, "mean"))
    return values, jax.tree_util.tree_structure(out)


def hessian_penalty_terms(
    fn: Callable[[jax.Array], Any],
    z: jax.Array,
    std: jax.Array | float | None = None,
    *,
    draws: jax.Array,
    eps: float = 0.1,
    chunk_size: int | None = None,
) -> tuple[Any, Any]:
    """The per-sample numerator and denominator of :func:`normalized_hessian_penalty`, from the caller's directions.

    For training code that draws its own directions (e.g. per-sample keys, as the Tripod authors' code does).

    Args:
        fn, z, std, eps, chunk_size: as :func:`normalized_hessian_penalty`.
        draws: (2k, n, d), k >= 2: the signs of the first k (+1 where >= 0; Rademacher signs pass unchanged) scale
            the Rademacher directions, the other k (standard normals) the Gaussian ones: h = u * eps * std.

    Returns:
        (numerator, denominator), each in fn's structure with (n,) per activation: the mean over the activation's
        elements of the variance over the k second differences of the Rademacher (numerator) and the Gaussian
        (denominator) directions. The penalty per sample is numerator / (denominator + 1e-10).
    """
    z = _checks.array("z", z, ndim=2, op=OP)
    draws = _checks.array("draws", draws, ndim=3, op=OP)
    if draws.shape[1:] != z.shape or draws.shape[0] % 2:
        raise ValueError(f"draws must be (2k, n, d) with (n, d) = {tuple(z.shape)}, got shape {tuple(draws.shape)}")
    _, eps = check_perturbations(draws.shape[0] // 2, eps)
    std = _std(std)
    dt = _checks.compute_dtype(z=z, draws=draws, std=_array_or_none(std))
    values, tree = _curvatures("hessian_penalty_terms", fn, z.astype(dt), std, draws.astype(dt), eps, chunk_size)
    return jax.tree_util.tree_unflatten(tree, [v[0] for v in values]), jax.tree_util.tree_unflatten(
        tree, [v[1] for v in values]
    )


def normalized_hessian_penalty(
    fn: Callable[[jax.Array], Any],
    z: jax.Array,
    key: Any,
    std: jax.Array | float | None = None,
    *,
    num_perturbations: int = 2,
    eps: float = 0.1,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Any:
    """Tripod's normalized Hessian penalty (Section 3.3, Prop. 3.2, Algorithm 1), as
    :func:`qkernels.normalized_hessian_penalty`.

    Directions v_l = eps std r_l (r Rademacher: the signs of the first k of ONE (2k, n, d) standard-normal draw
    from ``key``) and w_l = eps std g_l (g: the other k); per activation and sample mean(numerator) /
    (mean(denominator) + 1e-10), the variances over the k second differences of each group; batch mean; summed
    over fn's activations. :func:`hessian_penalty_terms` takes the directions from the caller instead.

    Args:
        fn: maps latents (N, d) to an activation array (N, ...) or a pytree (list, tuple, dict) of them; called
            once on the stacked batch of 4k n rows (in row chunks of ``chunk_size`` when given). Deterministic and
            smooth at the scale eps * std.
        z: (n, d) latents. Gradients reach z, std and whatever fn closes over.
        key: a ``jax.random`` key for the directions.
        std: (d,) positive scales, or one (a number or 0-d array); default the population std of z + 1e-6
            (differentiable in z).
        num_perturbations: k >= 2; eps: the step (> 0), relative to each latent's std.
        reduction: "mean" (a scalar) or "none": per-sample values (n,) in fn's structure.
        chunk_size: at most this many rows per fn call.

    Returns:
        A scalar ("mean") or per-activation (n,) values ("none"), in the activations' dtype.

    Raises:
        TypeError: fn not callable or half-precision activations. ValueError: k < 2, eps <= 0, a misshaped std,
            another reduction, or activations without the stacked batch as their first dimension.
    """
    z = _checks.array("z", z, ndim=2, op=OP)
    k, eps = check_perturbations(num_perturbations, eps)
    check_choice("reduction", reduction, ("mean", "none"))
    std = _std(std)
    dt = _checks.compute_dtype(z=z, std=_array_or_none(std))
    draws = jax.random.normal(key, (2 * k, *z.shape), dt)
    values, tree = _curvatures("normalized_hessian_penalty", fn, z.astype(dt), std, draws, eps, chunk_size)
    per = [v[0] / (v[1] + NHP_DENOM_EPS) for v in values]
    if reduction == "none":
        return jax.tree_util.tree_unflatten(tree, per)
    return sum((p.mean() for p in per[1:]), per[0].mean())
