"""The baselines of benchmarks/test_jax.py (benchmarks/jax_baselines.py) compute what the ops compute (float64, values
and gradients):

- every formulation of benchmarks/jax_baselines.py against qkernels' torch reference (qkernels.reference), always;
- against the authors' own functions when a checkout is named (QKERNELS_TRIPOD_REPO, QKERNELS_QLAE_REPO; skipped
  otherwise): KLM, the normalized Hessian penalty (the authors' per-sample draws through
  python/jax_dropin_tripod.py's ``tripod_draws``), FSQ, and the latent quantizer with its two losses;
- the drop-in examples (python/jax_dropin_*.py) for 2 steps in float64 with the checkouts: the drop-in's losses
  and gradients equal the original's to 1e-9; and Tripod's penalty in float32 at the drop-in's initial state:
  the drop-in's value equals the original's to 1e-4, both are far from the float64 value along the same
  directions (printed: the authors' float32 penalty is rounding-dominated there).

    .venv/bin/python -m pytest tests/test_jax_baselines.py -q
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import require

jax = require("jax", "jax")
import jax.numpy as jnp  # noqa: E402

from qkernels.reference import hessian as ref_hessian  # noqa: E402
from qkernels.reference import kde as ref_kde  # noqa: E402
from qkernels.reference import quantize as ref_quantize  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _load_baselines():
    """benchmarks/jax_baselines.py as a module (benchmarks/ stays off sys.path: its test files share names with
    these)."""
    spec = importlib.util.spec_from_file_location("jax_baselines", ROOT / "benchmarks" / "jax_baselines.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


jb = _load_baselines()

RTOL = 1e-12  # float64
RTOL_FD = 1e-9  # the Hessian penalty: second differences / eps^2 lose 2 digits; with or without the centre rows


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def rng(seed=0):
    return np.random.default_rng(seed)


def close(a, b, rtol=RTOL):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(np.abs(b).max(initial=0.0), 1e-300)
    assert np.abs(a - b).max(initial=0.0) <= rtol * scale, (np.abs(a - b).max(), scale)


def torch_grads(loss, *arrays):
    """loss(*tensors) and its gradient in each input, float64 torch."""
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = loss(*ts)
    out.backward()
    return out.detach().numpy(), [t.grad.numpy() for t in ts]


def jax_grads(loss, *arrays):
    """loss(*arrays) and its gradients, jitted: one XLA compile instead of one per primitive (eager JAX compiles each
    op at its first shape, tens of seconds for Cliff on 2 cores)."""
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(arrays)))))(*map(jnp.asarray, arrays))
    return np.asarray(value), [np.asarray(g) for g in grads]


# ----------------------------------------------------------------------------- against the torch reference


@pytest.mark.parametrize(("n", "d"), [(2, 1), (7, 3), (64, 12)])
def test_klm_equals_torch_reference(n, d):
    z = rng(1).normal(size=(n, d))
    std = z.std(0) + 0.3
    tv, tg = torch_grads(lambda z, s: ref_kde.klm(z, s)[0], z, std)
    jv, jg = jax_grads(jb.klm, z, std)
    close(jv, tv)
    for a, b in zip(jg, tg, strict=True):
        close(a, b)


def mlp_arrays(d, widths=(5, 4), seed=2):
    g = rng(seed)
    sizes = [d, *widths]
    return [
        (g.normal(size=(a, b)) / math.sqrt(a), g.normal(size=b) * 0.1)
        for a, b in zip(sizes[:-1], sizes[1:], strict=True)
    ]


def test_nhp_equals_torch_reference():
    n, d, k, eps = 6, 3, 2, 0.1
    g = rng(3)
    z, std, draws = g.normal(size=(n, d)), g.uniform(0.5, 1.5, size=d), g.normal(size=(2 * k, n, d))
    params = mlp_arrays(d)

    def torch_loss(z, std):
        h, total = ref_hessian.perturbed_batch(z, torch.tensor(draws), std, eps, k, "std"), 0.0
        for w, b in params:
            h = torch.nn.functional.gelu(h @ torch.tensor(w) + torch.tensor(b), approximate="tanh")
            values, _ = ref_hessian.finite_difference_curvature(h, n, k, eps, 2, False, "mean")
            total = total + ref_hessian.curvature_penalty(values, True, "mean")
        return total

    def fn(x):
        out = []
        for w, b in params:
            x = jax.nn.gelu(x @ w + b)
            out.append(x)
        return out

    tv, tg = torch_grads(torch_loss, z, std)
    jv, jg = jax_grads(lambda z, s: jb.nhp(fn, z, s, jnp.asarray(draws), eps), z, std)
    close(jv, tv, RTOL_FD)
    for a, b in zip(jg, tg, strict=True):
        close(a, b, RTOL_FD)


@pytest.mark.parametrize("global_codebook", [False, True])
def test_latent_quantize_equals_torch_reference(global_codebook):
    g = rng(4)
    z = g.normal(size=(9, 4)) * 0.6
    values = g.normal(size=(1 if global_codebook else 4, 7)) * 0.5
    upstream = g.normal(size=z.shape)
    t = ref_quantize.latent_quantize(torch.tensor(z), torch.tensor(values))
    q, idx, _, _ = jb.latent_quantize(jnp.asarray(z), jnp.asarray(values))
    close(q, t[0].numpy())
    assert np.array_equal(np.asarray(idx), t[1].numpy())

    def loss(quantize, module):
        def f(z, values):
            z_q, _, loss_q, loss_c = quantize(z, values)
            return (z_q * module.asarray(upstream)).sum() + 0.3 * loss_q + 0.7 * loss_c

        return f

    tv, tg = torch_grads(loss(ref_quantize.latent_quantize, torch), z, values)
    jv, jg = jax_grads(loss(jb.latent_quantize, jnp), z, values)
    close(jv, tv)
    for a, b in zip(jg, tg, strict=True):
        close(a, b)


def test_fsq_equals_torch_reference():
    g = rng(5)
    z, upstream = g.normal(size=(11, 3)) * 2, g.normal(size=(11, 3))
    levels = [12, 5, 2]
    tq, tidx = ref_quantize.fsq(torch.tensor(z), torch.tensor(levels))
    q, idx = jb.fsq(jnp.asarray(z), jnp.asarray(levels))
    close(q, tq.numpy())
    assert np.array_equal(np.asarray(idx), tidx.numpy())
    _, tg = torch_grads(lambda z: (ref_quantize.fsq(z, torch.tensor(levels))[0] * torch.tensor(upstream)).sum(), z)
    _, jg = jax_grads(lambda z: (jb.fsq(z, jnp.asarray(levels))[0] * upstream).sum(), z)
    close(jg[0], tg[0])


@pytest.mark.parametrize("derivative", [False, True])
def test_kde_grid_equals_torch_reference(derivative):
    g = rng(6)
    points, samples, upstream = g.normal(size=(3, 8)) * 2, g.normal(size=(10, 3)), g.normal(size=(3, 8))

    def loss(fn, module):
        return lambda p, s: (fn(p, s, 0.3, derivative) * module.asarray(upstream)).sum()

    tv, tg = torch_grads(loss(ref_kde.kde_grid, torch), points, samples)
    jv, jg = jax_grads(loss(jb.kde_grid, jnp), points, samples)
    close(jv, tv)
    for a, b in zip(jg, tg, strict=True):
        close(a, b)


@pytest.mark.parametrize(("n", "d", "m", "k"), [(12, 1, 3, 20), (16, 3, 4, 25)])
def test_cliff_equals_torch_reference(n, d, m, k):
    g = rng(7)
    z = g.normal(size=(n, d)) + np.linspace(0, 1, d)
    idx = np.stack([g.permutation(n)[:m] for _ in range(d)])
    args = (0.3, -4.0, 4.0, k, 0.5, 1.0, 0.7)
    terms = ref_kde.cliff_loss(torch.tensor(z), torch.tensor(idx), *args)

    def total(z):  # the loss, with every term beside it: one jitted call gives the terms and the gradient
        ours = jb.cliff_loss(z, jnp.asarray(idx), sigma=0.3, grid=(-4.0, 4.0, k))
        return ours[0], ours

    (_, ours), jg = jax.jit(jax.value_and_grad(total, has_aux=True))(jnp.asarray(z))
    for a, b in zip(ours, terms, strict=True):
        close(a, b.numpy())
    _, tg = torch_grads(lambda z: ref_kde.cliff_loss(z, torch.tensor(idx), *args)[0], z)
    close(jg, tg[0])


# ----------------------------------------------------------------------------- against the authors' code


@pytest.fixture(scope="module")
def tripod():
    if not os.environ.get(jb.TRIPOD_ENV):
        pytest.skip(f"{jb.TRIPOD_ENV} names no checkout of github.com/kylehkhsu/tripod")
    require("equinox", "equinox")
    return jb.authors_tripod()


@pytest.fixture(scope="module")
def qlae():
    if not os.environ.get(jb.QLAE_ENV):
        pytest.skip(f"{jb.QLAE_ENV} names no checkout of github.com/kylehkhsu/latent_quantization")
    require("equinox", "equinox")
    return jb.authors_qlae()


def test_klm_equals_authors(tripod):
    z = np.round(np.tanh(rng(8).normal(size=(64, 12))) * 5.5) / 5.5  # FSQ-like values, with ties
    std = np.abs(rng(9).normal(size=12)) + 0.2
    av, ag = jax_grads(tripod["klm"], z, std)
    jv, jg = jax_grads(jb.klm, z, std)
    close(jv, av)
    for a, b in zip(jg, ag, strict=True):
        close(a, b)


def test_nhp_equals_authors(tripod):
    sys.path.insert(0, str(ROOT / "python"))
    try:
        from jax_dropin_tripod import tripod_draws
    finally:
        sys.path.remove(str(ROOT / "python"))
    n, d, k = 5, 3, 2
    g = rng(10)
    z, std = g.normal(size=(n, d)), g.uniform(0.5, 1.5, size=d)
    keys = jax.random.split(jax.random.PRNGKey(11), n)
    params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in mlp_arrays(d)]

    def fn(x):
        out = {}
        for i, (w, b) in enumerate(params):
            x = jax.nn.gelu(x @ w + b)
            out[f"h{i}"] = x
        return out

    av, ag = jax_grads(lambda z, s: tripod["nhp"](fn, z, s, keys, k, 0.1), z, std)
    jv, jg = jax_grads(lambda z, s: jb.nhp(fn, z, s, tripod_draws(keys, k, d, z.dtype), 0.1), z, std)
    close(jv, av, RTOL_FD)
    for a, b in zip(jg, ag, strict=True):
        close(a, b, RTOL_FD)


def test_fsq_equals_authors(tripod):
    g = rng(12)
    z, upstream = g.normal(size=(20, 4)) * 2, g.normal(size=(20, 4))
    close(tripod["fsq"](jnp.asarray(z), 12), jb.fsq(jnp.asarray(z), 12)[0])
    _, ag = jax_grads(lambda z: (tripod["fsq"](z, 12) * upstream).sum(), z)
    _, jg = jax_grads(lambda z: (jb.fsq(z, 12)[0] * upstream).sum(), z)
    close(jg[0], ag[0])


def test_latent_quantize_equals_authors(qlae):
    g = rng(13)
    z, values, upstream = g.normal(size=(16, 5)) * 0.5, np.sort(g.normal(size=(5, 10)) * 0.4), g.normal(size=(16, 5))
    for a, b in zip(
        qlae["latent_quantize"](jnp.asarray(z), jnp.asarray(values)),
        jb.latent_quantize(jnp.asarray(z), jnp.asarray(values)),
        strict=True,
    ):
        close(b, a)

    def loss(quantize):
        def f(z, values):
            z_q, _, loss_q, loss_c = quantize(z, values)
            return (z_q * upstream).sum() + 0.3 * loss_q + 0.7 * loss_c

        return f

    av, ag = jax_grads(loss(qlae["latent_quantize"]), z, values)
    jv, jg = jax_grads(loss(jb.latent_quantize), z, values)
    close(jv, av)
    for a, b in zip(jg, ag, strict=True):
        close(a, b)


@pytest.mark.parametrize("method", ["tripod", "qlae"])
def test_dropin_lockstep_float64(method, capsys):
    env = jb.TRIPOD_ENV if method == "tripod" else jb.QLAE_ENV
    if not os.environ.get(env):
        pytest.skip(f"{env} names no checkout")
    require("equinox", "equinox")
    sys.path.insert(0, str(ROOT / "python"))
    try:
        module = __import__(f"jax_dropin_{method}")
    finally:
        sys.path.remove(str(ROOT / "python"))
    common = sys.modules["jax_dropin_common"]
    run = module.setup(os.environ[env], batch=8, steps=2, x64=True)
    runs = common.run_pair(run.original, run.dropin, run.state, run.batches, run.keys, run.losses)
    worst = common.report(runs)
    assert all(run.traced.values()), run.traced
    assert max(v for name, v in worst.items() if "indep." not in name) <= 1e-9, worst


def test_tripod_nhp_float32(capsys):
    """The authors' normalized Hessian penalty in float32 at the drop-in's initial state (python/
    jax_dropin_tripod.py, batch 64): the drop-in's value equals theirs to 1e-4 (float32 rounding). Printed: both
    float32 values and their gradients' distance from the drop-in in float64 along the same directions (the float32
    draws, cast; float64 drop-in = float64 original: test_dropin_lockstep_float64), quoted in docs/jax.md."""
    if not os.environ.get(jb.TRIPOD_ENV):
        pytest.skip(f"{jb.TRIPOD_ENV} names no checkout")
    eqx = require("equinox", "equinox")
    sys.path.insert(0, str(ROOT / "python"))
    try:
        import jax_dropin_tripod as tripod_module
        from jax_dropin_common import (
            compiled,
            gradient_difference,
            in_float64,
            jax_compat,
            load_authors,
            procedural_images,
        )
    finally:
        sys.path.remove(str(ROOT / "python"))
    import qkernels.jax as qj

    pkg = load_authors(os.environ[jb.TRIPOD_ENV]).package
    jax_compat()
    key = jax.random.PRNGKey(1000)
    with jax.enable_x64(False):
        model, size = tripod_module.build(pkg, "small", key)
        batch = {"x": procedural_images(jax.random.PRNGKey(1), 64, size, low=-1.0)}
    only_nhp = {
        "reconstruct": 0.0,
        "latent_multiinformation": 0.0,
        "hessian_penalty": 0.0,
        "hessian_penalty_normalized": 1.0,
    }
    model = eqx.tree_at(lambda m: m.lambdas, model, only_nhp)

    def value_and_grad(m, b, *, key):
        (value, _), grads = eqx.filter_value_and_grad(m.batched_loss, has_aux=True)(m, b, key=key)
        return value, grads

    step = eqx.filter_jit(value_and_grad)
    traced = {"klm_loss": 0, "normalized_hessian_penalty": 0}
    patches = tripod_module.dropin_patches(pkg.models.autoencoder, qj, traced)
    out = {}
    with jax.enable_x64(False):
        for name, p in (("original", []), ("drop-in", patches)):
            out[name, 32] = compiled(step, model, batch, key=key, patches=p)(model, batch, key=key)
    m64, b64 = in_float64(model), in_float64(batch)
    draws = tripod_module.tripod_draws
    tripod_module.tripod_draws = lambda keys, k, d, dtype=jnp.float32: draws(keys, k, d, jnp.float32).astype(dtype)
    try:  # float64 along the float32 directions: the drop-in's draws are the authors' keys' float32 draws, cast
        out["drop-in", 64] = compiled(step, m64, b64, key=key, patches=patches)(m64, b64, key=key)
    finally:
        tripod_module.tripod_draws = draws
    assert abs(float(out["drop-in", 32][0]) / float(out["original", 32][0]) - 1) <= 1e-4
    exact = out["drop-in", 64]
    with capsys.disabled():
        for name in ("original", "drop-in"):
            value, grads = out[name, 32]
            print(
                f"\n{name} float32 NHP {float(value):.6g} (float64, same directions: {float(exact[0]):.6g}); "
                f"gradient distance from float64 / its norm: {gradient_difference(exact[1], grads):.3g}"
            )
