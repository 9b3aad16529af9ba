"""Figures of benchmark results: ``qkernels bench --plot DIR`` and ``python benchmarks/summarize.py``.

One PNG per machine (``DIR/<machine>.png``), titled with the machine, its CPU/GPU, the dates and versions; one
row of panels per hot path (for each, the latest run of that machine that measured it): the speed-up of every
variant over the case's baseline (the eager reference, or the hot path's own baseline: ``sequential`` for the
Hessian penalty, ``add`` for the per-call overhead, ``float32`` for bf16 cases), the speed-up over
``reference_compiled`` (torch.compile of the reference), and the peak memory of one run. Horizontal bars, one
group per case (shape), one colour per variant (:func:`colour`: the same in every panel, figure and run); log scales
where the values span more than a decade; a dashed line at 1x. The ``step`` hot path is the end-to-end training step.
:func:`headline`: the README's one-panel summary (speed-up over eager and over torch.compile per op).

Needs matplotlib (``pip install qkernels[plot]``).
"""

from __future__ import annotations

import math
from pathlib import Path

from qkernels._extras import needs

PANELS = (
    ("vs_baseline", "speed-up over the baseline (x)"),
    ("vs_compiled", "speed-up over reference_compiled (x)"),
    ("peak_bytes", "peak memory of one run (MiB)"),
)
ORDER = ("quantize", "kde", "hessian", "step", "overhead")
TITLES = {
    "quantize": "quantization",
    "kde": "KDE (Cliff, KLM)",
    "hessian": "Hessian penalty",
    "step": "end-to-end training step",
    "overhead": "per-call overhead",
}


# one colour per variant name in every panel, figure and run (tab10 / tab20 colours); other names get one of
# tab20's by a hash of the name, the same in every figure
FIXED_COLOURS = {
    "reference": "#1f77b4",
    "reference_compiled": "#ff7f0e",
    "cpu": "#2ca02c",
    "triton": "#d62728",
    "cuda": "#9467bd",
    "materialized": "#8c564b",
    "materialized compiled": "#e377c2",
    "sequential": "#7f7f7f",
    "auto": "#17becf",
    "auto_compiled": "#bcbd22",
    "reference_compiled_ro": "#ffbb78",
    "auto_compiled_ro": "#dbdb8d",
    "triton high": "#ff9896",
    "add": "#c7c7c7",
    "float32": "#1f77b4",
    "bf16": "#98df8a",
    "plain autocast": "#ff7f0e",
    "none": "#c7c7c7",
    "stacked": "#c49c94",
    "fused": "#17becf",
}
HEADLINE = (("vs eager", "#1f77b4"), ("vs torch.compile", "#ff7f0e"))


def colour(variant: str) -> str:
    """The colour of ``variant`` in every figure (:data:`FIXED_COLOURS`, else a stable pick of tab20's)."""
    if variant in FIXED_COLOURS:
        return FIXED_COLOURS[variant]
    if variant.endswith(" raw"):
        return colour(variant[: -len(" raw")])
    import zlib

    tab20 = (
        "#aec7e8",
        "#ffbb78",
        "#98df8a",
        "#ff9896",
        "#c5b0d5",
        "#c49c94",
        "#f7b6d2",
        "#c7c7c7",
        "#dbdb8d",
        "#9edae5",
    )
    return tab20[zlib.crc32(variant.encode()) % len(tab20)]


def _matplotlib():
    with needs("qkernels bench --plot", "plot"):
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ticker():
    import matplotlib.ticker

    return matplotlib.ticker


def latest(records: list[dict]) -> dict[str, dict[str, list[dict]]]:
    """machine -> hot path -> the records of the latest run (file) of that machine that measured the hot path."""
    out: dict[str, dict[str, list[dict]]] = {}
    by: dict = {}
    for r in records:
        by.setdefault((r["machine"], r["hotpath"]), {}).setdefault((r["date"], r.get("file", "")), []).append(r)
    for (machine, hotpath), runs in by.items():
        out.setdefault(machine, {})[hotpath] = runs[max(runs)]
    return out


def _ok(r: dict) -> bool:
    return not r.get("error") and r.get("median_s") is not None


