"""qkernels.jax at the inputs that tell a right wrapper from a plausible wrong one (issue 58's review of the JAX
front-end; the ops' values against torch: tests/test_jax.py): each term's gradient of the Cliff loss (the backward
takes four upstream gradients, a swap of two is invisible through the total), a zero draw in the Rademacher signs
(+1 where >= 0), the conditioning rows 0 and n - 1 (valid) next to -1 and n (not), half-precision inputs (computed in
float32), and a constant latent under the penalty's default std (a zero gradient, not NaN)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import missing, require

import qkernels
from qkernels import _ext

jax = require("jax", "jax")
if not _ext.LOADED:
    missing("ext", "needs the built qkernels._C (the torch ops the JAX ops are compared with)")
qj = require("qkernels.jax", "jax", "needs qkernels/jax/_kernels.abi3.so (built when jax is importable)")
jnp = jax.numpy


@pytest.fixture(autouse=True)
def _cpu_backend():
    with qkernels.use_backend("cpu"), jax.enable_x64(True):
        yield


def _data(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def test_cliff_gradient_of_each_term_matches_torch():
    (z,) = _data((16, 3))
    cond = np.random.default_rng(1).integers(0, 16, (3, 4))
    kw = dict(sigma=0.4, grid=(-3.0, 3.0, 12), lambda_uni=0.5, lambda_biv=1.0, lambda_kl=0.7)
    weights = (1.0, 2.0, -3.0, 5.0)  # total, uni, biv, kl: every upstream gradient distinct and non-zero

    def combined(z):
        t = qj.cliff_loss(z, cond_index=jnp.asarray(cond), return_terms=True, **kw)
        return sum(w * term for w, term in zip(weights, t, strict=True))

    got = jax.grad(combined)(jnp.asarray(z))
    zt = torch.tensor(z, requires_grad=True)
    t = qkernels.cliff_loss(zt, cond_index=torch.tensor(cond), return_terms=True, **kw)
    sum(w * term for w, term in zip(weights, t, strict=True)).backward()
    np.testing.assert_allclose(np.asarray(got), zt.grad.numpy(), rtol=1e-12, atol=1e-14)
    for i in range(1, 4):  # each term alone: its own gradient, not another term's
        g = jax.grad(lambda z, i=i: qj.cliff_loss(z, cond_index=jnp.asarray(cond), return_terms=True, **kw)[i])(
            jnp.asarray(z)
        )
        zi = torch.tensor(z, requires_grad=True)
        qkernels.cliff_loss(zi, cond_index=torch.tensor(cond), return_terms=True, **kw)[i].backward()
        np.testing.assert_allclose(np.asarray(g), zi.grad.numpy(), rtol=1e-12, atol=1e-14, err_msg=str(i))


def test_a_zero_rademacher_draw_is_a_plus_one():
    z, w = _data((5, 2), (2, 3), seed=2)
    draws = np.concatenate([np.sign(_data((2, 5, 2), seed=3)[0]), _data((2, 5, 2), seed=4)[0]])
    draws[0, 1, 0] = draws[1, 3, 1] = 0.0  # exact zeros where the signs are taken
    plus = draws.copy()
    plus[0, 1, 0] = plus[1, 3, 1] = 1.0

    def terms(d):
        return qj.hessian_penalty_terms(lambda x: jnp.tanh(x @ jnp.asarray(w)), jnp.asarray(z), draws=jnp.asarray(d))

    minus = plus.copy()
    minus[0, 1, 0] = minus[1, 3, 1] = -1.0
    num, _ = terms(draws)
    np.testing.assert_array_equal(num, terms(plus)[0])
    assert not np.array_equal(num, terms(minus)[0])  # the sign matters here: the test tells +1 from -1


def test_conditioning_rows_from_0_to_n_minus_1():
    (z,) = _data((6, 2), seed=5)
    ok = jnp.asarray([[0, 5], [5, 0]])
    got = qj.cliff_loss(jnp.asarray(z), cond_index=ok, sigma=0.5, grid=(-3.0, 3.0, 8))
    want = qkernels.cliff_loss(torch.tensor(z), cond_index=torch.tensor(np.asarray(ok)), sigma=0.5, grid=(-3.0, 3.0, 8))
    np.testing.assert_allclose(float(got), float(want), rtol=1e-12)
    for bad in ([[0, 6], [1, 2]], [[-1, 0], [1, 2]]):
        with pytest.raises(ValueError, match=r"row indices in \[0, 6\)"):
            qj.cliff_loss(jnp.asarray(z), cond_index=jnp.asarray(bad), sigma=0.5, grid=(-3.0, 3.0, 8))


def test_half_precision_inputs_are_computed_in_float32():
    z, v = _data((20, 3), (5,), seed=6)
    zb = jnp.asarray(z, jnp.bfloat16)
    z32 = zb.astype(jnp.float32)
    loss = qj.klm_loss(zb)
    assert loss.dtype == jnp.float32
    np.testing.assert_array_equal(loss, qj.klm_loss(z32))
    q = qj.latent_quantize(zb, jnp.asarray(v, jnp.bfloat16))
    assert q.z_q.dtype == jnp.bfloat16 and q.loss_commit.dtype == jnp.float32
    np.testing.assert_array_equal(
        q.indices, qj.latent_quantize(z32, jnp.asarray(v, jnp.bfloat16).astype(jnp.float32)).indices
    )


def test_a_constant_latent_under_the_default_std_gets_a_zero_gradient():
    (z,) = _data((6, 3), seed=7)
    z[:, 1] = 0.25  # constant: std 0, + 1e-6

    def penalty(z):
        return qj.normalized_hessian_penalty(lambda x: jnp.tanh(x) ** 2 + x[:, :1] * x, z, jax.random.key(0))

    val, g = jax.jit(jax.value_and_grad(penalty))(jnp.asarray(z))
    assert np.isfinite(float(val)) and np.isfinite(np.asarray(g)).all()
