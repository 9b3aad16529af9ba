"""The ``qkernels`` command (also ``python -m qkernels``); what it does and how it fails: :data:`DESCRIPTION` (its
``--help``).

Start-up: the parser is built without importing torch, scikit-learn or any qkernels module that does (``import
qkernels`` is light, :mod:`qkernels`), so ``--help`` and a bad command line answer at once; each command imports
what it needs when it runs. The names the parser offers (:data:`MODELS`, :data:`PROTOCOL_NAMES`,
:data:`PAPER_STEPS`) are copies of the registries' (tests/test_light_install.py checks them).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

DESCRIPTION = """Train, evaluate and compare the five papers' methods, and time qkernels' kernels.

Errors are one line on stderr, "qkernels: error: ...", exit status 2 for a bad command line (a flag value, a
name, a path or a device that cannot work) and 1 for a run that failed; --debug shows the traceback instead."""

# qkernels.models.registry.METHODS (names; the authors' run lengths where stated) and
# qkernels.metrics.protocols.PROTOCOLS, copied: importing those modules imports torch and scikit-learn
MODELS = (
    "ae",
    "qlae",
    "tripod",
    "qvae",
    "factorqvae",
    "dvae",
    "factordvae",
    "beta_vae",
    "beta_tcvae",
    "factorvae",
    "cliff_vae",
    "cliff_ae",
)
PAPER_STEPS = {
    "ae": 200_000,
    "qlae": 200_000,
    "tripod": 250_000,
    "qvae": 100_000,
    "factorqvae": 50_000,
    "dvae": 300_000,
    "factordvae": 300_000,
    "cliff_ae": 1_000,
    "cliff_vae": 750_000,
}
PROTOCOL_NAMES = ("qlae", "tripod", "factorqvae", "dlib", "fast")


class UsageError(Exception):
    """A command line that cannot work: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (the usage is on ``--help``), as the rest of the CLI's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("qkernels")
    except PackageNotFoundError:  # a source tree on sys.path, not installed
        return "unknown (not installed)"


