"""A run that slows down when other work takes its cores: notice it, and use fewer threads.

When another job starts beside a run, every parallel region of a step waits for the thread that shares a core with
it: measured on 2 cores, 2 threads fell from 2.29 to 0.12 it/s while ``--threads 1`` at the same load ran 0.95
it/s (benchmarks/HISTORY.md). :class:`CollapseWatch` compares the step times of the last ``window`` steps with the
run's own early ones (medians: a single slow step, a garbage collection, is no collapse); :func:`fewer_threads` says
how many threads to keep once it fires, from the cores other processes keep busy
(:func:`qkernels.train.threads.busy_cores`, measured while the run sleeps).

The trainer (:class:`qkernels.train.loop.Trainer`) acts on it only when ``TrainConfig.adapt_threads`` is set:
``qkernels train`` sets it when the thread count is its automatic choice (no ``--threads``, no ``threads`` in a
``--config`` file, no ``OMP_NUM_THREADS``); a count given is never changed. The count changes float summation
order, so a run that dropped threads is no longer bit-for-bit the run of its command on a quiet machine: the
drop is written to ``log.jsonl`` (``{"type": "threads", "step", "threads", "was", ...}``) and to config.json
(``threads``, with a checkpoint of that step), so that ``--resume`` continues with the count the run had, and
``--threads N`` gives a reproducible run. The count is only lowered, never raised again.
"""

from __future__ import annotations

import math
import statistics
from collections import deque


class CollapseWatch:
    """Step times in, "collapsed" out: True when the median of the last ``window`` step times exceeds ``factor``
    times the median of the reference steps (the ``window`` steps after the first ``skip``, which carry the
    warm-up: lazy initialisation, ``torch.compile``). :meth:`reset` starts over (a new reference), e.g. after the
    thread count changed.

    Examples:
        >>> from qkernels.train.throughput import CollapseWatch
        >>> w = CollapseWatch(window=4, skip=1, factor=3.0)
        >>> [w.observe(t) for t in (5.0, 0.5, 0.5, 0.5, 0.5)]  # warm-up, then the reference: 2 it/s
        [False, False, False, False, False]
        >>> [w.observe(t) for t in (0.6, 4.0, 4.0, 4.0)]  # the median of the last 4 steps: 4.0 s > 3 x 0.5 s
        [False, False, False, True]
        >>> w.rates()  # (early, recent) steps per second
        (2.0, 0.25)
    """

    def __init__(self, *, window: int = 20, skip: int = 5, factor: float = 3.0) -> None:
        if window < 1 or skip < 0 or not factor > 1:
            raise ValueError(f"need window >= 1, skip >= 0, factor > 1; got {window}, {skip}, {factor}")
        self.window, self.skip, self.factor = window, skip, factor
        self.reset()

    def reset(self) -> None:
        self.seen = 0
        self.reference: float | None = None  # median seconds per step early on
        self.recent: deque[float] = deque(maxlen=self.window)

    def observe(self, seconds: float) -> bool:
        """One step took ``seconds``; True when the recent steps are ``factor`` times slower than the early ones."""
        self.seen += 1
        if self.seen <= self.skip:
            return False
        self.recent.append(seconds)
        if self.reference is None:
            if len(self.recent) == self.window:
                self.reference = statistics.median(self.recent)
                self.recent.clear()
            return False
        return len(self.recent) == self.window and statistics.median(self.recent) > self.factor * self.reference

    def rates(self) -> tuple[float | None, float | None]:
        """(early, recent) steps per second; None where not measured yet."""
        recent = statistics.median(self.recent) if len(self.recent) == self.window else None
        return tuple(None if t is None else 1.0 / max(t, 1e-12) for t in (self.reference, recent))


def fewer_threads(threads: int, cores: int, busy: float) -> int | None:
    """The thread count to continue with after a collapse: the cores that other processes leave free (``cores``
    usable, ``busy`` of them kept busy by others), at least 1 and fewer than ``threads``; None to keep the count
    (a single thread, or no other work that would explain the slowdown: fewer threads would only be slower).

    Examples:
        >>> from qkernels.train.throughput import fewer_threads
        >>> fewer_threads(2, 2, 1.0), fewer_threads(16, 16, 3.4), fewer_threads(16, 16, 15.8)
        (1, 13, 1)
        >>> fewer_threads(2, 2, 0.2), fewer_threads(1, 2, 2.0)  # nothing else running; one thread already
        (None, None)
    """
    if threads <= 1 or busy < 0.5:
        return None
    return max(1, min(threads - 1, cores - math.floor(busy + 0.5)))
