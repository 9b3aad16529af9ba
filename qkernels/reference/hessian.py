"""Reference finite-difference curvature (Tripod's NHP, Peebles et al.'s Hessian penalty).

The specification of the ops ``perturbed_batch`` (the stacked batch fn is called on),
``finite_difference_curvature`` (activations -> per-sample curvature values) and
``curvature_penalty`` (per-sample values -> the penalty), differentiable through autograd.
"""

from __future__ import annotations

import torch

from qkernels.reference.kde import population_std


def finite_difference_curvature(
    stacked: torch.Tensor,
    n: int,
    num_perturbations: int,
    eps: float,
    groups: int,
    unbiased: bool,
    reduce: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample curvature statistics of a stacked finite-difference batch.

    stacked: (R, M) activations, R = n * 2k * groups rows ordered [group 0: f(z + h_1), f(z - h_1),
    ..., f(z + h_k), f(z - h_k); group 1: ...], each block n rows; or R = n * (1 + 2k * groups) with
    the n center rows f(z) first. For every sample i, group g and column c the second central
    differences fd_l = (f(z + h_l) - 2 f(z) + f(z - h_l)) / eps^2 give var_l(fd_l) (population, or
    unbiased with ``unbiased``); ``reduce`` "mean" / "max" reduces it over the M columns.
    Without center rows, f(z) is taken as 0: it is common to all fd_l and cancels from the variance.

    Returns (values (groups, n), argmax (groups, n) int64: the first column of the maximum).
    """
    k = num_perturbations
    p = n * 2 * k * groups
    m = stacked.shape[1]
    x = stacked[stacked.shape[0] - p :].reshape(groups, k, 2, n, m)
    fd = x[:, :, 0] + x[:, :, 1]  # (groups, k, n, M)
    if stacked.shape[0] > p:
        fd = fd - 2 * stacked[:n]
    # minus direction 0's: a shift common to every fd_l of an element leaves the variance as it is, and keeps the
    # sums' 2 f(z) out of the float32 mean, whose rounding at that size would leave the gradients' sum over the
    # directions nonzero (the decoder's Jacobian at z then leaks into them: csrc/include/qkernels/hessian.h)
    fd = (fd - fd[:, :1]) / (eps * eps)
    var = fd.var(dim=1, correction=1 if unbiased else 0)  # (groups, n, M)
    best, argmax = var.max(dim=-1)
    values = best if reduce == "max" else var.mean(dim=-1)
    return values, argmax


NHP_DENOM_EPS = 1e-10  # Tripod: mean(numerator) / (mean(denominator) + 1e-10)
STD_EPS = 1e-6  # the default NHP scale: population std of z + 1e-6
SCALES = ("std", "population", "one")


def perturbed_batch(
    z: torch.Tensor,
    draws: torch.Tensor,
    std: torch.Tensor | None,
    eps: float,
    signs: int,
    scale: str,
) -> torch.Tensor:
    """The stacked finite-difference batch [z + h_1; z - h_1; ...; z + h_D; z - h_D] (2 D n, d).

    z: (n, d) latents; draws: (D, n, d) standard normals, the raw random numbers; the first
    ``signs`` of them are used as their signs u = +1 where draw >= 0 else -1 (Rademacher: the sign
    of a standard normal is +-1 with probability 1/2 each), the others as they are (u = draw).
    Directions h_l = u_l * (eps * s) with the per-latent scale s (d,): ``scale`` "std" -> s = std
    (d,), "population" -> s = z.std(0, correction=0) + 1e-6 (differentiable in z; std unused),
    "one" -> h_l = eps * u_l (std unused). Differentiable in z and std; the draws are constants.
    """
    u = draws.detach()
    if signs:
        u = torch.cat([torch.where(u[:signs] >= 0, 1.0, -1.0).to(u.dtype), u[signs:]])
    if scale == "one":
        h = eps * u
    else:
        s = std if scale == "std" else population_std(z) + STD_EPS
        h = u * (eps * s)
    return torch.stack([z + h, z - h], dim=1).reshape(-1, z.shape[1])


def curvature_penalty(values: torch.Tensor, ratio: bool, reduction: str) -> torch.Tensor:
    """Per-sample curvature values (groups, n) to the penalty.

    ratio (groups = 2, NHP): per-sample p_i = values[0, i] / (values[1, i] + 1e-10); otherwise
    (groups = 1, HP) p_i = values[0, i]. ``reduction`` "mean" -> mean_i p_i (0-d), "max" -> max_i
    p_i (0-d; ``Tensor.max()``: NaN if any p_i is NaN, gradient shared evenly by the tied maxima),
    "none" -> p (n,).
    """
    p = values[0] / (values[1] + NHP_DENOM_EPS) if ratio else values[0]
    if reduction == "mean":
        return p.mean()
    if reduction == "max":
        return p.max()
    return p