class _Version(argparse.Action):
    """``--version``: reads the installed version when asked (importlib.metadata costs ~0.1 s at every start)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"qkernels {_version()}")  # on stdout, as argparse's own version action
        parser.exit(0)


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v

    return parse


def _steps(text: str) -> int | str:
    return "paper" if text == "paper" else _int_at_least(1)(text)


def _eval_every(text: str) -> int | str:
    return text if text in ("auto", "tripod") else _int_at_least(0)(text)


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def _bench(args: argparse.Namespace) -> int:
    from qkernels import bench

    bad = [h for h in args.hotpath or () if h not in bench.HOTPATHS]
    if bad:
        raise UsageError(f"--hotpath {bad[0]}: unknown hot path; choose from {', '.join(bench.HOTPATHS)}")
    if args.plot:
        from qkernels.bench import plot

        plot._matplotlib()  # no matplotlib: fail before minutes of benchmarks
    info = None
    if args.save or args.plot:
        from qkernels.bench import results

        info = results.machine_info()  # the load average before the benchmarks ran
    hotpaths = tuple(dict.fromkeys(args.hotpath)) if args.hotpath else bench.DEFAULT_HOTPATHS
    save = (lambda rows: results.save(rows, args.save, info)) if args.save else None  # after every case
    try:
        rows = bench.run(
            hotpaths,
            memory=not args.no_memory,
            include_slow=args.all,
            min_time=args.min_time,
            threads=args.threads,
            only=tuple(args.case or ()),
            on_case=save,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if save:
        path = save(rows)
        print(f"saved {path} and {path.with_suffix('.json').name}")
    if args.plot:
        recs = results.records(rows, info)
        for png in plot.plot(recs, args.plot):
            print(f"plotted {png}")
    return 0


def _check_device(device: str) -> None:
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {device}: not a device name; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(
            f"--device {device}: this torch ({torch.__version__}) has no usable CUDA device; use --device cpu"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)")
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device}: only cpu and cuda devices are supported")


def _train_config(args: argparse.Namespace):
    import json
    from pathlib import Path

    from qkernels.data import FILE_DATASETS
    from qkernels.train import TrainConfig
    from qkernels.train.files import CONFIG

    out = _out_dir(args)
    if args.resume and args.force:
        raise UsageError("--resume continues the run in --out and --force deletes it: give one of them")
    if args.resume and args.paper:
        raise UsageError("--paper sets a new run's settings; --resume continues the run in --out with its own")
    if args.resume and not (Path(out) / CONFIG).is_file():
        raise UsageError(f"--resume needs a run: --out {out} holds none (no {CONFIG}); drop --resume to start one")
    if args.resume and (Path(out) / CONFIG).is_file():
        cfg = TrainConfig.load(Path(out) / CONFIG)  # the run's own settings; only --steps/--device/--threads change
        cfg.out = str(out)  # where it is now (a copied or moved run continues there, not in its old place)
        if args.steps is not None:
            cfg.steps = args.steps
        if args.device is not None:
            cfg.device = args.device
        if args.threads is not None:  # else the recorded count: the resumed run goes on bit-for-bit
            cfg.threads, cfg.adapt_threads = args.threads, False  # a count given is never changed
        return _resolved(cfg)
    try:  # only the fields the file sets: the others still follow --model (e.g. the default --out)
        base = json.loads(Path(args.config).read_text()) if args.config else {}
    except (OSError, ValueError) as err:
        raise UsageError(f"--config {args.config}: {err}") from None
    if not isinstance(base, dict):
        raise UsageError(f"--config {args.config}: expected a JSON object of TrainConfig fields")
    flags = {
        "model": args.model,
        "dataset": args.dataset,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "eval_samples": args.eval_samples,
        "device": args.device,
        "lr": args.lr,
        "arch": args.arch,
        "image_size": args.image_size,
        "num_latents": args.num_latents,
        "eval_every": args.eval_every,
        "threads": args.threads,
        "protocol": args.protocol,
        "data_order": args.data_order,
        "select": args.select,
    }
    base.update({k: v for k, v in flags.items() if v is not None})
    if args.compile:
        base["compile"] = True
    if args.amp:
        base["amp"] = True
    if args.local_kde:
        base["local_kde"] = True
    if args.data_root is not None:
        name = base.get("dataset", TrainConfig.dataset)
        if name not in FILE_DATASETS:
            raise UsageError(
                f"--data-root: {name} is procedural and reads no files (file datasets: {', '.join(FILE_DATASETS)})"
            )
        base["dataset_kwargs"] = {**base.get("dataset_kwargs", {}), "root": args.data_root}
    if args.paper:
        from qkernels.train.paper import apply_paper

        try:
            base, said = apply_paper(base)
        except ValueError as err:
            raise UsageError(str(err)) from None
        print(f"qkernels train: --paper set {said}", file=sys.stderr)
    base["out"] = _out_dir(args)
    try:
        cfg = TrainConfig.from_dict(base)
    except (TypeError, ValueError) as err:
        raise UsageError(f"--config {args.config}: {err}") from None
    return _resolved(cfg)


def _resolved(cfg):
    """``cfg`` with the authors' values for its method and dataset written in (what config.json records)."""
    try:
        return cfg.resolve_defaults()
    except ValueError as err:
        raise UsageError(str(err)) from None


def _out_dir(args: argparse.Namespace) -> str:
    """The run directory of a ``train`` command line: --out, else the --config file's "out" (not for --resume),
    else runs/<model> (--model, else the file's, else tripod). Reads no more than the JSON file."""
    import json
    from pathlib import Path

    if args.out:
        return args.out
    base = {}
    if args.config and not args.resume:
        try:
            base = json.loads(Path(args.config).read_text())
        except (OSError, ValueError):  # _train_config says so
            base = {}
    base = base if isinstance(base, dict) else {}
    return base.get("out") or f"runs/{args.model or base.get('model') or 'tripod'}"