def _panel(ax, rows: list[dict], key: str, colours: dict, label: str) -> None:
    ticker = _ticker()
    cases = list(dict.fromkeys(r["case"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    skip = {
        "vs_baseline": lambda r: r["variant"] == r.get("baseline"),
        "vs_compiled": lambda r: r["variant"] == "reference_compiled",
    }.get(key, lambda r: False)
    shown = [v for v in variants if any(r["variant"] == v and not skip(r) and r.get(key) for r in rows)]
    height = 0.8 / max(len(shown), 1)
    values = []
    for i, case in enumerate(cases):
        for j, v in enumerate(shown):
            r = next((r for r in rows if r["case"] == case and r["variant"] == v), None)
            x = None if r is None or skip(r) else r.get(key)
            if not x:
                continue
            x = x / 2**20 if key == "peak_bytes" else x
            values.append(x)
            y = i - 0.4 + (j + 0.5) * height
            ax.barh(y, x, height=height, color=colours[v])
            text = f"{x:.3g}" if key == "peak_bytes" else f"{x:.3g}x"
            ax.text(x, y, " " + text, va="center", ha="left", fontsize=6.5)
    ax.set_yticks(range(len(cases)), [c if len(c) <= 44 else c[:43] + "~" for c in cases], fontsize=8)
    ax.set_ylim(len(cases) - 0.5, -0.5)
    ax.set_xlabel(label, fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", alpha=0.3, which="both")
    if not values:
        ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center", va="center", fontsize=9)
        return
    lo, hi = min(values), max(values)
    if key != "peak_bytes":
        lo, hi = min(lo, 1.0), max(hi, 1.0)
        ax.axvline(1.0, color="k", lw=0.8, ls="--")
    if hi / max(lo, 1e-12) > 10:
        ax.set_xscale("log")
        ax.set_xlim(lo / 1.5, hi * 4)  # room for the labels
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}" + ("" if key == "peak_bytes" else "x")))
    else:
        ax.set_xlim(0, hi * 1.25)


def figure(machine: str, hotpaths: dict[str, list[dict]], path: str | Path) -> Path:
    """Draw one machine's figure (``hotpaths``: hot path -> records, as :func:`latest` gives) into ``path``."""
    plt = _matplotlib()
    names = sorted(hotpaths, key=lambda h: (ORDER.index(h) if h in ORDER else len(ORDER), h))
    rows = {h: [r for r in hotpaths[h] if _ok(r)] for h in names}
    names = [h for h in names if rows[h]]
    if not names:
        raise ValueError(f"no successful measurements of {machine} to plot")
    variants = list(dict.fromkeys(r["variant"] for h in names for r in rows[h]))
    colours = {v: colour(v) for v in variants}
    heights = [
        max(2.2, 1.2 + 0.22 * len({r["case"] for r in rows[h]}) * min(max(len({r["variant"] for r in rows[h]}), 2), 5))
        for h in names
    ]
    fig, axes = plt.subplots(
        len(names), len(PANELS), figsize=(17, sum(heights) + 1.0), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    for axrow, h in zip(axes, names, strict=True):
        for k, (ax, (key, label)) in enumerate(zip(axrow, PANELS, strict=True)):
            _panel(ax, rows[h], key, colours, label)
            if k:
                ax.set_yticklabels([])
        axrow[0].set_title(f"{TITLES.get(h, h)} ({h})", loc="left", fontsize=11, fontweight="bold")
        present = list(dict.fromkeys(r["variant"] for r in rows[h]))
        axrow[-1].legend(
            handles=[plt.Rectangle((0, 0), 1, 1, color=colours[v]) for v in present],
            labels=present,
            fontsize=8,
            loc="center left",
            bbox_to_anchor=(1.01, 0.5),
            frameon=False,
        )
    first = next(iter(rows[names[0]]))
    dates = sorted({r["date"][:10] for h in names for r in rows[h]})
    loads = [r["load_avg"] for h in names for r in rows[h] if r.get("load_avg") is not None]
    hw = f"{first['cpu']}, {int(first['cores'])} cores" + (f", GPU {first['gpu']}" if first.get("gpu") else "")
    fig.suptitle(
        f"qkernels bench on {machine}: {hw}\n{' to '.join([dates[0], dates[-1]] if len(dates) > 1 else dates)}"
        f", torch {first['torch']}, qkernels {first.get('qkernels_commit') or '?'}"
        + (f", load average measured by the runs {min(loads):.1f}-{max(loads):.1f}" if loads else ""),
        fontsize=12,
    )
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / (sum(heights) + 1.0)))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def headline(rows: list[dict], path: str | Path) -> Path:
    """The README's figure: one panel, per op and device (``rows``: ``op``, ``device``, ``best``, and the geometric
    means ``vs_eager`` / ``vs_compiled`` of the best backend, as benchmarks/summarize.py computes them) the speed-up
    over the eager reference and over torch.compile of it; log scale, a dashed line at 1x (left of it: slower)."""
    plt = _matplotlib()
    ticker = _ticker()
    rows = [r for r in rows if r.get("vs_eager") or r.get("vs_compiled")]
    if not rows:
        raise ValueError("no summary rows to plot")
    fig, ax = plt.subplots(figsize=(8.0, 1.2 + 0.42 * len(rows)))
    values, labelled = [], set()
    for i, r in enumerate(rows):
        for j, ((label, col), key) in enumerate(zip(HEADLINE, ("vs_eager", "vs_compiled"), strict=True)):
            x = r.get(key)
            if not x:
                continue
            values.append(x)
            y = i - 0.2 + 0.4 * j
            ax.barh(y, x, height=0.38, color=col, label=None if label in labelled else label)
            labelled.add(label)
            ax.text(x, y, f" {x:.2g}x", va="center", ha="left", fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{r['op']} ({r['best']}), {r['device']}" for r in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xscale("log")
    lo, hi = min([*values, 1.0]), max([*values, 1.0])
    ax.set_xlim(lo / 1.6, hi * 3)
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.axvline(1.0, color="k", lw=0.8, ls="--")
    ax.grid(axis="x", alpha=0.3, which="both")
    ax.set_xlabel("speed-up of the best backend, fwd + bwd (geometric mean over shapes; < 1x: slower)", fontsize=8)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("qkernels per op: faster than eager PyTorch and than torch.compile of it?", fontsize=10, loc="left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(records: list[dict], directory: str | Path) -> list[Path]:
    """One PNG per machine of ``records`` (:func:`qkernels.bench.results.load`'s): ``directory/<machine>.png``."""
    return [figure(m, hp, Path(directory) / f"{m}.png") for m, hp in sorted(latest(records).items())]


def geomean(xs) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None
