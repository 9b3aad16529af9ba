"""Tripod (Hsu et al., ICML 2024) in the authors' own JAX training code, with qkernels.jax dropped in.

Imports the authors' model, loss and training step from a checkout of their repository (github.com/kylehkhsu/tripod;
nothing of it is copied here), trains from one seed twice, the original and with the drop-in, and prints the
losses of every step side by side with their relative difference as it goes:

    git clone https://github.com/kylehkhsu/tripod /tmp/tripod
    python python/jax_dropin_tripod.py /tmp/tripod                 # 10 steps, batch 64, small model: ~5 min, 2 cores
    python python/jax_dropin_tripod.py /tmp/tripod --steps 100 --gradients   # the 100-step agreement (docs/jax.md)
    python python/jax_dropin_tripod.py /tmp/tripod --size paper    # the paper's encoder and decoder, 64 x 64 images

Most of a short run is XLA compiling their train_step twice (the original and the drop-in: minutes on 2 cores; it says
which as it goes); ``--gradients`` compiles their loss gradient twice more to compare the gradients at every step.

What it swaps, at run time (the checkout's files are not edited):

- ``Autoencoder.latent_multiinformation(z, H, h)`` (KLM: (n, n, d) tensors) -> ``qkernels.jax.klm_loss(z, std=h)``
  (O(n d) memory), the batch value given to every sample (the loss averages them). H is Silverman's diag(h^2 f^2),
  which the op forms itself.
- ``jax.vmap(Autoencoder.hessian_regularization, ...)`` in ``Autoencoder.batched_loss`` (NHP, one sample at a
  time) -> ``qkernels.jax.normalized_hessian_penalty`` on the whole batch: one decoder call on the 4k n stacked
  rows, the fused curvature reduction, along the same directions (drawn from the authors' per-sample keys as their
  code draws them: :func:`tripod_draws`).

What differs from the paper's runs, for a CPU: procedural 6-factor images instead of Shapes3D (their data sets load
through TensorFlow Datasets); ``--size small`` (the default) trains 16 x 16 images and replaces their decoder,
whose widths are fixed (512 channels at 4 x 4 up to 64 x 64 images), by :class:`SmallDecoder`: the same layout
from their own layers at CPU widths. The optimizer, clipping, learning rate, lambdas (Shapes3D: KLM 1e-4, NHP 1e-2),
k = 2, eps = 0.1, FSQ with 12 values and 12 latents are theirs.
"""

from __future__ import annotations

import functools
import sys
import types

import equinox as eqx
import jax
import jax.numpy as jnp
from jax_dropin_common import (
    cli,
    compiled,
    in_float64,
    jax_compat,
    load_authors,
    params_filtered,
    procedural_images,
    quietly,
)

NUM_LATENTS = 12  # 2 x the 6 sources of Shapes3D (Tripod Table 4)
REGULARIZED = ["cond", "block0", "block1", "block2"]  # their configs/train_autoencoder.yaml
VMAP_AXES = (None, 0, None, 0, None, None, 0)  # how batched_loss vmaps hessian_regularization


def tripod_draws(keys: jax.Array, k: int, d: int, dtype=jnp.float32) -> jax.Array:
    """(2k, n, d) draws from n per-sample keys, as the authors' penalty draws its directions (per sample: the key
    split in two, k Rademacher signs from the first half, k standard normals from the second): the signs of the
    first k are the Rademacher directions, the other k the Gaussian ones (qkernels' convention)."""

    def one(key):
        r_key, g_key = jax.random.split(key)
        return jnp.concatenate(
            [jax.random.rademacher(r_key, (k, d)).astype(dtype), jax.random.normal(g_key, (k, d), dtype)]
        )

    return jnp.moveaxis(jax.vmap(one)(keys), 0, 1)