def _hold_run_dir(out: str, args: argparse.Namespace, *, fresh: bool):
    """The lock of ``out`` (:class:`qkernels.train.files.RunLock`, held by rank 0), taken before torch loads: a
    directory another process trains or evaluates is refused, and so is, for a ``fresh`` run, one that already
    holds a run (without --force)."""
    import os

    from qkernels.train.files import RunInUseError, RunLock, run_files

    lock = RunLock(out, enabled=os.environ.get("RANK", "0") == "0")
    try:
        lock.acquire()
    except RunInUseError as err:
        raise UsageError(str(err)) from None
    old = [p.relative_to(out).as_posix() for p in run_files(out)]
    if fresh and old and not args.force:
        lock.release()
        shown = ", ".join(old[:4]) + (f" and {len(old) - 4} more" if len(old) > 4 else "")
        raise UsageError(
            f"--out {out} already holds a run ({shown}): continue it with --resume, or delete "
            "those files and start over with --force"
        )
    return lock


def _train(args: argparse.Namespace) -> int:
    from qkernels._extras import require

    # the directory first (a fresh run never shares --out with another; --force: the Trainer deletes that run's
    # files; --resume without a checkpoint restarts the run of its config.json), then the extras, then torch
    lock = _hold_run_dir(_out_dir(args), args, fresh=not args.resume)
    try:
        require("qkernels train", "train", "sklearn", "scipy", "PIL")  # its evaluation and figures: before training
        return _train_locked(args, lock)
    finally:
        lock.release()


def _train_locked(args: argparse.Namespace, lock) -> int:
    print("qkernels train: loading torch, the data and the model ...", file=sys.stderr, flush=True)
    import json

    import torch

    from qkernels.data import DatasetFormatError
    from qkernels.train.loop import Trainer
    from qkernels.train.threads import auto_threads

    cfg = _train_config(args)
    _check_device(cfg.device)
    if cfg.threads is None:  # recorded in config.json by the Trainer: a --resume keeps the count
        cfg.threads, why = auto_threads()
        cfg.adapt_threads = why != "OMP_NUM_THREADS"  # our own choice: fewer when other work slows the steps down
    else:
        why = "" if args.threads else "recorded in config.json" if args.resume else "--config"
    if cfg.adapt_threads and cfg.threads > 1:
        why += ("; " if why else "") + "fewer if other work makes the steps 3x slower"
    distributed = _init_distributed(cfg)
    threads = torch.get_num_threads()  # set back after the run (for callers of main() in a live process)
    try:
        try:
            trainer = Trainer(cfg, resume=args.resume)
        except (ValueError, TypeError, FileNotFoundError, DatasetFormatError) as err:
            raise UsageError(f"{cfg.model} on {cfg.dataset}: {err}") from None
        trainer.threads_why = why
        try:
            res = trainer.run()
        except KeyboardInterrupt:  # SIGINT / SIGTERM (qkernels.train.interrupt): how to continue, then main's line
            lock.release()  # the checkpoint is written: the command printed may start at once
            _resume_hint(trainer)
            raise
    finally:
        torch.set_num_threads(threads)
        if distributed:
            import torch.distributed as dist

            dist.destroy_process_group()
    if res is not None:  # rank 0 (or the only process)
        print(json.dumps({k: v for k, v in res.items() if not isinstance(v, (list, dict))}, indent=1))
        print(f"run directory: {cfg.out}")
    return 0


def resume_command(out: str, argv0: str | None = None) -> str:
    """The shell command that continues the run in ``out``, with the program as this process was started
    (``argv0``: ``sys.argv[0]``): ``qkernels`` when that is the one on PATH, ``python -m qkernels`` for
    ``__main__.py``, else the path given. config.json holds the run's settings, so only --resume and --out.

    Examples:
        >>> from qkernels.cli import resume_command
        >>> resume_command("runs/my run", "/nowhere/bin/qkernels")
        "/nowhere/bin/qkernels train --resume --out 'runs/my run'"
    """
    import os
    import shlex
    import shutil

    prog = argv0 if argv0 is not None else (sys.argv[0] if sys.argv else "")
    name = os.path.basename(prog)
    if name == "__main__.py":
        head = [sys.executable, "-m", "qkernels"]
    elif name != "qkernels":  # main() called from other code: the command's usual name
        head = ["qkernels"]
    else:
        found = shutil.which(name)
        head = [name] if found and os.path.realpath(found) == os.path.realpath(prog) else [prog]
    return shlex.join([*head, "train", "--resume", "--out", str(out)])


