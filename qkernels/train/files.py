"""A run directory's files, and the lock of a run in use: plain file operations, no torch, so that ``qkernels train``
refuses a directory before it loads torch, the data and the model.

The lock (:class:`RunLock`, ``run.lock`` in the run directory: the holder's process id and host) is held by
``qkernels train`` and ``qkernels eval`` while they write into the directory: a second process on that directory
refuses with :class:`RunInUseError` naming the holder. A lock whose process has ended (killed, crashed: its file
stays) is stale and taken over; one from another host cannot be checked and is respected (the message says how
to remove it).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

CHECKPOINT, CONFIG, LOG, METRICS_FILE = "checkpoint.pt", "config.json", "log.jsonl", "metrics.json"
SELECTED = "selected.pt"  # the weights of the checkpoint a selection rule chose (qkernels.train.selection)
FIGURES = "figures"
# the files a run writes into its directory (and their ".tmp" siblings while written), and its figures
RUN_FILES = (CONFIG, LOG, CHECKPOINT, METRICS_FILE, SELECTED)
FIGURE_FILES = ("reconstructions.png", "interventions.png", "nmi.png", "latents.png", "loss.png")
LOCK = "run.lock"
FRESH_S = 10.0  # an empty lock file younger than this is being written by its holder, not abandoned

#: metric keys renamed since a run could have written them (old -> new): such runs are still read (selection, compare)
RENAMED_KEYS = {"recon.psnr_uint8": "recon.psnr_tripod"}


def current_keys(record: dict) -> dict:
    """``record`` (a line of log.jsonl, a metrics.json) with the keys of :data:`RENAMED_KEYS` renamed."""
    return {RENAMED_KEYS.get(k, k): v for k, v in record.items()}


class RunExistsError(FileExistsError):
    """A fresh run asked to write into a directory that holds another run; ``files``: that run's files there."""

    def __init__(self, message: str, files: list[str] = ()) -> None:
        super().__init__(message)
        self.files = list(files)


class RunInUseError(RuntimeError):
    """Another live process holds the run directory's lock (:class:`RunLock`); ``pid``, ``host``: that process."""

    def __init__(self, message: str, pid: int | None = None, host: str | None = None) -> None:
        super().__init__(message)
        self.pid, self.host = pid, host


def run_files(out: str | Path) -> list[Path]:
    """The files of a run present in ``out``: config.json, log.jsonl, checkpoint.pt, metrics.json (and their
    ``.tmp`` siblings), figures/<a figure a run draws>. Nothing else in ``out`` belongs to a run."""
    out = Path(out)
    names = [*RUN_FILES, *(f + ".tmp" for f in RUN_FILES), *(f"{FIGURES}/{f}" for f in FIGURE_FILES)]
    return [out / n for n in names if (out / n).is_file()]


def clear_run(out: str | Path) -> list[Path]:
    """Delete the run files of ``out`` (:func:`run_files`) and figures/ when that leaves it empty; other files
    stay. Returns what was deleted."""
    gone = run_files(out)
    for p in gone:
        p.unlink(missing_ok=True)
    fig = Path(out) / FIGURES
    if fig.is_dir() and not any(fig.iterdir()):
        fig.rmdir()
    return gone


def alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc: kill(pid, 0) is the answer
        return True


class RunLock:
    """``run.lock`` in ``out`` while this process writes the run there; a context manager (or :meth:`acquire`,
    :meth:`release`). ``enabled`` False: does nothing (e.g. the ranks other than 0 under ``torchrun``).

    Examples:
        >>> import tempfile
        >>> from qkernels.train.files import RunLock
        >>> out = tempfile.mkdtemp()
        >>> with RunLock(out) as lock:
        ...     lock.path.read_text().split()[0] == str(os.getpid())
        True
        >>> lock.path.exists()  # released
        False
    """

    def __init__(self, out: str | Path, *, enabled: bool = True) -> None:
        self.out, self.path, self.enabled = Path(out), Path(out) / LOCK, enabled
        self.held, self._made = False, []  # the directories acquire created, deepest first

    def holder(self) -> tuple[int, str] | None:
        """(pid, host) written in the lock file; None when there is none, or it is empty or garbled."""
        try:
            pid, host = self.path.read_text().split()[:2]
            return int(pid), host
        except (OSError, ValueError):
            return None

    def _in_use(self) -> RunInUseError | None:
        """Why the existing lock file is not stale (None: it is)."""
        held = self.holder()
        if held is None:
            try:
                young = time.time() - self.path.stat().st_mtime < FRESH_S
            except OSError:  # gone meanwhile
                return None
            return RunInUseError(f"{self.out} is in use: {self.path} is being written") if young else None
        pid, host = held
        if host == socket.gethostname():
            if pid == os.getpid() or not alive(pid):  # this process, or one that has ended: stale
                return None
            return RunInUseError(
                f"{self.out} is in use by process {pid} (qkernels train or eval): wait for it to "
                f"end, or stop it (kill {pid}), then run this again",
                pid,
                host,
            )
        return RunInUseError(
            f"{self.out} is in use by process {pid} on {host} (qkernels train or eval): wait for "
            f"it to end; if no such process runs there, delete {self.path}",
            pid,
            host,
        )

    def acquire(self) -> RunLock:
        """Take the lock (creating ``out`` if needed); :class:`RunInUseError` when a live process holds it."""
        if not self.enabled or self.held:
            return self
        self._made = [p for p in (self.out, *self.out.parents) if not p.exists()]
        self.out.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                err = self._in_use()
                if err is not None:
                    self._remove_made_dirs()
                    raise err from None
                self.path.unlink(missing_ok=True)  # stale: its process has ended
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(f"{os.getpid()} {socket.gethostname()}\n")
            self.held = True
            return self
        self._remove_made_dirs()
        raise RunInUseError(f"{self.out} is in use: another process keeps taking {self.path}")

    def release(self) -> None:
        """Drop the lock (and the directories :meth:`acquire` created, where nothing else was written)."""
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False
        self._remove_made_dirs()

    def _remove_made_dirs(self) -> None:
        for p in self._made:
            if not p.is_dir() or any(p.iterdir()):
                break
            p.rmdir()
        self._made = []

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
