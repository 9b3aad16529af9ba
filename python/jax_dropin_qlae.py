"""QLAE (Hsu et al., NeurIPS 2023) in the authors' own JAX training code, with qkernels.jax's quantizer dropped in.

Imports the authors' model, loss and training step from a checkout of their repository
(github.com/kylehkhsu/latent_quantization; nothing of it is copied here), trains from one seed twice, the original
and with the drop-in, and prints the losses of every step side by side with their relative difference as it goes:

    git clone https://github.com/kylehkhsu/latent_quantization /tmp/latent_quantization
    python python/jax_dropin_qlae.py /tmp/latent_quantization                 # 10 steps, batch 128: ~3-5 min, 2 cores
    python python/jax_dropin_qlae.py /tmp/latent_quantization --steps 100 --gradients   # the 100-step agreement
    python python/jax_dropin_qlae.py /tmp/latent_quantization --size paper    # their image encoder / decoder, 64 x 64

Most of a short run is XLA compiling their train_step twice (it says which as it goes); ``--gradients`` compiles their
loss gradient twice more to compare the gradients at every step.

What it swaps, at run time (the checkout's files are not edited): ``QuantizedLatent.__call__`` (per latent, the
distance to every codebook value, argmin, straight-through) -> ``qkernels.jax.latent_quantize(x, codebook)`` for
the nearest values, their indices and the straight-through output. Their loss functions stay theirs: they take
``z_quantized``, the codebook gathered at the op's indices (the path of the quantization loss's gradient to the
codebook, as in their quantizer).

What differs from the paper's runs, for a CPU: procedural 6-factor images instead of Shapes3D (their data sets load
through TensorFlow Datasets); ``--size small`` (the default) trains 32 x 32 images with their encoder and decoder
classes at small widths (3 strided convolutions 16-32-32, one dense layer of 64; the style decoder 32-32-16).
Latents (12 = 2 x 6 sources), codebooks (10 values from linspace(-0.5, 0.5)), lambdas (BCE 1, quantization 0.01,
commitment 0.01, weight decay 0.1), AdamW 1e-3 with clipping 1 and batch 128 are theirs.
"""

from __future__ import annotations

import functools
import sys
import types

import equinox as eqx
import jax
import jax.numpy as jnp
from jax_dropin_common import (
    ConfigDict,
    cli,
    compiled,
    in_float64,
    jax_compat,
    load_authors,
    params_filtered,
    procedural_images,
    quietly,
)

NUM_LATENTS, NUM_VALUES = 12, 10  # 2 x the 6 sources of Shapes3D; QLAE's n_v
LAMBDAS = {"binary_cross_entropy": 1.0, "quantization": 0.01, "commitment": 0.01, "l2": 0.1, "l1": 0.0}
# (conv widths, kernels, strides; dense widths; style-decoder widths, kernels, strides; image size)
SIZES = {
    "paper": (
        [32, 32, 32, 64, 64, 64, 128, 128, 128, 256, 256, 256],
        [3, 3, 4] * 4,
        [1, 1, 2] * 4,
        [256, 256],
        [256, 256, 256, 128, 128, 128, 64, 64, 64, 32, 32, 32],
        [3, 3, 4] * 4,
        [1, 1, 2] * 4,
        64,
    ),
    "small": ([16, 32, 32], [4] * 3, [2] * 3, [64], [32, 32, 16], [4] * 3, [2] * 3, 32),
}


def build(pkg, size: str, x, key):
    """The authors' QuantizedAE (image encoder, style decoder, per-latent learnable codebooks) for images like x."""
    conv, kernels, strides, dense, style, style_kernels, style_strides, _ = SIZES[size]
    blocks = pkg.blocks
    encoder = functools.partial(
        pkg.encoders.ImageEncoder,
        conv_partial=functools.partial(
            blocks.Conv2DBlocks,
            widths=conv,
            kernel_sizes=kernels,
            strides=strides,
            paddings=[1] * len(conv),
            activation="leaky_relu",
            norm="instance_norm",
        ),
        dense_partial=functools.partial(blocks.DenseBlocks, widths=dense, activation="relu", norm="none"),
    )
    decoder = functools.partial(
        pkg.decoders.StyleImageDecoder,
        dense_partial=functools.partial(blocks.DenseBlocks, widths=dense, activation="relu", norm="none"),
        style_conv_transpose_partial=functools.partial(
            blocks.StyleConvTranspose2DBlocks,
            widths=style,
            kernel_sizes=style_kernels,
            strides=style_strides,
            paddings=[1] * len(style),
            activation="leaky_relu",
            norm="none",
        ),
        conv_partial=functools.partial(
            blocks.Conv2DBlock, kernel_size=3, stride=1, padding=1, norm="none", activation="none"
        ),
        input_channels=conv[-1],
    )
    latent = functools.partial(
        pkg.latents.QuantizedLatent, num_latents=NUM_LATENTS, num_values_per_latent=NUM_VALUES, optimize_values=True
    )
    return pkg.models.QuantizedAE(latent, encoder, decoder, ConfigDict(LAMBDAS), x=x, key=key)


