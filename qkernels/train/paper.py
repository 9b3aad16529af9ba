"""The papers' settings in one switch: ``qkernels train --paper`` / :func:`paper_config`.

For a method and dataset, :func:`paper_fields` gives the :class:`~qkernels.train.TrainConfig` fields its paper trains
and scores with: the authors' network (``arch="paper"``), their image size (64 x 64 in all five papers), their run
length (:func:`~qkernels.models.registry.paper_steps`), their evaluation cadence (Tripod's every 10,000 steps,
:mod:`qkernels.train.selection`; the others evaluate at the end) and their protocol
(:data:`~qkernels.metrics.protocols.METHOD_PROTOCOL`). Everything else (optimizer, lr, batch size, loss weights, data
order) already defaults to the authors' (:mod:`qkernels.models.registry`). Fields given besides ``--paper`` win;
``config.json`` records ``"paper": true`` and the values used, and the run's ``training ...`` line names what
differs from the paper (:func:`describe_settings`), as the CPU-sized default's line says that it is not the paper's.

Cliff (Barin-Pacela et al., ICML 2025): ``cliff_ae`` on ``quantized_grid2d`` is App. F.2 (5,000 samples, batch 5,000,
1,000 epochs = 1,000 steps) with App. G.1's mixing ``x = B tanh(A (0.5 z))`` as printed (``mixing="paper"``,
:mod:`qkernels.data.grid2d`); ``cliff_vae`` on Shapes3D is App. F.4. The Balls model of Table 2 (an autoencoder
with Lachapelle et al.'s architecture, App. F.3 / G.2) is not in qkernels: ``--paper`` refuses it (a Balls run of
any method still reports the Spearman MCC of Table 2, :func:`qkernels.train.evaluate.evaluate_model`).
"""

from __future__ import annotations

#: each method's paper (the one whose table reports it as its own method or its direct baseline)
METHOD_PAPER = {
    "ae": "qlae",
    "qlae": "qlae",
    "tripod": "tripod",
    "qvae": "factorqvae",
    "factorqvae": "factorqvae",
    "dvae": "dvae",
    "factordvae": "dvae",
    "cliff_vae": "cliff",
    "cliff_ae": "cliff",
}
PAPER_NAMES = {
    "qlae": "QLAE (Hsu et al., NeurIPS 2023)",
    "tripod": "Tripod (Hsu et al., ICML 2024)",
    "factorqvae": "FactorQVAE (Baykal et al., 2024)",
    "dvae": "D-VAE (Friede et al., 2023)",
    "cliff": "Cliff (Barin-Pacela et al., ICML 2025)",
}
#: the datasets each paper reports (a procedural stand-in takes its real dataset's settings)
PAPER_DATASETS = {
    "qlae": ("shapes3d", "mpi3d", "falcor3d", "isaac3d"),
    "tripod": ("shapes3d", "mpi3d", "falcor3d", "isaac3d"),
    "factorqvae": ("shapes3d", "isaac3d", "mpi3d"),
    "dvae": ("dsprites", "shapes3d", "mpi3d"),
    "cliff": ("quantized_grid2d", "balls", "shapes3d"),
}
PAPER_IMAGE_SIZE = 64
#: the fields :func:`describe_settings` compares (label, field)
_SHOWN = (
    ("arch", "arch"),
    ("image size", "image_size"),
    ("steps", "steps"),
    ("evaluation cadence", "eval_every"),
    ("protocol", "protocol"),
    ("batch size", "batch_size"),
    ("data", "dataset_kwargs"),
)


def paper_fields(model: str, dataset: str) -> dict:
    """The TrainConfig fields of ``model``'s paper on ``dataset`` (module docstring).

    Raises:
        ValueError: a method no paper here trains (``beta_vae``, ``beta_tcvae``, ``factorvae``), or a method and
            dataset its paper does not pair (``cliff_ae`` off ``quantized_grid2d``; ``cliff_vae`` on Balls or the
            synthetic grid).

    Examples:
        >>> from qkernels.train.paper import paper_fields
        >>> f = paper_fields("tripod", "shapes3d")
        >>> f["arch"], f["image_size"], f["steps"], f["eval_every"], f["protocol"]
        ('paper', 64, 250000, 'tripod', 'tripod')
        >>> paper_fields("cliff_ae", "quantized_grid2d")["dataset_kwargs"]
        {'n': 5000, 'mixing': 'paper'}
    """
    from qkernels.metrics.protocols import METHOD_PROTOCOL
    from qkernels.models.registry import METHODS, paper_steps

    if model not in METHODS:
        raise ValueError(f"model must be one of {', '.join(METHODS)}, got {model!r}")
    if model not in METHOD_PAPER:
        raise ValueError(
            f"--paper: {model} is no method of the five papers (theirs: {', '.join(METHOD_PAPER)}); "
            "give its settings as flags"
        )
    if model == "cliff_ae":
        if dataset != "quantized_grid2d":
            raise ValueError(
                f"--paper: cliff_ae is Cliff's App. F.2 network for the synthetic quantized_grid2d, not {dataset}"
            )
        return {
            "steps": paper_steps(model),
            "batch_size": METHODS[model].batch_size,
            "eval_every": 0,
            "protocol": METHOD_PROTOCOL[model],
            "dataset_kwargs": {"n": 5000, "mixing": "paper"},
        }
    if model == "cliff_vae" and dataset in ("balls", "quantized_grid2d"):
        raise ValueError(
            f"--paper: the Cliff paper trains cliff_vae on Shapes3D only; its {dataset} model ("
            + (
                "an autoencoder with Lachapelle et al.'s architecture, App. F.3 / G.2, Table 2) is not in qkernels"
                if dataset == "balls"
                else "App. F.2) is --model cliff_ae"
            )
            + ")"
        )
    return {
        "arch": "paper",
        "image_size": PAPER_IMAGE_SIZE,
        "steps": paper_steps(model),
        "eval_every": "tripod" if model == "tripod" else 0,
        "protocol": METHOD_PROTOCOL[model],
    }


