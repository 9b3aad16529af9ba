"""Reference finite-difference curvature (Tripod's NHP, Peebles et al.'s Hessian penalty).

The specification of the ``finite_difference_curvature`` op, differentiable through autograd.
"""

from __future__ import annotations

import torch


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
    fd = fd / (eps * eps)
    var = fd.var(dim=1, correction=1 if unbiased else 0)  # (groups, n, M)
    best, argmax = var.max(dim=-1)
    values = best if reduce == "max" else var.mean(dim=-1)
    return values, argmax
