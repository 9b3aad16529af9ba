"""KDE hot path for JAX: :func:`kde_grid`, :func:`cliff_loss`, :func:`klm_loss`.

Each is a ``jax.custom_vjp`` whose forward and backward are XLA FFI calls of the C++ CPU kernels the torch ops use
(csrc/cpu/kde_impl.h through csrc/jax/kde_ffi.cpp); semantics: :mod:`qkernels.reference.kde`, as for
:mod:`qkernels.ops.kde`. Memory is linear in the inputs (no (n, n, d) tensor for KLM, no (d, d, M, K) for Cliff).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from qkernels._args import (
    check_cond_index,
    check_grid,
    check_latents,
    check_num_cond,
    check_numbers,
    check_points_and_samples,
    check_sigma,
)
from qkernels.decl import kde as decl
from qkernels.jax import _checks
from qkernels.jax._ffi import batched, call


class CliffTerms(NamedTuple):
    """The terms of :func:`cliff_loss` (``return_terms=True``): total = lambda_uni uni + lambda_biv biv +
    lambda_kl kl, each a scalar array."""

    total: jax.Array
    uni: jax.Array
    biv: jax.Array
    kl: jax.Array


# ----------------------------------------------------------------------------- kde_grid


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _kde_grid(points: jax.Array, samples: jax.Array, sigma: float, derivative: bool) -> jax.Array:
    return call(
        decl.KDE_GRID,
        {"points": points, "samples": samples},
        sigma=sigma,
        derivative=derivative,
        vmap=partial(_kde_grid_vmap, sigma, derivative),
    )


def _kde_grid_fwd(points, samples, sigma, derivative):
    return _kde_grid(points, samples, sigma, derivative), (points, samples)


def _kde_grid_bwd(sigma, derivative, res, grad):
    points, samples = res
    return call(
        decl.KDE_GRID.backward,
        {"grad": grad, "points": points, "samples": samples},
        sigma=sigma,
        derivative=derivative,
        vmap=partial(_kde_grid_backward_vmap, sigma, derivative),
    )


# Under jax.vmap (B problems points (d, K), samples (n, d)) each direction is ONE kernel call: the KDEs are per latent,
# so the batch is B d latents: points (B d, K), samples (n, B d).


def _latents(samples: jax.Array) -> jax.Array:
    """(B, n, d) -> (n, B d)."""
    return jnp.moveaxis(samples, 0, 1).reshape(samples.shape[1], -1)


def _kde_grid_vmap(sigma, derivative, size, in_batched, t):
    t = batched(size, in_batched, t)
    points = t["points"]
    out = call(
        decl.KDE_GRID,
        {"points": points.reshape(-1, points.shape[-1]), "samples": _latents(t["samples"])},
        sigma=sigma,
        derivative=derivative,
        vmap=partial(_kde_grid_vmap, sigma, derivative),
    )
    return (out.reshape(points.shape),), (True,)


def _kde_grid_backward_vmap(sigma, derivative, size, in_batched, t):
    t = batched(size, in_batched, t)
    points, samples = t["points"], t["samples"]
    gp, gs = call(
        decl.KDE_GRID.backward,
        {
            "grad": t["grad"].reshape(-1, points.shape[-1]),
            "points": points.reshape(-1, points.shape[-1]),
            "samples": _latents(samples),
        },
        sigma=sigma,
        derivative=derivative,
        vmap=partial(_kde_grid_backward_vmap, sigma, derivative),
    )
    return (gp.reshape(points.shape), jnp.moveaxis(gs.reshape(samples.shape[1], size, -1), 1, 0)), (True, True)


_kde_grid.defvjp(_kde_grid_fwd, _kde_grid_bwd)


def kde_grid(points: jax.Array, samples: jax.Array, sigma: float, *, derivative: bool = False) -> jax.Array:
    """Per-latent Gaussian KDE (or its derivative d/dt) on per-latent points, as :func:`qkernels.kde_grid`.

    Args:
        points: (d, K) evaluation points.
        samples: (n, d) samples; column j is latent j's KDE.
        sigma: the bandwidth (> 0).
        derivative: d/dt of the KDE instead of the density.

    Returns:
        (d, K): out[j, k] = 1/n sum_s N(points[j, k]; samples[s, j], sigma^2) (or its d/dt), differentiable in
        points and samples; float32 for half-precision inputs, otherwise their dtype.

    Raises:
        ValueError: samples' d not points' d, sigma <= 0 (at trace time); NaN / inf values raise
            ``jax.errors.JaxRuntimeError`` at run time.
    """
    points = _checks.array("points", points, ndim=2, op="kde_grid")
    samples = _checks.array("samples", samples, ndim=2, op="kde_grid")
    dt = _checks.compute_dtype(points=points, samples=samples)
    check_points_and_samples(points.shape, samples.shape)
    sigma = check_sigma(sigma)
    return _kde_grid(points.astype(dt), samples.astype(dt), sigma, bool(derivative))


# ----------------------------------------------------------------------------- cliff_loss


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cliff(z: jax.Array, cond: jax.Array, cfg: tuple[Any, ...]) -> tuple[jax.Array, ...]:
    return call(decl.CLIFF_LOSS, {"z": z, "cond_index": cond}, **_cliff_attrs(cfg))


def _cliff_attrs(cfg: tuple[Any, ...]) -> dict[str, Any]:
    names = [a.name for a in decl.CLIFF_LOSS.args[2:]]  # the scalars, in declared order
    return dict(zip(names, cfg, strict=True))


def _cliff_fwd(z, cond, cfg):
    return _cliff(z, cond, cfg), (z, cond)


def _cliff_bwd(cfg, res, grads):
    z, cond = res
    upstream = {f"grad_{name}": g.astype(z.dtype) for name, g in zip(CliffTerms._fields, grads, strict=True)}
    gz = call(decl.CLIFF_LOSS.backward, {**upstream, "z": z, "cond_index": cond}, **_cliff_attrs(cfg))
    return gz, None


_cliff.defvjp(_cliff_fwd, _cliff_bwd)


def _cond_index(cond_index: Any, key: Any, num_cond: int, n: int, d: int) -> jax.Array:
    """(d, M) conditioning rows: drawn from ``key`` (every latent's M rows without replacement: the M smallest
    of n uniform keys, as the torch op draws them), or the user's (integer, shape checked)."""
    if cond_index is None:
        check_num_cond(num_cond, n)
        if key is None:
            raise ValueError("cliff_loss needs key (a jax.random key) to draw the conditioning rows, or cond_index")
        u = jax.random.uniform(key, (d, n))
        return jax.lax.top_k(-u, num_cond)[1]
    if not hasattr(cond_index, "dtype") or not jnp.issubdtype(cond_index.dtype, jnp.integer):
        raise TypeError(f"cond_index must be an integer array, got {getattr(cond_index, 'dtype', type(cond_index))}")
    check_cond_index(cond_index.shape, d)
    if not _checks.is_traced(cond_index):  # concrete: checked now (a traced one is checked by the kernel)
        rows = np.asarray(cond_index)
        if rows.min() < 0 or rows.max() >= n:
            raise ValueError(f"cond_index must hold row indices in [0, {n}), got values outside")
    return jnp.asarray(cond_index)


