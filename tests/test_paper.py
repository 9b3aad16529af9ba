"""Issue 55, parts 1 and 2: each paper's rule on by default (Tripod's checkpoint cadence), Balls' Spearman MCC, the
Cliff paper's mixing, and ``--paper``: the paper's settings for a method and dataset in one flag."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qkernels.train import TrainConfig


def test_tripod_cadence_is_the_authors_loop():
    # tripod scripts/train_autoencoder.py: `if step == 0 or (step + 1) % 10000 == 0 or (step + 1 < 10000 and
    # (step + 1) % 2000 == 0)` BEFORE that index's update, i.e. after `step` updates; 250,000 steps (num_steps)
    from qkernels.train.selection import eval_steps

    want = [0, 1999, 3999, 5999, 7999, 9999] + [k * 10_000 - 1 for k in range(2, 26)]
    authors = [s for s in range(250_000) if s == 0 or (s + 1) % 10_000 == 0 or (s + 1 < 10_000 and (s + 1) % 2000 == 0)]
    assert want == authors
    cfg = TrainConfig(model="tripod", steps="paper").resolve_defaults()
    assert cfg.eval_every == "tripod" and eval_steps(cfg) == want
    # short runs: after 1/5 .. 4/5 of the steps (and the final step): five candidates
    assert eval_steps(TrainConfig(model="tripod", steps=600).resolve_defaults()) == [119, 239, 359, 479]
    # off for the other protocols' default, and when asked
    assert TrainConfig(model="qlae").resolve_defaults().eval_every == 0
    assert TrainConfig(model="tripod", eval_every=0).resolve_defaults().eval_every == 0
    assert TrainConfig(model="tripod", select="final").resolve_defaults().eval_every == 0
    with pytest.raises(ValueError, match="eval_every"):
        TrainConfig(model="tripod", eval_every="often").resolve_defaults()


def _scripted(monkeypatch, script, trainers):
    """The loop's evaluations return scripted (InfoM, uint8 PSNR) by the trainer's step; a record of each call's
    step and of the weights it saw."""
    import qkernels.train.loop as loop

    seen = []

    def scripted(model, ds, cfg, **kw):
        tr = trainers[-1]
        seen.append((tr.step, {k: v.clone() for k, v in model.state_dict().items()}))
        infom, psnr = script[tr.step]
        return {"infomec.infom": infom, "recon.psnr_tripod": psnr, "recon.psnr": psnr - 10}

    def final(model, ds, cfg, out, step, log, progress=None):  # as finish_run: eval line, metrics.json, no figures
        res = {"step": step, **scripted(model, ds, cfg)}
        log({"type": "eval", **res})
        (out / "metrics.json").write_text(json.dumps(res))
        return res

    monkeypatch.setattr(loop, "evaluate_model", scripted)
    monkeypatch.setattr(loop, "finish_run", final)
    return seen


def test_tripods_default_cadence_gives_several_candidates_and_the_rule_picks_one(tmp_path, monkeypatch, capsys):
    # The bare tripod config: --eval-every auto -> Tripod's cadence (10 steps: after 1, 3, 5, 7 updates, and 10); the
    # rule keeps the evaluations at >= 38 dB and reports the best InfoM among them; the first line says so
    import qkernels.train.loop as loop

    script = {1: (0.9, 20.0), 3: (0.5, 39.0), 5: (0.7, 38.5), 7: (0.95, 37.9), 10: (0.6, 41.0)}
    trainers = []
    seen = _scripted(monkeypatch, script, trainers)
    cfg = TrainConfig(
        model="tripod",
        dataset="sprites",
        image_size=8,
        batch_size=4,
        steps=10,
        seed=1,
        model_kwargs={"lambda_klm": 0.0, "lambda_nhp": 0.0},
        checkpoint_every=100,
        out=str(tmp_path / "a"),
    )
    trainers.append(loop.Trainer(cfg))
    res = trainers[-1].run()
    assert [s for s, _ in seen] == [1, 3, 5, 7, 10]  # five candidates
    sel = res["selection"]
    assert (sel["rule"], sel["step"], sel["evaluated"], sel["passed"]) == ("tripod", 5, 5, 3)
    assert res["selected"]["infomec.infom"] == 0.7 and sel["weights"] == "selected.pt"
    kept = torch.load(tmp_path / "a" / "selected.pt", weights_only=True)
    for k, v in seen[2][1].items():  # the weights evaluated at step 5
        assert torch.equal(kept["model"][k], v), k
    err = capsys.readouterr().err
    assert (
        "evaluating after 1, 3, 5, 7 updates and at the end: Tripod's checkpoint cadence, scaled for a run of 10 steps"
        in err
        and "5 candidates" in err
    )
    assert (
        "not the paper's settings: arch small (theirs paper), image size 8 (theirs 64), 10 of their 250,000 "
        "steps" in err
    )


def test_an_evaluation_at_step_0_sees_the_initial_weights(tmp_path, monkeypatch):
    # the authors evaluate before the update of index 0: the model as initialized (the 250k cadence's first
    # candidate); here a cadence of [0, 2] on a 4-step run, and a resumed run does not evaluate a step twice
    import qkernels.train.loop as loop

    script = {0: (0.1, 40.0), 2: (0.2, 40.0), 4: (0.3, 40.0)}
    trainers = []
    seen = _scripted(monkeypatch, script, trainers)
    monkeypatch.setattr(loop, "eval_steps", lambda cfg: [0, 2])
    cfg = TrainConfig(
        model="tripod",
        dataset="sprites",
        image_size=8,
        batch_size=4,
        steps=4,
        seed=1,
        model_kwargs={"lambda_klm": 0.0, "lambda_nhp": 0.0},
        checkpoint_every=2,
        progress=False,
        out=str(tmp_path / "a"),
    )
    trainers.append(loop.Trainer(cfg))
    init = {k: v.clone() for k, v in trainers[-1].model.state_dict().items()}
    trainers[-1].run(stop_after=3, final_eval=False)  # killed after step 3: checkpoint of step 2
    trainers.append(loop.Trainer(cfg, resume=True))
    trainers[-1].run()
    assert [s for s, _ in seen] == [0, 2, 4]
    assert all(torch.equal(seen[0][1][k], v) for k, v in init.items())
    evals = [
        json.loads(ln)["step"]
        for ln in (tmp_path / "a" / "log.jsonl").read_text().splitlines()
        if json.loads(ln)["type"] == "eval"
    ]
    assert evals == [0, 2, 4]


class _Oracle(torch.nn.Module):
    """Encodes Balls images to a monotone, nonlinear function of their true coordinates (looked up in order)."""

    def __init__(self, z):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.z, self.at = z, 0

    def forward(self, x):
        z = self.z[self.at : self.at + x.shape[0]]
        self.at += x.shape[0]
        return torch.exp(3 * z.flip(1))  # permuted, rank-preserving: Spearman 1, Pearson < 1


def test_balls_reports_the_spearman_mcc_of_cliffs_table_2():
    from qkernels import metrics as M
    from qkernels.data import Balls
    from qkernels.train.data import generator
    from qkernels.train.evaluate import balls_spearman_mcc

    ds = Balls(n=16, image_size=16, sampler="quantized")
    _, z = ds.sample(300, generator(5, 4))  # the draw balls_spearman_mcc makes for seed 5
    oracle = _Oracle(z)
    assert balls_spearman_mcc(oracle, ds, 300, 5, batch_size=128) == pytest.approx(1.0, abs=1e-12)
    assert oracle.at == 300
    pearson = M.mcc(z, torch.exp(3 * z.flip(1)).double())["mcc"]
    assert pearson < 0.99  # the Pearson MCC would not credit the monotone map


def test_every_balls_evaluation_has_mcc_spearman(tmp_path):
    from qkernels.train import build, evaluate_model

    cfg = TrainConfig(model="ae", dataset="balls", image_size=16, dataset_kwargs={"n": 64}, metrics=("mig",))
    model, ds = build(cfg)
    res = evaluate_model(model, ds, cfg, num_samples=120)
    assert 0.0 <= res["mcc.spearman"] <= 1.0 and "mig.mig" in res


def test_grid2d_paper_mixing_is_the_printed_decoder():
    # Cliff App. G.1: "Ground-truth decoder: x = B tanh A (0.5 z)" (not centred); "nonlinear" centres z first
    from qkernels.data import QuantizedGrid2D

    paper, centred = QuantizedGrid2D(n=50, mixing="paper", seed=3), QuantizedGrid2D(n=50, seed=3)
    a, b, z = paper.A.numpy(), paper.B.numpy(), paper.z.double().numpy()
    want = np.tanh((0.5 * z) @ a.T) @ b.T
    np.testing.assert_allclose(paper.x.numpy(), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(paper.z, centred.z) and not torch.allclose(paper.x, centred.x)
    with pytest.raises(ValueError, match="mixing"):
        QuantizedGrid2D(n=5, mixing="papr")


@pytest.mark.parametrize(
    "model, dataset, want",
    [
        ("qlae", "shapes3d", dict(arch="paper", image_size=64, steps=200_000, eval_every=0, protocol="qlae")),
        ("tripod", "mpi3d", dict(arch="paper", image_size=64, steps=250_000, eval_every="tripod", protocol="tripod")),
        (
            "factorqvae",
            "isaac3d",
            dict(arch="paper", image_size=64, steps=50_000, eval_every=0, protocol="factorqvae", batch_size=256),
        ),
        ("dvae", "shapes3d", dict(arch="paper", image_size=64, steps=300_000, eval_every=0, protocol="dlib")),
        ("cliff_vae", "shapes3d", dict(arch="paper", image_size=64, steps=750_000, eval_every=0, protocol="dlib")),
        (
            "cliff_ae",
            "quantized_grid2d",
            dict(steps=1000, batch_size=5000, eval_every=0, dataset_kwargs={"n": 5000, "mixing": "paper"}),
        ),
    ],
)
def test_cli_paper_sets_the_papers_settings_and_records_them(model, dataset, want, tmp_path, capsys):
    from qkernels.cli import _train_config, parser

    cfg = _train_config(
        parser().parse_args(["train", "--model", model, "--dataset", dataset, "--paper", "--out", str(tmp_path)])
    )
    assert {k: getattr(cfg, k) for k in want} == want and cfg.paper
    said = capsys.readouterr().err
    assert said.startswith("qkernels train: --paper set ") and f"steps {want['steps']:,}" in said
    cfg.save(tmp_path / "config.json")
    assert json.loads((tmp_path / "config.json").read_text())["paper"] is True
    from qkernels.train.paper import describe_settings

    assert describe_settings(cfg).startswith("the paper's settings")


def test_paper_flags_given_win_and_the_line_names_them(tmp_path):
    from qkernels.cli import UsageError, _train_config, parser
    from qkernels.train.paper import describe_settings

    def cfg_of(*argv):
        return _train_config(parser().parse_args(["train", *argv, "--out", str(tmp_path)]))

    cfg = cfg_of(
        "--model", "tripod", "--dataset", "shapes3d_procedural", "--paper", "--steps", "100", "--image-size", "32"
    )
    assert (cfg.steps, cfg.image_size, cfg.arch, cfg.eval_every) == (100, 32, "paper", "tripod")
    assert describe_settings(cfg) == (
        "the paper's settings except image size 32 (theirs 64), 100 of their 250,000 steps"
    )
    with pytest.raises(UsageError, match="beta_tcvae is no method of the five papers"):
        cfg_of("--model", "beta_tcvae", "--paper")
    with pytest.raises(UsageError, match="not in qkernels"):
        cfg_of("--model", "cliff_vae", "--dataset", "balls", "--paper")
    with pytest.raises(UsageError, match="--paper sets a new run"):
        cfg_of("--resume", "--paper")
