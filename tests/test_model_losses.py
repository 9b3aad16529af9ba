"""Every method's loss terms recomputed by hand (float64 numpy, formulas written from the papers and
the docstrings, not from qkernels' helpers) on tiny fixed models: reconstruction kind and scale,
KL, the TC sign and estimator, where each lambda goes and which tensors are detached. The models'
own encoder / decoder / discriminator modules are used as black boxes; random draws are
replayed from the same seed."""

import math

import numpy as np
import pytest
import torch
from test_kde import np_cliff, np_klm

from qkernels.models import build_model

SMALL = {"disc_width": 16, "disc_layers": 2}
IMG = (1, 8, 8)


def f64(t):
    return t.detach().double().cpu().numpy()


def np_bce_sum(logits, x):
    """sum over pixels of -[x log s(o) + (1 - x) log(1 - s(o))], mean over the batch."""
    o, x = f64(logits), f64(x)
    return float((np.logaddexp(0.0, o) - x * o).reshape(len(x), -1).sum(1).mean())


def np_bce_mean(logits, x):
    o, x = f64(logits), f64(x)
    return float((np.logaddexp(0.0, o) - x * o).mean())


def np_gauss_kl(mu, logvar):
    """KL(N(mu, exp(logvar)) || N(0, I)), summed over latents, mean over the batch."""
    mu, lv = f64(mu), f64(logvar)
    return float((0.5 * (mu**2 + np.exp(lv) - 1.0 - lv)).sum(1).mean())


def np_kl_uniform(logits):
    """KL(softmax(logits) || Uniform(K)) per (sample, latent)."""
    lg = f64(logits)
    p = np.exp(lg - lg.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p * np.log(p * lg.shape[-1])).sum(-1)


def build(name, **kw):
    torch.manual_seed(0)
    return build_model(name, IMG, 3, **kw), torch.rand(6, *IMG, generator=torch.Generator().manual_seed(1))


def last_linear(module):
    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)][-1]


def spread_latents(model, scale, tie=0):
    """Scale the encoder's output layer (latents of order ``scale`` instead of ~0.05 at
    initialisation) and make its first ``tie`` outputs copies of output 0 (dependent latents)."""
    lin = last_linear(model.encoder)
    with torch.no_grad():
        lin.weight.mul_(scale)
        lin.bias.mul_(scale)
        for r in range(1, tie):
            lin.weight[r].copy_(lin.weight[0])
            lin.bias[r].copy_(lin.bias[0])


def close(got, want, rel=1e-5):
    got, want = float(torch.as_tensor(got).detach()), float(want)
    assert math.isclose(got, want, rel_tol=rel, abs_tol=1e-6), (got, want)


def seeded_loss(model, x, step=0, seed=3):
    torch.manual_seed(seed)
    return {k: v.detach() for k, v in model.loss(x, step).items()}


@pytest.mark.parametrize("beta", [1.0, 4.0])
def test_beta_vae_terms(beta):
    model, x = build("beta_vae", beta=beta)
    terms = seeded_loss(model, x)
    torch.manual_seed(3)
    with torch.no_grad():
        mu, lv = model.encoder(x).chunk(2, dim=1)
        z = mu + torch.exp(0.5 * lv) * torch.randn_like(mu)  # reparameterized sample
        rec = np_bce_sum(model.decoder(z), x)  # disentanglement_lib: BCE summed per image
    kl = np_gauss_kl(mu, lv)
    close(terms["recon"], rec)
    close(terms["kl"], kl)
    close(terms["total"], rec + beta * kl)


