"""Metric registry and ``evaluate``: sample a ground-truth dataset, encode it, score it."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch

from qkernels._extras import require
from qkernels.metrics.dci import NEEDS as DCI_NEEDS
from qkernels.metrics.dci import dci
from qkernels.metrics.infomec import NEEDS as INFOMEC_NEEDS
from qkernels.metrics.infomec import infomec
from qkernels.metrics.mcc import NEEDS as MCC_NEEDS
from qkernels.metrics.mcc import mcc
from qkernels.metrics.mig import mig
from qkernels.metrics.modularity import modularity
from qkernels.metrics.protocols import Protocol, get_protocol
from qkernels.metrics.sap import NEEDS as SAP_NEEDS
from qkernels.metrics.sap import sap

#: name -> ``fn(sources, latents, **options) -> dict``. A new metric is one function + one line.
METRICS: dict[str, Callable[..., dict]] = {
    "infomec": infomec,
    "dci": dci,
    "mig": mig,
    "sap": sap,
    "modularity": modularity,
    "mcc": mcc,
}
#: name -> the optional modules (the metrics extra) the metric needs; ``evaluate`` checks them before it encodes
NEEDS: dict[str, tuple[str, ...]] = {"infomec": INFOMEC_NEEDS, "dci": DCI_NEEDS, "sap": SAP_NEEDS, "mcc": MCC_NEEDS}


def evaluate(
    encode: Callable[[torch.Tensor], torch.Tensor],
    dataset,
    *,
    protocol: str | Protocol | None = None,
    metrics: Sequence[str] | None = None,
    num_samples: int | None = None,
    seed: int = 0,
    batch_size: int = 256,
    options: Mapping[str, Mapping] | None = None,
    discrete_latents: bool | None = None,
    verbose: bool = False,
    progress: Callable[[int, int], None] | None = None,
    on_metric: Callable[[str, int], None] | None = None,
) -> dict:
    """Score ``encode`` on samples of a ground-truth ``dataset``.

    ``dataset`` needs ``sample_factors(n, generator)`` -> int ``(n, n_s)`` and
    ``observations_from_factors(factors)`` -> float ``(n, C, H, W)``. All factors are drawn at
    once from a ``torch.Generator`` seeded with ``seed``; observations are rendered and encoded in
    batches of ``batch_size`` under ``torch.no_grad()`` (so results do not depend on
    ``batch_size`` as long as ``encode`` treats samples independently). ``encode`` maps a batch
    of observations to latents ``(B, n_z)`` (an integer tensor = discrete codes).

    ``protocol``: a paper's evaluation (:mod:`qkernels.metrics.protocols`: ``"qlae"``, ``"tripod"``,
    ``"factorqvae"``, ``"dlib"``, ``"fast"``) fixing the metrics, each metric's sample count (metric m
    runs on the first ``samples[m]`` rows of one draw) and its options; ``metrics``, ``num_samples``
    (one count for every metric) and ``options`` (merged over the protocol's, per metric) override
    it. Without a protocol: ``("infomec", "dci")`` on 10,000 samples with each metric's defaults.
    ``options`` gives per-metric keyword arguments, e.g. ``{"dci": {"preset": "dlib"}}``; ``seed`` is
    passed to every metric that takes one, ``discrete_latents`` (None: integer dtype = discrete) to
    every metric that takes it. Progress: ``progress(done, total)`` after each batch, ``on_metric(name,
    samples)`` before each metric, and/or a line on stderr for each when ``verbose``.

    Returns every metric's entries under namespaced keys: ``"infomec.infom"``,
    ``"dci.disentanglement"``, ``"infomec.nmi"``, ... Values are floats, numpy arrays, or strings
    naming the convention used (``"dci.preset"``, and ``"protocol"`` with the samples per metric in
    ``"<metric>.num_samples"``).

    Raises:
        ValueError: an unknown protocol or metric, or ``encode`` not returning (B, n_z) latents.
        qkernels._extras.MissingExtraError: a metric asked for needs scipy or scikit-learn, not installed (checked
            before anything is encoded; :data:`NEEDS`).

    Examples:
        >>> from qkernels.data import Sprites
        >>> from qkernels.metrics import evaluate
        >>> ds = Sprites(n_shapes=2, n_scales=2, n_orientations=2, n_x=2, n_y=2, image_size=16)
        >>> r = evaluate(lambda x: x.flatten(1)[:, :6], ds, metrics=["mig"], num_samples=200)
        >>> list(r), 0 <= r["mig.mig"] <= 1
        (['mig.mig'], True)
    """
    proto = None if protocol is None else get_protocol(protocol)
    if metrics is None:
        metrics = proto.metrics if proto is not None else ("infomec", "dci")
    unknown = [m for m in metrics if m not in METRICS]
    if isinstance(metrics, str) or unknown:
        raise ValueError(f"metrics must be a sequence of names from {sorted(METRICS)}, got {metrics!r}")
    options = dict(options or {})
    if set(options) - set(metrics):
        raise ValueError(f"options has entries for metrics not requested: {sorted(set(options) - set(metrics))}")
    for name, v in (("num_samples", num_samples), ("batch_size", batch_size)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    counts = sample_counts(proto, metrics, num_samples)
    for name in metrics:  # before minutes of encoding
        require(f"qkernels.metrics.evaluate (its {name})", "metrics", *NEEDS.get(name, ()))

    sources, latents = encode_dataset(
        encode,
        dataset,
        num_samples=max(counts.values()),
        seed=seed,
        batch_size=batch_size,
        verbose=verbose,
        progress=progress,
    )
    results: dict = {} if proto is None else {"protocol": proto.name}
    for name in metrics:
        fn = METRICS[name]
        params = inspect.signature(fn).parameters
        kwargs = dict(proto.options.get(name, {})) if proto is not None else {}
        kwargs.update(options.get(name, {}))
        if "seed" in params:
            kwargs.setdefault("seed", seed)
        if discrete_latents is not None and "discrete_latents" in params:
            kwargs.setdefault("discrete_latents", discrete_latents)
        if verbose:
            print(f"[qkernels.metrics] computing {name} on {counts[name]} samples", file=sys.stderr)
        if on_metric is not None:
            on_metric(name, counts[name])
        n = counts[name]
        for key, value in fn(sources[:n], latents[:n], **kwargs).items():
            results[f"{name}.{key}"] = value
        if proto is not None:
            results[f"{name}.num_samples"] = n
    return results


def sample_counts(
    protocol: str | Protocol | None, metrics: Sequence[str], num_samples: int | None = None
) -> dict[str, int]:
    """The samples ``evaluate`` scores each of ``metrics`` on: ``num_samples`` for every one when given, else
    the protocol's count for it, else 10,000.

    Examples:
        >>> from qkernels.metrics.evaluate import sample_counts
        >>> sample_counts("factorqvae", ("infomec", "dci")), sample_counts(None, ("mig",), 500)
        ({'infomec': 10000, 'dci': 15000}, {'mig': 500})
    """
    proto = None if protocol is None else get_protocol(protocol)
    if num_samples is not None:
        return {m: num_samples for m in metrics}
    if proto is not None:
        return {m: proto.samples.get(m, proto.num_samples()) for m in metrics}
    return {m: 10_000 for m in metrics}


def encode_dataset(
    encode,
    dataset,
    *,
    num_samples: int,
    seed: int,
    batch_size: int,
    verbose: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Sampled factors int64 ``(num_samples, n_s)`` and their latents ``(num_samples, n_z)``."""
    gen = torch.Generator().manual_seed(int(seed))
    factors = torch.as_tensor(dataset.sample_factors(num_samples, gen))
    if factors.shape != (num_samples, len(dataset.factor_sizes)):
        raise ValueError(
            f"dataset.sample_factors returned shape {tuple(factors.shape)}, expected "
            f"({num_samples}, {len(dataset.factor_sizes)})"
        )
    chunks = []
    with torch.no_grad():
        for start in range(0, num_samples, batch_size):
            obs = torch.as_tensor(dataset.observations_from_factors(factors[start : start + batch_size]))
            z = torch.as_tensor(encode(obs))
            if z.ndim != 2 or z.shape[0] != obs.shape[0]:
                raise ValueError(f"encode must return (B, n_z) latents, got shape {tuple(z.shape)}")
            chunks.append(z.detach().cpu())
            done = min(start + batch_size, num_samples)
            if progress is not None:
                progress(done, num_samples)
            if verbose:
                print(f"[qkernels.metrics] encoded {done}/{num_samples}", file=sys.stderr)
    return factors.numpy().astype(np.int64), torch.cat(chunks).numpy()
