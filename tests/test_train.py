"""Trainer: bit-for-bit resume, atomic checkpoints, CLI smoke run producing every file, eval/compare of a saved run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from qkernels.cli import main
from qkernels.models.registry import METHODS
from qkernels.train import TrainConfig, Trainer, train
from qkernels.train.data import get_batch
from qkernels.train.loop import lr_at

DISC = {"disc_width": 32, "disc_layers": 2}


def tiny_cfg(model, out, **kw):
    base = dict(model=model, dataset="sprites", image_size=16, steps=6, batch_size=8, out=str(out),
                checkpoint_every=3, log_every=1, eval_samples=200, progress=False,
                model_kwargs=dict(DISC) if model.startswith("factor") else {})
    base.update(kw)
    return TrainConfig(**base)


def _state(out):
    return torch.load(out / "checkpoint.pt", weights_only=False)


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _assert_same(a[k], b[k])
        elif isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        elif isinstance(a[k], list):
            assert len(a[k]) == len(b[k])
            for x, y in zip(a[k], b[k], strict=True):
                _assert_same({"v": x}, {"v": y}) if not isinstance(x, dict) else _assert_same(x, y)
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("model", ["factorqvae", "dvae", "tripod"])
def test_resume_is_bit_for_bit(tmp_path, model):
    a, b = tmp_path / "a", tmp_path / "b"
    train(tiny_cfg(model, a), final_eval=False)
    # killed after step 4: the checkpoint is from step 3, the log has lines up to 4
    assert Trainer(tiny_cfg(model, b)).run(stop_after=4, final_eval=False) is None
    assert _state(b)["step"] == 3
    assert len((b / "log.jsonl").read_text().splitlines()) == 4
    train(tiny_cfg(model, b), resume=True, final_eval=False)
    sa, sb = _state(a), _state(b)
    assert sa["step"] == sb["step"] == 6
    _assert_same(sa["model"], sb["model"])
    _assert_same(sa["opt"], sb["opt"])
    if "disc_opt" in sa:
        _assert_same(sa["disc_opt"], sb["disc_opt"])
    assert (a / "log.jsonl").read_text() == (b / "log.jsonl").read_text()
    assert not list(b.glob("*.tmp"))
    # and the run did train: 6 optimizer steps on every parameter (Adam's step count), parameters
    # moved from their initial values, every logged term finite
    assert {float(st["step"]) for st in sa["opt"]["state"].values()} == {6.0}
    init = Trainer(tiny_cfg(model, tmp_path / "init")).model.state_dict()
    assert any(not torch.equal(init[k], v) for k, v in sa["model"].items() if v.is_floating_point())
    lines = [json.loads(ln) for ln in (a / "log.jsonl").read_text().splitlines()]
    assert [ln["step"] for ln in lines] == [1, 2, 3, 4, 5, 6]
    assert all(torch.isfinite(torch.tensor(v)) for ln in lines for k, v in ln.items() if k != "type")


def test_different_seeds_differ_and_data_order_is_stateless(tmp_path):
    cfg = tiny_cfg("ae", tmp_path)
    tr = Trainer(cfg)
    x1 = get_batch(tr.ds, 8, 0, 5)
    assert torch.equal(x1, get_batch(tr.ds, 8, 0, 5))
    assert not torch.equal(x1, get_batch(tr.ds, 8, 1, 5))
    assert not torch.equal(x1, get_batch(tr.ds, 8, 0, 5, stream=1))
    # the same for a dataset held as an array (epochs of permutations): the discriminator's second
    # batch (stream 1) is another batch than the model's
    from qkernels.data import QuantizedGrid2D

    grid = QuantizedGrid2D(64, seed=0)
    for step in (0, 3, 9):
        assert not torch.equal(get_batch(grid, 8, 0, step), get_batch(grid, 8, 0, step, stream=1))


def test_gradient_clipping_kinds():
    # "value" (QLAE / Tripod): each element clamped to [-c, c]; "norm": all rescaled to norm <= c
    from qkernels.models.registry import OptimSpec
    from qkernels.train.loop import clip_

    def grads(kind):
        p = torch.nn.Parameter(torch.zeros(3))
        p.grad = torch.tensor([5.0, -0.5, 0.1])
        clip_([p], OptimSpec(clip=kind, clip_value=1.0))
        return p.grad

    torch.testing.assert_close(grads("value"), torch.tensor([1.0, -0.5, 0.1]))
    norm = math.sqrt(25 + 0.25 + 0.01)
    torch.testing.assert_close(grads("norm"), torch.tensor([5.0, -0.5, 0.1]) / norm, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads(None), torch.tensor([5.0, -0.5, 0.1]))


def test_weight_decay_groups_and_schedules(tmp_path):
    # latent_quantization: optax AdamW (b2 0.999), decay 0.1 on everything but biases and the codebook (norm
    # scales and the decoder's input map ARE decayed), elementwise clip 1.0 on the decayed group only
    tr = Trainer(tiny_cfg("qlae", tmp_path))
    groups = tr.opt.param_groups
    assert isinstance(tr.opt, torch.optim.AdamW) and [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert all(g["betas"] == (0.9, 0.999) for g in groups)
    named = dict(tr.model.named_parameters())
    no_decay = {id(p) for p in groups[1]["params"]}
    assert no_decay == {id(p) for n, p in named.items() if n.endswith(".bias") or n == "quantizer.values"}
    decayed = {n for n, p in named.items() if id(p) not in no_decay}
    assert "decoder.start" in decayed and any(".conv." in n and n.endswith(".weight") for n in decayed)
    assert any(isinstance(m, torch.nn.InstanceNorm2d) and id(m.weight) not in no_decay
               for m in tr.model.modules() if getattr(m, "weight", None) is not None)
    assert {id(p) for p in tr.clip_params} == {id(p) for p in groups[0]["params"]}
    # Tripod (configs/train_autoencoder.yaml): AdamW b2 0.999, lr 2e-4, no decay, clip 1.0 on every parameter
    tr = Trainer(tiny_cfg("tripod", tmp_path / "t"))
    assert all(g["betas"] == (0.9, 0.999) and g["weight_decay"] == 0.0 for g in tr.opt.param_groups)
    assert len(tr.clip_params) == len(list(tr.model.parameters())) and METHODS["tripod"].optim.lr == 2e-4
    # FactorQVAE: CosineAnnealingLR(T_max 50k, eta_min 1.25e-6) for the VAE AND the discriminator (Adam 1e-3),
    # periodic as torch's closed form: down at 50k, back up at 100k (the authors' max_steps)
    for spec in (METHODS["factorqvae"].optim, METHODS["factorqvae"].disc_optim):
        assert spec.name == "adam" and spec.lr == 1e-3 and spec.betas == (0.9, 0.999)
        assert lr_at(spec, 1e-3, 0, 100_000) == pytest.approx(1e-3)
        assert lr_at(spec, 1e-3, 25_000, 100_000) == pytest.approx(1.25e-6 + (1e-3 - 1.25e-6) / 2)
        assert lr_at(spec, 1e-3, 50_000, 100_000) == pytest.approx(1.25e-6)
        assert lr_at(spec, 1e-3, 100_000, 100_000) == pytest.approx(1e-3)
        # a short run keeps the authors' T_max: the schedule is not squeezed into the run
        assert lr_at(spec, 1e-3, 600, 600) == pytest.approx(1e-3, rel=1e-3)


def _clone_optimizer(opt, src, dst, lr):
    """``opt`` (over ``src``'s parameters) rebuilt over the same-named parameters of ``dst``, at ``lr``."""
    name_of = {id(p): n for n, p in src.named_parameters()}
    params = dict(dst.named_parameters())
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "lr": lr,
               "params": [params[name_of[id(p)]] for p in g["params"]]} for g in opt.param_groups]
    return type(opt)(groups)


