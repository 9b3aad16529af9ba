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
    base = dict(
        model=model,
        dataset="sprites",
        image_size=16,
        steps=6,
        batch_size=8,
        out=str(out),
        checkpoint_every=3,
        log_every=1,
        eval_samples=200,
        progress=False,
        eval_every=0,
        model_kwargs=dict(DISC) if model.startswith("factor") else {},
    )
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
    assert any(
        isinstance(m, torch.nn.InstanceNorm2d) and id(m.weight) not in no_decay
        for m in tr.model.modules()
        if getattr(m, "weight", None) is not None
    )
    assert {id(p) for p in tr.clip_params} == {id(p) for p in groups[0]["params"]}
    # Tripod (configs/train_autoencoder.yaml): AdamW b2 0.999, lr 2e-4, no decay, clip 1.0 on every parameter
    tr = Trainer(tiny_cfg("tripod", tmp_path / "t"))
    assert all(g["betas"] == (0.9, 0.999) and g["weight_decay"] == 0.0 for g in tr.opt.param_groups)
    assert len(tr.clip_params) == len(list(tr.model.parameters())) and METHODS["tripod"].optim.lr == 2e-4
    # FactorQVAE: CosineAnnealingLR(T_max 50k, eta_min 1.25e-6) for the VAE AND the discriminator (Adam 1e-3),
    # periodic as torch's closed form: down at 50k (FactorQVAE's 50k iterations: one half-cosine), back up at
    # 100k (QVAE's 100k iterations, same spec)
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
    groups = [
        {
            **{k: v for k, v in g.items() if k != "params"},
            "lr": lr,
            "params": [params[name_of[id(p)]] for p in g["params"]],
        }
        for g in opt.param_groups
    ]
    return type(opt)(groups)


@pytest.mark.parametrize("model", ["factorvae", "factorqvae"])
def test_discriminator_steps_after_model(tmp_path, model):
    # the trainer's step against one written out here: zero the model's grads, loss, backward, clip,
    # step; THEN the discriminator's step (its permuted samples from the UPDATED model; FactorQVAE's real
    # ones are the model step's own), its grads zeroed first (the TC term left gradients on it). The other
    # order gives different parameters. Batches in the method's data order, two per step.
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
            x = get_batch(tr.ds, tr.batch_size, cfg.seed, s, order=spec.data_order, streams=2)

            def disc_step(x=x, s=s):
                x2 = get_batch(tr.ds, tr.batch_size, cfg.seed, s, stream=1, order=spec.data_order, streams=2)
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


def test_cli_train_eval_compare(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    rc = main(
        [
            "train",
            "--model",
            "qlae",
            "--dataset",
            "sprites",
            "--image-size",
            "16",
            "--steps",
            "4",
            "--batch-size",
            "8",
            "--eval-samples",
            "300",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    for f in (
        "config.json",
        "log.jsonl",
        "checkpoint.pt",
        "metrics.json",
        "figures/reconstructions.png",
        "figures/interventions.png",
        "figures/nmi.png",
    ):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    m = json.loads((out / "metrics.json").read_text())
    assert m["protocol"] == "qlae" and m["dci.preset"] == "qlae"  # the authors' protocol (InfoMEC and DCI)
    for k in ("infomec.infom", "dci.disentanglement", "recon.psnr"):
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
    monkeypatch.chdir(tmp_path)  # short run names: the width below is the table's, not that of pytest's tmp path
    assert main(["compare", "run", "run"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["run", "model", "dataset", "step"] and max(map(len, table)) <= 120
    assert "qlae" in table[2] and len(table) == 5 * (table.count("") + 1) - 1  # 4 lines per (wrapped) table


def test_cli_cliff_ae_on_grid2d(tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"dataset_kwargs": {"n": 300}, "batch_size": 100}))
    out = tmp_path / "cliff"
    assert (
        main(
            [
                "train",
                "--model",
                "cliff_ae",
                "--dataset",
                "quantized_grid2d",
                "--steps",
                "3",
                "--config",
                str(cfg),
                "--out",
                str(out),
            ]
        )
        == 0
    )
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
        (tmp_path / name / "metrics.json").write_text(
            json.dumps({"model": "qlae", "dataset": "sprites", "step": 3, "mig.mig": v})
        )
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

    demo = TrainConfig(steps=2, out=str(tmp_path / "demo")).resolve_defaults()  # the values config.json records
    assert cfg_of("--steps", "2", "--out", str(tmp_path / "demo")) == demo and demo.lr == 2e-4
    assert cfg_of("--lr", "0.01").lr == 0.01 and cfg_of().out == "runs/tripod"
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"model": "qlae", "steps": 9, "batch_size": 100}))
    cfg = cfg_of("--config", str(conf), "--steps", "3")
    assert (cfg.model, cfg.steps, cfg.batch_size, cfg.lr, cfg.out) == ("qlae", 3, 100, 1e-3, "runs/qlae")
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


@pytest.mark.parametrize(
    "argv, code, says",
    [
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
        (["train", "--stepz", "3"], 2, "unrecognized arguments: --stepz 3"),
        (["nonsense"], 2, "invalid choice: 'nonsense'"),
        # issue 39: it silently started a fresh 600-step run
        (["train", "--resume", "--out", "empty"], 2, "--resume needs a run: --out empty holds none (no config.json)"),
    ],
)
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
    lines = err.strip().splitlines()
    last = lines[-1]
    assert says in last and (last.startswith("qkernels: error: ") or "error: argument" in last), last
    # issue 39: one line, argparse's own errors too (no usage block before them: that is on --help)
    assert [line for line in lines if not line.startswith("qkernels train: loading")] == [last], err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "empty").exists()  # nothing half-made


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
    (tmp_path / "a" / "metrics.json").write_text(
        json.dumps({"model": "ae", "dataset": "sprites", "step": 1, "mig.mig": 0.5})
    )
    r = subprocess.run(
        [sys.executable, "-m", "qkernels", "compare", str(tmp_path / "a")], capture_output=True, text=True, timeout=120
    )
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
    values = model.latent_values(
        model.encode(ds.observations_from_factors(ds.sample_factors(256, generator(4, 6)))).detach()
    )
    labels = [f"{float(v.min()):.2g} to {float(v.max()):.2g}" for v in values]  # each under its "zj" (issue 47)
    left, top, size, pad = 8 + 6 * max(map(len, labels)), 14, 64, figures.PAD  # 16 px tiles upscaled x4
    for col, img in ((0, x[0]), (1, recon)):
        x0, y0 = left + pad + col * (size + pad), top + pad
        want = np.asarray(figures._to_pil(img))
        assert (im[y0 : y0 + size, x0 : x0 + size] == want).all(), col
    assert (im[:top, left:] < 128).any()  # column labels drawn above the tiles
    heat = np.asarray(figures.nmi_heatmap([[0.0, 1.0], [0.5, 0.25]], ["a", "b"]))
    cell, hl, ht = 30, 90, 24
    assert tuple(heat[ht + 30 + 2, hl + 30 + 25]) == figures.colormap(0.25)  # cell (1, 1), off its text
    bar_x = hl + 2 * cell + 12 + 5
    assert tuple(heat[ht, bar_x]) == figures.colormap(1.0) and tuple(
        heat[ht + 2 * cell - 1, bar_x]
    ) == figures.colormap(0.0)