def test_beta_tcvae_minibatch_weighted_tc():
    model, x = build("beta_tcvae", beta=6.0)
    spread_latents(model, 20.0, tie=3)  # three copies of one latent: a large total correlation
    with torch.no_grad():  # and narrow posteriors (log-variance -4), so that the copies stay dependent in z
        last_linear(model.encoder).weight[3:].zero_()
        last_linear(model.encoder).bias[3:].fill_(-4.0)
    terms = seeded_loss(model, x)
    torch.manual_seed(3)
    with torch.no_grad():
        mu, lv = (f64(t) for t in model.encoder(x).chunk(2, dim=1))
        eps = f64(torch.randn(mu.shape))
    z = mu + np.exp(0.5 * lv) * eps
    n = len(z)
    # log q(z_i | x_j) per latent: (i, j, d)
    logq = -0.5 * (np.log(2 * np.pi) + lv[None] + (z[:, None] - mu[None]) ** 2 / np.exp(lv[None]))

    def lse(a, axis):
        m = a.max(axis, keepdims=True)
        return (m + np.log(np.exp(a - m).sum(axis, keepdims=True))).squeeze(axis)

    log_qz = lse(logq.sum(2), 1) - np.log(n)  # minibatch-weighted sampling (Chen et al. 2018)
    log_prod = (lse(logq, 1) - np.log(n)).sum(1)
    tc = float((log_qz - log_prod).mean())
    assert tc > 0.3
    close(terms["tc"], tc)
    close(float(terms["total"]) - float(terms["recon"]) - float(terms["kl"]), 5.0 * tc, rel=1e-4)  # beta - 1


def _constant_discriminator(disc, joint_logit):
    """Make the discriminator output logits (joint_logit, -joint_logit) for every input."""
    last = disc.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([joint_logit, -joint_logit]))


@pytest.mark.parametrize("name", ["factorvae", "factorqvae", "factordvae"])
def test_tc_sign_and_discriminator_classes(name):
    # the density-ratio trick: a discriminator sure that z comes from q(z) (class 0, the class
    # discriminator_loss gives the unpermuted batch) means positive total correlation
    model, x = build(name, gamma=7.0, **SMALL)
    _constant_discriminator(model.discriminator, 1.5)
    terms = seeded_loss(model, x)
    close(terms["tc"], 3.0)  # log D / (1 - D) = logit_0 - logit_1
    others = {k: float(v) for k, v in terms.items() if k not in ("tc", "total")}
    weights = {"recon": 1.0, "kl": 1.0 if name == "factorvae" else model.beta}
    close(terms["total"], sum(weights[k] * v for k, v in others.items()) + 7.0 * 3.0)
    # discriminator_loss: cross-entropy with the unpermuted batch as class 0, permuted as class 1
    d = model.discriminator_loss(x, x, 0)["disc"]
    close(d, 0.5 * (math.log1p(math.exp(-3.0)) + math.log1p(math.exp(3.0))))


def test_cliff_vae_cliff_on_posterior_means():
    model, x = build("cliff_vae", beta=10.0, lambda_a=2.0, num_cond=3, sigma=0.3)
    terms = seeded_loss(model, x)
    torch.manual_seed(3)
    with torch.no_grad():
        mu, lv = model.encoder(x).chunk(2, dim=1)
        torch.randn_like(mu)  # the reparameterization draw comes first
        idx = torch.rand(3, len(x)).argsort(1)[:, :3]  # then cliff_loss's rows: M smallest uniform keys
    uni, biv, kl_uni = np_cliff(f64(mu), idx.numpy(), 0.3, (-5.0, 5.0, 100))
    close(terms["cliff"], 0.5 * uni + 1.0 * biv + 0.7 * kl_uni, rel=1e-4)
    close(terms["kl"], np_gauss_kl(mu, lv))
    close(terms["total"], float(terms["recon"]) + 10.0 * float(terms["kl"]) + 2.0 * float(terms["cliff"]))
    # the Cliff term trains the encoder (through the means), not the decoder
    torch.manual_seed(3)
    model.loss(x, 0)["cliff"].backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())
    assert all(p.grad is None or not p.grad.any() for p in model.decoder.parameters())