@pytest.mark.parametrize("model", ["factorvae", "factorqvae"])
def test_discriminator_steps_after_model(tmp_path, model):
    # the trainer's step against one written out here: zero the model's grads, loss, backward, clip,
    # step; THEN the discriminator's step on latents of the UPDATED model, its grads zeroed first
    # (the TC term left gradients on it). The other order gives different parameters.
    import copy

    from qkernels.train.data import derive_seed
    from qkernels.train.loop import clip_

    tr = Trainer(tiny_cfg(model, tmp_path))
    cfg, spec = tr.cfg, tr.spec

    def hand_steps(disc_first):  # steps 0 and 1: grads left by step 0 must not leak into step 1
        m = copy.deepcopy(tr.model)
        opt = _clone_optimizer(tr.opt, tr.model, m, tr.lr)
        dopt = _clone_optimizer(tr.disc_opt, tr.model, m, spec.disc_optim.lr)
        for s in (0, 1):
            for g in opt.param_groups:
                g["lr"] = lr_at(spec.optim, tr.lr, s, cfg.steps)
            for g in dopt.param_groups:
                g["lr"] = lr_at(spec.disc_optim, spec.disc_optim.lr, s, cfg.steps)
            torch.manual_seed(derive_seed(cfg.seed, s, 3))
            x = get_batch(tr.ds, tr.batch_size, cfg.seed, s)

            def disc_step(x=x, s=s):
                x2 = get_batch(tr.ds, tr.batch_size, cfg.seed, s, stream=1)
                d = m.discriminator_loss(x, x2, s)["total"]
                dopt.zero_grad(set_to_none=True)
                d.backward()
                dopt.step()

            if disc_first:
                disc_step()
            loss = m.loss(x, s)["total"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            clip_([p for _, p in m.model_parameters()], spec.optim)
            opt.step()
            if not disc_first:
                disc_step()
        return dict(m.named_parameters())

    right, wrong = hand_steps(False), hand_steps(True)
    tr.train_step(0)
    terms = tr.train_step(1)
    assert {"tc", "disc", "disc_total"} <= set(terms)
    got = dict(tr.model.named_parameters())
    for n, p in got.items():
        torch.testing.assert_close(p, right[n], rtol=1e-6, atol=1e-7, msg=n)
    assert any(not torch.allclose(p, wrong[n]) for n, p in got.items() if n.startswith("discriminator."))
    assert any(not torch.allclose(p, wrong[n]) for n, p in got.items() if n.startswith("encoder."))


def test_cli_train_eval_compare(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "--model", "qlae", "--dataset", "sprites", "--image-size", "16", "--steps", "4",
               "--batch-size", "8", "--eval-samples", "300", "--out", str(out)])
    assert rc == 0
    for f in ("config.json", "log.jsonl", "checkpoint.pt", "metrics.json", "figures/reconstructions.png",
              "figures/interventions.png", "figures/nmi.png"):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    m = json.loads((out / "metrics.json").read_text())
    for k in ("infomec.infom", "dci.disentanglement", "mig.mig", "recon.psnr"):
        assert k in m and m[k] == m[k]
    assert len(m["infomec.nmi"]) == 5
    # PSNR of the reconstructions: a mean of per-image dB, >= the dB of the mean MSE (Jensen), finite
    assert math.isfinite(m["recon.psnr"]) and m["recon.psnr"] >= 10 * math.log10(1 / m["recon.mse"]) - 1e-6
    assert m["recon.psnr"] < 60
    (out / "metrics.json").unlink()
    assert main(["eval", str(out), "--eval-samples", "300"]) == 0
    m2 = json.loads((out / "metrics.json").read_text())
    assert m2["step"] == 4 and m2["infomec.infom"] == pytest.approx(m["infomec.infom"])
    capsys.readouterr()
    assert main(["compare", str(out), str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["run", "model", "dataset", "step"] and len(table) == 4
    assert "qlae" in table[2]


def test_cli_cliff_ae_on_grid2d(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dataset_kwargs": {"n": 300}, "batch_size": 100}))
    out = tmp_path / "cliff"
    assert main(["train", "--model", "cliff_ae", "--dataset", "quantized_grid2d", "--steps", "3", "--config",
                 str(cfg), "--out", str(out)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert 0 <= m["mcc.mcc"] <= 1 and (out / "figures/latents.png").is_file()


def test_figure_helpers_by_hand():
    # viridis-like colour stops: 0 -> first stop, 1 -> last, 0.5 -> the middle one; small images
    # are upscaled by the smallest integer factor that reaches min_size
    from qkernels.train.figures import _to_pil, colormap

    assert colormap(0.0) == (68, 1, 84) and colormap(1.0) == (253, 231, 37) and colormap(0.5) == (33, 145, 140)
    assert colormap(0.125) == (64, 42, 112)  # halfway between the first two stops
    assert _to_pil(torch.rand(3, 10, 10), min_size=64).size == (70, 70)
    assert _to_pil(torch.rand(1, 64, 64), min_size=64).size == (64, 64)


def test_config_round_trip_and_unknown_keys(tmp_path):
    cfg = TrainConfig(model="qlae", steps=7, metrics=("mig",), model_kwargs={"num_values": 5})
    cfg.save(tmp_path / "c.json")
    raw = json.loads((tmp_path / "c.json").read_text())
    assert raw["metrics"] == ["mig"] and raw["steps"] == 7 and raw["model_kwargs"] == {"num_values": 5}
    back = TrainConfig.load(tmp_path / "c.json")
    assert back == cfg and back.metrics == ("mig",)
    with pytest.raises(ValueError, match=r"unknown config keys \['bogus'\]"):
        TrainConfig.from_dict({"bogus": 1})


def test_batches_are_a_function_of_seed_step_and_stream():
    import numpy as np

    from qkernels.data import load_dataset
    from qkernels.train.data import derive_seed, get_batch

    assert derive_seed(1, 2) == int(np.random.SeedSequence([1, 2]).generate_state(2, dtype=np.uint64)[0] >> 1)
    ds = load_dataset("sprites", image_size=16)
    g = torch.Generator().manual_seed(derive_seed(3, 5, 1, 0))
    want = ds.observations_from_factors(ds.sample_factors(8, g))
    torch.testing.assert_close(get_batch(ds, 8, 3, 5, stream=1), want, rtol=0, atol=0)
    # fixed-size data: one permutation per epoch, so consecutive steps of an epoch cover every row once
    grid = load_dataset("quantized_grid2d", n=64)
    rows = torch.cat([get_batch(grid, 8, 0, s) for s in range(8)])
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, grid.x.tolist()))
    assert not torch.equal(torch.cat([get_batch(grid, 8, 0, s) for s in range(8, 16)]), rows)


def test_build_uses_the_authors_latent_counts_and_lambdas():
    from qkernels.models.registry import default_num_latents, method_defaults
    from qkernels.train.run import build, scalars

    model, ds = build(TrainConfig(model="qlae", dataset="sprites", image_size=16))
    assert ds.observation_shape == (1, 16, 16) and model.num_latents == 10  # 2 x 5 sources
    _, balls = build(TrainConfig(model="ae", dataset="balls", image_size=16, seed=3))
    assert balls.seed == 3  # a procedural dataset follows the run's seed (Balls draws its samples from it)
    assert default_num_latents("dvae", 5) == 10 and default_num_latents("cliff_ae", 2) == 2
    assert method_defaults("tripod", "mpi3d") == {"lambda_klm": 1e-8, "lambda_nhp": 1e-4}
    assert method_defaults("tripod", "shapes3d_procedural") == {"lambda_klm": 1e-4, "lambda_nhp": 1e-2}
    assert scalars({"a": 1, "b": True, "c": [1], "d": 0.5, "e": "x"}) == {"a": 1, "d": 0.5}
    with pytest.raises(ValueError, match="unknown model 'nosuch'"):
        build(TrainConfig(model="nosuch"))


def test_compare_table_cells_and_missing_metrics(tmp_path):
    from qkernels.train.evaluate import compare_runs

    for name, v in (("a", 0.12345), ("b", 12345.6)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(
            {"model": "qlae", "dataset": "sprites", "step": 3, "mig.mig": v}))
    lines = compare_runs([tmp_path / "a", tmp_path / "b"]).splitlines()
    assert lines[0].split() == ["run", "model", "dataset", "step", "mig.mig"]
    assert lines[2].split()[1:] == ["qlae", "sprites", "3", "0.123"]
    assert lines[3].split()[-1] == "1.235e+04"
    with pytest.raises(FileNotFoundError, match="qkernels eval"):
        compare_runs([tmp_path / "none"])


def test_cli_config_precedence(tmp_path):
    # the bare command is the authors' Tripod (its own lr, 2e-4; no demo settings); a --config file is
    # overridden by flags; --resume keeps the run's own config and changes only --steps / --device
    from qkernels.cli import _train_config, parser

    def cfg_of(*argv):
        return _train_config(parser().parse_args(["train", *argv]))

    assert cfg_of("--steps", "2", "--out", str(tmp_path / "demo")) == TrainConfig(steps=2, out=str(tmp_path / "demo"))
    assert cfg_of("--lr", "0.01").lr == 0.01 and cfg_of().out == "runs/tripod"
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"model": "qlae", "steps": 9, "batch_size": 100}))
    cfg = cfg_of("--config", str(conf), "--steps", "3")
    assert (cfg.model, cfg.steps, cfg.batch_size, cfg.lr, cfg.out) == ("qlae", 3, 100, None, "runs/qlae")
    conf.write_text(json.dumps({"seed": 5, "eval_every": 50}))
    cfg = cfg_of("--config", str(conf), "--seed", "0", "--eval-every", "0")  # a flag of 0 is a value, not unset
    assert (cfg.seed, cfg.eval_every) == (0, 0)
    run = tmp_path / "r"
    run.mkdir()
    TrainConfig(model="dvae", steps=5, batch_size=16, out=str(run)).save(run / "config.json")
    cfg = cfg_of("--resume", "--out", str(run), "--steps", "8", "--batch-size", "4")
    assert (cfg.model, cfg.steps, cfg.batch_size) == ("dvae", 8, 16)
    cfg = cfg_of("--dataset", "shapes3d", "--data-root", str(tmp_path))
    assert cfg.dataset_kwargs == {"root": str(tmp_path)}