class SmallDecoder(eqx.Module):
    """Tripod's decoder layout at CPU widths, from the authors' own layers: a two-layer conditioning MLP
    (``LinearLayerNormAct``), then upsampling stages of a conditioned residual block (``ResCondConvBlock``) and a
    2x ``Upsample`` from a learned 1 x 1 input; returns the activations by name ('cond', 'block0', 'block1',
    'block2', 'x_logits' (3, 16, 16)), as their ``ResidualDecoder`` does."""

    start: jax.Array
    cond: eqx.nn.Sequential
    stages: tuple

    def __init__(self, *, latent_size: int, layers: types.ModuleType, widths=(32, 32, 16, 16), cond_size=64, key):
        keys = iter(jax.random.split(key, 2 + 2 * len(widths)))
        self.start = jnp.ones((widths[0], 1, 1))
        self.cond = eqx.nn.Sequential(
            [
                layers.LinearLayerNormAct(latent_size, cond_size, key=next(keys)),
                layers.LinearLayerNormAct(cond_size, key=next(keys)),
            ]
        )
        self.stages = tuple(
            (layers.ResCondConvBlock(cond_size, w, key=next(keys)), layers.Upsample(w, out_channels=o, key=next(keys)))
            for w, o in zip(widths, (*widths[1:], 3), strict=True)
        )

    def __call__(self, z, *, key=None):
        cond = self.cond(z)
        outs, x = {"cond": cond}, self.start
        for i, (block, upsample) in enumerate(self.stages):
            x = upsample(block(x, cond))
            outs["x_logits" if i == len(self.stages) - 1 else f"block{i}"] = x
        return outs


class _JaxBatchingPenalty:
    """Stands for the ``jax`` module in the authors' autoencoder module: ``vmap`` of their per-sample penalty gives
    the batched replacement; everything else is JAX's."""

    def __init__(self, per_sample, batched):
        self._per_sample, self._batched = per_sample, batched

    def __getattr__(self, name):
        return getattr(jax, name)

    def vmap(self, fun, *args, **kwargs):
        if fun is not self._per_sample:
            return jax.vmap(fun, *args, **kwargs)
        axes = kwargs.get("in_axes", args[0] if args else None)
        if tuple(axes) != VMAP_AXES:
            raise RuntimeError(f"the authors' loss vmaps hessian_regularization with in_axes={axes}, not {VMAP_AXES}")
        return self._batched


def dropin_patches(autoencoder_module, qj, traced: dict) -> list:
    """The (owner, name, value) patches of the drop-in; ``traced`` counts the traces of each replacement."""
    ae = autoencoder_module.Autoencoder

    def latent_multiinformation(z, H, h):
        traced["klm_loss"] += 1
        return jnp.broadcast_to(qj.klm_loss(z, std=h), z.shape[:1])

    def batched_penalty(decoder, z, z_std, f_z, k, epsilon, keys):
        traced["normalized_hessian_penalty"] += 1  # f_z: the centre f(z) cancels from the variances
        draws = tripod_draws(keys, k, z.shape[1], z.dtype)
        num, den = qj.hessian_penalty_terms(jax.vmap(decoder), z, z_std, draws=draws, eps=epsilon)
        return {
            "hessian_penalty": num,
            "hessian_penalty_normalized": {name: num[name] / (den[name] + 1e-10) for name in num},
        }

    return [
        (ae, "latent_multiinformation", staticmethod(latent_multiinformation)),
        (autoencoder_module, "jax", _JaxBatchingPenalty(ae.hessian_regularization, batched_penalty)),
    ]


def stepper(step_fn, grad_fn, optimizer):
    """(step, grad) on the state (model, optimizer state), from the compiled train_step and loss gradient."""

    def step(state, batch, key):
        m, s, log = step_fn(state[0], state[1], optimizer, batch, key=key)
        return (m, s), log

    return step, grad_fn and (lambda state, batch, key: grad_fn(state[0], batch, key=key))


