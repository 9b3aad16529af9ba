"""The ``qkernels`` command (also ``python -m qkernels``)."""

from __future__ import annotations

import argparse
import sys


def _bench(args: argparse.Namespace) -> int:
    from qkernels import bench

    bench.run(
        tuple(args.hotpath) if args.hotpath else bench.HOTPATHS, memory=not args.no_memory, include_slow=args.all
    )
    return 0


def _train(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from qkernels.train import TrainConfig, train
    from qkernels.train.run import CONFIG

    out = args.out or f"runs/{args.model or 'tripod'}"
    if args.resume and (Path(out) / CONFIG).is_file():
        cfg = TrainConfig.load(Path(out) / CONFIG)  # the run's own settings; only --steps/--device may change
        if args.steps is not None:
            cfg.steps = args.steps
        if args.device is not None:
            cfg.device = args.device
    else:
        base = TrainConfig.load(args.config).to_dict() if args.config else {}
        flags = {"model": args.model, "dataset": args.dataset, "steps": args.steps, "batch_size": args.batch_size,
                 "seed": args.seed, "eval_samples": args.eval_samples, "device": args.device, "lr": args.lr,
                 "arch": args.arch, "image_size": args.image_size, "num_latents": args.num_latents,
                 "eval_every": args.eval_every}
        base.update({k: v for k, v in flags.items() if v is not None})
        if args.compile:
            base["compile"] = True
        if args.amp:
            base["amp"] = True
        base["out"] = args.out or base.get("out") or f"runs/{base.get('model', 'tripod')}"
        cfg = TrainConfig.from_dict(base)
    res = train(cfg, resume=args.resume)
    print(json.dumps({k: v for k, v in res.items() if not isinstance(v, (list, dict))}, indent=1))
    print(f"run directory: {cfg.out}")
    return 0


def _eval(args: argparse.Namespace) -> int:
    import json

    from qkernels.train import eval_run

    res = eval_run(args.run_dir, num_samples=args.eval_samples, device=args.device or "cpu")
    print(json.dumps({k: v for k, v in res.items() if not isinstance(v, (list, dict))}, indent=1))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from qkernels.train import compare_runs

    print(compare_runs(args.run_dirs, columns=args.columns))
    return 0


def _add_train(sub) -> None:
    from qkernels.models.registry import METHODS

    p = sub.add_parser("train", help="train a model (default: a small Tripod on shapes3d_procedural, ~10 min CPU)")
    p.add_argument("--model", choices=sorted(METHODS), help="method (default tripod)")
    p.add_argument("--dataset", help="dataset name for qkernels.data.load_dataset (default shapes3d_procedural)")
    p.add_argument("--steps", type=int, help="optimizer steps")
    p.add_argument("--out", help="run directory (default runs/<model>)")
    p.add_argument("--batch-size", type=int, help="batch size (default: the authors' for the method)")
    p.add_argument("--seed", type=int)
    p.add_argument("--lr", type=float, help="learning rate (default: the authors' for the method)")
    p.add_argument("--arch", choices=("small", "paper"), help="network widths (default small)")
    p.add_argument("--image-size", type=int, help="procedural image size (default 32)")
    p.add_argument("--num-latents", type=int)
    p.add_argument("--eval-samples", type=int, help="samples for the metrics")
    p.add_argument("--eval-every", type=int, help="evaluate every N steps (0: at the end only)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--device", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--config", help="JSON file of TrainConfig fields (flags override it)")
    p.add_argument("--compile", action="store_true", help="torch.compile the encoder and decoder")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast on CUDA")
    p.set_defaults(func=_train)
    p = sub.add_parser("eval", help="re-evaluate a saved run (metrics.json + figures)")
    p.add_argument("run_dir")
    p.add_argument("--eval-samples", type=int)
    p.add_argument("--device")
    p.set_defaults(func=_eval)
    p = sub.add_parser("compare", help="table of the metrics of several runs")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--columns", nargs="+", help="metric keys to show (default: the standard ones present)")
    p.set_defaults(func=_compare)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qkernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bench", help="time and peak memory of every available backend of every op vs the reference")
    p.add_argument("--hotpath", action="append", help="only this hot path (repeatable)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--all", action="store_true", help="include the slow cases (minutes each)")
    p.set_defaults(func=_bench)
    _add_train(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