def test_log_lines_every_log_every_steps_and_at_the_end(tmp_path):
    cfg = tiny_cfg("ae", tmp_path, steps=5, log_every=2, checkpoint_every=100)
    Trainer(cfg).run(final_eval=False)
    lines = [json.loads(ln) for ln in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [2, 4, 5] and all(r["type"] == "train" for r in lines)
    assert _state(tmp_path)["step"] == 5  # the final checkpoint, although 5 is no multiple of 100


class _Identity(torch.nn.Module):
    """A fake model whose latents and reconstructions are its inputs."""

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def encode(self, x):
        return x.clone()

    def decode(self, z):
        return z.clone()


def test_grid2d_evaluation_scores_the_true_latents():
    # quantized_grid2d runs are scored by MCC between the encoded observations and the TRUE latents ds.z
    # (train/evaluate.py). A model that encodes x as itself has MCC(z, x) < 1 under the nonlinear mixing;
    # the expected value is computed here in float64 numpy (Pearson |corr|, best of the two matchings).
    # Mutation audit 7: MCC against the observations ds.x (which gives exactly 1 here) passed every test.
    import numpy as np

    from qkernels.data import load_dataset
    from qkernels.train.evaluate import evaluate_model

    ds = load_dataset("quantized_grid2d", n=500, seed=2)  # nonlinear mixing; MCC(z, x) ~ 0.90
    cfg = TrainConfig(model="cliff_ae", dataset="quantized_grid2d", progress=False)
    res = evaluate_model(_Identity(), ds, cfg, num_samples=500)
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
    evals = [
        r["step"]
        for r in map(json.loads, (tmp_path / "run" / "log.jsonl").read_text().splitlines())
        if r["type"] == "eval"
    ]
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
    # resumed at step 50 of 100; 10 s later at step 60: 1.00 it/s, 40 steps left = 40 s; 10 s elapsed
    from qkernels.train import loop

    clock = iter([0.0, 10.0])
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock))
    bar = loop.Progress(100, 50)
    bar.update(60, {"total": 1.5})
    assert capsys.readouterr().err.strip() == "step 60/100 | total 1.5 | 1.00 it/s | elapsed 0:10 | eta 0:40"


# ------------------------------------------------------------------ pre-audit 9 review: the trainer's reporting
# paths, schedules and optimizer wiring pinned against hand-computed values


def _np_seed(*keys):
    """derive_seed recomputed with numpy's SeedSequence (63 bits)."""
    import numpy as np

    return int(np.random.SeedSequence(list(keys)).generate_state(2, dtype=np.uint64)[0] >> 1)


def _log(out):
    return [json.loads(ln) for ln in (out / "log.jsonl").read_text().splitlines()]


def test_cosine_lr_is_logged_and_applied_at_each_step(tmp_path, monkeypatch):
    """Cosine lr from 1e-3 to 0 with T_max 4 (then periodic): step s uses 0.5e-3 (1 + cos(pi s / 4)) and the log
    line of step k shows the lr of the step it completed (s = k - 1). Guards: lr_at(s + 1), the lr computed but
    not written into the optimizer's groups, lr_decay_steps 0 not meaning the run length, unknown schedules."""
    from dataclasses import replace

    from qkernels.models.registry import OptimSpec

    ae = METHODS["ae"]
    monkeypatch.setitem(METHODS, "ae", replace(ae, optim=replace(ae.optim, lr_schedule="cosine", lr_decay_steps=4)))
    tr = Trainer(tiny_cfg("ae", tmp_path, checkpoint_every=100))
    c = 0.5e-3 * (1 + math.cos(math.pi / 4))
    want = [1e-3, c, 0.5e-3, 1e-3 - c, 0.0, 1e-3 - c]
    tr.run(final_eval=False)
    assert [r["lr"] for r in _log(tmp_path)] == pytest.approx(want, abs=1e-12)
    assert [g["lr"] for g in tr.opt.param_groups] == pytest.approx([want[-1]] * 2, abs=1e-12)  # decay, no decay
    spec = OptimSpec(lr_schedule="cosine", lr_min=0.1)  # lr_decay_steps 0: T_max = the run length
    assert lr_at(spec, 1.1, 5, 10) == pytest.approx(0.6) and lr_at(spec, 1.1, 10, 10) == pytest.approx(0.1)
    assert lr_at(OptimSpec(lr_schedule=None), 0.3, 7, 10) == 0.3
    with pytest.raises(ValueError, match="unknown lr_schedule 'linear'"):
        lr_at(OptimSpec(lr_schedule="linear"), 1.0, 0, 10)


def test_logged_model_schedules_follow_the_step(tmp_path):
    """D-VAE's noise scale: cosine from 0.5 (step 0) to 2.0 over its horizon (here 4 steps; lddr's 300,000 by
    default, whatever the run's length: tests/test_fidelity.py); the log line of step k shows step k - 1's. Guards:
    schedules(s + 1), the schedules not logged."""
    Trainer(tiny_cfg("dvae", tmp_path, steps=4, checkpoint_every=100, model_kwargs={"noise_steps": 4})).run(
        final_eval=False
    )
    c = math.cos(math.pi / 4)
    want = [0.5, 2 - 0.75 * (1 + c), 1.25, 2 - 0.75 * (1 - c)]
    lines = _log(tmp_path)
    assert [r["noise_scale"] for r in lines] == pytest.approx(want, rel=1e-12)
    assert [r["lr"] for r in lines] == [1e-4] * 4  # dlib's Adam 1e-4, unscheduled


def test_discriminator_optimizer_is_kim_and_mnih_adam_and_ignores_cfg_lr(tmp_path):
    """FactorVAE: the VAE's Adam (betas 0.9, 0.999) takes --lr; the discriminator's own Adam (lr 1e-4, betas 0.5,
    0.9; Kim & Mnih 2018) does not, and holds only the discriminator's parameters. Guards: the discriminator built
    with the model's spec or lr, cfg.lr ignored, the model optimizer also stepping the discriminator."""
    tr = Trainer(tiny_cfg("factorvae", tmp_path, lr=0.05))
    named = dict(tr.model.named_parameters())
    disc = {id(p) for n, p in named.items() if n.startswith("discriminator.")}
    assert disc and type(tr.opt) is torch.optim.Adam and type(tr.disc_opt) is torch.optim.Adam
    assert {id(p) for g in tr.opt.param_groups for p in g["params"]} == {id(p) for p in named.values()} - disc
    assert {id(p) for g in tr.disc_opt.param_groups for p in g["params"]} == disc
    terms = tr.train_step(0)
    assert terms["lr"] == 0.05
    for g in tr.opt.param_groups:
        assert (g["lr"], g["betas"], g["weight_decay"], g["eps"]) == (0.05, (0.9, 0.999), 0.0, 1e-8)
    for g in tr.disc_opt.param_groups:
        assert (g["lr"], g["betas"], g["weight_decay"], g["eps"]) == (1e-4, (0.5, 0.9), 0.0, 1e-8)