def apply_paper(fields: dict) -> tuple[dict, str]:
    """``fields`` (TrainConfig fields given, e.g. by flags) over the paper's (:func:`paper_fields` of their model and
    dataset; ``dataset_kwargs`` merged), with ``"paper": True`` -> (fields, what --paper set, one phrase).
    ValueError as :func:`paper_fields`.

    Examples:
        >>> from qkernels.train.paper import apply_paper
        >>> f, said = apply_paper({"model": "qlae", "dataset": "mpi3d", "steps": 100})
        >>> f["steps"], f["arch"], f["paper"]
        (100, 'paper', True)
        >>> said
        'arch paper, image size 64, evaluation cadence at the end, protocol qlae (QLAE (Hsu et al., NeurIPS 2023))'
    """
    from qkernels.train.config import TrainConfig

    model, dataset = fields.get("model", TrainConfig.model), fields.get("dataset", TrainConfig.dataset)
    theirs = paper_fields(model, dataset)
    out = {**theirs, **fields, "paper": True}
    if "dataset_kwargs" in theirs:
        out["dataset_kwargs"] = {**theirs["dataset_kwargs"], **fields.get("dataset_kwargs", {})}
    set_ = [f"{label} {_show(f, out[f])}" for label, f in _SHOWN if f in theirs and f not in fields]
    return out, ", ".join(set_) + f" ({PAPER_NAMES[METHOD_PAPER[model]]})"


def paper_config(model: str, dataset: str, **fields):
    """A :class:`~qkernels.train.TrainConfig` with the paper's settings for ``model`` on ``dataset`` and ``fields``
    over them (e.g. ``seed``, ``out``); ``config.paper`` is True. ValueError as :func:`paper_fields`.

    Examples:
        >>> from qkernels.train.paper import paper_config
        >>> cfg = paper_config("factorqvae", "isaac3d", seed=2).resolve_defaults()
        >>> cfg.steps, cfg.arch, cfg.image_size, cfg.batch_size, cfg.paper
        (50000, 'paper', 64, 256, True)
    """
    from qkernels.train.config import TrainConfig

    return TrainConfig.from_dict(apply_paper({"model": model, "dataset": dataset, **fields})[0])


def describe_settings(cfg) -> str:
    """One phrase for a run's ``training ...`` line: whether it runs its paper's settings, and what differs.

    Examples:
        >>> from qkernels.train import TrainConfig
        >>> from qkernels.train.paper import describe_settings
        >>> said = describe_settings(TrainConfig(model="qlae").resolve_defaults())
        >>> said.startswith("not the paper's settings: arch small (theirs paper), image size 32 (theirs 64)")
        True
        >>> said.endswith("600 of their 200,000 steps; --paper for theirs")
        True
    """
    try:
        theirs = paper_fields(cfg.model, cfg.dataset)
    except ValueError:
        return "no paper's settings for this method and dataset"
    from qkernels.models.registry import STAND_INS

    real = STAND_INS.get(cfg.dataset, cfg.dataset)
    paper = METHOD_PAPER[cfg.model]
    note = "" if real in PAPER_DATASETS[paper] else f" ({cfg.dataset} is not in the paper: its Shapes3D settings)"
    diffs = []
    for label, f in _SHOWN:
        if f not in theirs:
            continue
        mine, want = getattr(cfg, f), theirs[f]
        if f == "dataset_kwargs":
            mine = {k: v for k, v in mine.items() if k in want}
        if mine == want or (f == "protocol" and mine == "auto"):
            continue
        if f == "steps":
            diffs.append(f"{_show(f, mine)} of their {_show(f, want)} steps")
        else:
            diffs.append(f"{label} {_show(f, mine)} (theirs {_show(f, want)})")
    if not diffs:
        return f"the paper's settings{note}"
    head = "the paper's settings except" if cfg.paper else "not the paper's settings:"
    tail = "" if cfg.paper else "; --paper for theirs"
    return f"{head} {', '.join(diffs)}{note}{tail}"


def _show(field: str, v) -> str:
    if field == "eval_every":
        return {0: "at the end", "tripod": "Tripod's"}.get(v, f"every {v}")
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {x}" for k, x in v.items())
    return str(v)
