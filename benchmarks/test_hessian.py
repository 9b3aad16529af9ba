"""Hessian hot path benchmarks: sequential vs batched + fused normalized Hessian penalty.

Decoder-shaped ``fn`` (an MLP and a small transposed-conv decoder, 3 regularized hidden layers),
n = 64, d = 12, k = 2 (Tripod's setting), float32 on CPU:

- ``sequential``: the authors' formulation, one fn call per perturbation (1 + 4k calls on n rows),
  second differences and variances with torch ops.
- ``fused``: :func:`qkernels.normalized_hessian_penalty`: one fn call on the 4k n stacked rows and
  the fused ``finite_difference_curvature`` reduction (cpu backend).

Timed: the penalty's forward + backward, and a full training step (BCE reconstruction + NHP,
Adam) relative to a step without NHP and to the unavoidable work (the plain step plus one forward
+ backward of fn on the stacked batch). Peak memory: the growth of the peak resident set size
(``ru_maxrss``) of a fresh subprocess over one penalty forward + backward, after a warm-up at a
tiny batch (tracemalloc does not see torch's CPU allocations).

Run ``pytest benchmarks/test_hessian.py --benchmark-only`` or ``python benchmarks/test_hessian.py``
(prints the summary table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from qkernels._backend import use_backend  # noqa: E402
from qkernels.ops.hessian import normalized_hessian_penalty  # noqa: E402

N, D, K, EPS = 64, 12, 2, 0.1
IMG = 32  # decoder output: 1 x 32 x 32 logits


class MLPDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.ModuleList([nn.Linear(D, 256), nn.Linear(256, 256), nn.Linear(256, 256)])
        self.out = nn.Linear(256, IMG * IMG)

    def activations(self, z):
        acts, h = [], z
        for layer in self.hidden:
            h = torch.nn.functional.silu(layer(h))
            acts.append(h)
        return acts

    def forward(self, z):
        return self.out(self.activations(z)[-1]).reshape(-1, 1, IMG, IMG)


class ConvDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(D, 64 * 4 * 4)
        self.up1 = nn.ConvTranspose2d(64, 32, 4, 2, 1)  # 8 x 8
        self.up2 = nn.ConvTranspose2d(32, 32, 4, 2, 1)  # 16 x 16
        self.out = nn.ConvTranspose2d(32, 1, 4, 2, 1)  # 32 x 32

    def activations(self, z):
        h1 = torch.nn.functional.silu(self.fc(z)).reshape(-1, 64, 4, 4)
        h2 = torch.nn.functional.silu(self.up1(h1))
        h3 = torch.nn.functional.silu(self.up2(h2))
        return [h1, h2, h3]

    def forward(self, z):
        return self.out(self.activations(z)[-1])


DECODERS = {"mlp": MLPDecoder, "conv": ConvDecoder}


def sequential_nhp(fn, z, std, k=K, eps=EPS, generator=None):
    """The authors' formulation: one fn call per perturbation, then torch ops."""
    f0 = fn(z)
    r = (2 * torch.randint(0, 2, (k, *z.shape), generator=generator) - 1).to(z.dtype)
    g = torch.randn((k, *z.shape), generator=generator, dtype=z.dtype)
    fds = {"num": [], "den": []}
    for key, dirs in (("num", r), ("den", g)):
        for h in dirs * (eps * std):
            fp, fm = fn(z + h), fn(z - h)
            fds[key].append([(a - 2 * c + b) / eps**2 for a, b, c in zip(fp, fm, f0, strict=True)])
    total = 0.0
    for e in range(len(f0)):
        num = torch.stack([f[e] for f in fds["num"]]).var(0, correction=0)
        den = torch.stack([f[e] for f in fds["den"]]).var(0, correction=0)
        num, den = num.reshape(z.shape[0], -1).mean(1), den.reshape(z.shape[0], -1).mean(1)
        total = total + (num / (den + 1e-10)).mean()
    return total


def fused_nhp(fn, z, std, generator=None):
    with use_backend("cpu"):
        return normalized_hessian_penalty(
            fn, z, std, num_perturbations=K, eps=EPS, generator=generator
        )


PENALTIES = {"sequential": sequential_nhp, "fused": fused_nhp}


def _setup(model: str, seed: int = 0, n: int = N):
    torch.manual_seed(seed)
    dec = DECODERS[model]()
    z = torch.randn(n, D)
    std = z.std(0, correction=0) + 1e-6
    return dec, z, std


def penalty_step(dec, z, std, variant):
    dec.zero_grad(set_to_none=True)
    loss = PENALTIES[variant](dec.activations, z, std, generator=torch.Generator().manual_seed(0))
    loss.backward()
    return loss


class AutoEncoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.enc = nn.Sequential(
            nn.Flatten(), nn.Linear(IMG * IMG, 256), nn.SiLU(), nn.Linear(256, D)
        )
        self.dec = DECODERS[model]()


def make_train_step(model, variant):
    """variant: "none" (reconstruction only), "sequential", "fused" (+ 1e-2 NHP), or "stacked"
    (reconstruction + one forward/backward of the regularized layers on 4k n rows: the
    unavoidable work of a batched penalty)."""
    torch.manual_seed(0)
    ae = AutoEncoder(model)
    opt = torch.optim.Adam(ae.parameters(), lr=2e-4)
    x = (torch.rand(N, 1, IMG, IMG) > 0.5).float()
    gen = torch.Generator().manual_seed(0)

    def step():
        opt.zero_grad(set_to_none=True)
        z = ae.enc(x)
        loss = nn.functional.binary_cross_entropy_with_logits(ae.dec(z), x)
        std = z.std(0, correction=0) + 1e-6
        if variant in PENALTIES:
            loss = loss + 1e-2 * PENALTIES[variant](ae.dec.activations, z, std, generator=gen)
        elif variant == "stacked":
            zs = z.detach().repeat(4 * K, 1)
            loss = loss + 1e-2 * sum(a.mean() for a in ae.dec.activations(zs))
        loss.backward()
        opt.step()

    return step


# ----------------------------------------------------------------------------- pytest-benchmark


@pytest.mark.parametrize("model", list(DECODERS))
@pytest.mark.parametrize("variant", list(PENALTIES))
def test_penalty_forward_backward(benchmark, model, variant):
    dec, z, std = _setup(model)
    benchmark.group = f"nhp-{model}"
    benchmark.pedantic(penalty_step, args=(dec, z, std, variant), rounds=10, warmup_rounds=2)


@pytest.mark.parametrize("model", list(DECODERS))
@pytest.mark.parametrize("variant", ["none", "stacked", "sequential", "fused"])
def test_train_step(benchmark, model, variant):
    benchmark.group = f"train-step-{model}"
    benchmark.pedantic(make_train_step(model, variant), rounds=10, warmup_rounds=2)


@pytest.mark.parametrize("model", list(DECODERS))
def test_peak_memory(benchmark, model):
    """Peak RSS growth (MiB) of one penalty forward + backward, each variant in a fresh process."""
    benchmark.group = f"nhp-peak-rss-{model}"
    res = {v: _peak_rss_mib(model, v) for v in PENALTIES}
    benchmark.extra_info.update({f"peak_rss_mib_{v}": m for v, m in res.items()})
    benchmark.pedantic(lambda: None, rounds=1)


def _peak_rss_mib(model, variant):
    out = subprocess.run(
        [sys.executable, __file__, "--peak-rss", model, variant],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mib"]


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_rss_child(model, variant):
    dec, z, std = _setup(model, n=2)
    penalty_step(dec, z, std, variant)  # warm-up: library initialization at a tiny batch
    dec, z, std = _setup(model)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    before = _status_kib("VmRSS")
    penalty_step(dec, z, std, variant)
    print(json.dumps({"peak_rss_mib": (_status_kib("VmHWM") - before) / 1024}))


# ----------------------------------------------------------------------------- summary script


def _time(fn, rounds=10, warmup=2):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def main():
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, n={N} d={D} k={K}")
    for model in DECODERS:
        args = _setup(model)
        t = {v: _time(lambda v=v, a=args: penalty_step(*a, v)) for v in PENALTIES}
        mem = {v: _peak_rss_mib(model, v) for v in PENALTIES}
        print(
            f"{model}: penalty fwd+bwd median  sequential {t['sequential'] * 1e3:.1f} ms, "
            f"fused {t['fused'] * 1e3:.1f} ms ({t['sequential'] / t['fused']:.2f}x); "
            f"peak RSS growth sequential {mem['sequential']:.1f} MiB, fused {mem['fused']:.1f} MiB"
        )
        s = {
            v: _time(make_train_step(model, v)) for v in ("none", "stacked", "sequential", "fused")
        }
        print(
            f"{model}: train step median  plain {s['none'] * 1e3:.1f} ms, "
            f"plain+stacked fwd/bwd {s['stacked'] * 1e3:.1f} ms, "
            f"+NHP sequential {s['sequential'] * 1e3:.1f} ms ({s['sequential'] / s['none']:.2f}x), "
            f"+NHP fused {s['fused'] * 1e3:.1f} ms ({s['fused'] / s['none']:.2f}x; "
            f"{s['fused'] / s['stacked']:.2f}x of the unavoidable work)"
        )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--peak-rss":
        _peak_rss_child(sys.argv[2], sys.argv[3])
    else:
        main()