def test_qlae_step_is_adamw_on_decay_groups_with_the_decayed_group_clipped(tmp_path):
    """Two QLAE trainer steps against steps written out here from the authors' recipe (optax AdamW lr 1e-3,
    decay 0.1 except biases and the codebook, grads of the decayed group clamped to [-1, 1]). Guards: clipping
    dropped or applied to the wrong group, lr/decay/betas not those of the recipe, zero_grad dropped."""
    import copy

    from qkernels.train.data import derive_seed

    tr = Trainer(tiny_cfg("qlae", tmp_path, model_kwargs={"recon": "bce_sum"}))  # summed: gradients above 1
    m = copy.deepcopy(tr.model)
    named = dict(m.named_parameters())
    undecayed = [p for n, p in named.items() if n.endswith(".bias") or n == "quantizer.values"]
    decayed = [p for n, p in named.items() if not (n.endswith(".bias") or n == "quantizer.values")]
    opt = torch.optim.AdamW(
        [{"params": decayed, "weight_decay": 0.1}, {"params": undecayed, "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.999),
    )
    big = 0.0
    for s in (0, 1):
        torch.manual_seed(derive_seed(0, s, 3))
        x = get_batch(tr.ds, 8, 0, s, order="epochs")  # QLAE reads shuffled epochs
        opt.zero_grad(set_to_none=True)
        m.loss(x, s)["total"].backward()
        big = max(big, max(float(p.grad.abs().max()) for p in undecayed + decayed))
        for p in decayed:
            p.grad.clamp_(-1.0, 1.0)
        opt.step()
        tr.train_step(s)
    assert big > 1.0  # the clipping did bite
    for n, p in tr.model.named_parameters():
        torch.testing.assert_close(p, named[n], rtol=1e-6, atol=1e-7, msg=n)


def test_resume_restores_rng_step_and_optimizer_and_a_missing_checkpoint_starts_fresh(tmp_path):
    """Resume: step, model, optimizer AND the global torch RNG as saved (the checkpoint's rng, not what building
    the model left). --resume without a checkpoint starts a fresh run (step 0, empty log)."""
    out = tmp_path / "r"
    Trainer(tiny_cfg("ae", out)).run(stop_after=4, final_eval=False)  # checkpoint of step 3
    s = _state(out)
    torch.manual_seed(1234)
    tr = Trainer(tiny_cfg("ae", out), resume=True)
    assert tr.step == 3 and torch.equal(torch.get_rng_state(), s["torch_rng"])
    _assert_same(tr.opt.state_dict(), s["opt"])
    _assert_same(tr.model.state_dict(), s["model"])
    assert s["config"] == tiny_cfg("ae", out).resolve_defaults().to_dict()
    fresh = tmp_path / "f"
    fresh.mkdir()
    (fresh / "log.jsonl").write_text('{"type": "train", "step": 1}\n')
    tr = Trainer(tiny_cfg("ae", fresh), resume=True)
    assert tr.step == 0 and (fresh / "log.jsonl").read_text() == ""


def test_non_finite_term_stops_the_run_and_a_run_with_a_checkpoint_keeps_its_files(tmp_path, monkeypatch):
    """Any non-finite logged term (not only the total) raises FloatingPointError naming the 1-based step; a run
    that fails after writing a checkpoint keeps config, log and checkpoint (a later --resume continues it)."""

    def fake(self, s):
        return {"total": 1.0, "recon": float("nan") if s == 2 else 0.5, "lr": 0.1}

    monkeypatch.setattr(Trainer, "train_step", fake)
    out = tmp_path / "run"
    with pytest.raises(FloatingPointError, match="non-finite loss at step 3"):
        Trainer(tiny_cfg("ae", out, checkpoint_every=1)).run(final_eval=False)
    assert _state(out)["step"] == 2 and (out / "config.json").is_file()
    assert [r["step"] for r in _log(out)] == [1, 2]


def test_progress_without_a_tty_prints_the_first_step_every_tenth_and_the_last(monkeypatch, capsys):
    """Not a tty: a line at the first step of the (re)start, every total // 10 steps and at the last; lr not
    shown; total < 10 prints every step; disabled prints nothing."""
    import itertools

    from qkernels.train import loop

    clock = itertools.count(1.0)
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock))

    def shown(total, start, **kw):
        bar = loop.Progress(total, start, **kw)
        for s in range(start + 1, total + 1):
            bar.update(s, {"total": 1.0, "lr": 0.5})
        bar.note("done")
        lines = capsys.readouterr().err.splitlines()
        assert all("lr" not in ln for ln in lines)
        return [int(ln.split()[1].split("/")[0]) for ln in lines if ln.startswith("step ")]

    assert shown(25, 0) == [1, *range(2, 25, 2), 25]
    assert shown(25, 6) == [7, *range(8, 25, 2), 25]
    assert shown(5, 0) == [1, 2, 3, 4, 5]
    assert shown(25, 0, enabled=False) == [] and capsys.readouterr().err == ""


def test_progress_on_a_tty_redraws_at_most_every_half_second(monkeypatch, capsys):
    """A tty: redrawn in place (\\r ... erase to end of line) at the first step, then only once 0.5 s passed since
    the last redraw, and always at the last step; close() ends the line."""
    from qkernels.train import loop

    clock = iter([0.0, 0.25, 0.5, 0.75, 1.0, 1.25])
    monkeypatch.setattr(loop.time, "perf_counter", lambda: next(clock))
    bar = loop.Progress(5, 0)
    bar.tty = True
    for s in range(1, 6):
        bar.update(s, {"total": 2.0})
    bar.close()
    err = capsys.readouterr().err
    assert err == (
        "\rstep 1/5 | total 2 | - it/s | elapsed 0:00 | eta -\x1b[K"  # the first step: warm-up
        "\rstep 3/5 | total 2 | 4.00 it/s | elapsed 0:01 | eta 0:00\x1b[K"
        "\rstep 5/5 | total 2 | 4.00 it/s | elapsed 0:01 | eta 0:00\x1b[K\n"
        "trained 5 steps in 0:01 (4.00 it/s after the first step)\n"
    )


def test_fixed_size_batches_are_slices_of_per_epoch_permutations():
    """n 20, batch 8: 2 batches per epoch (the last 4 rows of a permutation unused), epoch e's permutation from
    randperm seeded by (seed, e, stream, 1); a batch larger than the data is a whole permutation. Guards:
    ceil vs floor batches per epoch, epoch/offset swapped, the stream or epoch not in the seed."""
    from qkernels.data import QuantizedGrid2D

    grid = QuantizedGrid2D(20, seed=0)

    def perm(epoch, stream=0):
        return torch.randperm(20, generator=torch.Generator().manual_seed(_np_seed(3, epoch, stream, 1)))

    for step, epoch, k in ((0, 0, 0), (1, 0, 1), (2, 1, 0), (5, 2, 1)):
        assert torch.equal(get_batch(grid, 8, 3, step), grid.x[perm(epoch)[8 * k : 8 * k + 8]]), step
    assert torch.equal(get_batch(grid, 8, 3, 1, stream=1), grid.x[perm(0, 1)[8:16]])
    assert torch.equal(get_batch(grid, 32, 3, 3), grid.x[perm(3)])


