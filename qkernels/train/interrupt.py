"""Stopping a training run without losing its work: SIGINT (Ctrl-C) and SIGTERM.

While :class:`DeferredSignals` is active, the first SIGINT or SIGTERM only records the signal (and says so in one
line on stderr): the training loop finishes its step, saves a checkpoint at that step (atomically, as the periodic
ones) and raises :class:`TrainingInterrupted`; ``--resume`` continues from there bit-for-bit. A second signal
raises ``KeyboardInterrupt`` at once (the run keeps its last checkpoint). An evaluation inside the run
(``eval_every``) finishes before the stop. After the training steps, during the final evaluation, a signal
interrupts at once (:meth:`DeferredSignals.immediate`): every step is saved by then, and ``--resume`` evaluates.

Handlers are installed only in the main thread of a single process: under ``torchrun`` every rank would see the
signal at a different step and the collectives of the next step would hang, so there the signals act as before.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(KeyboardInterrupt):
    """A run stopped by a signal after saving a checkpoint at ``step``; ``signum``: the signal."""

    def __init__(self, message: str, *, step: int, signum: int) -> None:
        super().__init__(message)
        self.step, self.signum = step, signum


def _say(text: str) -> None:
    """One line on stderr from a signal handler: straight to the file descriptor (a handler that runs while
    Python's buffered stderr is mid-write must not write through it: "reentrant call")."""
    data = ("\n" + text + "\n").encode()
    try:
        os.write(sys.stderr.fileno(), data)
    except (AttributeError, OSError, ValueError):  # a replaced stderr (tests) without a descriptor
        sys.stderr.write(data.decode())


class DeferredSignals:
    """Context manager: SIGINT / SIGTERM deferred to the end of the current step (see the module docstring).

    ``pending``: the first signal received (None before); ``where``: what the first signal's message says will
    happen (e.g. "stopping after step 12 with a checkpoint"), called when the signal arrives. ``enabled`` False, or
    entered outside the main thread: installs nothing (``pending`` stays None).

    Examples:
        >>> import os, signal
        >>> from qkernels.train.interrupt import DeferredSignals
        >>> with DeferredSignals(lambda: "stopping after this step") as sig:
        ...     os.kill(os.getpid(), signal.SIGTERM)  # recorded, not acted on
        ...     print(sig.pending == signal.SIGTERM)
        True
    """

    def __init__(self, where=lambda: "stopping after this step with a checkpoint", *, enabled: bool = True) -> None:
        self.where = where
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.pending: int | None = None
        self._immediate = False
        self._old: dict[int, object] = {}

    def __enter__(self) -> DeferredSignals:
        if self.enabled:
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def immediate(self) -> None:
        """From now on a signal interrupts at once (``KeyboardInterrupt``)."""
        self._immediate = True

    def _restore(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._immediate or self.pending is not None:
            self._restore()  # a third signal gets the default behaviour
            raise KeyboardInterrupt(name)
        self.pending = signum
        again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
        _say(f"qkernels train: {name}: {self.where()}; {again} again quits at once")
