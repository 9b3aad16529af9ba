"""Plain-JAX formulations of the ``qkernels.jax`` ops, written from the papers' equations: the baselines of
benchmarks/test_jax.py where no checkout of the authors' repositories is named, and the authors' own functions,
imported from a checkout, where one is (``QKERNELS_TRIPOD_REPO``, ``QKERNELS_QLAE_REPO``).

Each function computes what the op does, with every intermediate in memory as plain code holds it (KLM: (n, n, d)
squared differences; quantization: (n, d, n_v) distances; Cliff: (d, K, n) kernel tiles and a (d, d, M, K)
contraction; the Hessian penalty: the decoder on the stacked batch with its centre rows).
tests/test_jax_baselines.py checks them against qkernels' torch reference and the authors' functions.

- :func:`klm`: Tripod eqs. 11-14 (Silverman joint bandwidth, marginal bandwidth = std, no leave-one-out).
- :func:`nhp_values` / :func:`nhp`: Tripod Alg. 1 / Prop. 3.2, the normalized Hessian penalty by central second
  differences (eq. 9) along scale-adjusted Rademacher and Gaussian directions.
- :func:`latent_quantize`: QLAE eq. 4 (nearest value per latent, straight-through) and its two losses.
- :func:`fsq`: Tripod eq. 10 (tanh, scale to [0, L - 1], round straight-through, rescale).
- :func:`kde_grid`, :func:`cliff_loss`: Cliff eqs. 1-8 and 10-15.

    python benchmarks/jax_baselines.py klm-peak {original,qkernels} N D   # one KLM forward + backward; prints peak RSS
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

sg = jax.lax.stop_gradient
TRIPOD_ENV, QLAE_ENV = "QKERNELS_TRIPOD_REPO", "QKERNELS_QLAE_REPO"
ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- KLM (Tripod)


def silverman(n: int, d: int) -> float:
    """Silverman's factor f: joint bandwidth = f * std (Tripod eq. 12: S_jj = (4 / ((d + 2) n))^(2/(d+4)) std_j^2)."""
    return (4.0 / ((d + 2) * n)) ** (1.0 / (d + 4))


def klm(z: jax.Array, std: jax.Array) -> jax.Array:
    """Tripod's kernel latent multiinformation of z (n, d) with per-latent scales std (d,):
    mean_i [log q(z_i) - sum_j log q_j(z_ij)], q a Gaussian KDE over the batch with bandwidths f * std, q_j with
    std_j. The Gaussians' normalizers leave (d - 1) log n - d log f."""
    n, d = z.shape
    f = silverman(n, d)
    u2 = jnp.square((z[:, None, :] - z[None, :, :]) / std)  # (n, n, d)
    log_joint = logsumexp(-0.5 * u2.sum(-1) / (f * f), axis=1)
    log_marginals = logsumexp(-0.5 * u2, axis=1).sum(-1)
    return jnp.mean(log_joint - log_marginals) + (d - 1) * math.log(n) - d * math.log(f)


# ----------------------------------------------------------------------------- normalized Hessian penalty (Tripod)


def directions(draws: jax.Array, k: int) -> jax.Array:
    """(2k, n, d) unit directions from (2k, n, d) draws: the signs of the first k (Rademacher; +1 at 0), the other k
    as they are (Gaussian)."""
    return jnp.concatenate([jnp.where(draws[:k] >= 0, 1.0, -1.0).astype(draws.dtype), draws[k:]])


def nhp_values(fn: Callable, z: jax.Array, std: jax.Array, draws: jax.Array, eps: float = 0.1):
    """Per-sample (numerator, denominator) of the normalized Hessian penalty for every activation fn returns.

    h_l = eps * std * u_l (u: :func:`directions`, k = len(draws) // 2); fn is called once on
    [z; z + h_1; z - h_1; ...; z + h_2k; z - h_2k] ((4k + 1) n rows); per activation element the second differences
    (f(z + h) - 2 f(z) + f(z - h)) / eps^2, their population variance over the k Rademacher directions (numerator)
    and over the k Gaussian ones (denominator), each averaged over the activation's elements. Returns fn's output
    structure with a (2, n) array [numerator; denominator] per activation."""
    n, k = z.shape[0], draws.shape[0] // 2
    h = eps * std * directions(draws, k)  # (2k, n, d)
    rows = jnp.concatenate([z, jnp.stack([z + h, z - h], 1).reshape(-1, z.shape[1])])

    def per_activation(a):
        a = a.reshape(1 + 4 * k, n, -1)
        fd = (a[1::2] + a[2::2] - 2 * a[0]) / (eps * eps)  # (2k, n, M)
        return jnp.stack([jnp.var(fd[:k], axis=0).mean(-1), jnp.var(fd[k:], axis=0).mean(-1)])

    return jax.tree_util.tree_map(per_activation, fn(rows))


def nhp(fn: Callable, z: jax.Array, std: jax.Array, draws: jax.Array, eps: float = 0.1) -> jax.Array:
    """Tripod's normalized Hessian penalty: per activation the batch mean of numerator / (denominator + 1e-10)
    (:func:`nhp_values`), summed over fn's activations."""
    values = jax.tree_util.tree_leaves(nhp_values(fn, z, std, draws, eps))
    return sum(jnp.mean(v[0] / (v[1] + 1e-10)) for v in values)