def test_load_data_and_build_follow_the_config(tmp_path):
    """dataset_kwargs win over image_size / the run's seed; quantized_grid2d keeps its own fixed seed; the
    parameters are initialized from torch.manual_seed(derive_seed(seed, 2**32 - 1)); num_latents, model_kwargs
    (over the method's lambdas) and the run length reach the model."""
    from qkernels.data import QuantizedGrid2D, load_dataset
    from qkernels.models.registry import build_model
    from qkernels.train.run import build, load_data

    assert load_data(
        TrainConfig(dataset="sprites", image_size=16, dataset_kwargs={"image_size": 8})
    ).observation_shape == (1, 8, 8)
    assert load_data(TrainConfig(dataset="sprites", image_size=None)).observation_shape == (1, 64, 64)
    assert load_data(TrainConfig(dataset="balls", seed=3, dataset_kwargs={"seed": 7, "n": 50})).seed == 7
    grid = load_data(TrainConfig(dataset="quantized_grid2d", seed=5, dataset_kwargs={"n": 50}))
    assert torch.equal(grid.x, QuantizedGrid2D(50).x)
    cfg = TrainConfig(
        model="tripod",
        dataset="sprites",
        image_size=16,
        seed=4,
        steps=77,
        num_latents=3,
        model_kwargs={"lambda_nhp": 0.5},
    )
    model, _ = build(cfg)
    assert (model.num_latents, model.total_steps, model.lambda_nhp, model.lambda_klm) == (3, 77, 0.5, 1e-4)
    torch.manual_seed(_np_seed(4, 2**32 - 1))
    ref = build_model(
        "tripod",
        load_dataset("sprites", image_size=16).observation_shape,
        3,
        arch="small",
        lambda_klm=1e-4,
        lambda_nhp=0.5,
    )
    _assert_same(model.state_dict(), ref.state_dict())
    other, _ = build(TrainConfig(model="tripod", dataset="sprites", image_size=16, seed=5, num_latents=3))
    assert any(
        not torch.equal(a, b) for a, b in zip(other.state_dict().values(), model.state_dict().values(), strict=True)
    )


class _Half(torch.nn.Module):
    """A fake model on 1 x 16 x 16 images: latents = half the pixels, decode = reshape (recon = x / 2)."""

    def __init__(self, codes=False):
        super().__init__()
        self.unused, self.with_codes = torch.nn.Parameter(torch.zeros(1)), codes

    def encode(self, x):
        return x.flatten(1) * 0.5

    def decode(self, z):
        return z.view(-1, 1, 16, 16)

    def codes(self, x):
        return (x.flatten(1) > 0.5).long() if self.with_codes else None


def test_evaluate_model_wiring_and_reconstruction_scores(monkeypatch):
    """Image data: qkernels.metrics.evaluate called with the method's protocol, the config's metrics, the given
    sample count, seed cfg.seed + 1 (not the training batches' seed) and the integer codes when the model has
    them; recon MSE / PSNR / uint8 PSNR (means of per-image dB) on the very images the metrics encode (the protocol's
    draw: factors of torch.Generator().manual_seed(seed + 1), the first samples["infomec"] of them, all when InfoMEC
    does not run; Tripod's PSNR filter reads these), recomputed in float64 numpy; the model's train/eval mode
    restored; arrays made JSON lists."""
    import numpy as np

    from qkernels import metrics as M
    from qkernels.data import load_dataset
    from qkernels.metrics.evaluate import encode_dataset
    from qkernels.train.evaluate import evaluate_model

    calls = []

    def spy(enc, ds, **kw):  # encodes the protocol's draw as the real evaluate does; scores nothing
        calls.append((enc, kw))
        n = max(kw["num_samples"] or 0, 1) if kw["num_samples"] else 300
        encode_dataset(enc, ds, num_samples=n, seed=kw["seed"], batch_size=kw["batch_size"])
        return {"mig.mig": np.float32(0.25), "mig.matrix": np.eye(2)}

    monkeypatch.setattr(M, "evaluate", spy)
    ds = load_dataset("sprites", image_size=16)
    cfg = TrainConfig(model="ae", dataset="sprites", image_size=16, seed=7, metrics=("mig",))
    model = _Half()
    res = evaluate_model(model, ds, cfg, num_samples=300)
    enc, kw = calls[0]
    assert kw == {
        "protocol": cfg.eval_protocol(),
        "metrics": ("mig",),
        "num_samples": 300,
        "seed": 8,
        "batch_size": 256,
    }
    assert cfg.eval_protocol().name == "qlae"  # ae: its authors' (QLAE's) protocol
    assert res["mig.mig"] == 0.25 and res["mig.matrix"] == [[1.0, 0.0], [0.0, 1.0]] and model.training
    x = ds.observations_from_factors(ds.sample_factors(300, torch.Generator().manual_seed(8)))
    torch.testing.assert_close(enc(x[:3]), x[:3].flatten(1) * 0.5)

    def want(x):
        x = x.double().numpy().reshape(x.shape[0], -1)
        per = ((0.5 * x - x) ** 2).mean(1)
        q = np.floor(255 * np.clip(x, 0, 1)).astype(np.int64)
        err = (np.floor(255 * np.clip(0.5 * x, 0, 1)).astype(np.int64) - q) % 256
        per8 = ((err * err) % 256).mean(1)
        return per.mean(), np.mean(10 * np.log10(1 / per)), np.mean(20 * np.log10(255) - 10 * np.log10(per8))

    mse, psnr, psnr8 = want(x)  # all 300 images (two batches of the draw), not 256 of another generator
    assert res["recon.mse"] == pytest.approx(mse, rel=1e-9)
    assert res["recon.psnr"] == pytest.approx(psnr, rel=1e-9)
    assert res["recon.psnr_tripod"] == pytest.approx(psnr8, rel=1e-9)
    # with InfoMEC: its images (the first samples["infomec"] of the draw; here all 300)
    tripod = TrainConfig(model="tripod", dataset="sprites", image_size=16, seed=7, metrics=("infomec", "dci"))
    res = evaluate_model(model, ds, tripod, num_samples=300)
    assert res["recon.psnr_tripod"] == pytest.approx(psnr8, rel=1e-9)
    coded = _Half(codes=True).eval()
    evaluate_model(coded, ds, cfg, num_samples=50)
    x = ds.observations_from_factors(ds.sample_factors(4, torch.Generator().manual_seed(0)))
    assert not coded.training and torch.equal(calls[-1][0](x), (x.flatten(1) > 0.5).long())


