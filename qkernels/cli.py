"""The ``qkernels`` command (also ``python -m qkernels``)."""

from __future__ import annotations

import argparse
import sys


def _bench(args: argparse.Namespace) -> int:
    from qkernels import bench

    bench.run(tuple(args.hotpath) if args.hotpath else bench.HOTPATHS, memory=not args.no_memory)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qkernels", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("bench", help="time and peak memory of every available backend of every op vs the reference")
    p.add_argument("--hotpath", action="append", help="only this hot path (repeatable)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.set_defaults(func=_bench)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
