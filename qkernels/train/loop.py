"""The training loop: ``train(config)`` -> final metrics; writes the run directory.

Run directory: ``config.json``, ``log.jsonl`` (one JSON object per line: ``{"type": "train", "step", terms...}`` and
``{"type": "eval", "step", metrics...}``), ``checkpoint.pt`` (atomic), ``metrics.json`` (final evaluation, incl.
matrices) and ``figures/*.png`` (:data:`~qkernels.train.run.FIGURE_FILES`). A fresh run never shares its directory
with another: it refuses a directory that holds one (``overwrite=False``; ``qkernels train`` without ``--force``)
or deletes that run's files first (:func:`~qkernels.train.files.clear_run`: only the files above; anything else in
the directory stays).

Determinism: the global torch RNG is re-seeded from (seed, step) before every step and batches are a function of
(seed, step) (:mod:`qkernels.train.data`); LR and temperature schedules are functions of the step. So a run resumed
from a checkpoint (model + optimizer states + step) continues bit-for-bit identically on CPU, at the thread count it
had then (config.json); a checkpoint saved on SIGINT / SIGTERM (:mod:`qkernels.train.interrupt`) is one like any
other. With ``adapt_threads`` a collapse of the steps' speed lowers the count mid-run
(:mod:`qkernels.train.throughput`): from then on the run's bits depend on when that happened.

Data parallelism: started by ``torchrun`` (the CLI initializes the process group), every rank trains a
DistributedDataParallel copy on its equal block of the global batch (``batch_size`` is the global batch); random
draws are made for the global batch and sliced (:mod:`qkernels.distributed`), the KDE losses see the global batch
(``local_kde``: each rank's own), so the run follows the single-process run with the same seed up to float
summation order. The discriminator (FactorVAE-style methods) is stepped on each rank's block, its gradients
averaged over ranks (one all_reduce per parameter); its permuted batch permutes each rank's block. Rank 0 alone
writes config, log, checkpoints, metrics and figures; logged terms are averaged over ranks.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from qkernels.distributed import average_gradients, mean_over_ranks, rank_and_size
from qkernels.models.base import discriminator_of
from qkernels.models.registry import METHODS, OptimSpec, method_optim
from qkernels.train import checkpoint as ckpt
from qkernels.train.config import TrainConfig
from qkernels.train.data import derive_seed, get_batch
from qkernels.train.eval_progress import EvalProgress, hms
from qkernels.train.evaluate import evaluate_model, finish_run
from qkernels.train.files import CHECKPOINT, CONFIG, LOG, RunExistsError, clear_run, run_files
from qkernels.train.interrupt import DeferredSignals, TrainingInterrupted
from qkernels.train.paper import describe_settings
from qkernels.train.run import build, scalars
from qkernels.train.selection import CheckpointSelector, describe_cadence, eval_records, eval_steps
from qkernels.train.throughput import CollapseWatch, fewer_threads


def make_optimizer(named_params, spec: OptimSpec, lr: float) -> torch.optim.Optimizer:
    """Adam/AdamW; with weight decay, parameters with ``no_decay`` (biases, codebooks) get none."""
    decay = [p for n, p, nd in named_params if not nd]
    no_decay = [p for n, p, nd in named_params if nd]
    groups = [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    cls = torch.optim.AdamW if spec.name == "adamw" else torch.optim.Adam
    if spec.name == "adam":
        for g in groups:
            g["weight_decay"] = 0.0
    return cls(groups, lr=lr, betas=spec.betas)


def lr_at(spec: OptimSpec, lr: float, step: int, total: int) -> float:
    if spec.lr_schedule is None:
        return lr
    if spec.lr_schedule == "cosine":
        t = step / max(spec.lr_decay_steps or total, 1)
        return spec.lr_min + (lr - spec.lr_min) * 0.5 * (1 + math.cos(math.pi * t))
    raise ValueError(f"unknown lr_schedule {spec.lr_schedule!r}")


def clip_(params, spec: OptimSpec) -> None:
    if spec.clip == "value":
        torch.nn.utils.clip_grad_value_(params, spec.clip_value)
    elif spec.clip == "norm":
        torch.nn.utils.clip_grad_norm_(params, spec.clip_value)


class Trainer:
    """Holds model, optimizers and data of one run; ``run()`` trains to ``cfg.steps``.

    resume: continue from ``cfg.out/checkpoint.pt`` when there is one (else start afresh). overwrite: what a fresh
    run does when ``cfg.out`` holds another run (:func:`~qkernels.train.files.run_files`): delete that run's files
    first (True) or raise :class:`~qkernels.train.files.RunExistsError` before anything is built or written (False;
    ``qkernels train`` refuses such a directory itself unless ``--force``). ``cfg.threads`` (when not None) is set
    with ``torch.set_num_threads`` for the process; ``threads_why`` is shown after the count in the first line.

    Examples:
        >>> import tempfile
        >>> from qkernels.train import TrainConfig, Trainer
        >>> cfg = TrainConfig(model="cliff_ae", dataset="quantized_grid2d", dataset_kwargs={"n": 256}, steps=2,
        ...                   batch_size=32, out=tempfile.mkdtemp(), progress=False)
        >>> trainer = Trainer(cfg)
        >>> sorted(trainer.train_step(0))  # the loss terms and the learning rate of one step
        ['cliff', 'decoder_mse', 'lr', 'total']
        >>> trainer.run(final_eval=False)  # the remaining step, then a checkpoint
        >>> trainer.step
        2
    """

    def __init__(self, cfg: TrainConfig, *, resume: bool = False, overwrite: bool = True) -> None:
        self.cfg, self.out = cfg.resolve_defaults(), Path(cfg.out)  # config.json records the values used
        self.spec = METHODS[cfg.model]
        self.selector = CheckpointSelector(cfg, self.out)
        self.eval_at = set(eval_steps(cfg))  # the periodic evaluations (after this many updates)
        self.optim = replace(method_optim(cfg.model, cfg.dataset), weight_decay=cfg.weight_decay)
        self.rank, self.world = rank_and_size()
        # every rank looks before rank 0 writes anything (the DDP set-up below and a barrier come between)
        resuming = resume and (self.out / CHECKPOINT).is_file()
        old = [str(p.relative_to(self.out)) for p in run_files(self.out)]
        if old and not resume and not overwrite:
            shown = ", ".join(old[:4]) + (f" and {len(old) - 4} more" if len(old) > 4 else "")
            raise RunExistsError(
                f"{self.out} already holds a run ({shown}): continue it with resume=True, or "
                "delete it and start over with overwrite=True",
                files=old,
            )
        if cfg.threads is not None:
            if isinstance(cfg.threads, bool) or not isinstance(cfg.threads, int) or cfg.threads < 1:
                raise ValueError(f"threads must be an integer >= 1, got {cfg.threads!r}")
            torch.set_num_threads(cfg.threads)
        self.threads_why = ""
        cfg.world_size = self.world
        self.model, self.ds = build(cfg)
        self.batch_size = cfg.batch_size
        if self.batch_size % self.world:
            raise ValueError(
                f"batch_size {self.batch_size} (the global batch) must be divisible by the number of "
                f"processes, {self.world}"
            )
        self.ddp = self.model
        if self.world > 1:
            self.model.dp_group = dist.group.WORLD
            self.model.kde_group = None if cfg.local_kde else dist.group.WORLD
            ids = [torch.cuda.current_device()] if torch.device(cfg.device).type == "cuda" else None
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=ids, find_unused_parameters=True
            )
        self.lr = cfg.lr
        named = [(n, p, self.model.no_decay(n, p)) for n, p in self.model.model_parameters()]
        self.clip_params = [p for _, p, nd in named if self.optim.clip_undecayed or not nd]
        self.opt = make_optimizer(named, self.optim, self.lr)
        self.disc = discriminator_of(self.model)
        self.disc_opt = None
        if self.disc is not None:
            dspec = self.spec.disc_optim
            self.disc_opt = make_optimizer([(n, p, False) for n, p in self.disc.named_parameters()], dspec, dspec.lr)
        self.step = 0
        self.saved_step: int | None = None  # the step of the checkpoint in cfg.out (None: none yet)
        self.watch, self._collapsed = CollapseWatch(), False  # the steps' speed (cfg.adapt_threads)
        self._made_dir = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        self.fresh = not resuming
        if self.world > 1 and dist.is_initialized():
            dist.barrier()
        self.replaced = []  # the files of a previous run deleted for this fresh one
        if self.fresh and self.rank == 0:
            self.replaced = clear_run(self.out)
            cfg.save(self.out / CONFIG)
            (self.out / LOG).write_text("")
        elif not self.fresh:
            self._restore()
            if self.rank == 0:
                cfg.save(self.out / CONFIG)  # world_size of this restart
        if cfg.compile:
            # the whole loss (encoder, qkernels' ops, decoder): on a CPU, 1 thread, a Tripod step took 474 ms so
            # against 777 with only the encoder and decoder compiled and 924 eager; QLAE 127 / 135 / 180 ms;
            # H200: 1.13-1.8x over eager (benchmarks/RESULTS.md "Training")
            self.model.compile(dynamic=False)

    # ------------------------------------------------------------------------------------------- state
    def state(self) -> dict:
        s = {
            "step": self.step,
            "model": self.model.state_dict(),
            "opt": self.opt.state_dict(),
            "config": self.cfg.to_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.disc_opt is not None:
            s["disc_opt"] = self.disc_opt.state_dict()
        if torch.cuda.is_available():
            s["cuda_rng"] = torch.cuda.get_rng_state_all()
        return s

    def save(self) -> None:
        if self.rank == 0:
            ckpt.save_atomic(self.state(), self.out / CHECKPOINT)
        self.saved_step = self.step

    def _restore(self) -> None:
        s = ckpt.load(self.out / CHECKPOINT, map_location=self.cfg.device)
        self.model.load_state_dict(s["model"])
        self.opt.load_state_dict(s["opt"])
        if self.disc_opt is not None:
            self.disc_opt.load_state_dict(s["disc_opt"])
        torch.set_rng_state(s["torch_rng"])
        if "cuda_rng" in s and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(s["cuda_rng"])
        self.step = self.saved_step = int(s["step"])
        # drop log lines written after the checkpoint (a killed run), so the log is what a straight run writes
        log = self.out / LOG
        keep = (
            [ln for ln in log.read_text().splitlines() if ln and json.loads(ln)["step"] <= self.step]
            if log.is_file()
            else []
        )
        if self.rank == 0:
            ckpt.write_text_atomic("".join(ln + "\n" for ln in keep), log)

    def log(self, record: dict) -> None:
        if self.rank != 0:
            return
        with open(self.out / LOG, "a") as fh:
            fh.write(json.dumps(record) + "\n")

    # ------------------------------------------------------------------------------------------- steps
    def train_step(self, s: int) -> dict[str, float]:
        """One model step (+ one discriminator step AFTER it, on freshly computed detached latents)."""
        cfg, dev = self.cfg, self.cfg.device
        torch.manual_seed(derive_seed(cfg.seed, s, 3))
        shard = (self.rank, self.world)
        order = self.spec.data_order if cfg.data_order == "auto" else cfg.data_order
        streams = 1 if self.disc is None else 2
        x = get_batch(self.ds, self.batch_size, cfg.seed, s, shard=shard, order=order, streams=streams).to(dev)
        lr = lr_at(self.optim, self.lr, s, cfg.steps)
        for g in self.opt.param_groups:
            g["lr"] = lr
        kind = torch.device(dev).type  # --amp: bfloat16 autocast on CUDA and on the CPU
        with torch.autocast(kind, dtype=torch.bfloat16, enabled=cfg.amp):
            terms = self.ddp(x, s)
        self.opt.zero_grad(set_to_none=True)
        terms["total"].backward()
        clip_(self.clip_params, self.optim)
        self.opt.step()
        out = {k: float(v.detach()) for k, v in terms.items()}
        if self.disc is not None:
            x2 = get_batch(
                self.ds, self.batch_size, cfg.seed, s, stream=1, shard=shard, order=order, streams=streams
            ).to(dev)
            dspec = self.spec.disc_optim
            for g in self.disc_opt.param_groups:
                g["lr"] = lr_at(dspec, dspec.lr, s, cfg.steps)
            with torch.autocast(kind, dtype=torch.bfloat16, enabled=cfg.amp):
                dterms = self.model.discriminator_loss(x, x2, s)
            self.disc_opt.zero_grad(set_to_none=True)  # also drops the grads the TC term left on D
            dterms["total"].backward()
            average_gradients(self.disc.parameters())
            self.disc_opt.step()
            out.update({f"disc_{k}" if k == "total" else k: float(v.detach()) for k, v in dterms.items()})
        out = mean_over_ranks(out)
        out["lr"] = lr
        out.update(self.model.schedules(s))
        return out

    def run(self, *, stop_after: int | None = None, final_eval: bool = True) -> dict | None:
        """Train to ``cfg.steps`` (or stop after ``stop_after`` steps without a final checkpoint: a simulated
        kill, for tests), then evaluate and draw the figures unless ``final_eval`` is False. Returns the final
        metrics (None when stopped early or not evaluated). A fresh run that fails before its first checkpoint
        removes what it wrote (nothing a later ``--resume`` or ``compare`` could mistake for a run).

        SIGINT / SIGTERM while training (a single process, the main thread; :mod:`qkernels.train.interrupt`): the
        current step ends, a checkpoint of it is saved and :class:`~qkernels.train.interrupt.TrainingInterrupted`
        (a ``KeyboardInterrupt``) is raised; a second signal interrupts at once."""
        try:
            with DeferredSignals(self._stop_note, enabled=self.world == 1) as self._signals:
                return self._run(stop_after, final_eval)
        except BaseException:
            if self.fresh and self.rank == 0 and not (self.out / CHECKPOINT).is_file():
                for name in (CONFIG, LOG):
                    (self.out / name).unlink(missing_ok=True)
                if self._made_dir and not any(self.out.iterdir()):
                    self.out.rmdir()
            raise

    def _stop_note(self) -> str:
        """What the first signal's line says (:class:`~qkernels.train.interrupt.DeferredSignals`)."""
        kept = "no checkpoint" if self.saved_step is None else f"the checkpoint of step {self.saved_step}"
        return f"stopping at the end of this step with a checkpoint of it (quitting now keeps {kept})"

    def _stop_if_signalled(self, bar: Progress) -> None:
        """After a deferred SIGINT / SIGTERM: save a checkpoint of the current step, raise TrainingInterrupted."""
        signum = self._signals.pending
        if signum is None:
            return
        bar.close()
        self.save()
        raise TrainingInterrupted(
            f"stopped at step {self.step} of {self.cfg.steps} by a signal; checkpoint saved: {self.out / CHECKPOINT}",
            step=self.step,
            signum=signum,
        )

    def _watched_step(self, bar: Progress) -> dict[str, float]:
        """``train_step(self.step)``, timed; with ``cfg.adapt_threads``, a collapse of the steps' speed while other
        processes keep cores busy lowers the thread count from the next step on (:mod:`qkernels.train.throughput`)."""
        if self._collapsed:  # noticed after the previous step, which is now logged (and checkpointed)
            self._collapsed = False
            self._fewer_threads(bar)
        t = time.perf_counter()
        terms = self.train_step(self.step)
        self._collapsed = self.cfg.adapt_threads and self.watch.observe(time.perf_counter() - t)
        return terms

    def _fewer_threads(self, bar: Progress) -> None:
        from qkernels.train.threads import busy_cores, usable_cores

        early, recent = self.watch.rates()
        self.watch.reset()  # a new reference: the speed from now on
        n, cores, busy = torch.get_num_threads(), usable_cores(), busy_cores()
        new = fewer_threads(n, cores, busy)
        if new is None:
            return
        torch.set_num_threads(new)
        self.cfg.threads = new
        self.log(
            {
                "type": "threads",
                "step": self.step,
                "threads": new,
                "was": n,
                "early_it_s": early,
                "recent_it_s": recent,
                "busy_cores": busy,
            }
        )
        bar.note(
            f"qkernels train: {recent:.2f} it/s at step {self.step}, {early:.2f} early on; other work keeps "
            f"{busy:.1f} of {cores} cores busy: {n} -> {new} thread{'s' if new > 1 else ''} from here on "
            "(recorded in config.json and log.jsonl; --threads N fixes the count)"
        )
        self.save()  # the latest checkpoint and config.json agree on the count: --resume continues with it
        if self.rank == 0:
            self.cfg.save(self.out / CONFIG)

    def _periodic_eval(self) -> None:
        """Evaluate the model at ``self.step`` (rank 0), log it and let the selection rule see it; before the
        checkpoint of that step, so a resumed run never evaluates a step twice."""
        if self.rank != 0:
            return
        res = evaluate_model(self.model, self.ds, self.cfg)
        self.log({"type": "eval", "step": self.step, **scalars(res)})
        self.selector.observe(self.step, self.model)
        self.model.train()

    def _run(self, stop_after: int | None, final_eval: bool) -> dict | None:
        cfg = self.cfg
        self.model.train()
        bar = Progress(cfg.steps, self.step, enabled=cfg.progress and self.rank == 0)
        why = f" ({self.threads_why})" if self.threads_why else ""
        n = torch.get_num_threads()
        bar.note(
            f"training {cfg.model} on {cfg.dataset} with {n} thread{'s' if n > 1 else ''}{why}: step "
            f"{self.step} of {cfg.steps}, batch {self.batch_size}, lr {self.lr:g} -> {self.out}; "
            f"{describe_cadence(cfg)}; {describe_settings(cfg)}"
        )
        if self.replaced:
            bar.note(f"deleted the {len(self.replaced)} files of the run that was in {self.out}")
        if self.step == 0 and 0 in self.eval_at and not any(r["step"] == 0 for r in eval_records(self.out)):
            self._periodic_eval()  # before the first update (Tripod's authors evaluate the initial model)
        while self.step < cfg.steps:
            self._stop_if_signalled(bar)
            if stop_after is not None and self.step >= stop_after:
                return None
            terms = self._watched_step(bar)
            self.step += 1
            bar.update(self.step, terms)
            if not all(math.isfinite(v) for v in terms.values()):
                raise FloatingPointError(f"non-finite loss at step {self.step}: {terms}")
            if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                self.log({"type": "train", "step": self.step, **terms})
            if self.step in self.eval_at:
                with bar.paused():
                    self._periodic_eval()
            if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
                self.save()
        self._stop_if_signalled(bar)
        self._signals.immediate()  # every step is saved: a signal during the evaluation interrupts at once
        bar.close()
        if self.world > 1:  # every rank done with its collectives before any leaves (rank 0 then evaluates)
            dist.barrier()
        if not final_eval or self.rank != 0:
            return None
        said = EvalProgress(f"evaluating step {self.step}", enabled=cfg.progress)
        return self.selector.finish(
            finish_run(self.model, self.ds, cfg, self.out, step=self.step, log=self.log, progress=said)
        )