def test_compare_table_is_aligned_and_formats_cells(tmp_path, monkeypatch):
    """The exact table: columns left-aligned to their widest cell, two spaces apart, a dashed rule; a float
    below 1000 in magnitude with 3 decimals, else 4 significant digits (a large negative too), an int as is,
    a missing value '-'; --columns picks and orders the columns."""
    from qkernels.train.evaluate import compare_runs

    monkeypatch.chdir(tmp_path)
    for name, m in (
        ("a", {"model": "qlae", "dataset": "sprites", "step": 3, "mig.mig": -12345.6, "recon.mse": 1000.0}),
        ("bb", {"model": "ae", "step": 10, "mig.mig": 5}),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(m))
    assert compare_runs(["a", "bb"]).splitlines() == [
        "run  model  dataset  step  mig.mig     recon.mse",
        "---  -----  -------  ----  ----------  ---------",
        "a    qlae   sprites  3     -1.235e+04  1000",
        "bb   ae              10    5           -",
    ]
    assert compare_runs(["bb"], columns=["recon.mse", "mig.mig"]).splitlines()[0].split()[-2:] == [
        "recon.mse",
        "mig.mig",
    ]
    from qkernels.train.evaluate import _fmt

    assert (_fmt(999.9994), _fmt(-0.5), _fmt(None), _fmt(2)) == ("999.999", "-0.500", "-", "2")


def test_colormap_clips_and_images_round_and_clamp():
    """colormap clips to [0, 1] (0.75 is the 4th stop); _to_pil rounds (127.5 -> 128, not truncation),
    clamps to [0, 1] (no uint8 wrap-around), keeps RGB channel order, upscales by nearest neighbour."""
    import numpy as np

    from qkernels.train.figures import _to_pil, colormap

    assert colormap(-0.5) == (68, 1, 84) and colormap(1.5) == (253, 231, 37) and colormap(0.75) == (94, 201, 98)
    a = np.asarray(_to_pil(torch.tensor([[[0.5, 1.5], [-0.2, 0.2]]]), min_size=4))
    assert (a[..., 0] == np.array([[128, 128, 255, 255]] * 2 + [[0, 0, 51, 51]] * 2)).all()
    assert (a[..., 0] == a[..., 2]).all()
    rgb = np.asarray(_to_pil(torch.tensor([0.2, 0.4, 0.6]).view(3, 1, 1), min_size=4))
    assert rgb.shape == (4, 4, 3) and (rgb == np.array([51, 102, 153])).all()


def test_image_grid_canvas_and_tile_positions():
    """Canvas: left labels 8 + 6 x the longest label, 14 px of column labels, tiles of 64 px with 2 px gaps."""
    import numpy as np

    from qkernels.train.figures import image_grid

    black, grey = torch.zeros(1, 16, 16), torch.full((1, 16, 16), 0.5)
    assert image_grid([[black] * 3, [black]]).size == (3 * 66 + 2, 2 * 66 + 2)
    im = image_grid([[black] * 3, [grey]], ["ab", "c"], ["u"])
    assert im.size == (20 + 3 * 66 + 2, 14 + 2 * 66 + 2)
    a = np.asarray(im)
    assert tuple(a[14 + 2 + 66, 20 + 2]) == (128, 128, 128) and tuple(a[14 + 2 + 66 + 63, 20 + 2 + 63]) == (
        128,
        128,
        128,
    )
    assert tuple(a[14 + 2, 20 + 2 + 2 * 66 + 63]) == (0, 0, 0) and tuple(a[14 + 2 + 66, 20 + 2 + 66]) == (255, 255, 255)


def test_interventions_decode_each_latent_at_its_values():
    """Row j, column 2 + k: the input's latents with latent j set to its k-th value; more than 10 values are
    subsampled at linspace(0, n - 1, 10) ROUNDED (13 values: indices 0 1 3 4 5 7 8 9 11 12). A fake model whose
    decoding paints z0 in the top half and z1 in the bottom half of a 4 x 4 image (upscaled to 64 px)."""
    import numpy as np

    from qkernels.data import load_dataset
    from qkernels.train.figures import interventions

    class Paint(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))

        def encode(self, x):
            return torch.stack([x.flatten(1).mean(1), torch.full((len(x),), 0.25)], 1)

        def decode(self, z):
            img = torch.empty(len(z), 1, 4, 4)
            img[:, :, :2], img[:, :, 2:] = z[:, 0, None, None, None], z[:, 1, None, None, None]
            return img

        def latent_values(self, z):
            return [torch.arange(13.0) / 12, torch.tensor([0.0, 1.0])]

    a = np.asarray(interventions(Paint(), load_dataset("sprites", image_size=16), seed=1))[..., 0]
    left, top = 8 + 6 * len("0 to 1"), 14  # row labels "z0" over "0 to 1" (issue 47)
    assert a.shape == (top + 2 * 66 + 2, left + 12 * 66 + 2)

    def tile(row, col):  # (top half, bottom half) pixel values
        x0, y0 = left + 2 + col * 66, top + 2 + row * 66
        return int(a[y0 + 16, x0 + 32]), int(a[y0 + 48, x0 + 32])

    want = [round(k / 12 * 255) for k in (0, 1, 3, 4, 5, 7, 8, 9, 11, 12)]
    assert [tile(0, 2 + k)[0] for k in range(10)] == want
    assert {tile(0, c)[1] for c in range(1, 12)} == {64}  # z1 of the input (0.25) kept
    z0 = tile(0, 1)[0]  # the reconstruction's
    assert [tile(1, c) for c in (1, 2, 3)] == [(z0, 64), (z0, 0), (z0, 255)]
    assert a[top + 2 + 66 + 16, left + 2 + 4 * 66 + 32] == 255  # latent 1 has 2 values: no 5th column


def test_nmi_heatmap_cells_sit_at_row_source_column_latent():
    """A 2 x 3 matrix: cell (i, j) at x = 90 + 30 j, y = 24 + 30 i, coloured colormap(nmi[i, j]); image
    90 + 3 * 30 + 16 + 14 + 30 wide, 24 + 2 * 30 + 8 high. Guards: rows and columns swapped (a square matrix's
    diagonal cannot tell)."""
    import numpy as np

    from qkernels.train.figures import colormap, nmi_heatmap

    m = [[0.0, 1.0, 0.25], [0.5, 0.75, 0.0]]
    a = np.asarray(nmi_heatmap(m, ["a", "b"]))
    assert a.shape == (92, 240, 3)
    for i in range(2):
        for j in range(3):
            assert tuple(a[24 + 30 * i + 1, 90 + 30 * j + 28]) == colormap(m[i][j]), (i, j)


def test_latent_scatter_places_and_colours_points():
    """2-D data: latent u -> x = 10 + 380 (u - lo) / (hi - lo) (0.5 / 99.5 percentiles), v -> y = 400 - that,
    coloured colormap((c0 + 4 c1) / 15) of the ground-truth cell (c0, c1)."""
    from types import SimpleNamespace

    import numpy as np

    from qkernels.train.figures import colormap, latent_scatter

    z = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.5, 0.0]]).repeat_interleave(100, 0)
    cells = torch.tensor([[0, 0], [3, 3], [1, 2]]).repeat_interleave(100, 0)
    a = np.asarray(latent_scatter(_Identity(), SimpleNamespace(x=z, cells=cells)))
    assert tuple(a[390, 10]) == colormap(0.0) and tuple(a[10, 390]) == colormap(1.0)
    assert tuple(a[390, 200]) == colormap(9 / 15)
    assert (a[200, :] == 255).all()  # nothing at the mid height