def dropin_patches(latents_module, qj, traced: dict) -> list:
    """The (owner, name, value) patch of the drop-in; ``traced`` counts the traces of the replacement."""

    def quantize(self, x, *, key=None):
        traced["latent_quantize"] += 1
        codebook = jnp.stack(self.values_per_latent)  # (d, n_v); stop_gradient'ed when the values are fixed
        out = qj.latent_quantize(x, codebook)
        quantized = jnp.take_along_axis(codebook, out.indices[..., None], axis=-1)[..., 0]
        return {"z_continuous": x, "z_quantized": quantized, "z_hat": out.z_q, "z_indices": out.indices}

    return [(latents_module.QuantizedLatent, "__call__", quantize)]


def stepper(step_fn, grad_fn, optimizer):
    """(step, grad) on the state (model, optimizer state); the key is (step number, PRNG key) as their loop gives."""

    def step(state, batch, key):
        m, s, aux = step_fn(state[0], optimizer, state[1], batch, *key)
        return (m, s), aux

    return step, grad_fn and (lambda state, batch, key: grad_fn(state[0], batch, *key))


def setup(checkout, *, size="small", batch=128, steps=1, seed=100, x64=False, gradients=True):
    """The authors' model, optimizer, training step (original and with the drop-in: (step, grad) pairs, grad None
    without ``gradients``), ``steps`` batches and (step number, key) pairs, from ``seed`` as their script draws them."""
    import qkernels.jax as qj

    authors = load_authors(checkout, scripts=["train_ae"])
    compat = jax_compat()
    pkg, train_step = authors.package, authors.scripts["train_ae"].train_step
    image_size = SIZES[size][-1]
    data_keys = jax.random.split(jax.random.PRNGKey(seed + 1), steps)
    batches = [{"x": procedural_images(k, batch, image_size)} for k in data_keys]  # their x lies in [0, 1]
    model_key, _, train_key, _ = jax.random.split(jax.random.PRNGKey(seed), 4)  # their main()'s keys
    with jax.enable_x64(False):  # their modules hard-code float32 in places: build in float32, then cast
        model = build(pkg, size, batches[0]["x"][0].astype(jnp.float32), model_key)
    if x64:
        model, batches = in_float64(model), in_float64(batches)
    config = types.SimpleNamespace(
        model_partial=types.SimpleNamespace(lambdas={"l2": LAMBDAS["l2"]}),
        optim=types.SimpleNamespace(learning_rate=1e-3, clip=1.0),
    )
    optimizer, opt_state = quietly(model.construct_optimizer, config)
    optimizer = params_filtered(optimizer, eqx.is_inexact_array)  # the leaves their labels cover
    step_keys = []
    for i in range(steps):
        train_key, sub = jax.random.split(train_key)
        step_keys.append((jnp.array(i), sub))

    traced = {"latent_quantize": 0}
    gradient = eqx.filter_jit(
        lambda m, b, step, key: eqx.filter_grad(m.batched_loss, has_aux=True)(m, b, step, key=key)[0]
    )
    variants = []
    variants_patches = ((" (original)", []), (" with qkernels.jax", dropin_patches(pkg.latents.quantized, qj, traced)))
    for which, patches in variants_patches:
        step_fn = compiled(
            train_step,
            model,
            optimizer,
            opt_state,
            batches[0],
            *step_keys[0],
            patches=patches,
            label=f"their train_step{which}",
        )
        grad_fn = (
            compiled(gradient, model, batches[0], *step_keys[0], patches=patches, label=f"their loss gradient{which}")
            if gradients
            else None
        )
        variants.append(stepper(step_fn, grad_fn, optimizer))

    def losses(aux):
        m = aux["metrics"]
        return {
            "total": jnp.mean(m["loss"]),
            "BCE": jnp.mean(m["binary_cross_entropy_loss"]),
            "quantization": jnp.mean(m["quantization_loss"]),
            "commitment": jnp.mean(m["commitment_loss"]),
        }

    def swapped():
        return f"QuantizedLatent.__call__ -> qkernels.jax.latent_quantize (traced {traced['latent_quantize']}x)"

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
    sys.exit(cli(__doc__, repo="github.com/kylehkhsu/latent_quantization", batch=128, seed=100, setup=setup))
