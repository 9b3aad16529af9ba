"""Each paper's table from a set of runs: mean ± std over seeds per method x dataset, in the paper's metrics and
scale, with its checkpoint rule and seed rule applied; Markdown, CSV and a figure (``qkernels sweep``).

A run contributes the metrics of the checkpoint its rule reported (``metrics.json``'s ``"selected"`` where the run
chose one, Tripod's PSNR filter + best InfoM, else its top level: :mod:`qkernels.train.selection`). Rows are grouped
by the paper of the method (:data:`qkernels.train.paper.METHOD_PAPER`; the dlib baselines under "dlib"), then by
dataset, method and named setting. Seed rules (:func:`seed_rule`):

- ``"cliff"`` (Cliff App. F.4, its rows by default): "Each set of hyperparameters is run for 10 seeds, and the best
  seed is selected based on the D score. Then, the mean and standard error are computed for the selected set of
  hyperparameters": among a method and dataset's settings the one whose best seed has the highest D is reported (as
  the mean over its seeds; the best seed is named), the others are left out of the table (kept in the CSV's
  ``runs`` file).
- ``recon_filter_db`` (QLAE, "all AEs are filtered for near-perfect data reconstruction"; the project's reading, off
  unless given, docs/methods.md): a QLAE-paper row (``ae``, ``qlae``) averages only the runs whose ``recon.psnr``
  reaches that many dB.
- otherwise every seed.

``std`` is the sample standard deviation (n - 1) over the seeds reported, ``se`` = std / sqrt(n) (the Cliff paper's
spread); one seed: std and se are NaN.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from qkernels.train.paper import METHOD_PAPER, PAPER_NAMES


@dataclass(frozen=True)
class PaperTable:
    """One paper's table shape: ``columns`` (label, metric key, scale) per dataset kind, the spread it prints,
    its seed rule, and where it stands (table numbers; the stored text's file)."""

    key: str
    title: str
    columns: tuple[tuple[str, str, float], ...]
    spread: str
    seed_rule: str = "all"
    special: dict = field(default_factory=dict)  # dataset -> columns, where a dataset has its own

    def columns_for(self, dataset: str) -> tuple[tuple[str, str, float], ...]:
        return self.special.get(dataset, self.columns)


_DCI = (("D", "dci.disentanglement", 1.0), ("C", "dci.completeness", 1.0), ("I", "dci.informativeness", 1.0))
TABLES: dict[str, PaperTable] = {
    "qlae": PaperTable(
        "qlae",
        PAPER_NAMES["qlae"] + ", App. E, Tables 12-15",
        (
            ("InfoM", "infomec.infom", 1.0),
            ("InfoE", "infomec.infoe", 1.0),
            ("InfoC", "infomec.infoc", 1.0),
            ("D", "dci.disentanglement", 1.0),
            ("I", "dci.informativeness", 1.0),
            ("C", "dci.completeness", 1.0),
            ("PSNR (dB)", "recon.psnr", 1.0),
        ),
        "95% CI",
    ),
    "tripod": PaperTable(
        "tripod",
        PAPER_NAMES["tripod"] + ", Table 1",
        (("InfoM", "infomec.infom", 1.0), ("InfoC", "infomec.infoc", 1.0), ("InfoE", "infomec.infoe", 1.0), *_DCI),
        "none",
    ),
    "factorqvae": PaperTable(
        "factorqvae",
        PAPER_NAMES["factorqvae"] + ", Table 1",
        (
            ("D", "dci.disentanglement", 1.0),
            ("I", "dci.informativeness", 1.0),
            ("C", "dci.completeness", 1.0),
            ("InfoM", "infomec.infom", 1.0),
            ("InfoE", "infomec.infoe", 1.0),
            ("InfoC", "infomec.infoc", 1.0),
            ("MSE x 1e4", "recon.mse", 1e4),
        ),
        "none",
    ),
    "dvae": PaperTable(
        "dvae", PAPER_NAMES["dvae"] + " (disentanglement_lib's metrics)", (("MIG", "mig.mig", 1.0), *_DCI), "quantiles"
    ),
    "cliff": PaperTable(
        "cliff",
        PAPER_NAMES["cliff"] + ", Tables 2 and 3",
        (
            ("D", "dci.disentanglement", 100.0),
            ("C", "dci.completeness", 100.0),
            ("I", "dci.informativeness", 100.0),
            ("MIG", "mig.mig", 100.0),
        ),
        "standard error",
        seed_rule="cliff",
        special={"balls": (("MCC (Spearman)", "mcc.spearman", 100.0),), "quantized_grid2d": (("MCC", "mcc.mcc", 1.0),)},
    ),
    "dlib": PaperTable(
        "dlib", "disentanglement_lib baselines (Locatello et al., 2019)", (("MIG", "mig.mig", 1.0), *_DCI), "none"
    ),
}
SEED_RULES = ("all", "cliff")


def paper_of(method: str) -> str:
    return METHOD_PAPER.get(method, "dlib")


@dataclass
class Run:
    """One run's row of the ``runs`` CSV: where it is, what it is, and the metrics its checkpoint rule reported."""

    dir: str
    model: str
    dataset: str
    setting: str
    seed: int
    step: int
    checkpoint: dict
    metrics: dict


def load_run_result(run_dir: str | Path, setting: str = "") -> Run:
    """The reported metrics of a finished run (``metrics.json``; ``"selected"`` when its rule chose a checkpoint).
    FileNotFoundError when it has none."""
    run_dir = Path(run_dir)
    res = json.loads((run_dir / "metrics.json").read_text())
    cfg = json.loads((run_dir / "config.json").read_text())
    sel = res.get("selection") or {"rule": "final", "step": res.get("step"), "fallback": False}
    chosen = res.get("selected") or res
    metrics = {
        k: float(v)
        for k, v in chosen.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
    }
    return Run(str(run_dir), cfg["model"], cfg["dataset"], setting, int(cfg["seed"]), int(sel["step"]), sel, metrics)


def mean_std_se(values: list[float]) -> tuple[float, float, float]:
    """Mean, sample std (n - 1) and standard error of ``values`` (NaN spreads for one value, all NaN for none)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    m = sum(values) / n
    if n == 1:
        return m, math.nan, math.nan
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return m, sd, sd / math.sqrt(n)


@dataclass
class Row:
    paper: str
    dataset: str
    method: str
    setting: str
    runs: list[Run]
    used: list[Run]
    note: str = ""

    def stats(self, key: str, scale: float = 1.0) -> tuple[float, float, float]:
        vals = [r.metrics[key] * scale for r in self.used if key in r.metrics]
        return mean_std_se(vals)


def seed_rule(rows: list[Row], rule: str) -> list[Row]:
    """``rule`` over the rows of one method and dataset (one per setting): ``"all"`` keeps them; ``"cliff"`` keeps the
    setting whose best seed has the highest ``dci.disentanglement`` (module docstring)."""
    if rule not in SEED_RULES:
        raise ValueError(f"seed rule must be one of {SEED_RULES}, got {rule!r}")
    if rule == "all":
        return rows
    scored = []
    for row in rows:
        ds = [(r.metrics.get("dci.disentanglement", -math.inf), -r.seed, r) for r in row.used]
        ds = [d for d in ds if not math.isnan(d[0])]
        if ds:
            best = max(ds, key=lambda t: (t[0], t[1]))
            scored.append((best[0], row, best[2]))
    if not scored:
        for row in rows:
            row.note = (row.note + "; " if row.note else "") + "cliff seed rule: no D score, every setting kept"
        return rows
    d, row, best = max(scored, key=lambda t: t[0])
    of = f" of {len(rows)} settings" if len(rows) > 1 else ""
    row.note = (row.note + "; " if row.note else "") + f"best seed by D: {best.seed} (D {d:.3f}){of}"
    return [row]


def build_rows(runs: list[Run], *, recon_filter_db: float | None = None, seed_rules: dict | None = None) -> list[Row]:
    """Rows in table order (paper, dataset, method, setting as first seen) with the rules applied.
    ``seed_rules``: paper -> rule, over each table's default."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault((paper_of(r.model), r.dataset, r.model, r.setting), []).append(r)
    rows = []
    for (paper, dataset, method, setting), rs in groups.items():
        rs = sorted(rs, key=lambda r: r.seed)
        used, note = rs, ""
        if recon_filter_db is not None and paper == "qlae":
            used = [r for r in rs if r.metrics.get("recon.psnr", -math.inf) >= recon_filter_db]
            note = f"{len(used)} of {len(rs)} seeds at >= {recon_filter_db:g} dB (recon filter)"
        rows.append(Row(paper, dataset, method, setting, rs, used, note))
    out: list[Row] = []
    order = list(TABLES)
    by = {}
    for row in rows:
        by.setdefault((row.paper, row.dataset, row.method), []).append(row)
    for (paper, _, _), rs in sorted(by.items(), key=lambda kv: order.index(kv[0][0])):
        rule = (seed_rules or {}).get(paper, TABLES[paper].seed_rule)
        out.extend(seed_rule(rs, rule))
    return out


def checkpoint_cell(row: Row) -> str:
    sels = [r.checkpoint for r in row.used]
    if not sels or all(s.get("rule") == "final" for s in sels):
        return "final"
    steps = ", ".join(str(s["step"]) for s in sels)
    passed = ", ".join(f"{s.get('passed', '?')}/{s.get('evaluated', '?')}" for s in sels)
    fb = sum(bool(s.get("fallback")) for s in sels)
    tail = f"; {fb} fell back to the final step" if fb else ""
    return f"{sels[0]['rule']}: steps {steps}; >= {sels[0].get('threshold_db', '?')} dB: {passed}{tail}"


def _cell(m: float, sd: float, digits: int) -> str:
    if math.isnan(m):
        return "-"
    return f"{m:.{digits}f}" if math.isnan(sd) else f"{m:.{digits}f} ± {sd:.{digits}f}"


def _digits(scale: float, label: str) -> int:
    return 1 if "PSNR" in label or "MSE" in label else (2 if scale >= 100 else 3)


def markdown(rows: list[Row], *, published: bool = False) -> str:
    """One Markdown table per paper and dataset kind: mean ± std over the seeds reported (``-``: not measured)."""
    from qkernels.train.published import published as published_of

    parts = []
    for paper in TABLES:
        prow = [r for r in rows if r.paper == paper]
        if not prow:
            continue
        t = TABLES[paper]
        for cols in dict.fromkeys(t.columns_for(r.dataset) for r in prow):
            rs = [r for r in prow if t.columns_for(r.dataset) == cols]
            parts.append(f"### {t.title}" + ("" if cols == t.columns else f" ({', '.join(c for c, _, _ in cols)})"))
            head = ["dataset", "method", "seeds", *(c for c, _, _ in cols), "checkpoint", "notes"]
            lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for r in rs:
                name = r.method + (f" @{r.setting}" if r.setting else "")
                cells = [_cell(*r.stats(k, s)[:2], _digits(s, c)) for c, k, s in cols]
                lines.append(
                    f"| {r.dataset} | {name} | {len(r.used)} | "
                    + " | ".join(cells)
                    + f" | {checkpoint_cell(r)} | {r.note} |"
                )
                pub = published_of(paper, r.method, r.dataset) if published else None
                if pub:
                    vals = []
                    for _, k, _ in cols:
                        v = pub["values"].get(k)
                        vals.append("-" if v is None else f"{v[0]:g} ± {v[1]:g}" if isinstance(v, tuple) else f"{v:g}")
                    spread = "" if pub["spread"] == "none" else f"; ± {pub['spread']}"
                    lines.append(
                        f"| {r.dataset} | {r.method} (published) | | "
                        + " | ".join(vals)
                        + f" | | {pub['source']}{spread} |"
                    )
            spread = {
                "none": "means only",
                "95% CI": "mean ± 95% CI",
                "standard error": "mean ± standard error",
                "quantiles": "quantiles",
            }[t.spread]
            parts.append("\n".join(lines) + f"\n\nOurs: mean ± std over the seeds reported; the paper prints {spread}.")
    return "\n\n".join(parts) + "\n"


def write_csv(rows: list[Row], path: str | Path, *, published: bool = False) -> Path:
    """One line per row: the rules' outcome and, per metric of its table, mean, std and se on the paper's scale
    (full precision; ``published``: also the paper's value and spread)."""
    from qkernels.train.published import published as published_of

    path = Path(path)
    keys = list(
        dict.fromkeys(k for t in TABLES.values() for cols in (t.columns, *t.special.values()) for _, k, _ in cols)
    )
    head = ["paper", "dataset", "method", "setting", "seeds", "seeds_reported", "checkpoint", "notes"]
    for k in keys:
        head += [f"{k}_mean", f"{k}_std", f"{k}_se"] + (
            [f"{k}_published", f"{k}_published_spread"] if published else []
        )
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(head)
        for r in rows:
            t = TABLES[r.paper]
            scale = {k: s for _, k, s in t.columns_for(r.dataset)}
            pub = published_of(r.paper, r.method, r.dataset) if published else None
            line = [r.paper, r.dataset, r.method, r.setting, len(r.runs), len(r.used), checkpoint_cell(r), r.note]
            for k in keys:
                line += [repr(v) for v in r.stats(k, scale.get(k, 1.0))]
                if published:
                    v = (pub or {}).get("values", {}).get(k)
                    line += ["", ""] if v is None else ([v[0], v[1]] if isinstance(v, tuple) else [v, ""])
            w.writerow(line)
    return path


def write_runs_csv(runs: list[Run], path: str | Path) -> Path:
    """Every run's reported metrics (unscaled), one line each."""
    path = Path(path)
    keys = sorted({k for r in runs for k in r.metrics})
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["dataset", "method", "setting", "seed", "step", "rule", "dir", *keys])
        for r in runs:
            w.writerow(
                [
                    r.dataset,
                    r.model,
                    r.setting,
                    r.seed,
                    r.step,
                    r.checkpoint.get("rule"),
                    r.dir,
                    *(repr(r.metrics[k]) if k in r.metrics else "" for k in keys),
                ]
            )
    return path


