"""``qkernels sweep``: a grid of runs (methods x datasets x seeds, optionally x named settings), in parallel worker
processes on one machine or as tasks on a Ray cluster, and each paper's table from them (:mod:`qkernels.train.table`).

Cells. Each cell is an ordinary run directory, ``<out>/<dataset>/<method>[@<setting>]/seed<k>``, trained by a
``python -m qkernels train`` process (``qkernels eval`` / ``compare`` work on it). Its TrainConfig is the grid's
``base`` fields, then its setting's, then model, dataset and seed (:meth:`Grid.config`; with ``paper``: over the
paper's settings, :mod:`qkernels.train.paper`); the plan of each cell is ``<out>/.sweep/<cell>.json``, its worker's
output ``<out>/.sweep/<cell>.log``.

State and faults. Before anything runs every cell is classified (:func:`cell_state`): ``done`` (metrics.json and a
config.json equal to the plan, run-time fields aside), ``resume`` (a config.json equal to the plan, no metrics: a run
that was stopped; ``qkernels train --resume`` continues it from its checkpoint, or starts it again when it had none),
``new``, or ``conflict`` (another run's config.json: refused unless ``force``, which starts it over). A re-run skips
the done cells and resumes the others, so nothing runs twice to completion. A worker killed by a signal (SIGKILL, a
lost Ray worker) is started again with ``--resume`` up to ``retries`` times; since a run's batches and RNG are
functions of (seed, step) and its threads are fixed, the resumed run ends bit-for-bit where an uninterrupted one
does. One stopped by SIGINT / SIGTERM (Ctrl-C of the sweep) saves a checkpoint and is reported as stopped: the next
invocation resumes it. A worker that exits with an error (exit status 1: a failed run such as a NaN loss; 2: a bad
config) is reported with its error line and not retried. Only one sweep at a time writes a directory (a lock,
``<out>/.sweep/lock``).

Cores. Locally ``workers`` processes run at once and each gets ``threads // workers`` torch threads (``threads``
default: the usable cores; ``workers`` default: as many as cells, at most ``threads``), and ``OMP_NUM_THREADS`` /
``MKL_NUM_THREADS`` / ``OPENBLAS_NUM_THREADS`` of that count, so the machine is never oversubscribed. A run's bits
depend on its thread count (float summation order): the same cell run alone with ``qkernels train --threads N`` at the
same N gives the same bits. On Ray (``ray="auto"``: the cluster of ``ray start`` / ``RAY_ADDRESS``; an address; or a
Ray already initialized in this process) each cell is a task of ``ray_threads`` CPUs (default 1) running the same
worker command on its node; ``data_root`` is passed to the file datasets there. The run directories must be on a
filesystem every node sees (the driver reads their metrics, a retried task resumes from their checkpoints), and
qkernels must be installed on every node (``pip install 'qkernels[ray,train]'``).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

#: TrainConfig fields that may differ between a cell's plan and its run (they do not change what is computed, or
#: are set per worker)
RUNTIME_FIELDS = frozenset({"out", "threads", "adapt_threads", "progress", "device", "world_size"})
STATES = ("done", "resume", "new", "conflict")
SWEEP_DIR = ".sweep"


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    model: str
    dataset: str
    seed: int
    setting: str = ""

    @property
    def path(self) -> str:
        """The run directory relative to the sweep's: ``<dataset>/<method>[@<setting>]/seed<k>``."""
        return f"{self.dataset}/{self.model}{'@' + self.setting if self.setting else ''}/seed{self.seed}"

    @property
    def slug(self) -> str:
        return self.path.replace("/", ".")

    def __str__(self) -> str:
        return f"{self.model}{' @' + self.setting if self.setting else ''} {self.dataset} seed {self.seed}"


def _names(kind: str, v) -> tuple:
    if isinstance(v, str) or not isinstance(v, (list, tuple)) or not v:
        raise ValueError(f"{kind} must be a non-empty list, got {v!r}")
    return tuple(v)


