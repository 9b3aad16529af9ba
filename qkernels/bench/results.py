"""Machine-readable benchmark results: ``qkernels bench --save DIR``.

A run writes ``DIR/<machine>/<date>.csv`` and ``.json`` (``<machine>``: :func:`machine_slug`, e.g.
``nvidia-h100-80gb-hbm3`` or ``amd-epyc-2c``; ``<date>``: UTC ``YYYY-MM-DDTHHMMSSZ``, so runs of one day do not
overwrite each other). ``benchmarks/results/`` keeps the runs that benchmarks/RESULTS.md quotes; ``python
benchmarks/summarize.py`` reads them.

CSV: one row per (case, variant), every row carrying the machine and versions (:data:`MACHINE_FIELDS`), so
files concatenate; then :data:`ROW_FIELDS`. Times in seconds; ``iqr_pct``: interquartile range, % of the median;
``vs_baseline`` / ``vs_compiled``: baseline (the case's ``baseline``) / variant and ``reference_compiled`` /
variant, medians of per-round ratios (> 1: the variant is faster); ``memory_ratio``: variant peak / baseline
peak; ``launches``: GPU kernel launches of one run where counted; ``error``: a variant that failed. JSON:
``{"machine": {...}, "rows": [...]}`` with the same fields.
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import re
import subprocess
from pathlib import Path

import torch

MACHINE_FIELDS = (
    "date",
    "machine",
    "cpu",
    "cores",
    "threads",
    "gpu",
    "gpu_driver",
    "torch",
    "triton",
    "qkernels_commit",
    "load_avg",
)
ROW_FIELDS = (
    "hotpath",
    "case",
    "variant",
    "baseline",
    "min_s",
    "median_s",
    "q1_s",
    "q3_s",
    "iqr_pct",
    "rounds",
    "vs_baseline",
    "vs_baseline_clear",
    "vs_compiled",
    "vs_compiled_clear",
    "peak_bytes",
    "memory_ratio",
    "launches",
    "error",
)
FIELDS = MACHINE_FIELDS + ROW_FIELDS


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _gpu_driver() -> str:
    try:
        res = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _commit() -> str:
    root = Path(__file__).resolve().parents[2]
    try:
        res = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=20
        )
        if res.returncode != 0:
            return ""
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
        return res.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def slug(text: str) -> str:
    text = re.sub(r"\((r|tm)\)|cpu @.*|processor|\d+-core", " ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")


def machine_info(load_avg: float | None = None) -> dict:
    """The machine and versions of this process (:data:`MACHINE_FIELDS`); ``load_avg``: the 1-minute load
    average to record (default: now)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = ""
    if load_avg is None:
        try:
            load_avg = os.getloadavg()[0]
        except (OSError, AttributeError):
            load_avg = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    cpu, cores = cpu_model(), os.cpu_count() or 1
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_slug(cpu, cores, gpu),
        "cpu": cpu,
        "cores": cores,
        "threads": torch.get_num_threads(),
        "gpu": gpu,
        "gpu_driver": _gpu_driver() if gpu else "",
        "torch": torch.__version__,
        "triton": triton_version,
        "qkernels_commit": _commit(),
        "load_avg": None if load_avg is None else round(load_avg, 2),
    }


def machine_slug(cpu: str, cores: int, gpu: str = "") -> str:
    """A file-name-safe machine name: the GPU's (``nvidia-h100-80gb-hbm3``) or the CPU's with its core count
    (``amd-epyc-2c``)."""
    return slug(gpu) if gpu else f"{slug(cpu)}-{cores}c"


def _iqr_pct(row: dict) -> float | None:
    q1, q3, med = row.get("q1_s"), row.get("q3_s"), row.get("median_s")
    return None if q1 is None or q3 is None or not med else 100 * (q3 - q1) / med


def records(rows: list[dict], info: dict) -> list[dict]:
    """``rows`` (:func:`qkernels.bench.run`'s) as flat records of :data:`FIELDS`."""
    out = []
    for row in rows:
        rec = {**info, **{k: row.get(k) for k in ROW_FIELDS}}
        rec["iqr_pct"] = _iqr_pct(row)
        out.append(rec)
    return out


def save(rows: list[dict], directory: str | os.PathLike, info: dict | None = None) -> Path:
    """Write ``rows`` to ``directory/<machine>/<date>.csv`` and ``.json``; returns the CSV's path."""
    info = info or machine_info()
    stamp = info["date"].replace(":", "")
    folder = Path(directory) / info["machine"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stamp}.csv"
    recs = records(rows, info)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for rec in recs:
            w.writerow({k: "" if v is None else v for k, v in rec.items()})
    path.with_suffix(".json").write_text(
        json.dumps({"machine": info, "rows": [{k: rec[k] for k in ROW_FIELDS} for rec in recs]}, indent=1) + "\n"
    )
    return path


_NUMERIC = {
    "cores",
    "threads",
    "load_avg",
    "min_s",
    "median_s",
    "q1_s",
    "q3_s",
    "iqr_pct",
    "rounds",
    "vs_baseline",
    "vs_compiled",
    "peak_bytes",
    "memory_ratio",
    "launches",
}


def load(paths) -> list[dict]:
    """The records of CSV files (or of every ``*.csv`` under directories) written by :func:`save`, numbers
    parsed (empty: None; ``*_clear``: bool)."""
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.rglob("*.csv")) if p.is_dir() else [p]
    out = []
    for path in files:
        with open(path, newline="") as f:
            for rec in csv.DictReader(f):
                if set(FIELDS) - set(rec):
                    break  # not a qkernels bench file
                for k, v in rec.items():
                    if k in _NUMERIC:
                        rec[k] = None if v in ("", None) else float(v)
                    elif k.endswith("_clear"):
                        rec[k] = v == "True"
                rec["file"] = str(path)
                out.append(rec)
    return out