def _resume_hint(trainer) -> None:
    """After an interrupted run (rank 0): the checkpoint kept and the command that continues it."""
    if trainer.rank != 0:
        return
    if trainer.saved_step is None:
        print(
            f"qkernels train: stopped before the first checkpoint (every {trainer.cfg.checkpoint_every} steps): "
            "nothing to resume",
            file=sys.stderr,
        )
        return
    print(
        f"qkernels train: stopped; {trainer.out / 'checkpoint.pt'} holds step {trainer.saved_step} of "
        f"{trainer.cfg.steps}; continue with:\n  {resume_command(str(trainer.out))}",
        file=sys.stderr,
    )


def _init_distributed(cfg) -> bool:
    """Under ``torchrun`` (WORLD_SIZE > 1): one process group, nccl on CUDA (each rank on GPU LOCAL_RANK),
    gloo on the CPU, collectives failing after ``cfg.dist_timeout_s``. False for a single process."""
    import os
    from datetime import timedelta

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    import torch
    import torch.distributed as dist

    cuda = torch.device(cfg.device).type == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        cfg.device = "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=cfg.dist_timeout_s))
    return True


def _run_dir(path: str, *files: str) -> None:
    from pathlib import Path

    missing = [f for f in files if not (Path(path) / f).is_file()]
    if missing:
        raise UsageError(
            f"{path}: no {' or '.join(missing)} there; give a run directory written by `qkernels train --out DIR`"
        )


def _eval(args: argparse.Namespace) -> int:
    import json

    from qkernels.train.files import CHECKPOINT, CONFIG

    _run_dir(args.run_dir, CONFIG, CHECKPOINT)  # before torch loads, as the lock below
    lock = _hold_run_dir(args.run_dir, args, fresh=False)  # it rewrites metrics.json and the figures
    try:
        print("qkernels eval: loading torch, the run and its data ...", file=sys.stderr, flush=True)
        from qkernels.train import eval_run

        _check_device(args.device or "cpu")
        res = eval_run(
            args.run_dir,
            num_samples=args.eval_samples,
            device=args.device or "cpu",
            protocol=args.protocol,
            progress=True,
        )
    finally:
        lock.release()
    print(json.dumps({k: v for k, v in res.items() if not isinstance(v, (list, dict))}, indent=1))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from qkernels.train import compare_runs
    from qkernels.train.files import LOG, METRICS_FILE

    for d in args.run_dirs:
        _run_dir(d, METRICS_FILE, *((LOG,) if args.curves else ()))
    if args.curves and not args.curves.lower().endswith(".png"):
        raise UsageError(f"--curves {args.curves}: give a .png file name")
    print(compare_runs(args.run_dirs, columns=args.columns))
    if args.curves:
        from qkernels.train.figures import compare_curves

        print(f"loss curves: {compare_curves(args.run_dirs, args.curves)}")
    return 0


def _debug_flag(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    # also accepted after the subcommand; SUPPRESS keeps a --debug given before it
    p.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks instead of one-line errors"
    )
    return p


