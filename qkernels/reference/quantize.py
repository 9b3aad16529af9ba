"""Reference quantizers (QLAE, FactorQVAE, Tripod FSQ, D-VAE), differentiable through autograd."""

from __future__ import annotations

import math

import torch


def latent_quantize(z: torch.Tensor, values: torch.Tensor):
    """Nearest-value scalar quantization with straight-through gradient (QLAE eq. 5, Alg. 1).

    z: (N, d); values: (G, n_v) with G = 1 (global codebook) or G = d (one per latent).
    Returns (z_q (N, d), indices (N, d) int64, loss_quantize (), loss_commit ()):
    z_q's value is the nearest codebook value (ties -> lowest index) and its gradient goes
    straight through to z; loss_quantize = mean((sg(z) - z_q)^2) reaches only ``values``,
    loss_commit = mean((z - sg(z_q))^2) only ``z``.
    """
    vals = values.expand(z.shape[1], -1)  # (d, n_v)
    dist = (z.detach()[:, :, None] - vals.detach()[None]).abs()  # (N, d, n_v)
    indices = dist.argmin(dim=-1)  # first minimum on ties
    q = torch.gather(vals[None].expand(z.shape[0], -1, -1), 2, indices[:, :, None])[:, :, 0]
    z_q = q.detach() + (z - z.detach())  # exactly q, identity gradient to z
    loss_quantize = ((z.detach() - q) ** 2).mean()
    loss_commit = ((z - q.detach()) ** 2).mean()
    return z_q, indices, loss_quantize, loss_commit


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise -log(-log(u)), with u clamped into (0, 1) so the noise is finite."""
    tiny = 1e-20 if u.dtype != torch.float64 else 1e-300
    one_minus = 1.0 - torch.finfo(u.dtype).eps / 2
    return -torch.log(-torch.log(u.clamp(tiny, one_minus)))


def relaxed_categorical(
    logits: torch.Tensor,
    values: torch.Tensor,
    uniform: torch.Tensor | None,
    tau: float,
    noise_scale: float,
    hard: bool,
):
    """Relaxed categorical sample over scalar values (FactorQVAE's Gumbel-softmax, D-VAE).

    logits: (N, d, K); values: (G, K), G in {1, d}; uniform: (N, d, K) in [0, 1) or None (no
    noise). y = softmax((logits + noise_scale * Gumbel(uniform)) / tau), straight-through one-hot
    of its argmax when ``hard``; z = sum_k y_k values_k; kl = KL(softmax(logits) || Uniform(K)).
    Returns (z (N, d), y (N, d, K), kl (N, d)).
    """
    a = logits if uniform is None else logits + noise_scale * gumbel_from_uniform(uniform)
    y = torch.softmax(a / tau, dim=-1)
    if hard:
        one_hot = torch.nn.functional.one_hot(y.argmax(dim=-1), y.shape[-1]).to(y.dtype)
        y = one_hot + (y - y.detach())
    z = (y * values[None]).sum(dim=-1)
    logp = torch.log_softmax(logits, dim=-1)
    kl = (logp.exp() * (logp + math.log(logits.shape[-1]))).sum(dim=-1)
    return z, y, kl


def gumbel_quantize(
    z: torch.Tensor,
    values: torch.Tensor,
    uniform: torch.Tensor | None,
    tau: float,
    hard: bool,
    *,
    relaxed=relaxed_categorical,
):
    """FactorQVAE's relaxed quantizer: :func:`relaxed_categorical` (noise_scale 1) of the logits
    -(z - values)^2, the negative squared distances to every codebook value.

    z: (N, d); values: (G, K), G in {1, d}; uniform: (N, d, K) in [0, 1) or None (no noise).
    Returns (z_q (N, d), y (N, d, K), logits (N, d, K), kl (N, d)). ``relaxed``: the
    relaxed_categorical implementation to apply (another backend's kernel, same signature).
    """
    logits = -((z[:, :, None] - values[None]) ** 2)
    z_q, y, kl = relaxed(logits, values, uniform, tau, 1.0, hard)
    return z_q, y, logits, kl


def fsq(z: torch.Tensor, levels: torch.Tensor):
    """Finite scalar quantization (Tripod eq. 10): tanh, scale to [0, L-1], round (straight-through),
    rescale to [-1, 1].

    z: (N, d); levels: (d,) integers >= 2. Returns (z_q (N, d), indices (N, d) int64 in [0, L-1]).
    """
    top = (levels - 1).to(z.dtype)
    q = (torch.tanh(z) + 1) / 2 * top
    rounded = torch.round(q)
    q_st = rounded + (q - q.detach())
    return 2 * q_st / top - 1, rounded.long()