def cliff_loss(
    z: jax.Array,
    *,
    key: Any = None,
    sigma: float = 0.1,
    grid: tuple[float, float, int] = (-5.0, 5.0, 100),
    num_cond: int = 10,
    cond_index: jax.Array | None = None,
    lambda_uni: float = 0.5,
    lambda_biv: float = 1.0,
    lambda_kl: float = 0.7,
    return_terms: bool = False,
) -> jax.Array | CliffTerms:
    """The Cliff criterion (Barin-Pacela et al., ICML 2025, eq. 8) of latents z (n, d), as
    :func:`qkernels.cliff_loss`.

    Args:
        z: (n, d) float latents, n >= 2.
        key: a ``jax.random`` key drawing the conditioning rows (needed without ``cond_index``).
        sigma, grid, num_cond, lambda_uni, lambda_biv, lambda_kl, return_terms: as the torch op.
        cond_index: (d, M) integer rows of z (int32 or int64); None: drawn from ``key``.

    Returns:
        The scalar total, or :class:`CliffTerms`; differentiable in z.

    Raises:
        ValueError / TypeError: as the torch op, at trace time; NaN / inf z (and, when traced, a cond_index
            outside [0, n)) raise ``jax.errors.JaxRuntimeError`` at run time.
    """
    z = _checks.array("z", z, ndim=2, op="cliff_loss")
    n, d = check_latents(z.shape)
    sigma = check_sigma(sigma)
    a, b, k = check_grid(grid)
    check_numbers(lambda_uni=lambda_uni, lambda_biv=lambda_biv, lambda_kl=lambda_kl)
    idx = _cond_index(cond_index, key, num_cond, n, d)
    cfg = (sigma, a, b, k, float(lambda_uni), float(lambda_biv), float(lambda_kl))
    terms = CliffTerms(*_cliff(z.astype(_checks.compute_dtype(z=z)), idx, cfg))
    return terms if return_terms else terms.total


