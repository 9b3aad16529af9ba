"""How many torch intra-op threads a training process uses (``qkernels train --threads``, ``TrainConfig.threads``).

torch starts one thread per core. When another job keeps a core busy, every parallel region waits for the thread
that shares a core with it, and a step slows 3-20x (measured: benchmarks/HISTORY.md, "Training threads"; README:
a run on 2 cores kept busy from before its start). So the default (:func:`auto_threads`) is decided at the start
from what the machine shows:

- ``OMP_NUM_THREADS`` set (by the user, or by ``torchrun`` for several processes per machine): that number;
- else the usable cores (the process's CPU affinity, capped by a cgroup CPU quota) that other processes do not keep
  busy at the start (measured over half a second from ``/proc/stat``; ``os.getloadavg()`` where there is none),
  divided among the training processes of this machine (``LOCAL_WORLD_SIZE``), at least 1.

The count changes float summation order, hence the bits of a run, and with this default it depends on the load when
the run starts: it is printed, with the reason, in the run's first line and recorded in ``config.json``;
``--resume`` keeps the recorded count (bit-for-bit resume) unless ``--threads`` is given, and ``--threads N`` (or
``OMP_NUM_THREADS``) gives the same run on a busy and on an idle machine.
"""

from __future__ import annotations

import math
import os
import time


def _affinity() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def cpu_quota() -> float | None:
    """CPUs this process's cgroup may use (a fraction; None: no quota, or unknown)."""
    try:  # cgroup v2: "<quota> <period>" or "max <period>"
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int(open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read())
        period = int(open("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read())
        return None if quota <= 0 or period <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity, capped by a cgroup quota (rounded up)."""
    n = len(_affinity())
    quota = cpu_quota()
    return max(1, min(n, math.ceil(quota))) if quota else max(1, n)


def _cpu_times(cpus: set[int]) -> dict[int, tuple[int, int]]:
    """cpu -> (busy, total) jiffies from /proc/stat (busy: all but idle and iowait; steal counts as busy)."""
    out = {}
    with open("/proc/stat") as fh:
        for line in fh:
            name, *vals = line.split()
            if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus):
                continue
            v = [int(x) for x in vals[:8]]  # user nice system idle iowait irq softirq steal (guest is in user)
            total = sum(v)
            out[int(name[3:])] = (total - v[3] - v[4], total)
    return out


def busy_cores(interval: float = 0.5) -> float:
    """Cores of this process's affinity that other processes keep busy, averaged over ``interval`` seconds
    (this process sleeps meanwhile). Without /proc/stat: the 1-minute load average, capped at the cores."""
    cpus = set(_affinity())
    try:
        a = _cpu_times(cpus)
        time.sleep(interval)
        b = _cpu_times(cpus)
    except (OSError, ValueError):
        a = b = {}
    if not a:
        try:
            return min(float(os.getloadavg()[0]), float(len(cpus)))
        except (AttributeError, OSError):
            return 0.0
    busy = 0.0
    for c, (busy0, total0) in a.items():
        if c in b and b[c][1] > total0:
            busy += (b[c][0] - busy0) / (b[c][1] - total0)
    return busy


def auto_threads(*, interval: float = 0.5) -> tuple[int, str]:
    """(threads, why) for a run started now: see the module docstring."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return int(env), "OMP_NUM_THREADS"
    cores = usable_cores()
    local = os.environ.get("LOCAL_WORLD_SIZE", "1").strip()
    procs = max(1, int(local)) if local.isdigit() else 1
    n = max(1, cores // procs)
    per = f", {procs} processes" if procs > 1 else ""
    busy = busy_cores(interval)
    free = max(1, (cores - math.floor(busy + 0.5)) // procs)
    if busy >= 0.5 and free < n:
        return free, (
            f"auto: {cores} usable cores{per}, {busy:.1f} of them busy with other work at the start: a step "
            f"waits for its slowest thread, so {free} instead of {n}; --threads N to choose (the count "
            "changes the run's bits)"
        )
    return n, f"auto: {cores} usable cores{per}; --threads N to choose"
