"""Benchmark cases of the end-to-end training step: one optimizer step of a method at its default CPU
configuration, as ``qkernels train`` runs it.

A run is ONE call of :meth:`qkernels.train.loop.Trainer.train_step` (the code training runs): the batch,
forward, backward, gradient clipping, optimizer step and, for methods with a total-correlation
discriminator (FactorQVAE), the discriminator's forward, backward and step. Methods: Tripod (FSQ + KLM +
normalized Hessian penalty), Cliff-VAE (Cliff loss), QLAE (per-latent codebooks), FactorQVAE (global
codebook, Gumbel-softmax, discriminator), each with :class:`~qkernels.train.config.TrainConfig`'s defaults
(arch "small", 32 x 32 ``shapes3d_procedural``, the authors' batch size and optimizer). Every run repeats the
same step index (:data:`STEP`: the batch and the schedules are functions of it), on parameters that the
previous runs updated.

Variants (one Trainer, i.e. one model and optimizer, per variant):

- ``auto``: qkernels' default backends (what ``qkernels train`` runs);
- ``reference``: the same model with every qkernels op on the ``reference`` backend (plain PyTorch ops),
  eager: the baseline (what the method's authors' code does, in PyTorch);
- ``reference_compiled``: the same, with ``torch.compile`` (inductor, default mode, static shapes) of the
  model's ``forward``, i.e. the whole loss (encoder, quantizer / KDE losses / Hessian penalty, decoder:
  ``model.compile()``) — what a user gets for free, without qkernels' kernels. The optimizer step and the
  discriminator step stay eager (as with ``qkernels train --compile``, which compiles the same). Compiled
  with ``torch._inductor.config.fallback_random = True`` (random draws as in eager: the
  same training; see benchmarks/RESULTS.md);
- ``reference_compiled_ro`` (CUDA only): the same with ``mode="reduce-overhead"`` (CUDA graphs);
- ``auto_compiled``: qkernels' default backends under the same ``torch.compile`` of the model's forward (the ops
  are opaque custom ops to inductor, which fuses the code around them): what a qkernels user who also
  compiles gets;
- ``auto_compiled_ro`` (CUDA only): ``auto_compiled`` with ``mode="reduce-overhead"``.

Environment (tests, a quick look): ``QKERNELS_BENCH_TINY=1`` runs every case on tiny inputs (batch 16);
``QKERNELS_BENCH_STEP_MODELS=qlae,tripod`` picks the methods, ``QKERNELS_BENCH_STEP_VARIANTS=auto,reference`` the
variants (torch.compile takes a minute per method on a CPU).
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import torch

from qkernels.bench import Case

MODELS = ("tripod", "cliff_vae", "qlae", "factorqvae")
# (seconds per step, seconds per whole-model torch.compile) at the default batch on a 2-core CPU: the plan's estimate
STEP_COST = {"tripod": (0.55, 75.0), "cliff_vae": (0.02, 15.0), "qlae": (0.1, 20.0), "factorqvae": (0.2, 30.0)}
STEP = 1  # the step index every run repeats
TINY_BATCH = 16  # make(0) and QKERNELS_BENCH_TINY=1 (Cliff draws 10 conditioning rows)

TITLE = "one training step per run (Trainer.train_step: forward, backward, optimizer step(s))"

LEGEND = {
    "auto": "qkernels' default backends (auto), eager: what `qkernels train` runs",
    "reference": "every qkernels op on the reference backend (plain PyTorch ops), eager: the baseline",
    "reference_compiled": "the reference with torch.compile (inductor, default mode) of the model's forward "
    "(the whole loss); optimizer and discriminator steps eager: what a user gets for free",
    "reference_compiled_ro": "reference_compiled with mode='reduce-overhead' (CUDA graphs)",
    "auto_compiled": "auto under the same torch.compile of the model's forward (qkernels' ops opaque inside it)",
    "auto_compiled_ro": "auto_compiled with mode='reduce-overhead' (CUDA graphs)",
}


def _tiny() -> bool:
    return os.environ.get("QKERNELS_BENCH_TINY", "") not in ("", "0")


def _chosen(var: str, known) -> tuple[str, ...]:
    names = [m.strip() for m in os.environ.get(var, "").split(",") if m.strip()]
    bad = [m for m in names if m not in known]
    if bad:
        raise ValueError(f"{var}: unknown name {bad[0]!r}; choose from {', '.join(known)}")
    return tuple(names) or tuple(known)


class Steps:
    """The stateful "inputs" of a step case: one :class:`~qkernels.train.loop.Trainer` per variant, built on
    first use (its run directory: a temporary directory removed with this object)."""

    def __init__(self, model: str, device: str, batch_size: int | None) -> None:
        self.model, self.device, self.batch_size = model, device, batch_size
        self.trainers: dict = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="qkernels-bench-step-")

    def trainer(self, key: str, mode: str | None = None):
        if key not in self.trainers:
            from qkernels.train.config import TrainConfig
            from qkernels.train.loop import Trainer

            cfg = TrainConfig(
                model=self.model,
                out=os.path.join(self._tmp.name, key),
                device=self.device,
                batch_size=self.batch_size,
                progress=False,
                checkpoint_every=10**9,
            )
            tr = Trainer(cfg)
            tr.model.train()
            if mode is not None:
                tr.model.compile(dynamic=False, **({} if mode == "default" else {"mode": mode}))
            self.trainers[key] = tr
        return self.trainers[key]


_CACHE: dict = {}


def _step_variant(key: str, backend: str, mode: str | None = None):
    """One training step of ``Steps`` on ``backend`` (``mode``: torch.compile the model's forward)."""
    from qkernels import use_backend

    def run(_device_tensor, steps: Steps) -> None:
        tr = steps.trainer(key, mode)
        patch = torch._inductor.config.patch(fallback_random=True) if mode else contextlib.nullcontext()
        with patch, use_backend(backend):
            tr.train_step(STEP)

    return run


def _case(model: str, device: str) -> Case:
    from qkernels.models.registry import METHODS
    from qkernels.train.config import TrainConfig

    cfg = TrainConfig(model=model)
    batch = TINY_BATCH if _tiny() else METHODS[model].batch_size

    def make(scale: int):
        b = batch if scale else TINY_BATCH
        key = (model, device, b)
        if key not in _CACHE:  # the same trainers across make() calls: warm-up and memory probes reuse them
            _CACHE[key] = Steps(model, device, b)
        return torch.empty(0, device=device), _CACHE[key]

    variants = {
        "auto": _step_variant("auto", "auto"),
        "reference": _step_variant("reference", "reference"),
        "reference_compiled": _step_variant("reference_compiled", "reference", "default"),
        "auto_compiled": _step_variant("auto_compiled", "auto", "default"),
    }
    if device == "cuda":
        for backend in ("reference", "auto"):
            key = f"{backend}_compiled_ro"
            variants[key] = _step_variant(key, backend, "reduce-overhead")
    keep = _chosen("QKERNELS_BENCH_STEP_VARIANTS", LEGEND)
    variants = {v: f for v, f in variants.items() if v in keep}
    baseline = "reference" if "reference" in variants else next(iter(variants))
    name = f"{model} batch={batch} {cfg.image_size}x{cfg.image_size} {cfg.arch}"
    # for the plan: seconds per step and per whole-model compile (CPU: a quiet 2-core AMD EPYC; CUDA: an H200;
    # benchmarks/RESULTS.md)
    run_s, compile_s = (0.035, 30.0) if device == "cuda" else STEP_COST[model]
    if _tiny():
        run_s /= 4
    return Case("step", name, make, variants, baseline=baseline, stateful=True, run_s=run_s, compile_s=compile_s)


def cases(device: str | None = None) -> list[Case]:
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return [_case(m, device) for m in _chosen("QKERNELS_BENCH_STEP_MODELS", MODELS)]
