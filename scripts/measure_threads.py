#!/usr/bin/env python
"""Training speed of `qkernels train` against its thread count, on this machine idle and loaded.

    .venv/bin/python scripts/measure_threads.py [--steps 30] [--repeats 1] [-- more `qkernels train` flags]

For each condition (idle; loaded = one busy-loop process this script starts, 100% of a core) it trains the main
job (Tripod, shapes3d_procedural, 32x32, the authors' batch; or what the extra flags say) for a few steps with
--threads = all usable cores, cores minus load (the busy cores measured before the condition, rounded, at least
1), 1, and without --threads (the default rule, qkernels/train/threads.py). Speed: the run's closing line,
"it/s after the first step" (warm-up and the final evaluation left out). Prints the machine, `uptime` before each
condition, and a markdown table for benchmarks/HISTORY.md. Several --repeats interleave the settings.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qkernels.train.threads import busy_cores, usable_cores  # noqa: E402


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def train(steps: int, threads: int | None, extra: list[str], out: str) -> tuple[int, float]:
    """(threads the run used, it/s after its first step)."""
    cmd = [
        sys.executable,
        "-m",
        "qkernels",
        "train",
        "--steps",
        str(steps),
        "--eval-samples",
        "20",
        "--out",
        out,
        "--force",
        *extra,
        *(["--threads", str(threads)] if threads else []),
    ]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # the default rule would take it
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=3600)
    used = re.search(r" with (\d+) threads?", r.stderr)
    rate = re.search(r"\(([\d.]+) it/s after the first step\)", r.stderr)
    if r.returncode or not (used and rate):
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return int(used.group(1)), float(rate.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="steps per run (default 30)")
    p.add_argument("--repeats", type=int, default=1, help="runs per setting, interleaved (default 1)")
    p.add_argument("extra", nargs="*", help="more `qkernels train` flags (after --)")
    a = p.parse_args()
    cores = usable_cores()
    print(
        f"machine: {cpu_name()}, {cores} usable cores, {platform.system()} {platform.release()}; python "
        f"{platform.python_version()}; qkernels train --steps {a.steps} {' '.join(a.extra)}",
        flush=True,
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for condition in ("idle", "loaded"):
            hog = None
            if condition == "loaded":
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                time.sleep(2.0)
            try:
                load = busy_cores(1.0)
                up = uptime()
                print(f"\n{condition}: {load:.2f} busy cores measured; {up}", flush=True)
                minus = max(1, cores - int(load + 0.5))
                settings = [("all cores", cores), ("cores - load", minus), ("1", 1), ("default", None)]
                results: dict[str, list[tuple[int, float]]] = {name: [] for name, _ in settings}
                for _ in range(a.repeats):
                    for name, t in settings:
                        used, rate = train(a.steps, t, a.extra, str(Path(tmp) / "run"))
                        results[name].append((used, rate))
                        print(
                            f"  {name:13s} --threads {t or '(none)':<6} -> {used} threads: {rate:.2f} it/s", flush=True
                        )
                for name, _t in settings:
                    rates = sorted(r for _, r in results[name])
                    used = sorted({u for u, _ in results[name]})
                    rows.append(
                        (
                            condition,
                            f"{load:.2f}",
                            up.split("load average:")[-1].strip(),
                            name,
                            "/".join(map(str, used)),
                            rates[len(rates) // 2],
                            rates,
                        )
                    )
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
    print("\n| condition | busy cores | uptime load (1, 5, 15 min) | setting | threads | it/s (median) | runs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for cond, load, up, name, used, med, rates in rows:
        print(f"| {cond} | {load} | {up} | {name} | {used} | {med:.2f} | {', '.join(f'{r:.2f}' for r in rates)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