def _add_train(sub) -> None:
    p = _debug_flag(
        sub.add_parser(
            "train",
            help="train a model (default: the authors' Tripod on shapes3d_procedural, 32x32, 600 steps)",
            description="Train a method with its authors' defaults (optimizer, lr, batch size, lambdas) unless a flag "
            "overrides them; writes config.json, log.jsonl, checkpoint.pt, metrics.json and figures/ "
            "into --out; config.json records the values used (the authors' per-dataset ones included). "
            "The bare command trains Tripod exactly as its authors' code does, at CPU size (arch small, "
            "32x32 images, 600 of their 250k steps; its first line says so); --paper trains with the "
            "paper's network, resolution, run length, evaluation cadence and protocol.",
        )
    )
    p.add_argument("--model", choices=sorted(MODELS), help="method (default tripod)")
    p.add_argument("--dataset", help="dataset name for qkernels.data.load_dataset (default shapes3d_procedural)")
    p.add_argument("--data-root", help="folder of the dataset files (file datasets; default $QKERNELS_DATA)")
    paper = ", ".join(f"{n} {steps:,}" for n, steps in PAPER_STEPS.items())
    p.add_argument(
        "--steps",
        type=_steps,
        help="optimizer steps, or 'paper': the authors' run length, over which their lr and temperature "
        f"schedules (functions of the step) run their full course ({paper}). Default 600: a "
        "CPU-sized run, the first 600 steps of those schedules",
    )
    p.add_argument("--out", help="run directory (default runs/<model>)")
    p.add_argument("--batch-size", type=_int_at_least(2), help="batch size (default: the authors' for the method)")
    p.add_argument("--seed", type=_int_at_least(0))
    p.add_argument("--lr", type=_positive_float, help="learning rate (default: the authors' for the method)")
    p.add_argument("--arch", choices=("small", "paper"), help="network widths (default small)")
    p.add_argument("--image-size", type=_int_at_least(8), help="procedural image size: 8, 16, 32 (default), 64, ...")
    p.add_argument("--num-latents", type=_int_at_least(1))
    p.add_argument(
        "--data-order",
        choices=("auto", "iid", "epochs", "split"),
        help="how batches read the dataset (default auto: the method's authors': epochs for "
        "tripod/qlae/ae, an 80%% split for qvae/factorqvae, iid draws for the rest)",
    )
    p.add_argument(
        "--protocol",
        choices=("auto", *sorted(PROTOCOL_NAMES)),
        help="evaluation protocol (default auto: the method's authors', e.g. tripod: InfoMEC with IQR "
        "pruning and random-forest DCI on 10,000 samples; fast: 2,000 samples)",
    )
    p.add_argument("--eval-samples", type=_int_at_least(20), help="samples for every metric (default: the protocol's)")
    p.add_argument(
        "--eval-every",
        type=_eval_every,
        help="evaluate every N steps (0: at the end only), or 'tripod': the Tripod authors' cadence (every "
        "10000 steps and every 2000 of the first 10000; runs under 50000 steps: after 1/5, 2/5, 3/5 "
        "and 4/5 of the steps); the evaluations are the checkpoints --select chooses from (default "
        "auto: 'tripod' under Tripod's selection, else 0)",
    )
    p.add_argument(
        "--paper",
        action="store_true",
        help="the paper's settings for --model and --dataset: its network (--arch paper), 64x64 images, "
        "its run length (--steps paper), its evaluation cadence and protocol; other flags given win. "
        "Printed, and recorded in config.json",
    )
    p.add_argument(
        "--select",
        choices=("auto", "final", "tripod"),
        help="the checkpoint metrics.json reports as 'selected' (default auto: the protocol's; tripod: "
        "the Tripod paper's, the best InfoM among the evaluations above the dataset's PSNR "
        "threshold, else the final step; final: the last step). The final step's metrics stay at "
        "the top of metrics.json",
    )
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument(
        "--force",
        action="store_true",
        help="--out holds a run: delete its files (config.json, log.jsonl, checkpoint.pt, metrics.json, "
        "selected.pt, figures/*.png of a run; nothing else) and start over. Without it such a "
        "directory is refused",
    )
    p.add_argument(
        "--threads",
        type=_int_at_least(1),
        help="torch threads of the training process (default: the usable cores (affinity, quota) that "
        "other work does not keep busy when the run starts, or OMP_NUM_THREADS; --resume: the run's "
        "recorded count). Shown in the first line with the reason, kept in "
        "config.json; results depend on it (float summation order). A count of the default's own "
        "choice is lowered when other work makes the steps 3x slower (one line says so; "
        "log.jsonl and config.json record it); a count given never changes",
    )
    p.add_argument("--device", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--config", help="JSON file of TrainConfig fields (flags override it)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model's loss (encoder, qkernels' ops and decoder; the first steps compile)",
    )
    p.add_argument(
        "--local-kde",
        action="store_true",
        help="under torchrun: KDE losses (Cliff, KLM) on each rank's shard, not the global batch",
    )
    p.add_argument(
        "--amp", action="store_true", help="bfloat16 autocast (CUDA or CPU) for the model and discriminator steps"
    )
    p.set_defaults(func=_train)
    p = _debug_flag(sub.add_parser("eval", help="re-evaluate a saved run (metrics.json + figures)"))
    p.add_argument("run_dir")
    p.add_argument("--protocol", choices=("auto", *sorted(PROTOCOL_NAMES)), help="instead of the run's")
    p.add_argument("--eval-samples", type=_int_at_least(20))
    p.add_argument("--device")
    p.set_defaults(func=_eval)
    p = _debug_flag(sub.add_parser("compare", help="table of the metrics of several runs (and their loss curves)"))
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--columns", nargs="+", help="metric keys to show (default: the standard ones present)")
    p.add_argument("--curves", metavar="PNG", help="also draw the runs' loss curves on one figure into this file")
    p.set_defaults(func=_compare)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="qkernels", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_Version, help="show the installed version and exit")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = p.add_subparsers(dest="command", required=True)
    b = _debug_flag(
        sub.add_parser(
            "bench",
            help="time and peak memory of every available backend of every op vs the reference",
            description="Time (min and median of interleaved runs) and peak memory of every available backend of every "
            "op against its baseline and against torch.compile of the reference, on default shapes, on this "
            "machine. It first prints the plan: the cases, the slow ones left out (--all) and roughly how "
            "long the run takes; each case's table follows as it finishes (--save writes the results after "
            "every case, so a stopped run keeps what it measured).",
        )
    )
    b.add_argument(
        "--hotpath",
        action="append",
        help="only this hot path (repeatable): quantize, kde, hessian, "
        "overhead, step (the end-to-end training step of tripod, cliff_vae, qlae, factorqvae; not in the "
        "default run)",
    )
    b.add_argument(
        "--save",
        metavar="DIR",
        help="write the results as CSV and JSON to DIR/<machine>/<date>.csv/.json "
        "(machine, versions, load average, per case and variant: times, IQR, peak memory, launches, "
        "ratios)",
    )
    b.add_argument(
        "--plot",
        metavar="DIR",
        help="draw the results as DIR/<machine>.png (needs matplotlib: pip install 'qkernels[plot]')",
    )
    b.add_argument(
        "--case",
        action="append",
        metavar="REGEX",
        help="only the cases whose name REGEX finds "
        "(re.search; repeatable; slow cases included), e.g. --case 'cliff n=1024' --case 'klm.*bf16$'",
    )
    b.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    b.add_argument(
        "--all",
        action="store_true",
        help="include the slow cases (minutes each; the default run, a few "
        "minutes on 2 cores, leaves them out and names them in the plan it prints first)",
    )
    b.add_argument(
        "--min-time",
        type=_positive_float,
        default=0.5,
        metavar="SECONDS",
        help="timed seconds per variant and case (more: steadier ratios; default 0.5)",
    )
    b.add_argument(
        "--threads", type=_int_at_least(1), help="torch intra-op threads while timing (1: steadier on a busy machine)"
    )
    b.set_defaults(func=_bench)
    _add_train(sub)
    from qkernels.cli_sweep import add_sweep  # light: no torch

    add_sweep(sub, _debug_flag, _int_at_least, _positive_float, UsageError)
    return p