def test_make_all_writes_nmi_only_with_the_matrix_and_restores_train_mode(tmp_path):
    from qkernels.train import figures
    from qkernels.train.run import build

    cfg = TrainConfig(model="ae", dataset="sprites", image_size=16, num_latents=2)
    model, ds = build(cfg)
    paths = figures.make_all(model, ds, cfg, tmp_path / "f", {"mig.mig": 0.5})
    assert sorted(p.name for p in paths) == ["interventions.png", "reconstructions.png"] and model.training
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == ["interventions.png", "reconstructions.png"]
    paths = figures.make_all(model, ds, cfg, tmp_path / "g", {"infomec.nmi": [[0.5, 0.5]] * 5})
    assert sorted(p.name for p in paths) == ["interventions.png", "nmi.png", "reconstructions.png"]


def test_reconstruction_figure_rows_are_data_then_recon():
    """Top row: 8 images of generator(seed, 5); bottom row: their reconstructions (x / 2 here)."""
    import numpy as np

    from qkernels.data import load_dataset
    from qkernels.train.figures import _to_pil, reconstructions

    ds = load_dataset("sprites", image_size=16)
    a = np.asarray(reconstructions(_Half(), ds, seed=3))
    x = ds.observations_from_factors(ds.sample_factors(8, torch.Generator().manual_seed(_np_seed(3, 5))))
    left = 8 + 6 * len("recon")
    for col in (0, 7):
        x0 = left + 2 + col * 66
        assert (a[2:66, x0 : x0 + 64] == np.asarray(_to_pil(x[col]))).all(), col
        assert (a[68:132, x0 : x0 + 64] == np.asarray(_to_pil(x[col] * 0.5))).all(), col


def test_config_defaults_are_the_documented_ones():
    """The bare `qkernels train`: the authors' Tripod on shapes3d_procedural at 32 x 32 for 600 steps, small
    widths, method defaults for batch/lr/latents/data order, evaluation at the end with the authors' protocol
    (Tripod's: InfoMEC and DCI on 10,000 samples)."""
    cfg = TrainConfig()
    assert (cfg.model, cfg.dataset, cfg.steps, cfg.image_size, cfg.arch, cfg.out) == (
        "tripod",
        "shapes3d_procedural",
        600,
        32,
        "small",
        "runs/tripod",
    )
    assert (cfg.batch_size, cfg.lr, cfg.num_latents, cfg.seed, cfg.eval_every, cfg.eval_samples) == (
        None,
        None,
        None,
        0,
        "auto",
        None,
    )
    assert cfg.resolve_defaults().eval_every == "tripod" and not cfg.paper  # Tripod's checkpoint cadence
    assert (cfg.protocol, cfg.data_order, cfg.metrics) == ("auto", "auto", None)
    assert cfg.eval_protocol().name == "tripod" and cfg.eval_protocol().num_samples() == 10_000
    assert (cfg.device, cfg.compile, cfg.amp, cfg.local_kde) == ("cpu", False, False, False)
    assert (cfg.checkpoint_every, cfg.log_every, cfg.world_size, cfg.dist_timeout_s) == (250, 10, 1, 600)


