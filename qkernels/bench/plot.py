"""Figures of benchmark results: ``qkernels bench --plot DIR`` and ``python benchmarks/summarize.py``.

One PNG per machine (``DIR/<machine>.png``), titled with the machine, its CPU/GPU, the dates and versions; one
row of panels per hot path (for each, the latest run of that machine that measured it): the speed-up of every
variant over the case's baseline (the eager reference, or the hot path's own baseline: ``sequential`` for the
Hessian penalty, ``add`` for the per-call overhead, ``float32`` for bf16 cases), the speed-up over
``reference_compiled`` (torch.compile of the reference), and the peak memory of one run. Horizontal bars, one
group per case (shape), one colour per variant (the same colour in every panel); log scales where the values
span more than a decade; a dashed line at 1x. The ``step`` hot path is the end-to-end training step.

Needs matplotlib (``pip install qkernels[plot]``).
"""

from __future__ import annotations

import math
from pathlib import Path

PANELS = (("vs_baseline", "speed-up over the baseline (x)"), ("vs_compiled", "speed-up over reference_compiled (x)"),
          ("peak_bytes", "peak memory of one run (MiB)"))
ORDER = ("quantize", "kde", "hessian", "step", "overhead")
TITLES = {"quantize": "quantization", "kde": "KDE (Cliff, KLM)", "hessian": "Hessian penalty",
          "step": "end-to-end training step", "overhead": "per-call overhead"}


def _matplotlib():
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'qkernels[plot]' (or matplotlib>=3.7)") from exc
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
    skip = {"vs_baseline": lambda r: r["variant"] == r.get("baseline"),
            "vs_compiled": lambda r: r["variant"] == "reference_compiled"}.get(key, lambda r: False)
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
    cmap = plt.get_cmap("tab20" if len(variants) > 10 else "tab10")
    colours = {v: cmap(i % cmap.N) for i, v in enumerate(variants)}
    heights = [max(2.2, 1.2 + 0.22 * len({r["case"] for r in rows[h]})
                   * min(max(len({r["variant"] for r in rows[h]}), 2), 5)) for h in names]
    fig, axes = plt.subplots(len(names), len(PANELS), figsize=(17, sum(heights) + 1.0), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for axrow, h in zip(axes, names, strict=True):
        for k, (ax, (key, label)) in enumerate(zip(axrow, PANELS, strict=True)):
            _panel(ax, rows[h], key, colours, label)
            if k:
                ax.set_yticklabels([])
        axrow[0].set_title(f"{TITLES.get(h, h)} ({h})", loc="left", fontsize=11, fontweight="bold")
        present = list(dict.fromkeys(r["variant"] for r in rows[h]))
        axrow[-1].legend(handles=[plt.Rectangle((0, 0), 1, 1, color=colours[v]) for v in present], labels=present,
                         fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    first = next(iter(rows[names[0]]))
    dates = sorted({r["date"][:10] for h in names for r in rows[h]})
    loads = [r["load_avg"] for h in names for r in rows[h] if r.get("load_avg") is not None]
    hw = f"{first['cpu']}, {int(first['cores'])} cores" + (f", GPU {first['gpu']}" if first.get("gpu") else "")
    fig.suptitle(f"qkernels bench on {machine}: {hw}\n{' to '.join([dates[0], dates[-1]] if len(dates) > 1 else dates)}"
                 f", torch {first['torch']}, qkernels {first.get('qkernels_commit') or '?'}"
                 + (f", load average {min(loads):.1f}-{max(loads):.1f}" if loads else ""), fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / (sum(heights) + 1.0)))
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
