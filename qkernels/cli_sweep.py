"""``qkernels sweep``: its command line (built without importing torch, as the rest of :mod:`qkernels.cli`) and
what it runs (:mod:`qkernels.train.sweep`, :mod:`qkernels.train.table`).

A grid file is TOML::

    out = "runs/sweep"
    models = ["tripod", "qlae"]
    datasets = ["shapes3d_procedural"]
    seeds = 3                       # or a list: [0, 1, 2]
    paper = false                   # true: each method's paper settings (qkernels train --paper)

    [base]                          # TrainConfig fields of every cell
    steps = 600

    [settings.low_klm]              # named settings (optional): TrainConfig fields over base
    model_kwargs = { lambda_klm = 1e-5 }

    [run]                           # how it runs (flags win): workers, threads, ray, ray_threads, data_root, retries
    workers = 2

    [table]                         # published, recon_filter_db
    published = true

Flags given on the command line override the file's values.
"""

from __future__ import annotations

import argparse
import sys

EPILOG = """examples:
  qkernels sweep --models tripod qlae --datasets shapes3d_procedural --seeds 3 --set steps=600
  qkernels sweep --config grid.toml --workers 4 --threads 16 --published
  qkernels sweep --config grid.toml --ray auto --ray-threads 8 --data-root /mnt/data"""


def add_sweep(sub, debug_flag, int_at_least, positive_float, usage_error) -> None:
    """Add the ``sweep`` subcommand to ``sub`` (the CLI's helpers passed in: the --debug flag, the int and float
    parsers, its UsageError)."""
    p = debug_flag(
        sub.add_parser(
            "sweep",
            help="train a grid of methods x datasets x seeds in parallel (locally or on Ray) and write each "
            "paper's table",
            description=_wrap(
                "Train every cell of a grid (methods x datasets x seeds, optionally x named settings) as an "
                "ordinary run directory OUT/<dataset>/<method>[@<setting>]/seed<k>, in parallel worker processes "
                "(the cores split between them) or as Ray tasks, then write each paper's table: mean ± std over "
                "seeds per method x dataset in that paper's metrics, with its checkpoint and seed rules, as "
                "OUT/table.md, table.csv, runs.csv and table.png. Running it again skips finished cells and "
                "resumes interrupted ones from their checkpoints; a worker killed by a signal is resumed, one "
                "that fails (bad config, NaN) is reported."
            ),
            epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    p.add_argument(
        "--config",
        metavar="TOML",
        help="the grid as a TOML file (layout: python -m pydoc qkernels.cli_sweep); flags below override it",
    )
    p.add_argument("--models", nargs="+", metavar="M", help="methods (qkernels train --model names)")
    p.add_argument("--datasets", nargs="+", metavar="D", help="datasets (default shapes3d_procedural)")
    p.add_argument(
        "--seeds",
        nargs="+",
        type=int_at_least(0),
        metavar="S",
        help="seeds: one number n for 0..n-1, or several seeds (default 3)",
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        default=[],
        help="a TrainConfig field of every cell (repeatable; VALUE is JSON, else a string), e.g. "
        "--set steps=600 --set eval_samples=2000",
    )
    p.add_argument("--paper", action="store_true", help="each method's paper settings (as qkernels train --paper)")
    p.add_argument("--out", help="the sweep's directory (default runs/sweep)")
    p.add_argument(
        "--workers",
        type=int_at_least(1),
        help="worker processes at once on this machine (default: one per cell, at most --threads)",
    )
    p.add_argument(
        "--threads",
        type=int_at_least(1),
        help="cores for all workers together, split evenly between them (default: the usable cores)",
    )
    p.add_argument(
        "--ray",
        metavar="auto|ADDRESS",
        help="run the cells as tasks of a Ray cluster (pip install 'qkernels[ray]'): auto = the cluster "
        "of `ray start` / RAY_ADDRESS; the run directories must be on a filesystem all nodes see",
    )
    p.add_argument("--ray-threads", type=int_at_least(1), help="CPUs and torch threads per Ray task (default 1)")
    p.add_argument("--data-root", help="where the file datasets are on the workers (their root)")
    p.add_argument("--retries", type=int_at_least(0), help="resumes of a killed worker per cell (default 2)")
    p.add_argument("--force", action="store_true", help="start over the cells whose directory holds another run")
    p.add_argument(
        "--published",
        action="store_true",
        help="put the paper's own numbers beside ours (table and page-free citation of the paper's text)",
    )
    p.add_argument(
        "--recon-filter",
        type=positive_float,
        metavar="DB",
        help="QLAE's 'filtered for near-perfect data reconstruction' as qkernels reads it: average a "
        "QLAE-paper row (ae, qlae) over the seeds whose PSNR reaches DB (default: off)",
    )
    p.set_defaults(func=lambda args: _sweep(args, usage_error))


def _wrap(text: str) -> str:
    import textwrap

    return textwrap.fill(text, 100)


def _value(text: str):
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def _sweep(args: argparse.Namespace, usage_error) -> int:
    from qkernels._extras import require

    require("qkernels sweep", "train", "sklearn", "scipy", "PIL")
    from qkernels.train.sweep import Grid, run_sweep

    try:
        d = Grid.read_toml(args.config) if args.config else {}
    except ValueError as err:
        raise usage_error(f"--config {err}") from None
    run, table = dict(d.pop("run", {})), dict(d.pop("table", {}))
    base = dict(d.get("base", {}))
    for item in args.set:
        key, eq, text = item.partition("=")
        if not eq or not key:
            raise usage_error(f"--set {item}: expected FIELD=VALUE")
        base[key] = _value(text)
    seeds = args.seeds if not args.seeds or len(args.seeds) > 1 else args.seeds[0]
    d.setdefault("datasets", ["shapes3d_procedural"])
    d.setdefault("seeds", 3)
    try:
        grid = Grid.from_dict(
            {**d, "base": base},
            models=args.models,
            datasets=args.datasets,
            seeds=seeds,
            out=args.out,
            paper=True if args.paper else None,
        )
    except ValueError as err:
        raise usage_error(str(err)) from None

    def opt(name, key=None):
        v = getattr(args, name)
        return v if v is not None else run.get(key or name)

    try:
        res = run_sweep(
            grid,
            threads=opt("threads"),
            workers=opt("workers"),
            ray=opt("ray"),
            ray_threads=opt("ray_threads") or 1,
            data_root=opt("data_root"),
            retries=opt("retries") if opt("retries") is not None else 2,
            force=args.force,
            published=args.published or bool(table.get("published")),
            recon_filter_db=args.recon_filter if args.recon_filter is not None else table.get("recon_filter_db"),
        )
    except ValueError as err:
        raise usage_error(str(err)) from None
    if "md" in res.table:
        print(res.table["md"].read_text())
    return 1 if res.failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: qkernels sweep")
