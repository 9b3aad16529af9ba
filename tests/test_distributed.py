"""Global-batch KDE losses under torch.distributed (gloo, 2 CPU processes): the loss of the gathered
batch equals the single-process loss of the concatenated batch, and the ranks' gradients averaged (what
DistributedDataParallel applies) equal the single-process gradient; data-parallel `qkernels train`."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import skip_unless

import qkernels
from qkernels.distributed import average_gradients, gather_rows

pytestmark = pytest.mark.slow  # a long file: scheduled first (tests/conftest.py)

WORLD = 2
ROWS = (7, 5)  # unequal shards


def _data():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(sum(ROWS), 3, generator=g, dtype=torch.float64)
    w = torch.randn(3, 3, generator=g, dtype=torch.float64)  # a shared "parameter"
    idx = torch.stack([torch.randperm(sum(ROWS), generator=g)[:4] for _ in range(3)])
    return z, w, idx


def _losses(z, w, idx, group=None):
    h = torch.tanh(z @ w)
    cliff = qkernels.cliff_loss(h, cond_index=idx, sigma=0.3, grid=(-4.0, 4.0, 40), group=group)
    klm = qkernels.klm_loss(h, group=group)
    return cliff, klm


def _worker(rank, store, out):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        z, w, idx = _data()
        start = sum(ROWS[:rank])
        local = z[start : start + ROWS[rank]].clone()
        res = {}
        for name, i in (("cliff", 0), ("klm", 1)):
            w_r = w.clone().requires_grad_()
            loss = _losses(local, w_r, idx, dist.group.WORLD)[i]
            loss.backward()
            res[name] = (float(loss), w_r.grad)
        g = gather_rows(local, dist.group.WORLD)
        res["gathered"] = g
        p, skipped = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(1))
        p.grad = torch.full((3,), float(rank + 1))
        average_gradients([p, skipped])
        res["averaged"] = p.grad
        torch.save(res, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@skip_unless("gloo")
def test_global_batch_losses_and_gradient_shares(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    z, w, idx = _data()
    for r in ranks:
        assert torch.equal(r["gathered"], z)  # rank order, unequal shards
        assert torch.equal(r["averaged"], torch.full((3,), 1.5))  # (1 + 2) / 2 on every rank
    for name, i in (("cliff", 0), ("klm", 1)):
        w1 = w.clone().requires_grad_()
        loss = _losses(z, w1, idx)[i]
        loss.backward()
        for r in ranks:  # the same global loss on every rank
            assert r[name][0] == pytest.approx(loss.item(), rel=1e-12)
        mean = sum(r[name][1] for r in ranks) / WORLD  # DDP's average: the single-process gradient
        torch.testing.assert_close(mean, w1.grad, rtol=1e-6, atol=1e-12)
        assert not torch.allclose(ranks[0][name][1], w1.grad)  # each rank: world size x its share


def test_group_without_init_is_a_clear_error():
    with pytest.raises(ValueError, match="not initialized"):
        qkernels.klm_loss(torch.randn(4, 2), group=object())


# ------------------------------------------------------------------ data-parallel training
# float64 throughout (default dtype): a data-parallel run differs from the single-process one only by
# summation order, which Adam amplifies chaotically (float32: 1e-4 after 6 steps; float64 below).


def _train_worker(rank, store, jobs):
    """Runs ``jobs`` (config dict, stop_after, fail_rank) one after another in one process group: each rank's
    parameters saved beside each run. Several runs per pair of processes: starting one (torch, the trainer's
    imports, gloo) costs more than a tiny run."""
    from qkernels.train import TrainConfig, Trainer

    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        for cfg_dict, stop_after, fail_rank in jobs:
            trainer = Trainer(TrainConfig.from_dict(cfg_dict), resume=True)
            if rank == fail_rank:

                def fail(step):
                    raise RuntimeError(f"rank {rank} failed at step {step}")

                trainer.train_step = fail
            trainer.run(stop_after=stop_after, final_eval=False)
            torch.save(trainer.model.state_dict(), os.path.join(cfg_dict["out"], f"rank{rank}.pt"))
            dist.barrier()  # no rank tears the group down (or starts the next run) while another still talks to it
    finally:
        dist.destroy_process_group()


def _spawn_train(tmp_path, *jobs, tag="s"):
    """``jobs``: (TrainConfig, stop_after, fail_rank) run in order by one pair of processes."""
    store = tmp_path / f"store_{tag}"
    jobs = [(cfg.to_dict(), stop_after, fail_rank) for cfg, stop_after, fail_rank in jobs]
    mp.spawn(_train_worker, args=(str(store), jobs), nprocs=WORLD, join=True)


def _params(out):
    return torch.load(out / "checkpoint.pt", weights_only=False)["model"]


def _single(cfg):
    from qkernels.train import Trainer

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        Trainer(cfg).run(final_eval=False)
    finally:
        torch.set_default_dtype(previous)


PARITY_MODELS, PARITY_STEPS = ("qlae", "tripod", "cliff_vae"), 6


@pytest.fixture(scope="module")
def two_process_runs(tmp_path_factory):
    """The data-parallel runs the tests below check, made by two spawns of 2 ranks: the parity runs of
    PARITY_MODELS (global batch 16), a FactorVAE run, a cliff_vae run left alone and the same run stopped during
    step 5 (its last checkpoint: step 3); then, in fresh processes, that run resumed."""
    from test_train import tiny_cfg

    tmp = tmp_path_factory.mktemp("ddp")
    steps = PARITY_STEPS
    parity = [
        tiny_cfg(m, tmp / f"multi_{m}", batch_size=16, steps=steps, checkpoint_every=steps) for m in PARITY_MODELS
    ]
    fv = tiny_cfg("factorvae", tmp / "fv", batch_size=16)
    straight = tiny_cfg("cliff_vae", tmp / "straight", batch_size=16)
    resumed = tiny_cfg("cliff_vae", tmp / "resumed", batch_size=16)  # checkpoints every 3 steps
    _spawn_train(tmp, *[(c, None, -1) for c in (*parity, fv, straight)], (resumed, 4, -1), tag="first")
    _spawn_train(tmp, (resumed, None, -1), tag="resume")
    return tmp


@skip_unless("gloo")
@pytest.mark.parametrize("model", PARITY_MODELS)
def test_two_process_training_follows_the_single_process_run(two_process_runs, tmp_path, model):
    """2 ranks x 8 rows against one process on the global batch of 16, same seed: the same parameters
    (global-batch KLM / Cliff and Tripod's std, noise and NHP directions drawn for the global batch) and
    the same logged losses at every step (a rank-local reduction shows in step 1's loss).
    Measured differences, float64: qlae 2e-16, tripod 1e-9 after 20 steps; cliff_vae 7.5e-9 after 6
    steps, then growing 10-50x per step from 1e-15 at step 3 (the batch-16 Cliff loss is chaotic:
    8e-4 at step 20). 6 steps for each (20 took 440 of the suite's seconds)."""
    import json

    from test_train import tiny_cfg

    from qkernels.train import TrainConfig

    steps, multi = PARITY_STEPS, two_process_runs / f"multi_{model}"
    _single(tiny_cfg(model, tmp_path / "single", batch_size=16, steps=steps, checkpoint_every=steps))
    a, b = _params(tmp_path / "single"), _params(multi)
    assert a.keys() == b.keys() and next(iter(a.values())).dtype == torch.float64
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    assert TrainConfig.load(multi / "config.json").world_size == WORLD
    logs = [[json.loads(ln) for ln in (d / "log.jsonl").read_text().splitlines()] for d in (tmp_path / "single", multi)]
    assert len(logs[1]) == steps  # one writer
    for one, two in zip(*logs, strict=True):  # logged terms: the global batch's (averaged over ranks)
        assert one.keys() == two.keys()
        for k, v in one.items():
            assert two[k] == (v if isinstance(v, str) else pytest.approx(v, rel=1e-6, abs=1e-9)), (k, one["step"])


@skip_unless("gloo")
def test_two_process_run_killed_and_resumed_ends_as_the_uninterrupted_one(two_process_runs):
    a, b = _params(two_process_runs / "straight"), _params(two_process_runs / "resumed")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)
    log = (two_process_runs / "resumed" / "log.jsonl").read_text()
    assert log == (two_process_runs / "straight" / "log.jsonl").read_text()


@skip_unless("gloo")
def test_discriminator_methods_stay_in_sync_across_ranks(two_process_runs):
    """FactorVAE: DDP syncs the VAE, the trainer averages the discriminator's gradients: after its 6 steps
    every rank holds the same parameters, discriminator included."""
    ranks = [torch.load(two_process_runs / "fv" / f"rank{r}.pt") for r in range(WORLD)]
    assert any(k.startswith("discriminator.") for k in ranks[0])
    for k in ranks[0]:
        assert torch.equal(ranks[0][k], ranks[1][k]), k


@skip_unless("gloo")
def test_a_failing_rank_ends_the_job_with_its_error(tmp_path):
    import time

    from test_train import tiny_cfg

    cfg = tiny_cfg("qlae", tmp_path / "fail", batch_size=16, dist_timeout_s=30)
    t0 = time.perf_counter()
    with pytest.raises(Exception, match="rank 1 failed at step 0"):
        _spawn_train(tmp_path, (cfg, None, 1), tag="f")
    assert time.perf_counter() - t0 < 60


def test_global_batch_must_divide_over_ranks(tmp_path, monkeypatch):
    from test_train import tiny_cfg

    from qkernels.train import Trainer, loop

    monkeypatch.setattr(loop, "rank_and_size", lambda: (0, 3))
    with pytest.raises(ValueError, match="batch_size 16 .*divisible by the number of processes, 3"):
        Trainer(tiny_cfg("qlae", tmp_path / "x", batch_size=16))


@skip_unless("gloo")
def test_cli_under_torchrun(tmp_path):
    """The README's command line: torchrun starts 2 ranks (gloo on the CPU); rank 0 alone prints and writes
    the run; a global batch that does not divide fails on every rank with the one-line error."""
    import json
    import subprocess
    import sys

    def torchrun(*args):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(WORLD),
            "-m",
            "qkernels",
            "train",
            "--model",
            "qlae",
            "--dataset",
            "sprites",
            "--image-size",
            "16",
            "--steps",
            "2",
            "--eval-samples",
            "50",
            *args,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)

    out = tmp_path / "run"
    r = torchrun("--batch-size", "8", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("run directory:") == 1  # one rank prints
    assert json.loads((out / "config.json").read_text())["world_size"] == WORLD
    assert (out / "metrics.json").is_file() and len((out / "log.jsonl").read_text().splitlines()) >= 2
    r = torchrun("--batch-size", "7", "--out", str(tmp_path / "bad"))
    assert r.returncode != 0
    assert r.stderr.count("batch_size 7 (the global batch) must be divisible by the number of processes, 2") == WORLD


def test_rank_blocks_and_global_noise_by_hand(monkeypatch):
    """Single process with a faked (rank 1, world 3): rank_rows is the 2nd of 3 equal blocks along ``dim``;
    randn_rows is that block of ONE (3n, ...) draw (what a single process draws for the global batch); with no
    group it is plain randn_like. Without a process group: (0, 1), averaging is a no-op and values are copied."""
    from qkernels import distributed as D

    assert D.rank_and_size() == (0, 1)
    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.tensor([1.0, 3.0])
    D.average_gradients([p])
    assert torch.equal(p.grad, torch.tensor([1.0, 3.0]))
    vals = {"a": 1.5, "b": -2.0}
    got = D.mean_over_ranks(vals)
    assert got == vals and got is not vals
    like = torch.empty(2, 3)
    torch.manual_seed(5)
    want = torch.randn(2, 3)
    torch.manual_seed(5)
    assert torch.equal(D.randn_rows(like), want)
    monkeypatch.setattr(D, "rank_and_size", lambda group=None: (1, 3))
    full = torch.arange(24.0).view(6, 4)
    assert torch.equal(D.rank_rows(full, object()), full[2:4])
    assert torch.equal(D.rank_rows(full.T, object(), dim=1), full.T[:, 2:4])
    torch.manual_seed(5)
    want = torch.randn(6, 3)[2:4]
    torch.manual_seed(5)
    assert torch.equal(D.randn_rows(like, object()), want)