class Progress:
    """One status line on stderr: step, live loss terms, speed, elapsed time, ETA (``\\r``-updated on a tty, else
    every 10%), and a closing line with the run's speed.

    Speed and ETA come from an exponential moving average of the step time over about the last ``window`` steps
    (the first step, which carries the warm-up, is left out): a run that slows down when another job starts
    shows it within a few steps, where a whole-run average would keep promising the early speed. ``clock``:
    seconds (tests pass a fake one)."""

    def __init__(self, total: int, start: int, *, enabled: bool = True, window: int = 20, clock=None) -> None:
        self.total, self.start, self.enabled = total, start, enabled
        self.clock = clock or (lambda: time.perf_counter())
        self.t0 = self.last = self.last_step = self.clock()
        self.alpha = 2.0 / (window + 1)
        self.step_time: float | None = None  # EMA of seconds per step
        self.first_end: float | None = None
        self.first_at = start
        self.at = start  # the step of the latest tick
        self.tty = sys.stderr.isatty()
        self.every = max(total // 10, 1)

    def tick(self, step: int, now: float) -> None:
        """Step ``step`` ended at ``now``: fold the time per step since the last tick into the moving average
        (as often as steps passed)."""
        k = step - self.at
        if k <= 0:
            return
        dt = (now - self.last_step) / k
        self.last_step, self.at = now, step
        if self.first_end is None:
            self.first_end, self.first_at = now, step
            if k == 1:  # the first step alone carries the warm-up: not a measure of the speed to come
                return
        if self.step_time is None:
            self.step_time, k = dt, k - 1
        self.step_time = dt + (self.step_time - dt) * (1 - self.alpha) ** k

    @contextlib.contextmanager
    def paused(self):
        """Time spent inside (a periodic evaluation) is not step time: neither the speed nor the ETA counts it."""
        began = self.clock()
        try:
            yield
        finally:
            self.last_step += self.clock() - began

    def eta(self, step: int) -> float | None:
        """Seconds to ``total`` at the recent speed (None before two steps)."""
        return None if self.step_time is None else (self.total - step) * self.step_time

    def line(self, step: int, terms: dict[str, float], now: float) -> str:
        shown = " ".join(f"{k} {v:.4g}" for k, v in terms.items() if k != "lr")
        rate = f"{1.0 / max(self.step_time, 1e-9):.2f} it/s" if self.step_time is not None else "- it/s"
        eta = self.eta(step)
        return (
            f"step {step}/{self.total} | {shown} | {rate} | elapsed {hms(now - self.t0)} | "
            f"eta {hms(eta) if eta is not None else '-'}"
        )

    def update(self, step: int, terms: dict[str, float]) -> None:
        now = self.clock()
        self.tick(step, now)
        if not self.enabled:
            return
        first = step == self.start + 1  # shown at once: the run is alive
        if self.tty and now - self.last < 0.5 and step < self.total and not first:
            return
        if not self.tty and step % self.every and step != self.total and not first:
            return
        self.last = now
        line = self.line(step, terms, now)
        sys.stderr.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        sys.stderr.flush()

    def summary(self, now: float) -> str | None:
        """The closing line, trained N steps in m:ss (x it/s after the first step); None before any step."""
        if self.first_end is None:
            return None
        n = self.at - self.start
        text = f"trained {n} steps in {hms(now - self.t0)}"
        if self.at > self.first_at and self.last_step > self.first_end:
            rate = (self.at - self.first_at) / (self.last_step - self.first_end)
            text += f" ({rate:.2f} it/s after the first step)"
        return text

    def close(self) -> None:
        if not self.enabled:
            return
        if self.tty:
            sys.stderr.write("\n")
        text = self.summary(self.last_step)
        if text:
            self.note(text)

    def note(self, text: str) -> None:
        """One line on stderr (when enabled)."""
        if self.enabled:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    final_eval: bool = True,
    overwrite: bool = True,
) -> dict | None:
    """Train ``cfg`` (resuming from ``cfg.out/checkpoint.pt`` when ``resume`` and it exists; ``overwrite``:
    see :class:`Trainer`).

    Writes config.json, log.jsonl and checkpoint.pt to ``cfg.out``; with ``final_eval``, also the final metrics
    (metrics.json, returned as a dict) and figures. ``stop_after``: stop after this many steps of this call.

    Examples:
        >>> import os, tempfile
        >>> from qkernels.train import TrainConfig, train
        >>> out = tempfile.mkdtemp()
        >>> cfg = TrainConfig(model="cliff_ae", dataset="quantized_grid2d", dataset_kwargs={"n": 256}, steps=2,
        ...                   batch_size=32, out=out, progress=False)
        >>> train(cfg, final_eval=False) is None
        True
        >>> sorted(os.listdir(out))
        ['checkpoint.pt', 'config.json', 'log.jsonl']
    """
    return Trainer(cfg, resume=resume, overwrite=overwrite).run(stop_after=stop_after, final_eval=final_eval)