def build(pkg, size: str, key):
    """The authors' Autoencoder with Tripod's Shapes3D settings: (model, image size)."""
    layers = pkg.nn
    decoder = (
        functools.partial(layers.ResidualDecoder, normalize_outputs=False)
        if size == "paper"
        else functools.partial(SmallDecoder, layers=layers)
    )
    model = pkg.models.Autoencoder(
        encoder=layers.ResidualEncoder,
        decoder=decoder,
        latent_size=NUM_LATENTS,
        lambdas={
            "reconstruct": 1.0,
            "latent_multiinformation": 1e-4,
            "hessian_penalty": 0.0,
            "hessian_penalty_normalized": 1e-2,
        },
        reconstruction_loss_fn="binary_cross_entropy",
        regularized_attributes=["encoder", "decoder"],
        hessian_regularization_on=REGULARIZED,
        num_perturbations=2,
        epsilon=0.1,
        quantize_latents=True,
        num_quantized_values=12,
        key=key,
    )
    return model, 64 if size == "paper" else 16


def setup(checkout, *, size="small", batch=64, steps=1, seed=1000, x64=False, gradients=True):
    """The authors' model, optimizer, training step (original and with the drop-in: (step, grad) pairs, grad None
    without ``gradients``), ``steps`` batches and step keys, from ``seed`` as their training script draws them."""
    import qkernels.jax as qj

    authors = load_authors(checkout, scripts=["train_autoencoder"])
    compat = jax_compat()
    pkg, train_step = authors.package, authors.scripts["train_autoencoder"].train_step
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 100))  # their main(): model key, then the train key
    with jax.enable_x64(False):  # their modules hard-code float32 in places: build in float32, then cast
        model, image_size = build(pkg, size, next(keys))
    if x64:
        model = in_float64(model)
    config = types.SimpleNamespace(optim=types.SimpleNamespace(learning_rate=2e-4, weight_decay=0.0, clip=1.0))
    optimizer, opt_state = quietly(model.construct_optimizer, config)
    optimizer = params_filtered(optimizer, eqx.is_array)  # the leaves their labels cover (optax >= 0.2 checks)
    train_key = next(keys)
    step_keys = []
    for _ in range(steps):
        train_key, sub = jax.random.split(train_key)
        step_keys.append(sub)
    data_keys = jax.random.split(jax.random.PRNGKey(seed + 1), steps)
    batches = [{"x": procedural_images(k, batch, image_size, low=-1.0)} for k in data_keys]  # their x: [-1, 1]

    traced = {"klm_loss": 0, "normalized_hessian_penalty": 0}
    gradient = eqx.filter_jit(lambda m, b, *, key: eqx.filter_grad(m.batched_loss, has_aux=True)(m, b, key=key)[0])
    variants = []
    variants_patches = ((" (original)", []), (" with qkernels.jax", dropin_patches(pkg.models.autoencoder, qj, traced)))
    for which, patches in variants_patches:
        step_fn = compiled(
            train_step,
            model,
            opt_state,
            optimizer,
            batches[0],
            key=step_keys[0],
            patches=patches,
            label=f"their train_step{which}",
        )
        grad_fn = (
            compiled(
                gradient, model, batches[0], key=step_keys[0], patches=patches, label=f"their loss gradient{which}"
            )
            if gradients
            else None
        )
        variants.append(stepper(step_fn, grad_fn, optimizer))

    def losses(log):
        return {
            "total": jnp.mean(log["loss/total"]),
            "reconstruct": jnp.mean(log["loss/reconstruct"]),
            "KLM": jnp.mean(log["loss/latent_multiinformation"]),
            "NHP": jnp.mean(log["loss/hessian_penalty_normalized"]),
        }

    def swapped():
        return (
            f"Autoencoder.latent_multiinformation -> qkernels.jax.klm_loss (traced {traced['klm_loss']}x); "
            "vmap(Autoencoder.hessian_regularization) in batched_loss -> qkernels.jax.hessian_penalty_terms on "
            f"the stacked batch (traced {traced['normalized_hessian_penalty']}x)"
        )

    return types.SimpleNamespace(
        authors=authors,
        compat=compat,
        state=(model, opt_state),
        batches=batches,
        keys=step_keys,
        original=variants[0],
        dropin=variants[1],
        losses=losses,
        traced=traced,
        swapped=swapped,
        image_size=image_size,
    )


if __name__ == "__main__":
    sys.exit(cli(__doc__, repo="github.com/kylehkhsu/tripod", batch=64, seed=1000, setup=setup))
