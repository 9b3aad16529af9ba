"""FSQ at exact half steps (issue 58): Tripod's eq. 10 rounds q = (tanh(z) + 1) / 2 (L - 1) to an integer level, and
with an even number of levels L, z = 0 puts q exactly half-way between two levels ((L - 1) / 2). Random normals never
land on such a tie, so the rounding rule there was unpinned.

Both front-ends, :func:`qkernels.fsq` (torch) and :func:`qkernels.jax.fsq`, round half to even, as ``torch.round`` does
and as vector-quantize-pytorch's FSQ rounds (its ``round_ste``, the rounding of ``FSQ.bound``). The ties tested: z = 0
and every other half step q = k + 1/2 for which a float z near atanh(2 (k + 1/2) / (L - 1) - 1) gives q exactly in
the front-end's own arithmetic (tanh, then (t + 1) / 2 (L - 1)); where no float does (t + 1 for most t < -1/2 has no
such value) there is no tie to test. The package's symmetric FSQ (``preserve_symmetry=True``, the same grid) rounds
its ties half up (floor(x + 1/2)): qkernels.compat follows it there, bitwise, at the package's own ties.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import require

import qkernels
from qkernels.compat import vector_quantize_pytorch as compat

LEVELS = (2, 4, 6, 8)
ULPS = 64  # how far from atanh(...) a tie is looked for


def _candidates(dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(z, L, k): for every L of LEVELS and k in [0, L - 2], the 2 ULPS + 1 floats of ``dtype`` nearest to
    atanh(2 (k + 1/2) / (L - 1) - 1), nearest first."""
    ints = np.int32 if dtype == "float32" else np.int64
    zs, ls, ks = [], [], []
    for levels in LEVELS:
        for k in range(levels - 1):
            z0 = np.arctanh((2 * k + 1) / (levels - 1) - 1)
            z = (np.asarray(z0, dtype).view(ints) + np.arange(-ULPS, ULPS + 1, dtype=ints)).view(dtype)
            zs.append(z[np.argsort(np.abs(z.astype(np.float64) - z0), kind="stable")])
            ls.append(np.full(z.size, levels))
            ks.append(np.full(z.size, k))
    return np.concatenate(zs), np.concatenate(ls), np.concatenate(ks)


def _ties(q: np.ndarray, z: np.ndarray, lv: np.ndarray, k: np.ndarray, offset: float = 0.5):
    """(z, k), each (rows, len(LEVELS)): column j holds the candidates with q = k + offset exactly for L = LEVELS[j]
    (the nearest z per k) and their k, padded with z = 0 (a tie itself, k = L / 2 - 1)."""
    cols, kcols = [], []
    for levels in LEVELS:
        found: dict[int, float] = {}
        for zz, kk in zip(z[(q == k + offset) & (lv == levels)], k[(q == k + offset) & (lv == levels)], strict=True):
            found.setdefault(int(kk), zz)
        cols.append([found[kk] for kk in sorted(found)])
        kcols.append(sorted(found))
    assert all(0.0 in c for c in cols), f"z = 0 must be a tie for every even L: {cols}"
    assert all(len(c) >= 2 for c in cols[1:]), f"too few ties found: {dict(zip(LEVELS, kcols, strict=True))}"
    rows = max(map(len, cols))
    zs = np.zeros((rows, len(LEVELS)), z.dtype)
    ks = np.array([[lv // 2 - 1 for lv in LEVELS]] * rows)
    for j, (c, kc) in enumerate(zip(cols, kcols, strict=True)):
        zs[: len(c), j], ks[: len(c), j] = c, kc
    return zs, ks


def _half_to_even(k: np.ndarray) -> np.ndarray:
    """round(k + 1/2) to the even neighbour, by integer arithmetic: k when k is even, else k + 1."""
    return k + k % 2


def _check(indices, z_q, k: np.ndarray, dtype: str) -> None:
    want = _half_to_even(k)
    np.testing.assert_array_equal(np.asarray(indices), want)
    # the package's FSQ rounding (round_ste: torch.round) of those exact ties gives the same levels
    round_ste = require("vector_quantize_pytorch.finite_scalar_quantization", "vqp").round_ste
    np.testing.assert_array_equal(round_ste(torch.from_numpy(k + 0.5)).numpy(), want)
    top = np.asarray(LEVELS) - 1
    tol = {"float32": 3e-7, "float64": 1e-15}[dtype]
    np.testing.assert_allclose(np.asarray(z_q, np.float64), 2 * want / top - 1, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_torch_fsq_rounds_half_steps_to_even(dtype):
    z, levels, k = _candidates(dtype)
    q = ((torch.tanh(torch.from_numpy(z)) + 1) / 2 * torch.from_numpy(levels - 1)).numpy()
    zt, kt = _ties(q, z, levels, k)
    out = qkernels.fsq(torch.from_numpy(zt), list(LEVELS))
    _check(out.indices, out.z_q, kt, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_jax_fsq_rounds_half_steps_to_even(dtype):
    jax = require("jax", "jax")
    qj = require("qkernels.jax", "jax")
    jnp = jax.numpy
    with jax.enable_x64(dtype == "float64"):
        z, levels, k = _candidates(dtype)
        q = np.asarray((jnp.tanh(jnp.asarray(z)) + 1) / 2 * jnp.asarray(levels - 1, z.dtype))
        zt, kt = _ties(q, z, levels, k)
        for fsq in (qj.fsq, jax.jit(qj.fsq, static_argnums=1)):
            out = fsq(jnp.asarray(zt), LEVELS)
            assert out.z_q.dtype == jnp.dtype(dtype)
            _check(out.indices, out.z_q, kt, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compat_symmetric_fsq_rounds_ties_half_up_as_the_package(dtype):
    """The package's symmetric bound floor((L - 1) (tanh(z) + 1) / 2 + 1/2) at its own ties (the bracket before the
    floor exactly an integer): qkernels.compat's codes and indices are the package's, bit for bit, half up."""
    vqp = require("vector_quantize_pytorch", "vqp")
    z, levels, k = _candidates(str(dtype)[6:])
    bracket = ((torch.from_numpy(levels - 1) * (torch.tanh(torch.from_numpy(z)) + 1)) / 2.0 + 0.5).numpy()
    zt, kt = _ties(bracket, z, levels, k, offset=1.0)
    x = torch.from_numpy(zt)[None]  # (B, N, D), D = len(LEVELS)
    theirs = vqp.FSQ(list(LEVELS), preserve_symmetry=True).to(dtype)
    mine = compat.FSQ(list(LEVELS), preserve_symmetry=True).to(dtype)
    (qa, ia), (qb, ib) = theirs(x), mine(x)
    assert torch.equal(ia, ib) and torch.equal(qa, qb)
    want = 2 * (kt + 1) / (np.asarray(LEVELS) - 1) - 1  # half up: level k + 1
    np.testing.assert_allclose(qa[0].double().numpy(), want, rtol=0, atol=3e-7)  # its scale 2 / (L - 1) is float32
