"""Normalized Hessian penalty: sequential (one fn call per perturbation, the authors' way) vs
batched + fused, n = 64, d = 12, k = 2, MLP and transposed-conv decoders (qkernels/bench/hessian.py).

- penalty forward + backward: time, and peak memory (extra_info["peak_mib"]);
- a full training step (BCE reconstruction + 1e-2 NHP, Adam) vs the same step without NHP
  ("none") and vs the unavoidable work ("stacked": the plain step plus one forward + backward of
  the regularized layers on the 4k n stacked rows); the summary table of benchmarks/conftest.py
  compares every step with "none".

    pytest benchmarks/test_hessian.py --benchmark-only
"""

import pytest
import torch
from torch import nn

from qkernels.bench import benchmark_case, cases, pedantic, short_id
from qkernels.bench.hessian import DECODERS, IMG, D, K, N, batched_nhp, sequential_nhp

PARAMS = [(c, v) for c in cases("hessian") for v in c.variants]


@pytest.mark.parametrize(("case", "variant"), PARAMS, ids=[short_id(c, v) for c, v in PARAMS])
def test_nhp(benchmark, case, variant):
    benchmark_case(benchmark, case, variant)


class AutoEncoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.enc = nn.Sequential(nn.Flatten(), nn.Linear(IMG * IMG, 256), nn.SiLU(), nn.Linear(256, D))
        self.dec = DECODERS[model]()


def make_train_step(model, variant):
    """variant: "none" (reconstruction only), "sequential" / "fused" (+ 1e-2 NHP), or "stacked"
    (reconstruction + one forward/backward of the regularized layers on 4k n rows)."""
    torch.manual_seed(0)
    ae = AutoEncoder(model)
    opt = torch.optim.Adam(ae.parameters(), lr=2e-4)
    x = (torch.rand(N, 1, IMG, IMG) > 0.5).float()
    gen = torch.Generator().manual_seed(0)
    penalty = {"sequential": sequential_nhp, "fused": batched_nhp("auto")}.get(variant)

    def step():
        opt.zero_grad(set_to_none=True)
        z = ae.enc(x)
        loss = nn.functional.binary_cross_entropy_with_logits(ae.dec(z), x)
        std = z.std(0, correction=0) + 1e-6
        if penalty is not None:
            loss = loss + 1e-2 * penalty(ae.dec.activations, z, std, generator=gen)
        elif variant == "stacked":
            loss = loss + 1e-2 * sum(a.mean() for a in ae.dec.activations(z.detach().repeat(4 * K, 1)))
        loss.backward()
        opt.step()

    return step


@pytest.mark.parametrize("model", list(DECODERS))
@pytest.mark.parametrize("variant", ["none", "stacked", "sequential", "fused"])
def test_train_step(benchmark, model, variant):
    benchmark.group = f"train step {model}"
    benchmark.extra_info.update(
        hotpath="hessian", case=f"train step {model} n={N} d={D} k={K}", variant=variant, baseline="none"
    )
    pedantic(benchmark, make_train_step(model, variant))
