"""``TrainConfig``: everything a run needs, saved as ``config.json`` in the run directory."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path


@dataclass
class TrainConfig:
    """A training run. ``None`` fields take the method's defaults (see :mod:`qkernels.models.registry`).

    model/dataset: registry names. steps: optimizer steps, or "paper": the authors' run length
    (:func:`~qkernels.models.registry.paper_steps`; the default 600 is a CPU-sized run, the first 600 steps of the
    authors' lr and temperature schedules, which are functions of the step). batch_size, lr, weight_decay,
    num_latents: None -> the authors' setting for the method and dataset (:meth:`resolve_defaults` writes them in;
    weight_decay: AdamW methods only). arch: "small" (CPU) or "paper" widths. image_size: rendering size of the
    procedural image datasets (None: their default, 64; file datasets keep their own size). dataset_kwargs /
    model_kwargs: passed to ``load_dataset`` / the model class (override lambdas etc.). eval_every: when the run
    evaluates besides the end: every N steps (0: only at the end), "tripod" (the Tripod authors' cadence, every 10,000
    steps and every 2,000 of the first 10,000, scaled down for runs under 50,000 steps:
    :func:`~qkernels.train.selection.eval_steps`) or "auto" (:meth:`resolve_defaults`: "tripod" when the run's
    selection rule is Tripod's, else 0). select: the checkpoint the run reports among its evaluations
    (:mod:`qkernels.train.selection`: "final", "tripod" (PSNR filter + best InfoM); "auto": the protocol's, Tripod's
    selection under the tripod protocol). paper: the config was made from the paper's settings
    (:func:`qkernels.train.paper.paper_config`, ``qkernels train --paper``); its ``training ...`` line names the
    fields changed from them. protocol: the evaluation protocol (:mod:`qkernels.metrics.protocols`; "auto":
    the method's authors', :data:`~qkernels.metrics.protocols.METHOD_PROTOCOL`, e.g. Tripod's on 10,000 samples;
    "fast": 2,000 samples for a quick look); eval_samples / metrics: override the protocol's sample counts (one
    count for every metric) / metric names (None: the protocol's). data_order: how training batches read the dataset
    (:mod:`qkernels.train.data`: "iid", "epochs", "split"; "auto": the method's authors').
    checkpoint_every: steps between checkpoints (and at the end). log_every: steps between JSONL lines.
    Data parallelism (``torchrun``; :class:`~qkernels.train.loop.Trainer`): batch_size is the GLOBAL batch;
    world_size records the number of processes of the latest (re)start; local_kde: each rank's KDE losses
    (Cliff, KLM) on its own shard instead of the global batch; dist_timeout_s: how long a collective waits
    for a rank before the job fails.
    threads: torch intra-op threads of the training process (``torch.set_num_threads``). None: ``qkernels train``
    picks the machine's usable cores (:func:`qkernels.train.threads.auto_threads`) and records the count in
    config.json, so that ``--resume`` keeps it; the Python API keeps the process's setting. adapt_threads: when the
    steps become 3x slower than early in the run while other processes keep cores busy, continue with fewer threads
    (:mod:`qkernels.train.throughput`; config.json then records the new count); ``qkernels train`` sets it when it
    chose the count itself.
    device: where the model trains; compile: ``torch.compile`` the model's loss (its forward: encoder, ops,
    decoder); progress: the status line
    on stderr. Saved as / loaded from ``config.json`` with :meth:`save` / :meth:`load`.

    Examples:
        >>> import tempfile
        >>> from qkernels.train import TrainConfig
        >>> cfg = TrainConfig(model="qlae", dataset="sprites", steps=100, image_size=16)
        >>> cfg.batch_size is None, cfg.arch, cfg.protocol, cfg.eval_every  # None / "auto": the authors' settings
        (True, 'small', 'auto', 'auto')
        >>> path = tempfile.mkdtemp() + "/config.json"
        >>> cfg.save(path)
        >>> TrainConfig.load(path) == cfg
        True
    """

    model: str = "tripod"
    dataset: str = "shapes3d_procedural"
    steps: int | str = 600
    out: str = "runs/tripod"
    batch_size: int | None = None
    seed: int = 0
    lr: float | None = None
    weight_decay: float | None = None
    num_latents: int | None = None
    arch: str = "small"
    image_size: int | None = 32
    dataset_kwargs: dict = field(default_factory=dict)
    model_kwargs: dict = field(default_factory=dict)
    eval_every: int | str = "auto"
    select: str = "auto"
    protocol: str = "auto"
    data_order: str = "auto"
    eval_samples: int | None = None
    metrics: tuple[str, ...] | None = None
    checkpoint_every: int = 250
    log_every: int = 10
    device: str = "cpu"
    compile: bool = False
    amp: bool = False
    world_size: int = 1
    local_kde: bool = False
    dist_timeout_s: int = 600
    threads: int | None = None
    adapt_threads: bool = False
    progress: bool = True
    paper: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        d["metrics"] = None if self.metrics is None else list(self.metrics)
        return d

    def resolve_defaults(self) -> TrainConfig:
        """Write the method's defaults into this config (in place; returns it), so that ``config.json`` records the
        values the run uses: ``steps="paper"`` -> the authors' run length; ``batch_size``, ``lr``, ``weight_decay``
        None -> the authors' for the method and dataset (:func:`~qkernels.models.registry.method_optim`);
        ``model_kwargs``: the authors' per-dataset keyword defaults
        (:func:`~qkernels.models.registry.method_defaults`, e.g. FactorQVAE's beta and gamma) under the ones given.
        ``eval_every="auto"`` -> "tripod" when the run selects its checkpoint by Tripod's rule, else 0.
        Idempotent. ValueError for an unknown model, a method whose authors state no run length, or a bad
        ``eval_every`` / ``select``.

        Examples:
            >>> from qkernels.train import TrainConfig
            >>> cfg = TrainConfig(model="factorqvae", dataset="isaac3d", steps="paper").resolve_defaults()
            >>> cfg.steps, cfg.batch_size, cfg.lr, cfg.model_kwargs
            (50000, 256, 0.001, {'beta': 5e-05, 'gamma': 5e-05})
            >>> TrainConfig(model="qlae", dataset="mpi3d").resolve_defaults().weight_decay
            0.001
        """
        from qkernels.models.registry import METHODS, method_defaults, method_optim, paper_steps

        if self.model not in METHODS:
            raise ValueError(f"model must be one of {', '.join(METHODS)}, got {self.model!r}")
        if self.steps == "paper":
            self.steps = paper_steps(self.model)
        elif isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be an integer >= 1 or 'paper', got {self.steps!r}")
        optim = method_optim(self.model, self.dataset)
        self.batch_size = self.batch_size or METHODS[self.model].batch_size
        self.lr = self.lr or optim.lr
        if self.weight_decay is None:
            self.weight_decay = optim.weight_decay
        elif optim.name != "adamw" and self.weight_decay:
            adamw = ", ".join(n for n, s in METHODS.items() if s.optim.name == "adamw")
            raise ValueError(
                f"weight_decay: {self.model} trains with {optim.name}, which has no weight decay "
                f"(the AdamW methods: {adamw})"
            )
        self.model_kwargs = {**method_defaults(self.model, self.dataset), **self.model_kwargs}
        if self.eval_every == "auto":
            self.eval_every = "tripod" if self.selection_rule() == "tripod" else 0
        elif self.eval_every != "tripod" and (
            isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) or self.eval_every < 0
        ):
            raise ValueError(f"eval_every must be an integer >= 0, 'tripod' or 'auto', got {self.eval_every!r}")
        return self

    def selection_rule(self) -> str:
        """The checkpoint rule this run reports by: ``select``, or for "auto" its protocol's
        (:data:`qkernels.train.selection.SELECTIONS`). ValueError for an unknown one."""
        from qkernels.train.selection import SELECTIONS

        rule = self.eval_protocol().selection if self.select == "auto" else self.select
        if rule not in SELECTIONS:
            raise ValueError(f"select must be 'auto' or one of {SELECTIONS}, got {self.select!r}")
        return rule

    def eval_protocol(self):
        """The :class:`~qkernels.metrics.Protocol` this run is scored with."""
        from qkernels.metrics.protocols import METHOD_PROTOCOL, get_protocol

        return get_protocol(METHOD_PROTOCOL.get(self.model, "fast") if self.protocol == "auto" else self.protocol)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}; known: {sorted(names)}")
        d = dict(d)
        if d.get("metrics") is not None:
            d["metrics"] = tuple(d["metrics"])
        return cls(**d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        return cls.from_dict(json.loads(Path(path).read_text()))
