"""What ``qkernels train --compile`` should compile: one ``Trainer.train_step`` (backend ``auto``) eager, with the
encoder and decoder compiled, and with the whole loss (the model's forward) compiled, interleaved.

    OMP_NUM_THREADS=1 python scripts/measure_compile_step.py tripod 8

Prints the first two steps' time (compilation) and the min / median of ROUNDS further steps per variant
(benchmarks/HISTORY.md, "What qkernels train --compile compiles").
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import torch

from qkernels.train.config import TrainConfig
from qkernels.train.loop import Trainer


def trainer(model: str, kind: str) -> Trainer:
    cfg = TrainConfig(model=model, out=tempfile.mkdtemp(), device="cpu", progress=False, checkpoint_every=10**9)
    tr = Trainer(cfg)
    tr.model.train()
    if kind == "parts":
        for name in ("encoder", "decoder"):
            tr.model._modules[name].compile()
    elif kind == "whole":
        tr.model.compile(dynamic=False)
    return tr


def main(model: str, rounds: int) -> None:
    torch.set_num_threads(1)
    trainers = {kind: trainer(model, kind) for kind in ("eager", "parts", "whole")}
    random_as_eager = torch._inductor.config.patch(fallback_random=True)
    for kind, tr in trainers.items():
        t = time.perf_counter()
        with random_as_eager:
            tr.train_step(1)
            tr.train_step(1)
        print(f"{kind}: first two steps {time.perf_counter() - t:.1f} s", flush=True)
    times: dict[str, list[float]] = {kind: [] for kind in trainers}
    for _ in range(rounds):
        for kind, tr in trainers.items():
            t = time.perf_counter()
            with random_as_eager:
                tr.train_step(1)
            times[kind].append(time.perf_counter() - t)
    for kind, v in times.items():
        print(f"{model} {kind}: min {1e3 * min(v):.1f} ms, median {1e3 * statistics.median(v):.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8)