def test_cliff_ae_decoder_fitted_on_detached_latents():
    torch.manual_seed(0)
    model = build_model("cliff_ae", (2,), 2)
    x = torch.randn(32, 2, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(3)
    terms = model.loss(x, 0)
    with torch.no_grad():
        mse = float(((f64(model.decoder(model.encoder(x))) - f64(x)) ** 2).mean())
    close(terms["decoder_mse"], mse)
    close(terms["total"], terms["cliff"].item() + mse)
    model.zero_grad()
    terms["decoder_mse"].backward()
    assert all(p.grad is None or not p.grad.any() for p in model.encoder.parameters())  # sg(z)
    assert any(p.grad is not None and p.grad.any() for p in model.decoder.parameters())


def np_fsq(z, levels):
    """Tripod eq. 10: tanh, scale to [0, L - 1], round, rescale to [-1, 1]."""
    top = levels - 1
    return np.round((np.tanh(z) + 1) / 2 * top) / top * 2 - 1


def test_tripod_terms():
    model, x = build("tripod", levels=5, lambda_klm=0.3, lambda_nhp=0.2)
    spread_latents(model, 40.0)  # |z| ~ 2: tanh(z) is far from z
    terms = seeded_loss(model, x)
    with torch.no_grad():
        z = model.encoder(2 * x - 1)
        zq = np_fsq(f64(z), 5)
        # the authors' scale: BCE mean over (c, h, w) per image, then the batch mean (tripod losses/image.py)
        rec = np_bce_mean(model.decoder(torch.from_numpy(zq).float()), x)
    std = np.tanh(f64(z)).std(0) + 1e-6  # the std of the CONTINUOUS latents tanh(z) (Alg. 1)
    close(terms["recon"], rec)
    close(terms["klm"], np_klm(zq, std), rel=1e-4)
    close(float(terms["total"]) - rec, 0.3 * float(terms["klm"]) + 0.2 * float(terms["nhp"]), rel=1e-4)


def test_tripod_klm_gradient_flows_through_the_std():
    # Alg. 1: the KLM's bandwidth std(tanh(z)) keeps its gradient (the encoder is trained through it too)
    from qkernels.ops.kde import klm_loss

    model, x = build("tripod", levels=5, lambda_klm=1.0, lambda_nhp=0.0)
    spread_latents(model, 40.0)
    head = last_linear(model.encoder).weight

    def grad_of(detach_std):
        model.zero_grad()
        z = model.encoder(2 * x - 1)
        std = torch.tanh(z).std(0, unbiased=False) + 1e-6
        klm_loss(model.quantizer(z).z_q, std=std.detach() if detach_std else std).backward()
        return head.grad.clone()

    model.zero_grad()
    model.loss(x, 0)["klm"].backward()
    got = head.grad.clone()
    torch.testing.assert_close(got, grad_of(False))
    assert not torch.allclose(got, grad_of(True), rtol=1e-3, atol=1e-6)


def test_tripod_nhp_layers_are_the_authors():
    """NHP on ``cond`` and every decoder block output but the last (tripod configs/train_autoencoder.yaml:
    cond, block0-block2 of 4 blocks at 64x64), never on the logits; GELU (smooth) throughout."""
    torch.manual_seed(0)
    model = build_model("tripod", (3, 32, 32), 4)  # 3 blocks: cond, block0, block1 regularized
    z = torch.randn(5, 4)
    logits, acts = model.decoder(z, return_activations=True)
    assert list(acts) == ["cond", "block0", "block1"]
    assert acts["cond"].shape == (5, 64) and acts["block1"].shape == (5, 16, 16, 16)
    torch.testing.assert_close(logits, model.decoder(z))
    kinds = {type(m) for m in model.modules()}
    assert torch.nn.GELU in kinds and not kinds & {torch.nn.ReLU, torch.nn.LeakyReLU}
    # the NHP term is the sum over exactly those activations, each a normalized Hessian penalty
    from qkernels.ops.hessian import normalized_hessian_penalty

    x = torch.rand(6, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(3)
    terms = model.loss(x, 0)
    torch.manual_seed(3)
    with torch.no_grad():
        zc = model.encoder(2 * x - 1)
        zq = model.quantizer(zc).z_q
        std = torch.tanh(zc).std(0, unbiased=False) + 1e-6
        per = normalized_hessian_penalty(
            lambda u: model.decoder(u, return_activations=True)[1], zq, std, reduction="none"
        )
    assert set(per) == {"cond", "block0", "block1"}  # (KLM draws no random numbers before the NHP)
    close(terms["nhp"], sum(float(v.mean()) for v in per.values()), rel=1e-4)


def test_ae_terms_and_unknown_model():
    model, x = build("ae")
    terms = model.loss(x, 0)
    with torch.no_grad():
        want = np_bce_mean(model.decoder(model.encoder(x)), x)  # QLAE's code: BCE mean over all elements
    close(terms["recon"], want)
    close(terms["total"], want)
    with pytest.raises(ValueError, match="unknown model 'nosuch'"):
        build_model("nosuch", IMG, 3)


def test_qlae_terms_and_stop_gradients():
    model, x = build("qlae", num_values=5, weight_quantize=0.3, weight_commit=0.2)
    terms = model.loss(x, 0)
    with torch.no_grad():
        z = f64(model.encoder(x))
    c = f64(model.quantizer.values)  # (d, n_v) per-latent codebooks
    nearest = c[np.arange(z.shape[1])[None], np.abs(z[:, :, None] - c[None]).argmin(-1)]
    sq = float(((z - nearest) ** 2).mean())  # both losses have this value; they differ in gradient
    close(terms["quantize"], sq)
    close(terms["commit"], sq)
    with torch.no_grad():
        rec = np_bce_mean(model.decoder(torch.from_numpy(nearest).float()), x)  # QLAE: per-pixel mean
    close(terms["recon"], rec)
    close(terms["total"], rec + 0.3 * sq + 0.2 * sq)
    # quantize: ||sg(z) - c||^2 moves the codebook only; commit: ||z - sg(c)||^2 the encoder only
    model.zero_grad()
    terms["quantize"].backward(retain_graph=True)
    assert model.quantizer.values.grad.any()
    assert all(p.grad is None or not p.grad.any() for p in model.encoder.parameters())
    g_quantize = model.quantizer.values.grad.clone()
    model.zero_grad()
    terms["commit"].backward(retain_graph=True)
    assert model.quantizer.values.grad is None or not model.quantizer.values.grad.any()
    assert any(p.grad is not None and p.grad.any() for p in model.encoder.parameters())
    # the codebook's gradient in the total comes from the quantize term alone, weighted 0.3 (the
    # reconstruction reaches z through the straight-through estimator, not the codebook)
    model.zero_grad()
    terms["total"].backward()
    torch.testing.assert_close(model.quantizer.values.grad, 0.3 * g_quantize)


def test_qvae_kl_of_negative_squared_distance_logits():
    model, x = build("qvae", num_values=7, beta=0.5)
    terms = seeded_loss(model, x)
    with torch.no_grad():
        z = f64(model.encoder(x - 0.5))
    c = f64(model.quantizer.values)
    kl = float(np_kl_uniform(torch.from_numpy(-((z[:, :, None] - c[None, None]) ** 2))).mean())  # mean over latents
    close(terms["kl"], kl)
    close(terms["total"], float(terms["recon"]) + 0.5 * kl)


def test_dvae_kl_summed_over_latents():
    model, x = build("dvae", num_values=6, beta=2.0)
    terms = seeded_loss(model, x)
    with torch.no_grad():
        logits = model.encoder(x).view(len(x), 3, 6)
    kl = float(np_kl_uniform(logits).sum(1).mean())  # D-VAE: sum over latents, mean over the batch
    close(terms["kl"], kl)
    close(terms["total"], float(terms["recon"]) + 2.0 * kl)


def test_factorvae_discriminator_loss_by_hand():
    # cross-entropy of the discriminator: class 0 for the batch's own latents, class 1 for the
    # second batch's latents with each latent permuted across the batch; replayed draws
    model, x = build("factorvae", **SMALL)
    x2 = torch.rand(6, *IMG, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(5)
    got = model.discriminator_loss(x, x2, 0)["disc"].item()
    torch.manual_seed(5)
    with torch.no_grad():
        mu1, lv1 = model.encoder(x).chunk(2, dim=1)
        z1 = mu1 + torch.exp(0.5 * lv1) * torch.randn_like(mu1)
        mu2, lv2 = model.encoder(x2).chunk(2, dim=1)
        z2 = mu2 + torch.exp(0.5 * lv2) * torch.randn_like(mu2)
        order = torch.argsort(torch.rand(z2.shape), dim=0)  # per latent, a permutation of the rows
        perm = torch.gather(z2, 0, order)
        l1, l2 = f64(model.discriminator(z1)), f64(model.discriminator(perm))

    def log_softmax(a):
        m = a.max(1, keepdims=True)
        return a - m - np.log(np.exp(a - m).sum(1, keepdims=True))

    want = 0.5 * (-log_softmax(l1)[:, 0].mean() - log_softmax(l2)[:, 1].mean())
    close(got, want)
    # the two classes are told apart by the inputs (not a constant): swapping them changes the loss
    assert abs(want - 0.5 * (-log_softmax(l1)[:, 1].mean() - log_softmax(l2)[:, 0].mean())) > 1e-4


def test_factordvae_discriminator_uses_a_shuffle_of_the_same_batch():
    # lddr: the discriminator tells the batch's soft z from a per-latent shuffle of the SAME z (the
    # second batch is not used); LeakyReLU slope 0.01
    model, x = build("factordvae", num_values=4, **SMALL)
    spread_latents(model, 40.0)  # logits that differ between images (at initialisation they barely do)
    slopes = {m.negative_slope for m in model.discriminator.modules() if isinstance(m, torch.nn.LeakyReLU)}
    assert slopes == {0.01}
    x2 = torch.rand(6, *IMG, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(5)
    got = model.discriminator_loss(x, x2, 7)["disc"].item()
    torch.manual_seed(5)
    with torch.no_grad():
        logits = model.encoder(x).view(6, 3, 4)
        u = torch.rand(logits.shape)
        g = -torch.log(-torch.log(u))
        y = torch.softmax((logits + model.noise_scale(7) * g), -1)  # tau = 1
        z = y @ torch.linspace(-1, 1, 4)
        order = torch.argsort(torch.rand(z.shape), dim=0)
        l1, l2 = f64(model.discriminator(z)), f64(model.discriminator(torch.gather(z, 0, order)))
    lse = lambda a: np.log(np.exp(a).sum(1))  # noqa: E731
    want = 0.5 * ((lse(l1) - l1[:, 0]).mean() + (lse(l2) - l2[:, 1]).mean())
    close(got, want, rel=1e-4)


def test_factorqvae_discriminator_init_and_width():
    # FactorQVAE's Discriminator: Linear(d K, 1000) + 4 x Linear(1000, 1000), LeakyReLU 0.2, Linear(1000, 2);
    # weights_init: N(0, 0.02) weights, zero biases
    torch.manual_seed(0)
    model = build_model("factorqvae", (3, 32, 32), 10, num_values=64)
    lins = [m for m in model.discriminator.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in lins] == [(640, 1000)] + [(1000, 1000)] * 4 + [(1000, 2)]
    w = torch.cat([m.weight.detach().flatten() for m in lins])
    assert abs(float(w.std()) - 0.02) < 5e-4 and abs(float(w.mean())) < 5e-4
    assert all(not m.bias.any() for m in lins)


@pytest.mark.parametrize("name", ["factorvae", "factorqvae", "factordvae"])
def test_tc_term_trains_the_encoder(name):
    # total = recon + w kl + gamma tc, every term differentiable in the encoder: its gradient is
    # the weighted sum of the terms' gradients (a detached TC would drop gamma * d tc)
    model, x = build(name, gamma=7.0, **SMALL)
    torch.manual_seed(3)
    terms = model.loss(x, 0)
    enc = [p for p in model.encoder.parameters()]
    w_kl = 1.0 if name == "factorvae" else model.beta

    def grad(t):
        return torch.cat([g.flatten() for g in torch.autograd.grad(t, enc, retain_graph=True, allow_unused=False)])

    g_tc = grad(terms["tc"])
    assert g_tc.abs().max() > 0
    torch.testing.assert_close(
        grad(terms["total"]), grad(terms["recon"]) + w_kl * grad(terms["kl"]) + 7.0 * g_tc, rtol=1e-4, atol=1e-6
    )


def test_factorqvae_discriminator_loss_by_hand():
    """Audit 9 review: permuting the FIRST batch's one-hots (instead of the second batch's) survived.
    FactorQVAE: class 0 the soft one-hots of x (flattened, n x d K), class 1 those of x2 with each
    latent's one-hot moved to another row of the batch (the same permutation for its K entries);
    Gumbel-softmax of logits -(z - c)^2 at tau = exp(-2e-5 iteration) (exp(-1e-5 global_step), two Lightning
    global steps per iteration); the encoder sees x - 0.5; replayed draws."""
    model, x = build("factorqvae", num_values=5, **SMALL)
    spread_latents(model, 30.0)
    with torch.no_grad():  # N(0, 1) weights: logits that tell inputs apart (N(0, 0.02) gives ~0)
        for m in model.discriminator.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.mul_(50.0)
    x2 = torch.rand(6, *IMG, generator=torch.Generator().manual_seed(2))
    step = 20_000
    torch.manual_seed(5)
    got = model.discriminator_loss(x, x2, step)["disc"].item()
    torch.manual_seed(5)
    tau = math.exp(-2e-5 * step)
    c = f64(model.quantizer.values)

    def soft_one_hots(xx):
        with torch.no_grad():
            z = f64(model.encoder(xx - 0.5))
        u = f64(torch.rand(6, 3, 5))
        a = (-((z[:, :, None] - c) ** 2) - np.log(-np.log(u))) / tau
        p = np.exp(a - a.max(-1, keepdims=True))
        return p / p.sum(-1, keepdims=True)

    w1, w2 = soft_one_hots(x), soft_one_hots(x2)
    order = torch.argsort(torch.rand(6, 3), dim=0).numpy()  # per latent, a permutation of the rows
    perm = w2[order, np.arange(3)[None]]
    assert not np.allclose(perm, w2)
    with torch.no_grad():
        l1 = f64(model.discriminator(torch.from_numpy(w1).float()))
        l2 = f64(model.discriminator(torch.from_numpy(perm).float()))
    lse = lambda a: np.log(np.exp(a).sum(1))  # noqa: E731
    want = 0.5 * ((lse(l1) - l1[:, 0]).mean() + (lse(l2) - l2[:, 1]).mean())
    close(got, want, rel=1e-4)
    with torch.no_grad():  # the first batch permuted instead: a clearly different loss
        l1p = f64(model.discriminator(torch.from_numpy(w1[order, np.arange(3)[None]]).float()))
    assert abs(want - 0.5 * ((lse(l1) - l1[:, 0]).mean() + (lse(l1p) - l1p[:, 1]).mean())) > 1e-3 * abs(want)


def test_tripod_drops_a_zero_weighted_term():
    """Audit 9 review: computing (and logging) the KLM at lambda_KLM = 0 survived. A term whose weight is 0
    is neither computed nor in the terms (no KDE work for NHP-only runs); total = recon + lambda * term."""
    model, x = build("tripod", levels=5, lambda_klm=0.0, lambda_nhp=0.2)
    terms = seeded_loss(model, x)
    assert set(terms) == {"recon", "nhp", "total"}
    close(terms["total"], float(terms["recon"]) + 0.2 * float(terms["nhp"]))
    model, x = build("tripod", levels=5, lambda_klm=0.3, lambda_nhp=0.0)
    terms = seeded_loss(model, x)
    assert set(terms) == {"recon", "klm", "total"}
    close(terms["total"], float(terms["recon"]) + 0.3 * float(terms["klm"]))


def test_tripod_forwards_its_nhp_settings():
    """Audit 9 review: Tripod calling the NHP with k = 2 and eps = 0.1 whatever it was built with survived
    (every test used the defaults). With k = 3 and eps = 1.5 the term is the normalized Hessian penalty at
    those settings (same random draws replayed); eps this large leaves the quadratic regime, where the
    ratio no longer depends on eps, so either setting changes the value."""
    from qkernels.ops.hessian import normalized_hessian_penalty

    model, x = build("tripod", levels=5, lambda_klm=0.0, lambda_nhp=1.0, num_perturbations=3, eps=1.5)
    spread_latents(model, 10.0)
    terms = seeded_loss(model, x)

    def nhp(**kw):
        torch.manual_seed(3)
        with torch.no_grad():
            zc = model.encoder(2 * x - 1)
            std = torch.tanh(zc).std(0, unbiased=False) + 1e-6
            return float(
                normalized_hessian_penalty(
                    lambda u: model.decoder(u, return_activations=True)[1], model.quantizer(zc).z_q, std, **kw
                )
            )

    want = nhp(num_perturbations=3, eps=1.5)
    assert math.isclose(float(terms["nhp"]), want, rel_tol=1e-4, abs_tol=0), (float(terms["nhp"]), want)
    for other in (nhp(num_perturbations=2, eps=1.5), nhp(num_perturbations=3, eps=0.1)):
        assert not math.isclose(want, other, rel_tol=1e-2), (want, other)


def test_cliff_ae_weights_and_sizes():
    """Audit 9 review: Cliff-AE swapping lambda_uni and lambda_KL-uni, or ignoring ``hidden``, survived
    (the defaults 0 and 1 were never varied). Cliff = lambda_uni l_uni + lambda_biv l_biv + lambda_kl
    l_KL-uni on the encoder's z (float64 equations, replayed rows); the encoder is MLP(dim, *hidden, d)."""
    torch.manual_seed(0)
    model = build_model(
        "cliff_ae",
        (2,),
        2,
        lambda_uni=0.2,
        lambda_biv=0.5,
        lambda_kl=0.9,
        num_cond=4,
        sigma=0.3,
        hidden=(7, 5),
        fit_decoder=False,
    )
    sizes = [(m.in_features, m.out_features) for m in model.encoder.modules() if isinstance(m, torch.nn.Linear)]
    assert sizes == [(2, 7), (7, 5), (5, 2)]
    sizes = [(m.in_features, m.out_features) for m in model.decoder.modules() if isinstance(m, torch.nn.Linear)]
    assert sizes == [(2, 5), (5, 7), (7, 2)]
    x = torch.randn(16, 2, generator=torch.Generator().manual_seed(1)) * 2
    terms = seeded_loss(model, x)
    assert set(terms) == {"cliff", "total"}
    torch.manual_seed(3)
    with torch.no_grad():
        z = model.encoder(x)
        idx = torch.rand(2, 16).argsort(1)[:, :4]  # cliff_loss's rows: the M smallest uniform keys per latent
    uni, biv, kl = np_cliff(f64(z), idx.numpy(), 0.3, (-5.0, 5.0, 100))
    assert min(uni, kl) > 1e-3 and abs(uni - kl) > 1e-3 * max(uni, kl)
    close(terms["cliff"], 0.2 * uni + 0.5 * biv + 0.9 * kl, rel=1e-4)
    close(terms["total"], terms["cliff"])


def test_forward_is_the_loss_at_the_given_step():
    """Audit 9 review: forward (what DistributedDataParallel calls) dropping the step survived. D-VAE's
    noise scale depends on the step, so forward(x, s) must be loss(x, s), not loss(x, 0)."""
    model, x = build("dvae", num_values=4, noise_steps=100)
    spread_latents(model, 20.0)
    got = seeded_loss(model, x, step=100)["recon"]  # via loss
    torch.manual_seed(3)
    via_forward = model(x, 100)["recon"].detach()
    close(via_forward, got, rel=1e-6)
    assert not math.isclose(float(seeded_loss(model, x, step=0)["recon"]), float(got), rel_tol=1e-4)