def figure(rows: list[Row], path: str | Path, *, published: bool = False) -> Path | None:
    """Bars of mean ± std per table column and row (published values as black crosses); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from qkernels.train.published import published as published_of

    panels = []
    for paper in TABLES:
        prow = [r for r in rows if r.paper == paper]
        for cols in dict.fromkeys(TABLES[paper].columns_for(r.dataset) for r in prow):
            panels.append((paper, cols, [r for r in prow if TABLES[paper].columns_for(r.dataset) == cols]))
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)), squeeze=False)
    for ax, (paper, cols, rs) in zip(axes[:, 0], panels, strict=True):
        width = 0.8 / max(len(rs), 1)
        for i, r in enumerate(rs):
            stats = [r.stats(k, s) for _, k, s in cols]
            xs = [j + (i - (len(rs) - 1) / 2) * width for j in range(len(cols))]
            ax.bar(
                xs,
                [0 if math.isnan(m) else m for m, _, _ in stats],
                width,
                yerr=[0 if math.isnan(sd) else sd for _, sd, _ in stats],
                capsize=2,
                label=f"{r.method}{'@' + r.setting if r.setting else ''} / {r.dataset}",
            )
            pub = published_of(paper, r.method, r.dataset) if published else None
            if pub:
                for x, (_, k, _) in zip(xs, cols, strict=True):
                    v = pub["values"].get(k)
                    if v is not None:
                        ax.plot(x, v[0] if isinstance(v, tuple) else v, "kx")
        ax.set_xticks(range(len(cols)), [c for c, _, _ in cols])
        ax.set_title(TABLES[paper].title, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_table(
    runs: list[Run],
    out: str | Path,
    *,
    published: bool = False,
    recon_filter_db: float | None = None,
    seed_rules: dict | None = None,
) -> dict[str, Path]:
    """``table.md``, ``table.csv``, ``runs.csv`` and ``table.png`` (with matplotlib) in ``out`` -> their paths."""
    out = Path(out)
    rows = build_rows(runs, recon_filter_db=recon_filter_db, seed_rules=seed_rules)
    paths = {"md": out / "table.md", "csv": out / "table.csv", "runs": out / "runs.csv"}
    paths["md"].write_text(markdown(rows, published=published))
    write_csv(rows, paths["csv"], published=published)
    write_runs_csv(runs, paths["runs"])
    png = figure(rows, out / "table.png", published=published)
    if png is not None:
        paths["png"] = png
    return paths