def test_cli_every_train_flag_reaches_its_config_field(tmp_path):
    """Each flag lands in its own field (no two swapped); a --config file's out and dataset_kwargs are kept
    (--data-root adds root to them); --out overrides the file's out."""
    from qkernels.cli import _train_config, parser

    def cfg_of(*argv):
        return _train_config(parser().parse_args(["train", *argv]))

    cfg = cfg_of(
        "--model",
        "dvae",
        "--dataset",
        "balls",
        "--steps",
        "7",
        "--batch-size",
        "6",
        "--seed",
        "3",
        "--lr",
        "0.5",
        "--arch",
        "paper",
        "--image-size",
        "16",
        "--num-latents",
        "4",
        "--eval-samples",
        "21",
        "--eval-every",
        "2",
        "--device",
        "cuda:1",
        "--out",
        "o",
        "--compile",
        "--amp",
        "--local-kde",
    )
    assert (
        cfg
        == TrainConfig(
            model="dvae",
            dataset="balls",
            steps=7,
            batch_size=6,
            seed=3,
            lr=0.5,
            arch="paper",
            image_size=16,
            num_latents=4,
            eval_samples=21,
            eval_every=2,
            device="cuda:1",
            out="o",
            compile=True,
            amp=True,
            local_kde=True,
        ).resolve_defaults()
    )
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"out": "x/y", "dataset": "shapes3d", "dataset_kwargs": {"seed": 5}}))
    cfg = cfg_of("--config", str(conf), "--data-root", "R")
    assert cfg.out == "x/y" and cfg.dataset_kwargs == {"seed": 5, "root": "R"}
    assert cfg_of("--config", str(conf), "--out", "z").out == "z"
    run = tmp_path / "r"
    run.mkdir()
    TrainConfig(model="dvae", steps=5, out=str(run)).save(run / "config.json")
    assert cfg_of("--resume", "--out", str(run), "--device", "cuda:1").device == "cuda:1"
    from qkernels.cli import UsageError

    with pytest.raises(UsageError, match="--resume needs a run"):  # nothing to resume: refused (issue 39)
        cfg_of("--resume", "--out", str(tmp_path / "new"), "--model", "ae")


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--steps", "x"], "--steps: expected an integer, got 'x'"),
        (["--eval-samples", "19"], "--eval-samples: must be >= 20, got 19"),
        (["--lr", "nan"], "--lr: must be > 0, got nan"),
        (["--lr", "abc"], "--lr: expected a number, got 'abc'"),
        (["--image-size", "7"], "--image-size: must be >= 8, got 7"),
    ],
)
def test_cli_flag_bounds(argv, says, capsys):
    """The smallest accepted values pass (--steps 1, --batch-size 2, --eval-samples 20, --eval-every 0); the ones
    below fail with argparse's one line."""
    from qkernels.cli import parser

    a = parser().parse_args(
        [
            "train",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--eval-samples",
            "20",
            "--eval-every",
            "0",
            "--image-size",
            "8",
            "--lr",
            "1e-9",
        ]
    )
    assert (a.steps, a.batch_size, a.eval_samples, a.eval_every, a.image_size, a.lr) == (1, 2, 20, 0, 8, 1e-9)
    with pytest.raises(SystemExit):
        parser().parse_args(["train", *argv])
    assert says in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "content, says",
    [
        ("{not json", "--config CONF: Expecting property name"),
        ("[1, 2]", "--config CONF: expected a JSON object of TrainConfig fields"),
        ('{"bogus": 1}', "--config CONF: unknown config keys ['bogus']"),
    ],
)
def test_cli_bad_config_file_is_a_usage_error(content, says, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "CONF").write_text(content)
    assert main(["train", "--config", "CONF"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("qkernels: error: " + says), last


def test_cli_train_passes_resume_and_prints_the_scalar_results(tmp_path, monkeypatch, capsys):
    """`train` builds the Trainer with --resume, prints the final metrics without matrices and the run
    directory; a ValueError building it is a usage error naming model and dataset."""
    from qkernels.train import loop

    calls = []

    class Fake:
        def __init__(self, cfg, *, resume=False):
            calls.append((cfg, resume))
            if cfg.dataset == "bad":
                raise ValueError("no good")

        def run(self):
            return {"step": 2, "mig.mig": 0.5, "infomec.nmi": [[1.0]], "dci.x": {"a": 1}}

    monkeypatch.setattr(loop, "Trainer", Fake)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    (tmp_path / "o").mkdir()
    TrainConfig(model="ae", out=str(tmp_path / "o")).save(tmp_path / "o" / "config.json")  # a run to resume
    assert main(["train", "--model", "ae", "--out", str(tmp_path / "o"), "--resume"]) == 0
    assert calls[0][1] is True and calls[0][0].model == "ae"
    out = capsys.readouterr().out
    assert json.loads(out[: out.index("}") + 1]) == {"step": 2, "mig.mig": 0.5}
    assert out.strip().splitlines()[-1] == f"run directory: {tmp_path / 'o'}"
    assert main(["train", "--model", "ae", "--out", str(tmp_path / "o2")]) == 0 and calls[1][1] is False
    assert main(["train", "--model", "ae", "--dataset", "bad", "--out", str(tmp_path / "o3")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "qkernels: error: ae on bad: no good"


def test_cli_eval_bench_compare_forward_their_flags(tmp_path, monkeypatch, capsys):
    import qkernels.bench
    import qkernels.train

    seen = {}
    monkeypatch.setattr(
        qkernels.train,
        "eval_run",
        lambda d, **kw: seen.update(eval=(d, kw)) or {"step": 4, "mig.mig": 0.5, "infomec.nmi": [[1.0]]},
    )
    monkeypatch.setattr(qkernels.bench, "run", lambda hp, **kw: seen.update(bench=(hp, kw)) or [])
    run = tmp_path / "run"
    run.mkdir()
    for f in ("config.json", "checkpoint.pt"):
        (run / f).write_text("")
    assert main(["eval", str(run), "--eval-samples", "25"]) == 0
    assert seen["eval"] == (str(run), {"num_samples": 25, "device": "cpu", "protocol": None, "progress": True})
    assert json.loads(capsys.readouterr().out) == {"step": 4, "mig.mig": 0.5}
    assert (
        main(
            [
                "bench",
                "--hotpath",
                "kde",
                "--hotpath",
                "quantize",
                "--no-memory",
                "--all",
                "--min-time",
                "0.1",
                "--threads",
                "2",
                "--case",
                "klm",
                "--save",
                str(tmp_path / "saved"),
            ]
        )
        == 0
    )
    assert seen["bench"][0] == ("kde", "quantize") and callable(seen["bench"][1].pop("on_case"))  # saves each case
    assert seen["bench"][1] == {"memory": False, "include_slow": True, "min_time": 0.1, "threads": 2, "only": ("klm",)}
    assert main(["bench"]) == 0
    assert seen["bench"] == (
        ("quantize", "kde", "hessian", "overhead"),
        {"memory": True, "include_slow": False, "min_time": 0.5, "threads": None, "only": (), "on_case": None},
    )
    (run / "metrics.json").write_text(json.dumps({"model": "ae", "step": 1, "mig.mig": 0.5, "recon.mse": 0.1}))
    capsys.readouterr()
    assert main(["compare", str(run), "--columns", "recon.mse", "mig.mig"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split() == [
        "run",
        "model",
        "dataset",
        "step",
        "recon.mse",
        "mig.mig",
    ]


def test_cli_debug_before_or_after_the_subcommand_and_interrupts(tmp_path, monkeypatch, capsys):
    """--debug works in either position (a usage error then raises instead of printing); Ctrl-C is exit 130
    with one line."""
    import qkernels.bench
    from qkernels.cli import UsageError

    monkeypatch.chdir(tmp_path)
    for argv in (["--debug", "bench", "--hotpath", "nosuch"], ["bench", "--hotpath", "nosuch", "--debug"]):
        with pytest.raises(UsageError, match="unknown hot path"):
            main(argv)

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(qkernels.bench, "run", interrupted)
    assert main(["bench"]) == 130 and capsys.readouterr().err.strip() == "qkernels: interrupted"


def test_periodic_and_final_evaluation_records(tmp_path, monkeypatch):
    """A periodic eval line is {"type": "eval", "step", scalar metrics} (matrices left out), evaluated on
    cfg.eval_samples; finish_run writes metrics.json = step, model, dataset + every metric, logs its scalars,
    and draws the figures into out/figures from the same results (num_samples: the given or cfg's)."""
    from qkernels.train import evaluate, figures, loop

    seen = []

    def fake_eval(model, ds, cfg, *, num_samples=None, progress=None):
        seen.append(num_samples or cfg.eval_samples)
        return {"mig.mig": 0.5, "infomec.nmi": [[0.25]]}

    monkeypatch.setattr(loop, "evaluate_model", fake_eval)
    Trainer(tiny_cfg("ae", tmp_path / "p", steps=5, eval_every=2, eval_samples=77)).run(final_eval=False)
    evals = [r for r in _log(tmp_path / "p") if r["type"] == "eval"]
    assert evals == [{"type": "eval", "step": 2, "mig.mig": 0.5}, {"type": "eval", "step": 4, "mig.mig": 0.5}]
    assert seen == [77, 77]
    drawn, logged = [], []
    monkeypatch.setattr(evaluate, "evaluate_model", fake_eval)
    monkeypatch.setattr(figures, "make_all", lambda m, ds, cfg, folder, res: drawn.append((folder, res)))
    cfg = tiny_cfg("ae", tmp_path / "f", eval_samples=33)
    res = evaluate.finish_run(None, None, cfg, tmp_path, step=7, log=logged.append)
    want = {"step": 7, "model": "ae", "dataset": "sprites", "mig.mig": 0.5, "infomec.nmi": [[0.25]]}
    assert res == want and json.loads((tmp_path / "metrics.json").read_text()) == want
    assert logged == [{"type": "eval", "step": 7, "mig.mig": 0.5}] and drawn == [(tmp_path / "figures", want)]
    evaluate.finish_run(None, None, cfg, tmp_path, step=7, num_samples=11)
    assert seen[-2:] == [33, 11]


def test_compile_flag_compiles_the_whole_loss_and_trains_as_eager(tmp_path):
    """``--compile`` compiles the model's forward (the loss with qkernels' ops inside, not only the encoder and
    decoder: 1.6x faster for Tripod on a CPU, benchmarks/RESULTS.md); its first steps give the eager losses
    (random draws as in eager: inductor's fallback_random)."""
    from qkernels.train.loop import Trainer

    losses = {}
    for compiled in (False, True):
        cfg = TrainConfig(
            model="cliff_ae",
            dataset="quantized_grid2d",
            dataset_kwargs={"n": 300},
            batch_size=100,
            steps=2,
            out=str(tmp_path / str(compiled)),
            progress=False,
            compile=compiled,
        )
        tr = Trainer(cfg)
        assert (tr.model._compiled_call_impl is not None) == compiled
        with torch._inductor.config.patch(fallback_random=True):
            losses[compiled] = [tr.train_step(s)["total"] for s in (1, 2)]
    assert all(math.isfinite(x) for x in losses[True])
    for a, b in zip(losses[True], losses[False], strict=True):
        assert a == pytest.approx(b, rel=1e-4)


def test_compare_table_wraps_to_120_columns(tmp_path, monkeypatch):
    """Issue 39: `qkernels compare` printed a 170-column table. Metric columns that do not fit in 120 go to a
    further table that starts with the run again; every cell is still there."""
    from qkernels.train.evaluate import COLUMNS, compare_runs

    monkeypatch.chdir(tmp_path)
    for name in ("runs/tripod-shapes3d-long-name", "runs/qlae"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "metrics.json").write_text(
            json.dumps({"model": "tripod", "dataset": "shapes3d_procedural", "step": 600, **{c: 0.5 for c in COLUMNS}})
        )
    text = compare_runs(["runs/tripod-shapes3d-long-name", "runs/qlae"])
    lines = text.splitlines()
    assert max(map(len, lines)) <= 120 and "" in lines  # wrapped into more than one table
    heads = [lines[0], *(lines[i + 1] for i, line in enumerate(lines) if line == "")]
    assert all(h.split()[0] == "run" for h in heads)
    assert [c for h in heads for c in h.split() if c in COLUMNS] == list(COLUMNS)  # each column once, in order
    assert sum(line.split()[:1] == ["runs/qlae"] for line in lines) == len(heads)  # each run's row in every table
    assert compare_runs(["runs/qlae"], columns=["mig.mig"]).count("\n") == 2  # narrow: one table, as before


# ---------------------------------------------------------------------------------------------------------------
# Issue 40 (review): the data orders and FactorQVAE's schedules, as the trainer and the command line run them


def test_data_order_flag_reaches_the_trainers_batches(tmp_path, monkeypatch):
    """`qkernels train --data-order X` -> config.json's data_order X -> every batch the trainer reads is read in
    order X (the model step's and the discriminator's); auto: the method's authors' (qlae: shuffled epochs,
    factorqvae: the 80% split). `qkernels eval` trains nothing: it has no --data-order."""
    from qkernels.cli import _train_config, parser
    from qkernels.train import loop

    seen = []
    real = loop.get_batch
    monkeypatch.setattr(loop, "get_batch", lambda *a, **kw: seen.append((kw["order"], kw["streams"])) or real(*a, **kw))
    for model, flag, want in (
        ("qlae", "auto", "epochs"),
        ("qlae", "iid", "iid"),
        ("qlae", "split", "split"),
        ("factorqvae", None, "split"),
        ("factorqvae", "epochs", "epochs"),
    ):
        argv = [
            "train",
            "--model",
            model,
            "--dataset",
            "sprites",
            "--image-size",
            "16",
            "--batch-size",
            "8",
            "--out",
            str(tmp_path / f"{model}-{flag}"),
            *(["--data-order", flag] if flag else []),
        ]
        cfg = _train_config(parser().parse_args(argv))
        assert cfg.data_order == (flag or "auto")
        if model == "factorqvae":
            cfg.model_kwargs = {**cfg.model_kwargs, **DISC}
        seen.clear()
        Trainer(cfg).train_step(5)
        streams = 2 if model == "factorqvae" else 1
        assert seen == [(want, streams)] * streams, (model, flag)
    with pytest.raises(SystemExit):
        parser().parse_args(["eval", str(tmp_path), "--data-order", "iid"])


class _FlatIndexData:
    """A ground-truth dataset of the given factor sizes whose observation is the combination's flat index."""

    def __init__(self, sizes):
        self.factor_sizes = sizes
        self.bases = torch.tensor([math.prod(sizes[i + 1 :]) for i in range(len(sizes))])

    def sample_factors(self, n, generator):
        return torch.stack([torch.randint(0, k, (n,), generator=generator) for k in self.factor_sizes], 1)

    def observations_from_factors(self, f):
        return (f * self.bases).sum(1)[:, None]


@pytest.mark.parametrize(
    "sizes",
    [(10, 10, 10, 8, 4, 15), (4, 4, 2, 3, 3, 40, 40), (3, 8, 5, 4, 3, 4, 4, 4, 4, 2), (4096,), (6144,), (7,)],
    ids=["shapes3d", "mpi3d-complex", "isaac3d", "balls", "sprites", "n=7"],
)
def test_split_order_reads_the_authors_random_split(sizes):
    """FactorQVAE data/shapes3d.py, mpi3d_complex.py, isaac3d.py: torch.utils.data.random_split(dataset, [0.8, 0.1,
    0.1], generator=torch.Generator().manual_seed(1)) (configs' train.seed 1), trained on the first part. The oracle is
    that call itself, on each dataset's size: one epoch of the "split" order (one batch of the whole part here) reads
    exactly its indices, each once, for every run seed."""
    from torch.utils.data import random_split

    n = math.prod(sizes)
    part = torch.tensor(random_split(range(n), [0.8, 0.1, 0.1], generator=torch.Generator().manual_seed(1))[0].indices)
    ds = _FlatIndexData(sizes)
    for seed in (0, 5):
        epoch = get_batch(ds, len(part), seed, 0, order="split")[:, 0]
        assert epoch.shape == part.shape and torch.equal(epoch.sort().values, part.sort().values)


@pytest.mark.parametrize("model", ["factorqvae", "qvae"])
def test_factorqvae_schedules_by_iteration_in_the_trainer(tmp_path, monkeypatch, model):
    """The trainer's iteration s reaches FactorQVAE's schedules as the authors' Lightning global step: tau =
    exp(-1e-5 global_step) with two optimizer steps per FactorQVAE iteration (exp(-2e-5 s)) and one per QVAE
    iteration (exp(-1e-5 s)), the tau the quantizer is given and the one logged; both optimizers' learning rate
    CosineAnnealingLR(T_max=50000, eta_min=1.25e-6) from 1e-3 at iteration s (train.py), whatever the run length."""
    tr = Trainer(tiny_cfg(model, tmp_path))
    taus = []
    quantizer = tr.model.quantizer
    real = quantizer.forward
    monkeypatch.setattr(quantizer, "forward", lambda z, tau=1.0, **kw: taus.append(tau) or real(z, tau, **kw))
    rate = {"factorqvae": 2e-5, "qvae": 1e-5}[model]
    for s in (0, 12_345, 49_999):
        taus.clear()
        terms = tr.train_step(s)
        tau = math.exp(-rate * s)
        lr = 1.25e-6 + (1e-3 - 1.25e-6) * (1 + math.cos(math.pi * s / 50_000)) / 2
        assert taus and all(t == pytest.approx(tau, rel=1e-12) for t in taus), s
        assert terms["tau"] == pytest.approx(tau, rel=1e-12) and terms["lr"] == pytest.approx(lr, rel=1e-12)
        optimizers = [tr.opt] + ([tr.disc_opt] if model == "factorqvae" else [])
        assert all(g["lr"] == pytest.approx(lr, rel=1e-12) for o in optimizers for g in o.param_groups)