# ----------------------------------------------------------------------------- quantizers (QLAE, Tripod FSQ)


def latent_quantize(z: jax.Array, values: jax.Array):
    """QLAE's latent quantization of z (n, d) onto per-latent codebooks values (d, n_v) (or one global (1, n_v)).

    Returns (z_q, indices, loss_quantize, loss_commit): z_q equals the nearest value (first on ties) with the
    identity gradient to z; loss_quantize = mean((sg(z) - q)^2) trains the values, loss_commit = mean((z - sg(q))^2)
    pulls z."""
    vals = jnp.broadcast_to(values, (z.shape[1], values.shape[-1]))
    indices = jnp.argmin(jnp.abs(sg(z)[:, :, None] - sg(vals)[None]), axis=-1)  # (n, d, n_v) distances
    q = jnp.take_along_axis(vals[None], indices[:, :, None], axis=2)[:, :, 0]
    z_q = z + sg(q - z)
    return z_q, indices, jnp.mean(jnp.square(sg(z) - q)), jnp.mean(jnp.square(z - sg(q)))


def fsq(z: jax.Array, levels) -> tuple[jax.Array, jax.Array]:
    """Tripod's finite scalar quantization: tanh, scale to [0, L - 1], round (straight-through), rescale to
    [-1, 1]. Returns (z_q, indices)."""
    top = jnp.asarray(levels, z.dtype) - 1
    scaled = (jnp.tanh(z) + 1) / 2 * top
    rounded = jnp.round(scaled)
    return 2 * (scaled + sg(rounded - scaled)) / top - 1, rounded.astype(jnp.int32)


# ----------------------------------------------------------------------------- Cliff


def _gaussian(u: jax.Array, sigma: float) -> jax.Array:
    return jnp.exp(-0.5 * u * u) / (sigma * math.sqrt(2 * math.pi))


def kde_grid(points: jax.Array, samples: jax.Array, sigma: float, derivative: bool = False) -> jax.Array:
    """(d, K): the KDE of samples[:, j] (n, d) with bandwidth sigma, or its derivative, at points[j] (d, K)."""
    u = (points[:, :, None] - samples.T[:, None, :]) / sigma  # (d, K, n)
    kernel = _gaussian(u, sigma)
    return jnp.mean(-u / sigma * kernel if derivative else kernel, axis=-1)


def _plogp(p: jax.Array) -> jax.Array:
    safe = jnp.where(p > 0, p, 1.0)
    return jnp.where(p > 0, p * jnp.log(safe), 0.0)


def _density(u: jax.Array, step: float) -> jax.Array:
    """u normalized to integrate to 1 over its last axis by the eq. 15 quadrature (an all-zero slice stays 0)."""
    c = step * u.sum(-1, keepdims=True)
    return u / jnp.where(c > 0, c, 1.0)


def _entropy(p: jax.Array, step: float) -> jax.Array:
    return -step * _plogp(p).sum(-1)


def cliff_loss(
    z: jax.Array,
    cond_index: jax.Array,
    *,
    sigma: float = 0.1,
    grid=(-5.0, 5.0, 100),
    lambda_uni: float = 0.5,
    lambda_biv: float = 1.0,
    lambda_kl: float = 0.7,
):
    """The Cliff criterion of z (n, d) with conditioning rows cond_index (d, M). Returns (total, uni, biv, kl).

    Standardize each latent (population std clamped to >= 1e-6); uni = sum_i H(|p_i'| normalized) on K points of
    [a, b]; biv = sum_{i != j} JSD over the M values zeta of latent j of the normalized |d p(z_i, z_j = zeta) / d z_i|;
    kl = sum_i [-log(2 sqrt 3) - mean_v log p_i(v)] over K points of [-sqrt 3, sqrt 3]."""
    a, b, num = grid
    n, d = z.shape
    mean, var = jnp.mean(z, 0), jnp.var(z, 0)
    x = (z - mean) / jnp.sqrt(jnp.maximum(var, 1e-12))
    step = (b - a) / num
    t = jnp.linspace(a, b, num, dtype=z.dtype)
    v = jnp.linspace(-math.sqrt(3.0), math.sqrt(3.0), num, dtype=z.dtype)
    uni = _entropy(_density(jnp.abs(kde_grid(jnp.broadcast_to(t, (d, num)), x, sigma, True)), step), step).sum()
    uv = (v[None, :, None] - x.T[:, None, :]) / sigma  # (d, K, n)
    log_p = logsumexp(-0.5 * uv * uv, axis=-1) - math.log(n * sigma * math.sqrt(2 * math.pi))
    kl = jnp.sum(-math.log(2 * math.sqrt(3.0)) - log_p.mean(-1))
    ut = (t[None, :, None] - x.T[:, None, :]) / sigma  # (d, K, n)
    dkernel = -ut / sigma * _gaussian(ut, sigma)
    zeta = jnp.take_along_axis(x.T, cond_index, axis=1)  # (d, M)
    kernel = _gaussian((zeta[:, :, None] - x.T[:, None, :]) / sigma, sigma)  # (d, M, n)
    joint = jnp.einsum("ikn,jmn->ijmk", dkernel, kernel) / n  # d p(z_i, z_j) / d z_i at (t_k, zeta_m)
    conditional = _density(jnp.abs(joint / kernel.mean(-1)[None, :, :, None]), step)  # (d, d, M, K)
    jsd = _entropy(conditional.mean(2), step) - _entropy(conditional, step).mean(-1)
    biv = jnp.sum(jnp.where(jnp.eye(d, dtype=bool), 0.0, jsd))
    return lambda_uni * uni + lambda_biv * biv + lambda_kl * kl, uni, biv, kl