# ----------------------------------------------------------------------------- klm_loss


@jax.custom_vjp
def _klm_default(z: jax.Array) -> jax.Array:
    return call(decl.KLM, {"z": z})[0]


def _klm_default_fwd(z):
    loss, lse = call(decl.KLM, {"z": z})
    return loss, (z, lse)


def _klm_default_bwd(res, grad):
    z, lse = res
    return (call(decl.KLM.backward, {"grad_loss": grad, "z": z, "lse": lse})[0],)


_klm_default.defvjp(_klm_default_fwd, _klm_default_bwd)


@jax.custom_vjp
def _klm_std(z: jax.Array, std: jax.Array) -> jax.Array:
    return call(decl.KLM, {"z": z, "std": std})[0]


def _klm_std_fwd(z, std):
    loss, lse = call(decl.KLM, {"z": z, "std": std})
    return loss, (z, std, lse)


def _klm_std_bwd(res, grad):
    z, std, lse = res
    return call(decl.KLM.backward, {"grad_loss": grad, "z": z, "std": std, "lse": lse})


_klm_std.defvjp(_klm_std_fwd, _klm_std_bwd)


def klm_loss(z: jax.Array, *, std: jax.Array | float | None = None) -> jax.Array:
    """Tripod's kernel latent multiinformation (Hsu et al., ICML 2024, eqs. 11-14), as :func:`qkernels.klm_loss`.

    mean_b [log q(z_b) - sum_j log q_j(z_bj)] with Gaussian KDEs over the batch: joint bandwidth^2 = std^2 *
    Silverman factor^2, marginal bandwidth = std. O(n d) memory (the authors' JAX code forms (n, n, d)).

    Args:
        z: (n, d) latents, n >= 2 (Tripod: the quantized ones).
        std: (d,) positive scales, or one scale (a number or 0-d array); differentiable. Default: the population
            std of z + 1e-6, computed by the kernel (differentiable in z). Tripod passes the std of the continuous
            latents + 1e-6.

    Returns:
        The scalar loss in z's dtype (float32 for half-precision inputs).

    Raises:
        ValueError / TypeError: z not (n, d) with n >= 2, a misshaped or (when concrete) non-positive std, at
            trace time; NaN / inf values raise ``jax.errors.JaxRuntimeError`` at run time.
    """
    z = _checks.array("z", z, ndim=2, op="klm")
    check_latents(z.shape)
    if std is None:
        return _klm_default(z.astype(_checks.compute_dtype(z=z)))
    s = std if isinstance(std, (int, float)) else _checks.array("std", std, ndim=(0, 1), op="klm")
    dt = _checks.compute_dtype(z=z, std=None if isinstance(s, (int, float)) else s)
    return _klm_std(z.astype(dt), _checks.std_array(s, z.shape[1], dt, "klm", kernel_checks=True))
