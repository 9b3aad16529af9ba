"""Reference KDE hot path (the specification): Gaussian KDE grids, the Cliff criterion and
Tripod's kernel latent multiinformation (KLM), in plain PyTorch, differentiable through autograd.

These are the dense formulations: they hold (d, K, n), (d, M, n) and (d, d, M, K) tensors for
Cliff and (n, n) tensors per latent for KLM. The fused backends compute the same quantities in
memory linear in the inputs.

Conventions shared by every backend:

- Gaussian kernel N(t; x, s^2) = exp(-(t - x)^2 / (2 s^2)) / (s sqrt(2 pi)).
- Integrals over a latent are (b - a) / K times the sum over the K points of linspace(a, b, K)
  (Cliff eq. 15); ``step`` below is that weight (b - a) / K.
- 0 log 0 = 0: an entry of a normalized density that is exactly 0 (the KDE underflowed)
  contributes 0 to an entropy and receives no gradient; a column whose normalizer is 0 is all 0.
"""

from __future__ import annotations

import math

import torch

LOG_2PI = math.log(2 * math.pi)


def standardize(z: torch.Tensor, min_std: float = 1e-6) -> torch.Tensor:
    """(z - mean) / std per column with the population std clamped to >= ``min_std``.

    The clamp is applied to the variance before the square root, so a collapsed (constant)
    column gives a finite value and a zero (not NaN) gradient through its std.
    """
    var, mean = torch.var_mean(z, 0, correction=0)  # one op (and one in backward): few launches
    std = var.clamp_min(min_std * min_std).sqrt()
    return (z - mean) / std


def population_std(z: torch.Tensor) -> torch.Tensor:
    """z.std(0, unbiased=False) with a zero (not NaN) gradient where a column is constant."""
    var = torch.var(z, 0, correction=0)
    pos = var > 0
    return torch.where(pos, var, 1.0).sqrt() * pos


def kde_grid(points: torch.Tensor, samples: torch.Tensor, sigma: float, derivative: bool = False) -> torch.Tensor:
    """Gaussian KDE of samples[:, j] (or its derivative d/dt) evaluated at points[j, :].

    points: (d, K); samples: (n, d) -> (d, K):
    out[j, k] = 1/n sum_s N(points[j, k]; samples[s, j], sigma^2)  (or d/dt of it).
    """
    u = (points[:, :, None] - samples.t()[:, None, :]) / sigma  # (d, K, n)
    e = torch.exp(-0.5 * u * u) / (sigma * math.sqrt(2 * math.pi))
    if derivative:
        e = -u / sigma * e
    return e.mean(-1)


def xlogx(p: torch.Tensor) -> torch.Tensor:
    """p log p with 0 log 0 = 0 and a zero gradient at p = 0."""
    pos = p > 0
    return torch.where(pos, p * torch.log(torch.where(pos, p, torch.ones_like(p))), torch.zeros_like(p))


def normalize(u: torch.Tensor, step: float, dim: int = -1) -> torch.Tensor:
    """u / (step * sum(u, dim)); an all-zero slice stays 0."""
    c = step * u.sum(dim, keepdim=True)
    return u / torch.where(c > 0, c, torch.ones_like(c))


def entropy(p: torch.Tensor, step: float, dim: int = -1) -> torch.Tensor:
    """Differential entropy -int p log p by the eq. 15 quadrature."""
    return -step * xlogx(p).sum(dim)


def cliff_terms(
    x: torch.Tensor,
    grid: torch.Tensor,
    uni_points: torch.Tensor,
    cond_index: torch.Tensor,
    sigma: float,
    step: float,
):
    """The three Cliff terms of standardized latents (eqs. 1-7, 11-15).

    Args:
        x: (n, d) standardized latents.
        grid: (K,) integration points linspace(a, b, K); ``step`` = (b - a) / K.
        uni_points: (K_u,) points linspace(-sqrt 3, sqrt 3, K_u) of the KL-uni expectation.
        cond_index: (d, M) int64 rows of x; zeta[j, m] = x[cond_index[j, m], j].
        sigma: kernel bandwidth.

    Returns:
        (uni, biv, kl) scalars: l_uni = sum_i H(s_i); l_biv = sum_{i != j} JSD(i|j);
        l_KL-uni = sum_i [-log(2 sqrt 3) - mean_k log p_i(v_k)].
    """
    n, d = x.shape
    xt = x.t()  # (d, n)
    # univariate: entropy of the normalized |dp(z_i)/dz_i| on the grid
    dgrid = kde_grid(grid.expand(d, -1), x, sigma, derivative=True)  # (d, K)
    uni = entropy(normalize(dgrid.abs(), step), step).sum()

    # anti-collapse: log p_i(v) by a log-sum-exp over the batch (finite where the KDE underflows)
    uv = (uni_points[None, :, None] - xt[:, None, :]) / sigma  # (d, K_u, n)
    logp = torch.logsumexp(-0.5 * uv * uv, dim=-1) - log_count(n, x) - math.log(sigma) - 0.5 * LOG_2PI
    kl = (-math.log(2 * math.sqrt(3.0)) - logp.mean(-1)).sum()

    # bivariate: dp(z_i, z_j)/dz_i at (t_k, zeta_m) = 1/n sum_s N'(t_k - x_si) N(zeta_m - x_sj)
    zeta = torch.gather(xt, 1, cond_index)  # (d, M)
    norm = 1.0 / (sigma * math.sqrt(2 * math.pi))
    ud = (grid[None, :, None] - xt[:, None, :]) / sigma  # (d, K, n)
    dker = -ud / sigma * torch.exp(-0.5 * ud * ud) * norm  # N'(t_k; x_si)
    uz = (zeta[:, :, None] - xt[:, None, :]) / sigma  # (d, M, n)
    ker = torch.exp(-0.5 * uz * uz) * norm  # N(zeta_m; x_sj)
    joint_d = torch.einsum("ikn,jmn->ijmk", dker, ker) / n  # (d_i, d_j, M, K): GEMM
    p_zeta = ker.mean(-1)  # (d, M): p_j(zeta_m) > 0 (zeta_m is itself a sample)
    cond_d = joint_d / p_zeta[None, :, :, None]  # eq. 3
    p_tilde = normalize(cond_d.abs(), step)  # eqs. 4-5, over k
    h_each = entropy(p_tilde, step)  # (d, d, M)
    h_mix = entropy(p_tilde.mean(2), step)  # (d, d)
    jsd = h_mix - h_each.mean(-1)  # eq. 6
    off = ~torch.eye(d, dtype=torch.bool, device=x.device)
    biv = torch.where(off, jsd, torch.zeros_like(jsd)).sum()  # not jsd[off]: a mask index syncs a GPU
    return uni, biv, kl