@dataclass
class Grid:
    """methods x datasets x seeds (x ``settings``: name -> TrainConfig fields; "" is the unnamed one), under ``base``
    (TrainConfig fields for every cell); ``paper``: start from each method's paper settings. ``out``: the sweep's
    directory; ``data_root``: the file datasets' folder (their ``root``). Build it from flags, a dict or a TOML
    file (:meth:`from_dict`, :meth:`read_toml`)."""

    models: tuple[str, ...]
    datasets: tuple[str, ...]
    seeds: tuple[int, ...]
    out: str = "runs/sweep"
    base: dict = field(default_factory=dict)
    settings: dict[str, dict] = field(default_factory=lambda: {"": {}})
    paper: bool = False
    data_root: str | None = None

    def __post_init__(self) -> None:
        from qkernels.models.registry import METHODS

        self.models, self.datasets = _names("models", self.models), _names("datasets", self.datasets)
        if isinstance(self.seeds, int) and not isinstance(self.seeds, bool):
            self.seeds = tuple(range(self.seeds))
        self.seeds = _names("seeds", self.seeds)
        bad = [m for m in self.models if m not in METHODS]
        if bad:
            raise ValueError(f"models: unknown {bad[0]!r}; known: {', '.join(METHODS)}")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be integers >= 0, got {list(self.seeds)}")
        if not isinstance(self.settings, dict) or not self.settings:
            raise ValueError(f"settings must be a non-empty table of name -> TrainConfig fields, got {self.settings!r}")
        for name, fields_ in self.settings.items():
            if not isinstance(fields_, dict) or (name and not name.replace("_", "").replace("-", "").isalnum()):
                raise ValueError(
                    f"settings: {name!r} must be a name of letters, digits, - and _ with a table of TrainConfig fields"
                )
        for where, fields_ in (("base", self.base), *((f"settings.{n}", f) for n, f in self.settings.items())):
            taken = {"model", "dataset", "seed", "out"} & set(fields_)
            if taken:
                raise ValueError(f"{where}: {sorted(taken)[0]} is set by the grid (models, datasets, seeds, out)")
        for cell in self.cells():
            self.config(cell)  # every cell's config is valid before anything runs

    def cells(self) -> list[Cell]:
        return [Cell(m, d, s, n) for n in self.settings for d in self.datasets for m in self.models for s in self.seeds]

    def config(self, cell: Cell):
        """The resolved TrainConfig of ``cell`` (its ``out``: the cell's directory). ValueError for a bad field."""
        from qkernels.data import FILE_DATASETS
        from qkernels.train.config import TrainConfig
        from qkernels.train.paper import apply_paper

        fields_ = {**self.base, **self.settings[cell.setting]}
        kw = {**self.base.get("dataset_kwargs", {}), **self.settings[cell.setting].get("dataset_kwargs", {})}
        if kw:
            fields_["dataset_kwargs"] = kw
        if self.data_root is not None and cell.dataset in FILE_DATASETS:
            fields_["dataset_kwargs"] = {**fields_.get("dataset_kwargs", {}), "root": self.data_root}
        fields_.update(
            model=cell.model, dataset=cell.dataset, seed=cell.seed, out=str(Path(self.out) / cell.path), progress=False
        )
        try:
            if self.paper:
                fields_ = apply_paper(fields_)[0]
            return TrainConfig.from_dict(fields_).resolve_defaults()
        except (TypeError, ValueError) as err:
            raise ValueError(f"{cell}: {err}") from None

    @classmethod
    def from_dict(cls, d: dict, **over) -> Grid:
        """From a dict of the TOML layout (``models``, ``datasets``, ``seeds`` (a list, or n for 0..n-1), ``out``,
        ``paper``, ``[base]``, ``[settings.NAME]``); ``over``: values given besides (flags), None ignored."""
        d = {**d, **{k: v for k, v in over.items() if v is not None}}
        known = {"models", "datasets", "seeds", "out", "paper", "base", "settings", "run", "table"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sweep keys {unknown}; known: {sorted(known)}")
        missing = [k for k in ("models", "datasets", "seeds") if k not in d]
        if missing:
            raise ValueError(f"a sweep needs {', '.join(missing)}")
        settings = d.get("settings") or {"": {}}
        return cls(
            models=d["models"],
            datasets=d["datasets"],
            seeds=d["seeds"],
            out=d.get("out", "runs/sweep"),
            base=dict(d.get("base", {})),
            settings=dict(settings),
            paper=bool(d.get("paper", False)),
        )

    @staticmethod
    def read_toml(path: str | Path) -> dict:
        """The TOML file as a dict (``tomllib``; Python 3.10: ``tomli``). ValueError naming the file when unreadable."""
        try:
            import tomllib
        except ImportError:  # Python 3.10
            import tomli as tomllib  # type: ignore[no-redef]
        try:
            with open(path, "rb") as fh:
                return tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ValueError(f"{path}: {err}") from None


def _plan(cfg) -> dict:
    """What a cell computes: its config less the run-time fields and the data's location (``root``)."""
    d = {k: v for k, v in cfg.to_dict().items() if k not in RUNTIME_FIELDS}
    d["dataset_kwargs"] = {k: v for k, v in d["dataset_kwargs"].items() if k != "root"}
    return d


def cell_state(grid: Grid, cell: Cell) -> tuple[str, str]:
    """(state, why) of ``cell``'s directory against its plan: one of :data:`STATES` (module docstring)."""
    from qkernels.train.config import TrainConfig

    d = Path(grid.out) / cell.path
    conf = d / "config.json"
    if not conf.is_file():
        return "new", ""
    try:
        have = _plan(TrainConfig.load(conf))
    except (OSError, TypeError, ValueError) as err:
        return "conflict", f"unreadable config.json ({err})"
    want = _plan(grid.config(cell))
    diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
    if diff:
        k = diff[0]
        return "conflict", f"{k} {have.get(k)!r} where the sweep has {want.get(k)!r}" + (
            f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
        )
    return ("done", "") if (d / "metrics.json").is_file() else ("resume", "")


# ----------------------------------------------------------------------------------------------------- a worker
def worker_command(run_dir: str, plan: str | None, threads: int) -> list[str]:
    """The worker's command: a fresh run from the plan file, or (``plan`` None) ``--resume`` of ``run_dir``."""
    head = [sys.executable, "-m", "qkernels", "train", "--out", run_dir, "--threads", str(threads)]
    return head + (["--config", plan, "--force"] if plan else ["--resume"])


def _env(threads: int) -> dict:
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    return env


def _last_error(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no output"
    errs = [ln for ln in lines if "error" in ln.lower()]
    return (errs or lines or ["no output"])[-1].strip()[:300]


def run_cell(spec: dict) -> dict:
    """Run one cell to its end in worker processes (a driver thread or a Ray task calls this).

    ``spec``: ``run_dir``, ``plan`` (the plan file), ``log``, ``threads``, ``retries``, ``fresh`` (start over: a new
    or conflicting cell), ``stop`` (optional ``threading.Event``: no retry once set). A worker killed by a signal is
    started again with ``--resume`` (at most ``retries`` times); an error exit is final.

    Returns:
        ``{"status": "done" | "failed" | "stopped", "attempts", "killed", "seconds", "why", "returncode"}``.
    """
    t0, killed, attempts = time.perf_counter(), 0, 0
    run_dir, log, fresh = spec["run_dir"], Path(spec["log"]), spec.get("fresh", False)
    stop = spec.get("stop")
    while True:
        attempts += 1
        cmd = worker_command(run_dir, spec["plan"] if fresh else None, spec["threads"])
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(cmd)}\n")
            fh.flush()
            rc = subprocess.run(
                cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env(spec["threads"]), stdin=subprocess.DEVNULL
            ).returncode
        fresh = False
        out = {"attempts": attempts, "killed": killed, "returncode": rc}
        if rc == 0:
            return {**out, "status": "done", "why": "", "seconds": time.perf_counter() - t0}
        if rc in (130, 143):  # SIGINT / SIGTERM: the worker saved a checkpoint and stopped, as asked
            return {
                **out,
                "status": "stopped",
                "seconds": time.perf_counter() - t0,
                "why": f"stopped by {'SIGINT' if rc == 130 else 'SIGTERM'}; its checkpoint is kept: run the sweep "
                "again to resume it",
            }
        if rc < 0:  # killed by a signal (SIGKILL: no checkpoint of the step it was in): resumed from its checkpoint
            killed += 1
            out["killed"] = killed
            if stop is not None and stop.is_set():
                return {**out, "status": "stopped", "why": "the sweep was stopped", "seconds": time.perf_counter() - t0}
            if killed <= spec.get("retries", 2):
                with open(log, "a") as fh:
                    fh.write(f"qkernels sweep: the worker was killed (exit {rc}); resuming from its checkpoint\n")
                continue
            return {
                **out,
                "status": "failed",
                "seconds": time.perf_counter() - t0,
                "why": f"killed {killed} times (exit {rc}); last: {_last_error(log)}",
            }
        return {**out, "status": "failed", "why": _last_error(log), "seconds": time.perf_counter() - t0}


# ----------------------------------------------------------------------------------------------------- the driver
def hms(seconds: float) -> str:
    t = max(int(round(seconds)), 0)
    return f"{t // 3600}:{t // 60 % 60:02d}:{t % 60:02d}" if t >= 3600 else f"{t // 60}:{t % 60:02d}"


class SweepProgress:
    """One line per finished cell and an overall bar with an estimate (on a tty redrawn in place)."""

    def __init__(self, total: int, done: int, slots: int, *, stream=None, clock=time.perf_counter) -> None:
        self.total, self.done, self.slots, self.clock = total, done, max(slots, 1), clock
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0, self.durations, self.running, self.failed = clock(), [], 0, 0

    def bar(self) -> str:
        width, frac = 24, self.done / max(self.total, 1)
        fill = int(round(frac * width))
        left = self.total - self.done
        if self.durations and left:
            eta = hms(math.ceil(left / self.slots) * (sum(self.durations) / len(self.durations)))
        else:
            eta = "0:00" if not left else "-"
        failed = f", {self.failed} failed" if self.failed else ""
        return (
            f"sweep [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} cells done{failed}, "
            f"{self.running} running | elapsed {hms(self.clock() - self.t0)} | eta {eta}"
        )

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def show(self) -> None:
        self._write(("\r" + self.bar() + "\x1b[K") if self.tty else self.bar() + "\n")

    def line(self, text: str) -> None:
        self._write(("\r\x1b[K" if self.tty else "") + text + "\n")

    def finished(self, cell: Cell, res: dict, summary: str) -> None:
        self.running -= 1
        if res["status"] == "done":
            self.done += 1
            self.durations.append(res["seconds"])
        else:
            self.failed += 1
        self.line(f"[{self.done + self.failed}/{self.total}] {cell}: {summary}")

    def close(self) -> None:
        if self.tty:
            self._write("\n")


def _summary(grid: Grid, cell: Cell, res: dict) -> str:
    where = Path(grid.out) / cell.path
    retried = f", resumed {res['killed']}x after a kill" if res.get("killed") else ""
    if res["status"] != "done":
        return (
            f"{res['status'].upper()} after {hms(res['seconds'])}{retried}: {res['why']} (log: "
            f"{Path(grid.out) / SWEEP_DIR / (cell.slug + '.log')})"
        )
    try:
        from qkernels.train.table import TABLES, load_run_result, paper_of

        run = load_run_result(where)
        cols = TABLES[paper_of(cell.model)].columns_for(cell.dataset)
        shown = ", ".join(f"{c} {run.metrics[k] * s:.3g}" for c, k, s in cols if k in run.metrics)
    except (OSError, ValueError, KeyError):
        shown = ""
    return f"done in {hms(res['seconds'])}{retried}" + (f" ({shown})" if shown else "") + f" -> {where}"


@dataclass
class SweepResult:
    """What a sweep did: cells by outcome (``done_before``: skipped), failures (cell, why), the table's files."""

    done_before: list[Cell]
    ran: list[Cell]
    failed: list[tuple[Cell, str]]
    results: dict[Cell, dict]
    table: dict[str, Path]
    seconds: float


def _lock(out: Path):
    d = out / SWEEP_DIR
    d.mkdir(parents=True, exist_ok=True)
    fh = open(d / "lock", "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise RuntimeError(f"another qkernels sweep is writing {out} (its lock: {d / 'lock'}); wait for it") from None
    return fh


def _cells(n: int) -> str:
    """'1 cell', '4 cells'."""
    return f"{n} cell{'' if n == 1 else 's'}"


def split_cores(threads: int | None, workers: int | None, cells: int) -> tuple[int, int, str]:
    """(workers, threads per worker, how) for ``cells`` cells on this machine (module docstring). ValueError when
    ``workers`` exceed ``threads`` (each worker needs a core)."""
    from qkernels.train.threads import usable_cores

    cores = usable_cores()
    total = threads or cores
    w = workers or max(1, min(cells, total))
    if w > total:
        raise ValueError(f"workers {w} > threads {total}: each worker needs at least one thread (no oversubscription)")
    per = total // w
    src = "--threads" if threads else f"the {cores} usable cores"
    how = (
        f"{w} worker{'s' if w > 1 else ''} x {per} thread{'s' if per > 1 else ''} ({src}: {total} split evenly "
        f"between the workers{'' if workers else ', one per cell at most'}; each worker's torch threads and "
        f"OMP_NUM_THREADS = {per}; results depend on that count)"
    )
    return w, per, how


def run_sweep(
    grid: Grid,
    *,
    threads: int | None = None,
    workers: int | None = None,
    ray: str | None = None,
    ray_threads: int = 1,
    data_root: str | None = None,
    retries: int = 2,
    force: bool = False,
    published: bool = False,
    recon_filter_db: float | None = None,
    stream=None,
) -> SweepResult:
    """Run every cell of ``grid`` that is not done (locally, or on Ray with ``ray``), then write the tables.

    Raises:
        ValueError: a bad grid, a conflicting cell without ``force``, workers > threads.
        RuntimeError: another sweep holds the directory's lock.
    """
    stream = stream or sys.stderr
    out = Path(grid.out)
    if data_root is not None:
        from qkernels.data import FILE_DATASETS

        if not set(grid.datasets) & set(FILE_DATASETS):
            raise ValueError(f"data_root: none of {', '.join(grid.datasets)} reads files")
        grid.data_root = data_root  # the file datasets' root on the workers (not part of what a cell computes)
    t0 = time.perf_counter()
    lock = _lock(out)
    try:
        cells = grid.cells()
        states = {c: cell_state(grid, c) for c in cells}
        conflicts = [(c, why) for c, (s, why) in states.items() if s == "conflict"]
        if conflicts and not force:
            c, why = conflicts[0]
            more = f" (and {len(conflicts) - 1} more cells)" if len(conflicts) > 1 else ""
            raise ValueError(
                f"{out / c.path} holds another run ({why}){more}: give --force to start such cells "
                "over, or another --out"
            )
        done = [c for c in cells if states[c][0] == "done"]
        todo = [c for c in cells if states[c][0] != "done"]
        counts = {s: sum(st == s for st, _ in states.values()) for s in STATES}
        say = lambda text: (stream.write(text + "\n"), stream.flush())  # noqa: E731
        dims = (("method", grid.models), ("dataset", grid.datasets), ("seed", grid.seeds), ("setting", grid.settings))
        shape = " x ".join(f"{len(v)} {k}{'s' if len(v) > 1 else ''}" for k, v in dims if len(v) > 1 or k != "setting")
        say(
            f"qkernels sweep: {_cells(len(cells))} ({shape}) in {out}: {counts['done']} done, {counts['resume']} to "
            f"resume, {counts['new']} to start"
            + (f", {counts['conflict']} to start over (--force)" if counts["conflict"] else "")
        )
        results: dict[Cell, dict] = {}
        if not todo:
            say("qkernels sweep: every cell is done: nothing to run")
        else:
            runner = _ray_runner if ray else _local_runner
            results = runner(
                grid,
                todo,
                states,
                threads=threads,
                workers=workers,
                ray=ray,
                ray_threads=ray_threads,
                retries=retries,
                stream=stream,
                say=say,
            )
        failed = [(c, r["why"]) for c, r in results.items() if r["status"] != "done"]
        from qkernels.train.table import load_run_result, write_table

        runs = [load_run_result(out / c.path, c.setting) for c in cells if (out / c.path / "metrics.json").is_file()]
        table = write_table(runs, out, published=published, recon_filter_db=recon_filter_db) if runs else {}
        ran = [c for c, r in results.items() if r["status"] == "done"]
        secs = time.perf_counter() - t0
        tail = f"; {len(failed)} failed (fix and run again: finished cells are kept)" if failed else ""
        files = ", ".join(str(p) for p in table.values()) or "none (no finished run)"
        say(f"qkernels sweep: {len(ran)} ran, {len(done)} were done, in {hms(secs)}{tail}; table: {files}")
        return SweepResult(done, ran, failed, results, table, secs)
    finally:
        lock.close()


def _specs(grid: Grid, todo: list[Cell], states: dict, threads: int, retries: int) -> dict[Cell, dict]:
    out = Path(grid.out)
    specs = {}
    for c in todo:
        plan = out / SWEEP_DIR / f"{c.slug}.json"
        cfg = grid.config(c)
        plan.write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")
        specs[c] = {
            "run_dir": str(out / c.path),
            "plan": str(plan),
            "log": str(out / SWEEP_DIR / f"{c.slug}.log"),
            "threads": threads,
            "retries": retries,
            "fresh": states[c][0] in ("new", "conflict"),
        }
    return specs


def _local_runner(grid, todo, states, *, threads, workers, retries, stream, say, **_) -> dict[Cell, dict]:
    w, per, how = split_cores(threads, workers, len(todo))
    say(f"qkernels sweep: {_cells(len(todo))} on {how}")
    specs = _specs(grid, todo, states, per, retries)
    stop = threading.Event()
    for s in specs.values():
        s["stop"] = stop
    bar = SweepProgress(len(grid.cells()), len(grid.cells()) - len(todo), w, stream=stream)
    results: dict[Cell, dict] = {}
    pool = ThreadPoolExecutor(max_workers=w, thread_name_prefix="qkernels-sweep")
    try:
        pending = {}
        queue = list(todo)
        while queue or pending:
            while queue and len(pending) < w:
                c = queue.pop(0)
                pending[pool.submit(run_cell, specs[c])] = c
                bar.running += 1
            bar.show()
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                c = pending.pop(f)
                results[c] = f.result()
                bar.finished(c, results[c], _summary(grid, c, results[c]))
        bar.show()
    except BaseException:
        stop.set()  # the workers got the signal too (same process group): they save a checkpoint and stop
        raise
    finally:
        pool.shutdown(wait=True)
        bar.close()
    return results


def _ray_runner(grid, todo, states, *, ray, ray_threads, retries, stream, say, **_) -> dict[Cell, dict]:
    from qkernels._extras import require

    require("qkernels sweep --ray", "ray", "ray")
    import ray as ray_mod

    if not ray_mod.is_initialized():
        ray_mod.init(address=ray, log_to_driver=False)
    total = int(ray_mod.cluster_resources().get("CPU", 0))
    say(
        f"qkernels sweep: {_cells(len(todo))}, each a Ray task of {ray_threads} CPU{'s' if ray_threads > 1 else ''} "
        f"(torch threads and OMP_NUM_THREADS = {ray_threads}) on a cluster of {total} CPUs; a lost worker is retried "
        f"from its checkpoint up to {retries} times"
    )
    specs = _specs(grid, todo, states, ray_threads, retries)
    task = ray_mod.remote(run_cell).options(num_cpus=ray_threads, max_retries=retries, retry_exceptions=False)
    bar = SweepProgress(len(grid.cells()), len(grid.cells()) - len(todo), max(total // ray_threads, 1), stream=stream)
    refs = {task.remote(specs[c]): c for c in todo}
    bar.running = len(refs)
    bar.show()
    results: dict[Cell, dict] = {}
    try:
        while refs:
            ready, _ = ray_mod.wait(list(refs), num_returns=1)
            for ref in ready:
                c = refs.pop(ref)
                try:
                    results[c] = ray_mod.get(ref)
                except Exception as err:  # noqa: BLE001 - a task Ray gave up on (worker lost more than retries)
                    results[c] = {
                        "status": "failed",
                        "why": f"Ray: {type(err).__name__}: {err}".splitlines()[0],
                        "seconds": 0.0,
                        "killed": 0,
                        "attempts": 0,
                        "returncode": None,
                    }
                bar.finished(c, results[c], _summary(grid, c, results[c]))
            bar.show()
    except BaseException:
        for ref in refs:
            ray_mod.cancel(ref)
        raise
    finally:
        bar.close()
    return results
