"""Issue 47, items 6-7: messages that name the right argument or speak up (a 1-D ``z`` for per-latent codebooks,
a normalized Hessian penalty whose denominator sits at its floor), and the figures' labels (interventions' rows,
the loss panels' y axes)."""

from __future__ import annotations

import warnings

import pytest
import torch

import qkernels
from qkernels.nn import LatentQuantizer
from qkernels.ops import hessian as H
from qkernels.train import TrainConfig, build
from qkernels.train import figures as F


def test_a_1d_z_for_per_latent_codebooks_is_blamed_on_z():
    values = torch.linspace(-1, 1, 10).repeat(12, 1)  # (d, n_v) = (12, 10)
    want = r"^z must be \(\.\.\., d\) with d = 12, the number of per-latent codebooks in values \(12, 10\); got a 1-D z"
    for call in (lambda: qkernels.latent_quantize(torch.randn(128), values),
                 lambda: qkernels.gumbel_quantize(torch.randn(128), values, 0.5)):  # fmt: skip
        with pytest.raises(ValueError, match=want):
            call()
    with pytest.raises(ValueError, match=r"^z has shape \(128,\)"):  # the module's own message names z too
        LatentQuantizer(12, 10)(torch.randn(128))
    with pytest.raises(ValueError, match=r"^values must be \(n_v,\) or \(d, n_v\) with d = 128"):  # 2-D: values
        qkernels.latent_quantize(torch.randn(5, 128), values)
    assert qkernels.latent_quantize(torch.randn(12), values).z_q.shape == (12,)  # one sample of 12 latents: fine
    assert qkernels.latent_quantize(torch.randn(128), values[0]).z_q.shape == (128,)  # a global codebook: fine


def _kinked(x):  # piecewise linear: kinks at x1 + x2 = +-0.15, as a ReLU decoder has them
    s = x.sum(1, keepdim=True)
    return torch.relu(s - 0.15) + torch.relu(-s - 0.15)


def _smooth(x):
    s = x.sum(1, keepdim=True)
    return torch.nn.functional.softplus(s - 0.15) + torch.nn.functional.softplus(-s - 0.15)


def test_nhp_warns_once_when_its_denominator_is_at_the_floor(monkeypatch):
    """At z = 0 with std 1 and eps 0.1 the Rademacher directions (sum +-0.2 or 0) reach a kink of ``_kinked``
    where, for some samples, both Gaussian ones stay short of it: zero curvature along them, and the penalty of
    those samples is their numerator / 1e-10. One warning naming the cause; none for a smooth fn; one per process."""
    monkeypatch.setitem(H._FLOOR_CHECK, "warned", False)
    z = torch.zeros(64, 2, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        smooth = qkernels.normalized_hessian_penalty(_smooth, z, 1.0, generator=g)
        assert caught == []
        value = qkernels.normalized_hessian_penalty(_kinked, z, 1.0, generator=torch.Generator().manual_seed(0))
        again = qkernels.normalized_hessian_penalty(_kinked, z, 1.0, generator=torch.Generator().manual_seed(0))
    assert value == again and value > 1e8 > smooth  # the floor's doing
    (w,) = caught  # once
    assert w.category is RuntimeWarning and w.filename == __file__  # points at the caller's line
    msg = str(w.message)
    assert msg.startswith("normalized_hessian_penalty: the denominator of fn's output") and "of 64 samples" in msg
    assert "piecewise linear (ReLU, LeakyReLU)" in msg


def test_intervention_rows_and_loss_axes_are_labelled(monkeypatch):
    model, ds = build(TrainConfig(model="qlae", dataset="sprites", image_size=16, num_latents=3))
    labels = []
    monkeypatch.setattr(F, "image_grid", lambda rows, row_labels, col_labels: labels.extend(row_labels))
    F.interventions(model, ds, seed=0)
    assert [ln.split("\n")[0] for ln in labels] == ["z0", "z1", "z2"]
    lo, _, hi = labels[0].split("\n")[1].partition(" to ")
    assert float(lo) < float(hi)
    texts = []
    monkeypatch.setattr(F, "_vertical_text", lambda img, at, text, font: texts.append(text))
    recs = [{"type": "train", "step": s, "total": 1.0 / s, "recon": 0.5 + 0.01 * s, "lr": 1e-3} for s in (1, 10, 100)]
    F.loss_curves([("run", recs)], "title")
    assert texts == ["total, log scale", "recon"]  # one y label per panel (lr is constant: listed below)


# ----------------------------------------------------------------- klm_loss's own name (its raw op is 'klm')
def test_klm_loss_names_itself_in_its_value_messages():
    if "cpu" not in qkernels.available_backends():
        pytest.skip("the cpu backend is not built")
    z = torch.randn(50, 3)
    bad = z.clone()
    bad[0, 0] = float("nan")
    with qkernels.use_backend("cpu"):
        with pytest.raises(ValueError, match=r"^cliff_loss: z contains NaN or inf"):  # as the others say it
            qkernels.cliff_loss(bad)
        with pytest.raises(ValueError, match=r"^klm_loss: z contains NaN or inf"):
            qkernels.klm_loss(bad, std=torch.ones(3))
        with pytest.raises(ValueError, match=r"^klm_loss: std must be > 0"):
            qkernels.klm_loss(z, std=-torch.ones(3))


def test_jax_klm_loss_names_itself_in_its_value_message():
    jnp = pytest.importorskip("jax.numpy")
    qj = pytest.importorskip("qkernels.jax")
    import numpy as np

    z = np.random.default_rng(0).normal(size=(50, 3)).astype("float32")
    z[0, 0] = np.nan
    with pytest.raises(Exception, match=r"klm_loss: z contains NaN or inf"):
        qj.klm_loss(jnp.asarray(z), std=jnp.ones(3))