@pytest.mark.parametrize("argv, code, says", [
    (["train", "--dataset", "nosuch"], 2, "unknown dataset 'nosuch'"),
    (["train", "--dataset", "shapes3d"], 2, "3dshapes.h5"),
    (["train", "--device", "cuda"], 2, "--device cuda"),
    (["train", "--device", "tpu:0"], 2, "--device tpu:0"),
    (["train", "--data-root", "/tmp"], 2, "--data-root: shapes3d_procedural is procedural"),
    (["train", "--image-size", "48"], 2, "image_size must be 4 * 2**k"),
    (["eval", "NOWHERE"], 2, "NOWHERE: no config.json or checkpoint.pt"),
    (["compare", "NOWHERE"], 2, "NOWHERE: no metrics.json"),
    (["bench", "--hotpath", "nosuch"], 2, "choose from quantize, kde, hessian, overhead"),
    (["train", "--steps", "0"], 2, "--steps: must be >= 1, got 0"),
    (["train", "--steps", "-5"], 2, "--steps: must be >= 1, got -5"),
    (["train", "--batch-size", "1"], 2, "--batch-size: must be >= 2, got 1"),
    (["train", "--lr", "0"], 2, "--lr: must be > 0"),
])
def test_cli_errors_are_one_line(argv, code, says, tmp_path, monkeypatch, capsys):
    import torch

    from qkernels.cli import main

    monkeypatch.delenv("QKERNELS_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    if "--device" in argv and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == code and "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert says in last and (last.startswith("qkernels: error: ") or "error: argument" in last), last
    assert not (tmp_path / "runs").exists()  # nothing half-made


def test_cli_failed_run_exit_1_debug_and_cleanup(tmp_path, monkeypatch, capsys):
    from qkernels.cli import main
    from qkernels.train.loop import Trainer

    def boom(self, s):
        raise FloatingPointError(f"non-finite loss at step {s + 1}\nsecond line")

    monkeypatch.setattr(Trainer, "train_step", boom)
    out = tmp_path / "run"
    argv = ["train", "--model", "ae", "--dataset", "sprites", "--image-size", "16", "--out", str(out)]
    assert main(argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "qkernels: error: FloatingPointError: non-finite loss at step 1 (run with --debug for the traceback)"
    assert not out.exists()  # the fresh run wrote nothing a later --resume or compare could trust
    with pytest.raises(FloatingPointError):
        main([*argv, "--debug"])
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("qkernels ")


def test_python_dash_m_entry_point(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "qkernels", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and all(c in r.stdout for c in ("bench", "train", "eval", "compare"))
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.json").write_text(json.dumps({"model": "ae", "dataset": "sprites", "step": 1,
                                                             "mig.mig": 0.5}))
    r = subprocess.run([sys.executable, "-m", "qkernels", "compare", str(tmp_path / "a")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.splitlines()[2].split()[1:] == ["ae", "sprites", "1", "0.500"]


def test_figures_label_columns_show_the_reconstruction_and_a_colour_bar():
    import numpy as np

    from qkernels.train import figures
    from qkernels.train.data import generator
    from qkernels.train.run import build

    cfg = TrainConfig(model="ae", dataset="sprites", image_size=16, num_latents=3)
    model, ds = build(cfg)
    model.eval()
    im = np.asarray(figures.interventions(model, ds, seed=4))
    x = ds.observations_from_factors(ds.sample_factors(256, generator(4, 6)))[:1]
    with torch.no_grad():
        recon = model.decode(model.encode(x))[0]
    values = model.latent_values(model.encode(ds.observations_from_factors(
        ds.sample_factors(256, generator(4, 6)))).detach())
    labels = [f"z{j} {float(v.min()):.2g}..{float(v.max()):.2g}" for j, v in enumerate(values)]
    left, top, size, pad = 8 + 6 * max(map(len, labels)), 14, 64, figures.PAD  # 16 px tiles upscaled x4
    for col, img in ((0, x[0]), (1, recon)):
        x0, y0 = left + pad + col * (size + pad), top + pad
        want = np.asarray(figures._to_pil(img))
        assert (im[y0:y0 + size, x0:x0 + size] == want).all(), col
    assert (im[:top, left:] < 128).any()  # column labels drawn above the tiles
    heat = np.asarray(figures.nmi_heatmap([[0.0, 1.0], [0.5, 0.25]], ["a", "b"]))
    cell, hl, ht = 30, 90, 24
    assert tuple(heat[ht + 30 + 2, hl + 30 + 25]) == figures.colormap(0.25)  # cell (1, 1), off its text
    bar_x = hl + 2 * cell + 12 + 5
    assert tuple(heat[ht, bar_x]) == figures.colormap(1.0) and tuple(heat[ht + 2 * cell - 1, bar_x]) == \
        figures.colormap(0.0)


def test_log_lines_every_log_every_steps_and_at_the_end(tmp_path):
    cfg = tiny_cfg("ae", tmp_path, steps=5, log_every=2, checkpoint_every=100)
    Trainer(cfg).run(final_eval=False)
    lines = [json.loads(ln) for ln in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [2, 4, 5] and all(r["type"] == "train" for r in lines)
    assert _state(tmp_path)["step"] == 5  # the final checkpoint, although 5 is no multiple of 100


def test_grid2d_evaluation_scores_the_true_latents():
    # quantized_grid2d runs are scored by MCC between the encoded observations and the TRUE latents ds.z
    # (train/evaluate.py). A model that encodes x as itself has MCC(z, x) < 1 under the nonlinear mixing;
    # the expected value is computed here in float64 numpy (Pearson |corr|, best of the two matchings).
    # Mutation audit 7: MCC against the observations ds.x (which gives exactly 1 here) passed every test.
    import numpy as np

    from qkernels.data import load_dataset
    from qkernels.train.evaluate import evaluate_model

    class Identity(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))

        def encode(self, x):
            return x.clone()

        def decode(self, z):
            return z.clone()

    ds = load_dataset("quantized_grid2d", n=500, seed=2)  # nonlinear mixing; MCC(z, x) ~ 0.90
    cfg = TrainConfig(model="cliff_ae", dataset="quantized_grid2d", progress=False)
    res = evaluate_model(Identity(), ds, cfg, num_samples=500)
    z, x = ds.z.double().numpy(), ds.x.double().numpy()
    zc, xc = z - z.mean(0), x - x.mean(0)
    corr = np.abs(zc.T @ xc / np.outer(np.linalg.norm(zc, axis=0), np.linalg.norm(xc, axis=0)))
    want = max((corr[0, 0] + corr[1, 1]) / 2, (corr[0, 1] + corr[1, 0]) / 2)
    assert want < 0.95
    assert res["mcc.mcc"] == pytest.approx(want, rel=1e-9)
    assert res["recon.mse"] == 0.0


@pytest.mark.parametrize("dataset", ["sprites", "quantized_grid2d"])
def test_shards_of_a_batch_are_its_rank_ordered_blocks(dataset):
    """Data parallelism: rank r's shard of batch ``step`` is the r-th equal block of the single-process
    batch, so the ranks' shards concatenated in rank order are that batch (noise drawn for the global
    batch and gathered latents line up with it)."""
    from qkernels.train.run import load_data

    ds = load_data(TrainConfig(dataset=dataset, image_size=16))
    for step in (0, 7):
        whole = get_batch(ds, 12, 3, step)
        shards = [get_batch(ds, 12, 3, step, shard=(r, 3)) for r in range(3)]
        assert [len(s) for s in shards] == [4, 4, 4]
        assert torch.equal(torch.cat(shards), whole)


def test_periodic_evaluations_and_the_final_one_are_logged_once(tmp_path):
    # eval_every 3 over 6 steps: one evaluation at step 3, then the final one at step 6 (none twice)
    cfg = tiny_cfg("ae", tmp_path / "run", eval_every=3, metrics=("mig",), eval_samples=60)
    Trainer(cfg).run()
    evals = [r["step"] for r in map(json.loads, (tmp_path / "run" / "log.jsonl").read_text().splitlines())
             if r["type"] == "eval"]
    assert evals == [3, 6]


def test_compare_shows_every_metric_some_run_has(tmp_path):
    from qkernels.train.evaluate import compare_runs

    for name, metrics in (("a", {"mig.mig": 0.5}), ("b", {"mig.mig": 0.25, "recon.psnr": 20.0})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps({"model": "ae", "step": 1, **metrics}))
    lines = compare_runs([tmp_path / "a", tmp_path / "b"]).splitlines()
    assert lines[0].split()[-2:] == ["mig.mig", "recon.psnr"]
    assert lines[2].split()[-1] == "-" and lines[3].split()[-1] == "20.000"


def test_progress_line_rate_and_eta(monkeypatch, capsys):
    # resumed at step 50 of 100; 10 s later at step 60: 1.00 it/s, 40 steps left = 0.7 min
    from qkernels.train import loop

    clock = iter([0.0, 10.0])
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock))
    bar = loop.Progress(100, 50)
    bar.update(60, {"total": 1.5})
    assert capsys.readouterr().err.strip() == "step 60/100 | total 1.5 | 1.00 it/s | eta 0.7 min"