def cliff_loss(
    z: torch.Tensor,
    cond_index: torch.Tensor,
    sigma: float,
    a: float,
    b: float,
    num_points: int,
    lambda_uni: float,
    lambda_biv: float,
    lambda_kl: float,
):
    """The whole Cliff criterion (eq. 8) of raw latents z (n, d): standardize, the integration grid
    linspace(a, b, K) (K = ``num_points``, step (b - a) / K), the KL-uni points
    linspace(-sqrt 3, sqrt 3, K), the terms, the weighted total.

    Returns (total, uni, biv, kl)."""
    x = standardize(z)
    t = torch.linspace(a, b, num_points, dtype=z.dtype, device=z.device)
    v = torch.linspace(-math.sqrt(3.0), math.sqrt(3.0), num_points, dtype=z.dtype, device=z.device)
    uni, biv, kl = cliff_terms(x, t, v, cond_index, sigma, (b - a) / num_points)
    return lambda_uni * uni + lambda_biv * biv + lambda_kl * kl, uni, biv, kl


def log_count(n, like: torch.Tensor) -> torch.Tensor:
    """log(n) as a 0-d tensor of ``like``'s dtype and device: math.log of a batch size would
    specialize torch.compile's dynamic batch dimension to one value."""
    return torch.log(like.new_full((), n))


def silverman_factor(n: int, d: int) -> float:
    """Silverman's rule of thumb factor (4 / (d + 2))^(1/(d+4)) n^(-1/(d+4)) (Tripod eq. 12)."""
    return (4.0 / (d + 2)) ** (1.0 / (d + 4)) * n ** (-1.0 / (d + 4))


def klm(z: torch.Tensor, std: torch.Tensor | None):
    """Tripod's kernel latent multiinformation (eqs. 11-14), dense form.

    z: (n, d); std: (d,) per-latent scale, or None: the population std of z + 1e-6 (differentiable
    in z). Joint bandwidth^2 = std^2 * silverman_factor^2, marginal
    bandwidth = std. Returns (loss (), lse (n, d + 1)) where loss = mean_b [log q(z_b) -
    sum_j log q_j(z_bj)] and lse[b, 0] = log sum_a K_joint(z_b - z_a), lse[b, 1 + j] = log sum_a
    exp(-(z_bj - z_aj)^2 / (2 std_j^2)) (unnormalized; used by the fused backward).
    The normalizing constants of q and the q_j cancel up to (d - 1) log n - d log f.
    """
    n, d = z.shape
    if std is None:
        std = population_std(z) + 1e-6
    f = silverman_factor(n, d)
    y = z / std  # (n, d)
    joint = torch.zeros(n, n, dtype=z.dtype, device=z.device)
    marg = []
    for j in range(d):
        diff2 = (y[:, None, j] - y[None, :, j]) ** 2  # (n, n), exact differences
        joint = joint + diff2
        marg.append(torch.logsumexp(-0.5 * diff2, dim=1))
    lse_joint = torch.logsumexp(-0.5 * joint / (f * f), dim=1)
    lse_marg = torch.stack(marg, 1)  # (n, d)
    # (d - 1) log n - d log f with log f = log(4 / (d + 2)) / (d + 4) - log(n) / (d + 4)
    const = (d - 1 + d / (d + 4)) * log_count(n, z) - d * math.log(4.0 / (d + 2)) / (d + 4)
    loss = (lse_joint - lse_marg.sum(1)).mean() + const
    return loss, torch.cat([lse_joint[:, None], lse_marg], 1)
