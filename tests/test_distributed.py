"""Global-batch KDE losses under torch.distributed (gloo, 2 CPU processes): the loss of the gathered
batch equals the single-process loss of the concatenated batch, and the per-rank gradients (each rank's
share) sum to the single-process gradient."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import qkernels
from qkernels.distributed import gather_rows

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
        local = z[start:start + ROWS[rank]].clone()
        res = {}
        for name, i in (("cliff", 0), ("klm", 1)):
            w_r = w.clone().requires_grad_()
            loss = _losses(local, w_r, idx, dist.group.WORLD)[i]
            loss.backward()
            res[name] = (float(loss), w_r.grad)
        g = gather_rows(local, dist.group.WORLD)
        res["gathered"] = g
        torch.save(res, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
def test_global_batch_losses_and_gradient_shares(tmp_path):
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    z, w, idx = _data()
    for r in ranks:
        assert torch.equal(r["gathered"], z)  # rank order, unequal shards
    for name, i in (("cliff", 0), ("klm", 1)):
        w1 = w.clone().requires_grad_()
        loss = _losses(z, w1, idx)[i]
        loss.backward()
        for r in ranks:  # the same global loss on every rank
            assert r[name][0] == pytest.approx(loss.item(), rel=1e-12)
        total = sum(r[name][1] for r in ranks)  # the shares add up to the single-process gradient
        torch.testing.assert_close(total, w1.grad, rtol=1e-6, atol=1e-12)
        assert not torch.allclose(ranks[0][name][1], w1.grad)  # a share, not the whole gradient


def test_group_without_init_is_a_clear_error():
    with pytest.raises(ValueError, match="not initialized"):
        qkernels.klm_loss(torch.randn(4, 2), group=object())
