"""Summarize saved benchmark results (``qkernels bench --save benchmarks/results``): plots and the summary table.

    python benchmarks/summarize.py                     # PNGs (one per machine, headline.png) into
                                                       # benchmarks/results/plots/, table on stdout
    python benchmarks/summarize.py --markdown          # only the markdown table (the top of RESULTS.md)
    python benchmarks/summarize.py --details           # every case of the latest runs (RESULTS.md's "Latest run")
    python benchmarks/summarize.py RUN.csv DIR ... --plot OUT_DIR

Reads every CSV under the given files / directories (default: benchmarks/results). For each machine and hot
path the latest run that measured it counts (:func:`qkernels.bench.plot.latest`).

The table: one row per op x device. Op: the first word of a case's name (``latent_quantize``, ``cliff``,
``klm``, ...; the step hot path: ``<method> step``), over all its shapes; bf16 cases and the per-call
overhead are left out. Best backend: among qkernels' variants (everything but the baseline, the reference, its
torch.compile and the materialized formulations) the one with the highest geometric-mean speed-up over
``reference_compiled`` across the op's shapes (over the baseline where there is no compiled reference).
Speed-ups are geometric means over shapes, with the range in brackets ("?": in no shape did one side win
over 3/4 of the interleaved rounds); "vs eager" is over the case's baseline
(the eager reference; the Hessian penalty's: ``sequential``, the authors' formulation); memory: the variant's
peak / the baseline's (geometric mean).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qkernels.bench import plot, results
from qkernels.bench.report import memory_text, ratio_text

DEFAULT = Path(__file__).resolve().parent / "results"
# not candidates for "best backend": the baselines, and variants that change the arithmetic ("triton high": TF32
# products, percent-level gradient error in Cliff; the bf16 cases)
NOT_KERNELS = (
    "reference",
    "reference_compiled",
    "materialized",
    "materialized compiled",
    "sequential",
    "none",
    "stacked",
    "add",
    "float32",
    "bf16",
    "plain autocast",
    "triton high",
)


def _op(rec: dict) -> str:
    head = rec["case"].split()[0]
    return f"{head} step" if rec["hotpath"] == "step" else head


def _span(xs: list[float], clear: bool = True) -> str:
    g = plot.geomean(xs)
    if g is None:
        return "-"
    text = ratio_text(g, clear=clear)
    lo, hi = min(xs), max(xs)
    if len(xs) > 1 and ratio_text(lo) != ratio_text(hi):
        text += f" ({lo:.2g}-{hi:.2g}x)"
    return text


def summary_rows(records: list[dict]) -> list[dict]:
    """One row per op x device of ``records`` (:func:`qkernels.bench.results.load`'s), ops in hot-path order:
    ``op``, ``device``, ``best`` (the backend with the highest geometric-mean speed-up over ``reference_compiled``,
    then over the baseline), its per-shape ratios ``vb`` / ``vc`` with ``cb`` / ``cc`` (whether any shape had a clear
    winner), their geometric means ``vs_eager`` / ``vs_compiled``, ``mem`` (memory vs the baseline), ``shapes``,
    ``date``."""
    found: list[tuple] = []  # (hot path's place, op's place, device, row): rows grouped by op, then device
    ops: dict[str, int] = {}
    for _, hotpaths in sorted(plot.latest(records).items()):
        for hotpath in hotpaths:
            if hotpath == "overhead":
                continue
            recs = [
                r
                for r in hotpaths[hotpath]
                if not r.get("error") and r.get("median_s") is not None and r.get("baseline") != "float32"
            ]
            for op in dict.fromkeys(map(_op, recs)):
                mine = [r for r in recs if _op(r) == op]
                kernels = [
                    v
                    for v in dict.fromkeys(r["variant"] for r in mine)
                    if v not in NOT_KERNELS and not any(v == r.get("baseline") for r in mine)
                ]
                if not kernels:
                    continue

                def score(v, mine=mine):
                    rs = [r for r in mine if r["variant"] == v]
                    return (
                        plot.geomean(r["vs_compiled"] for r in rs) or 0,
                        plot.geomean(r["vs_baseline"] for r in rs) or 0,
                    )

                best = max(kernels, key=score)
                rs = [r for r in mine if r["variant"] == best]
                vb = [r["vs_baseline"] for r in rs if r.get("vs_baseline")]
                vc = [r["vs_compiled"] for r in rs if r.get("vs_compiled")]
                first = rs[0]
                place = plot.ORDER.index(hotpath) if hotpath in plot.ORDER else len(plot.ORDER)
                device = first["gpu"] or f"{first['cpu']} ({int(first['cores'])} cores)"
                found.append(
                    (
                        place,
                        ops.setdefault(op, len(ops)),
                        device,
                        {
                            "op": op,
                            "device": device,
                            "best": best,
                            "vb": vb,
                            "vc": vc,
                            # '?': no shape where the variant won or lost in over 3/4 of the interleaved rounds
                            "cb": any(r.get("vs_baseline_clear") for r in rs),
                            "cc": any(r.get("vs_compiled_clear") for r in rs),
                            "vs_eager": plot.geomean(vb),
                            "vs_compiled": plot.geomean(vc),
                            "mem": plot.geomean(r.get("memory_ratio") for r in rs),
                            "shapes": len(rs),
                            "date": first["date"][:10],
                        },
                    )
                )
    return [f[-1] for f in sorted(found, key=lambda f: f[:3])]


def table(records: list[dict]) -> list[str]:
    """The markdown summary table (lines) of ``records`` (:func:`summary_rows`)."""
    lines = [
        "| op | device | best backend | vs eager | vs torch.compile | memory vs eager | shapes | date |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    return lines + [
        f"| {r['op']} | {r['device']} | {r['best']} | {_span(r['vb'], r['cb'])} | "
        f"{_span(r['vc'], r['cc'])} | {memory_text(r['mem'])} | {r['shapes']} | {r['date']} |"
        for r in summary_rows(records)
    ]


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.3g}"


def details(records: list[dict]) -> list[str]:
    """Markdown tables (lines) of every case of the latest run per machine and hot path: one row per variant with
    min / median / IQR time, ratios against the case's baseline and ``reference_compiled``, and peak memory."""
    lines: list[str] = []
    for _, hotpaths in sorted(plot.latest(records).items()):
        for hotpath in sorted(hotpaths, key=lambda h: plot.ORDER.index(h) if h in plot.ORDER else len(plot.ORDER)):
            recs = hotpaths[hotpath]
            first = recs[0]
            device = first["gpu"] or f"{first['cpu']}, {int(first['cores'])} cores"
            when = first["date"][:16].replace("T", " ")
            lines += [
                "",
                f"#### {hotpath} ({device}, {when} UTC, torch {first['torch']}, "
                f"commit {first['qkernels_commit']}, load {first['load_avg']})",
                "",
                "| case | variant | min ms | median ms | IQR % | vs baseline | vs torch.compile | peak MiB |",
                "| --- | --- | ---: | ---: | ---: | --- | --- | ---: |",
            ]
            for case in dict.fromkeys(r["case"] for r in recs):
                label = case
                for r in [r for r in recs if r["case"] == case]:
                    name = f"**{r['variant']}** (baseline)" if r["variant"] == r.get("baseline") else r["variant"]
                    if r.get("error"):
                        lines.append(f"| {label} | {name} | {r['error']} | | | | | |")
                        continue
                    peak = r.get("peak_bytes")
                    vb = ratio_text(r.get("vs_baseline"), clear=bool(r.get("vs_baseline_clear")))
                    vc = ratio_text(r.get("vs_compiled"), clear=bool(r.get("vs_compiled_clear")))
                    lines.append(
                        f"| {label} | {name} | {_ms(r.get('min_s'))} | {_ms(r.get('median_s'))} | "
                        f"{r['iqr_pct']:.0f} | {vb} | {vc} | {'-' if peak is None else f'{peak / 2**20:.1f}'} |"
                    )
                    label = ""  # the case's name once
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", default=[str(DEFAULT)], help="CSV files or directories (default: %(default)s)")
    p.add_argument("--plot", metavar="DIR", help="where the PNGs go (default: <first directory>/plots)")
    p.add_argument("--markdown", action="store_true", help="print only the markdown summary table")
    p.add_argument("--details", action="store_true", help="print only the per-case markdown tables")
    args = p.parse_args(argv)
    records = results.load(args.paths)
    if not records:
        print(f"no qkernels bench results (CSV) under {', '.join(args.paths)}", file=sys.stderr)
        return 1
    print("\n".join(details(records) if args.details else table(records)))
    if not (args.markdown or args.details):
        first = Path(args.paths[0])
        out = Path(args.plot) if args.plot else (first if first.is_dir() else first.parent) / "plots"
        for png in [*plot.plot(records, out), plot.headline(summary_rows(records), out / "headline.png")]:
            print(f"plotted {png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