# ----------------------------------------------------------------------------- the authors' functions


def _load(env: str):
    """The authors' package from the checkout named by ``env``, or None."""
    path = os.environ.get(env)
    if not path:
        return None
    sys.path.insert(0, str(ROOT / "python"))
    try:
        from jax_dropin_common import jax_compat, load_authors
    finally:
        sys.path.remove(str(ROOT / "python"))
    jax_compat()
    return load_authors(path).package


def authors_tripod():
    """The authors' Tripod functions (``QKERNELS_TRIPOD_REPO``) as plain functions of arrays, or None:
    ``klm(z, std)``, ``nhp(decoder, z, std, keys, k, eps)`` (their per-sample penalty, vmapped as their loss does,
    with the centre f(z) computed here: their loss shares it with the reconstruction), ``fsq(z, levels)``."""
    pkg = _load(TRIPOD_ENV)
    if pkg is None:
        return None
    ae = pkg.models.Autoencoder

    def klm_authors(z, std):
        n, d = z.shape
        return jnp.mean(ae.latent_multiinformation(z, jnp.diag(std**2 * silverman(n, d) ** 2), std))

    def nhp_authors(decoder, z, std, keys, k=2, eps=0.1):
        per = jax.vmap(ae.hessian_regularization, in_axes=(None, 0, None, 0, None, None, 0))(
            decoder, z, std, jax.vmap(decoder)(z), k, eps, keys
        )["hessian_penalty_normalized"]
        return sum(jnp.mean(v) for v in per.values())

    def fsq_authors(z, levels):
        return jax.vmap(pkg.nn.Quantizer(num_latents=z.shape[1], num_values_per_latent=levels))(z)["z_q"]

    return {"klm": klm_authors, "nhp": nhp_authors, "fsq": fsq_authors, "package": pkg}


def authors_qlae():
    """The authors' QLAE quantizer and losses (``QKERNELS_QLAE_REPO``), or None: ``latent_quantize(z, values)`` ->
    (z_hat, indices, quantization loss, commitment loss) through their ``QuantizedLatent`` (vmapped over the batch
    as their model is) and their ``QuantizedAE`` loss functions, batch means."""
    pkg = _load(QLAE_ENV)
    if pkg is None:
        return None
    latent_cls, model_cls = pkg.latents.QuantizedLatent, pkg.models.QuantizedAE

    def quantize_authors(z, values):
        latent = _with_values(latent_cls(z.shape[1], values.shape[-1], True, jax.random.PRNGKey(0)), values)
        outs = jax.vmap(latent)(z)
        loss_q = jax.vmap(model_cls.quantization_loss)(outs["z_continuous"], outs["z_quantized"])
        loss_c = jax.vmap(model_cls.commitment_loss)(outs["z_continuous"], outs["z_quantized"])
        return outs["z_hat"], outs["z_indices"], jnp.mean(loss_q), jnp.mean(loss_c)

    return {"latent_quantize": quantize_authors, "package": pkg}


def _with_values(latent, values):
    import equinox as eqx

    return eqx.tree_at(lambda m: m._values_per_latent, latent, [values[j] for j in range(values.shape[0])])


# ----------------------------------------------------------------------------- peak memory of one KLM


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def _klm_peak(variant: str, n: int, d: int) -> None:
    """Print the peak-RSS growth and the peak RSS (bytes) of one jitted KLM forward + backward at (n, d): compiled
    ahead of time, the process's peak (VmHWM) reset to its resident set (Linux ``/proc/self/clear_refs``), one run.
    Run each variant in its own process."""
    z = jax.random.normal(jax.random.PRNGKey(0), (n, d))
    std = jnp.std(z, 0) + 1e-6
    if variant == "qkernels":
        import qkernels.jax as qj

        def loss(z, std):
            return qj.klm_loss(z, std=std)
    else:
        authors = authors_tripod()
        loss = authors["klm"] if authors else klm
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(z, std).compile()
    jax.block_until_ready((z, std))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status("VmRSS")
    jax.block_until_ready(step(z, std))
    peak = _status("VmHWM")
    print(peak - before, peak)


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "klm-peak" or sys.argv[2] not in ("original", "qkernels"):
        raise SystemExit("usage: python benchmarks/jax_baselines.py klm-peak {original,qkernels} N D")
    _klm_peak(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