def _exit_now(code: int) -> NoReturn:
    """End this process at once with ``code``: output flushed, every file of the run written and closed (the lock
    released); the interpreter's teardown (freeing torch's state, joining its threads: seconds, many on a loaded
    machine) is skipped, so that the shell prompt, and the resume command just printed, come back at once."""
    import os

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """The ``qkernels`` command; ``argv`` None: this process's command line (the console script, ``python -m
    qkernels``), in which case a training run stopped by a signal ends the process at once (:func:`_exit_now`)
    once it has said how to resume. Returns the exit status."""
    args = parser().parse_args(argv)  # a bad flag: one error line, exit 2 (_Parser)
    try:
        return args.func(args)
    except UsageError as err:
        if args.debug:
            raise
        print(f"qkernels: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        print("qkernels: interrupted", file=sys.stderr)
        code = 128 + getattr(err, "signum", 2)  # 130 for SIGINT, 143 for SIGTERM
        if argv is None and args.func is _train:
            _exit_now(code)
        return code
    except Exception as err:  # noqa: BLE001 - a failed run: one line, the traceback with --debug
        if args.debug:
            raise
        from qkernels._extras import MissingExtraError

        msg = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if isinstance(err, MissingExtraError):  # the feature, what it needs and the extra that installs it
            print(f"qkernels: error: {msg}", file=sys.stderr)
        else:
            print(f"qkernels: error: {type(err).__name__}: {msg} (run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
