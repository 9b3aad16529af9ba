"""What an evaluation is doing, on stderr, while it runs (``qkernels eval``, and ``qkernels train``'s final one).

An evaluation draws samples, encodes them (the longest part on a CPU: 10,000 images through the encoder, and the
first ones through the decoder too, their reconstructions scored as they go), runs each metric of its protocol, then
draws the figures. :class:`EvalProgress` says so as it goes: a first line with the protocol, metrics and sample
counts; after the first encoded batch the estimate of the whole (the encoding at that batch's speed, the metrics
from :data:`METRIC_SECONDS` scaled to the samples and the load, the figures from :data:`FIGURE_SAMPLES`); the
encoding's progress every quarter (``\\r``-updated on a terminal); each metric as it starts; the time it took.
"""

from __future__ import annotations

import os
import sys
import time

#: rough seconds of one idle CPU core for each metric of each protocol, (at 300 samples, at the protocol's own
#: count), on 10 discrete latents and 6 factors (scikit-learn's forests and boosting run on one core): the
#: estimate's metric part, linear in the samples between and beyond those two points
METRIC_SECONDS = {
    "qlae": {"infomec": (0.15, 2.6), "dci": (1.9, 12.4)},
    "tripod": {"infomec": (0.2, 2.2), "dci": (1.6, 8.6)},
    "factorqvae": {"infomec": (0.2, 7.4), "dci": (8.0, 65.0)},
    "dlib": {"dci": (8.6, 71.0), "mig": (0.0, 0.1)},
    "fast": {"infomec": (0.06, 0.5), "dci": (1.6, 2.8), "mig": (0.0, 0.1)},
}
#: the figures cost about as much as encoding (and reconstructing) this many samples (the interventions figure's 10
#: decodings per latent; Tripod's networks at 32 x 32: 300 to 4000, first calls at new batch sizes being the slow
#: ones)
FIGURE_SAMPLES = 1500


def metric_seconds(protocol, counts: dict[str, int], *, load: float | None = None, cpus: int | None = None) -> float:
    """Rough wall seconds of ``protocol``'s metrics at ``counts`` (metric -> samples): :data:`METRIC_SECONDS`
    at those samples, scaled to the 1-minute ``load`` average on ``cpus`` CPUs (default: now) as
    :func:`qkernels.bench.report.under_load` does; 0 for a protocol or metric without a measured cost.

    Examples:
        >>> from qkernels.metrics import get_protocol
        >>> from qkernels.train.eval_progress import metric_seconds
        >>> round(metric_seconds(get_protocol("tripod"), {"infomec": 10_000, "dci": 10_000}, load=0.0), 1)
        10.8
    """
    from qkernels.bench.report import under_load

    idle = 0.0
    for m, n in counts.items():
        small, full = METRIC_SECONDS.get(protocol.name, {}).get(m, (0.0, 0.0))
        ref = protocol.samples.get(m, n)
        idle += max(small + (full - small) * (n - 300) / (ref - 300), 0.0) if ref > 300 else full
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):
            load = 0.0
    return under_load(idle, load, cpus or os.cpu_count() or 1)


def hms(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    t = max(int(round(seconds)), 0)
    h, m, s = t // 3600, t // 60 % 60, t % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class EvalProgress:
    """Lines on stderr about the evaluation of ``what`` (e.g. "qkernels eval: runs/tripod (tripod on
    shapes3d_procedural, step 600)"; see the module docstring). ``enabled`` False: silent. ``clock``: seconds
    (tests pass a fake one); ``load``: the 1-minute load average for the estimate (default: now)."""

    def __init__(self, what: str, *, enabled: bool = True, clock=None, load: float | None = None, stream=None) -> None:
        self.what, self.enabled, self.load = what, enabled, load
        self.clock = clock or time.perf_counter
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = self.clock()
        self.protocol, self.counts, self.next_quarter, self.begun = None, {}, 1, False
        self.first: tuple[float, int] | None = None  # (time, samples) after the first encoded batch

    def say(self, text: str, *, at: bool = False) -> None:
        """One line (``at``: after the time since the evaluation began, "[m:ss] ")."""
        if self.enabled:
            when = f"[{hms(self.clock() - self.t0)}] " if at else ""
            self.stream.write(("\r\x1b[K" if self.tty else "") + when + text + "\n")
            self.stream.flush()

    def begin(self, protocol, counts: dict[str, int]) -> None:
        """The first line: the evaluation with ``protocol`` (a :class:`~qkernels.metrics.Protocol`), each metric on
        ``counts[metric]`` samples."""
        self.protocol, self.counts, self.t0, self.begun = protocol, dict(counts), self.clock(), True
        same = len(set(counts.values())) == 1
        on = (
            f"{', '.join(counts)} on {next(iter(counts.values())):,} samples"
            if same
            else ", ".join(f"{m} on {n:,}" for m, n in counts.items()) + " samples"
        )
        self.say(
            f"{self.what}: {protocol.name} protocol, {on} (reconstructions scored as they are encoded); then "
            "the figures"
        )

    def encoded(self, done: int, total: int) -> None:
        """After each encoded batch (``qkernels.metrics.evaluate``'s ``progress``): the estimate after the first,
        then a line every quarter."""
        now = self.clock()
        if self.first is None:
            self.first = (now, done)
            rate = done / max(now - self.t0, 1e-9)
            encode = now - self.t0 + (total - done) / rate
            metrics = metric_seconds(self.protocol, self.counts, load=self.load) if self.protocol else 0.0
            figures = FIGURE_SAMPLES / rate
            self.say(
                f"encoding {total:,} samples at {rate:.0f}/s: about {hms(encode + metrics + figures)} in all "
                f"(encoding {hms(encode)}, metrics {hms(metrics)}, figures {hms(figures)})"
            )
        if done == total:
            self.say(f"encoded {total:,} samples in {hms(now - self.t0)}")
            return
        if self.tty:
            self.stream.write(f"\r\x1b[Kencoded {done:,}/{total:,}" + self._eta(done, total, now))
            self.stream.flush()
        elif done * 4 >= self.next_quarter * total:
            self.next_quarter = done * 4 // total + 1
            self.say(f"encoded {done:,}/{total:,}" + self._eta(done, total, now))

    def _eta(self, done: int, total: int, now: float) -> str:
        t, n = self.first
        if done <= n or now <= t:
            return ""
        return f" | eta {hms((total - done) * (now - t) / (done - n))}"

    def metric(self, name: str, samples: int) -> None:
        """A metric starts (``qkernels.metrics.evaluate``'s ``on_metric``)."""
        self.say(f"{name} on {samples:,} samples ...", at=True)

    def stage(self, text: str) -> None:
        """Another part starts (the figures; the MCC of 2-D data, first)."""
        self.say((f"{self.what}: " if not self.begun else "") + f"{text} ...", at=self.begun)
        self.begun = True

    def close(self) -> None:
        self.say(f"evaluated in {hms(self.clock() - self.t0)}")
