"""Evaluation of a model / a saved run, and the cross-run comparison table.

Image datasets: ``qkernels.metrics.evaluate`` with the run's protocol (``cfg.protocol``; "auto": the method's
authors' (:mod:`qkernels.metrics.protocols`), recorded as ``"protocol"`` in metrics.json); discrete methods are
scored on their integer codes, or on their latent values where the protocol says so (Tripod's); continuous ones
on ``encode``; plus reconstruction MSE and two PSNRs on the images the protocol's InfoMEC scores (the first
``samples["infomec"]`` of its draw, 10,000 for the papers' protocols; all of them when InfoMEC is not run), as
Tripod's authors compute the PSNR of their checkpoint filter on the same ``num_val`` images as their InfoMEC
(:mod:`qkernels.train.selection`): ``recon.psnr``, the PSNR of the float images (10 log10(1 / MSE) per image in
[0, 1], then the mean), and ``recon.psnr_tripod``, the Tripod paper's: its authors' PSNR on wrapped uint8 images
(:func:`qkernels.metrics.psnr_uint8`, never below 24.07 dB), the one its checkpoint thresholds (38 dB on Shapes3D)
apply to. ``balls``: also the Spearman MCC of the Cliff paper's Table 2 (``mcc.spearman``)
between the true continuous ball coordinates and the representation, on as many fresh draws.
``quantized_grid2d``: MCC between the encoded and the true continuous latents.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from qkernels.data.balls import Balls
from qkernels.train.data import generator, is_ground_truth
from qkernels.train.eval_progress import EvalProgress
from qkernels.train.files import CHECKPOINT, CONFIG, METRICS_FILE, current_keys
from qkernels.train.run import build, scalars

RECON_SAMPLES = 256


def _jsonable(v):
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu().numpy()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def encode_fn(model, discrete_latents: str = "codes"):
    """The representation the metrics score: a discrete model's integer codes (or its latent values, with
    ``discrete_latents="values"``), a continuous model's ``encode``."""

    def fn(x):
        c = model.codes(x)
        return model.encode(x) if c is None or discrete_latents == "values" else c

    return fn


@torch.no_grad()
def evaluate_model(model, ds, cfg, *, num_samples: int | None = None, progress: EvalProgress | None = None) -> dict:
    """Metrics of ``model`` on ``ds`` with ``cfg``'s protocol -> flat dict (matrices as nested lists).
    ``num_samples``: every metric's sample count (default ``cfg.eval_samples``, else the protocol's); ``progress``:
    says what it is doing, as it goes (:class:`~qkernels.train.eval_progress.EvalProgress`).

    Examples:
        >>> from qkernels.train import TrainConfig, build, evaluate_model
        >>> cfg = TrainConfig(model="cliff_ae", dataset="quantized_grid2d", dataset_kwargs={"n": 256})
        >>> model, ds = build(cfg)
        >>> res = evaluate_model(model.eval(), ds, cfg, num_samples=200)
        >>> sorted(res), 0 <= res["mcc.mcc"] <= 1
        (['mcc.matching', 'mcc.mcc', 'recon.mse'], True)
    """
    from qkernels import metrics as M
    from qkernels.metrics.evaluate import sample_counts

    was = model.training
    model.eval()
    dev = next(model.parameters()).device
    try:
        if not is_ground_truth(ds):
            if progress is not None:
                progress.stage(f"MCC of the latents of all {len(ds.x):,} points, reconstructions")
            z = model.encode(ds.x.to(dev)).cpu()
            res = {f"mcc.{k}": v for k, v in M.mcc(ds.z, z).items()}
            x = ds.x[:RECON_SAMPLES]
            xh = model.decode(model.encode(x.to(dev))).cpu()
            res["recon.mse"] = float(M.mse(xh, x))
            return _jsonable(res)
        proto = cfg.eval_protocol()
        enc = encode_fn(model, proto.discrete_latents)
        kw = {}
        if proto.discrete_latents == "values":  # a discrete model's values, scored as discrete (float dtype)
            one = ds.observations_from_factors(ds.sample_factors(1, generator(cfg.seed, 3)))
            kw["discrete_latents"] = model.codes(one.to(dev)) is not None
        names = tuple(cfg.metrics) if cfg.metrics is not None else proto.metrics
        n = num_samples or cfg.eval_samples
        counts = sample_counts(proto, names, n)
        tally = ReconTally(model, counts.get("infomec", max(counts.values())))

        def rep(x):  # the representation the metrics score; the same images' reconstructions are tallied
            x = x.to(dev)
            return tally.add(x, enc(x)).cpu()

        if progress is not None:
            progress.begin(proto, counts)
            kw.update(progress=progress.encoded, on_metric=progress.metric)
        res = M.evaluate(rep, ds, protocol=proto, metrics=names, num_samples=n, seed=cfg.seed + 1, batch_size=256, **kw)
        res.update(tally.scores())
        if isinstance(ds, Balls):
            if progress is not None:
                progress.stage(f"the Spearman MCC on {tally.n:,} fresh draws")
            res["mcc.spearman"] = balls_spearman_mcc(lambda x: enc(x.to(dev)).cpu(), ds, tally.n, cfg.seed)
        return _jsonable(res)
    finally:
        model.train(was)


class ReconTally:
    """Reconstruction scores of the first ``n`` images a metric pass encodes, in batches: :meth:`add` each batch
    with its representation (returned unchanged), :meth:`scores` at the end -> ``recon.mse`` (over all elements),
    ``recon.psnr`` and ``recon.psnr_tripod`` (:func:`~qkernels.metrics.psnr_uint8`; means over the images,
    :mod:`qkernels.metrics.image`)."""

    def __init__(self, model, n: int) -> None:
        self.model, self.n, self.seen = model, int(n), 0
        self.sums = {"mse": 0.0, "psnr": 0.0, "psnr_tripod": 0.0}

    def add(self, x: torch.Tensor, rep: torch.Tensor) -> torch.Tensor:
        from qkernels import metrics as M

        k = min(self.n - self.seen, x.shape[0])
        if k > 0:
            x = x[:k]
            xh = self.model.decode(self.model.encode(x))
            x, xh = x.cpu(), xh.cpu()
            self.sums["mse"] += M.mse(xh, x) * k
            self.sums["psnr"] += M.psnr(xh, x) * k
            self.sums["psnr_tripod"] += M.psnr_uint8(x, xh) * k  # the Tripod paper's (selection.py)
            self.seen += k
        return rep

    def scores(self) -> dict:
        return {f"recon.{k}": v / max(self.seen, 1) for k, v in self.sums.items()}


def balls_spearman_mcc(encode, ds, n: int, seed: int, batch_size: int = 256) -> float:
    """The Cliff paper's Balls score (§E, Table 2: "the Mean Correlation Coefficient (MCC) with Spearman correlation
    coefficient"): MCC (:func:`qkernels.metrics.mcc`, ``method="spearman"``) between ``n`` fresh draws of the
    ball coordinates (``ds.sample``, generator (seed, 4)) and ``encode`` of their images."""
    from qkernels import metrics as M

    images, z = ds.sample(int(n), generator(seed, 4))
    reps = [torch.as_tensor(encode(images[i : i + batch_size])) for i in range(0, images.shape[0], batch_size)]
    return float(M.mcc(z, torch.cat(reps).double(), method="spearman")["mcc"])


def finish_run(
    model,
    ds,
    cfg,
    out: Path,
    *,
    step: int,
    log=None,
    num_samples: int | None = None,
    progress: EvalProgress | None = None,
) -> dict:
    """Final evaluation: metrics.json + figures (loss curves from the log included); also an eval line in the
    log when ``log`` is given; ``progress``: says what it is doing as it goes."""
    from qkernels.train import figures
    from qkernels.train.checkpoint import write_text_atomic

    res = evaluate_model(model, ds, cfg, num_samples=num_samples, progress=progress)
    res = {"step": step, "model": cfg.model, "dataset": cfg.dataset, **res}
    write_text_atomic(json.dumps(res, indent=1) + "\n", Path(out) / METRICS_FILE)
    if log is not None:
        log({"type": "eval", **scalars(res)})
    if progress is not None:
        progress.stage("drawing the figures")
    figures.make_all(model, ds, cfg, Path(out) / "figures", res)
    figures.loss_figure(out, cfg, step)
    if progress is not None:
        progress.close()
    return res


def load_run(run_dir: str | Path, device: str = "cpu"):
    """(model, dataset, config, step) of a saved run, model in eval mode with the checkpoint's weights.

    Examples:
        >>> import tempfile
        >>> from qkernels.train import TrainConfig, load_run, train
        >>> out = tempfile.mkdtemp()
        >>> cfg = TrainConfig(model="cliff_ae", dataset="quantized_grid2d", dataset_kwargs={"n": 256}, steps=2,
        ...                   batch_size=32, out=out, progress=False)
        >>> train(cfg, final_eval=False)
        >>> model, ds, saved, step = load_run(out)
        >>> type(model).__name__, model.training, saved.model, step
        ('CliffAE', False, 'cliff_ae', 2)
    """
    from qkernels.train import checkpoint as ckpt
    from qkernels.train.config import TrainConfig

    run_dir = Path(run_dir)
    cfg = TrainConfig.load(run_dir / CONFIG)
    cfg.device = device
    model, ds = build(cfg)
    s = ckpt.load(run_dir / CHECKPOINT, map_location=device)
    model.load_state_dict(s["model"])
    model.eval()
    return model, ds, cfg, int(s["step"])


def eval_run(
    run_dir: str | Path,
    *,
    num_samples: int | None = None,
    device: str = "cpu",
    protocol: str | None = None,
    progress: bool = False,
) -> dict:
    """Re-evaluate a saved run: rewrites its metrics.json and figures (``protocol``: instead of the run's);
    ``progress``: say on stderr what it is doing (protocol, samples, metrics), with an estimate and progress.

    Returns the metrics written (a dict with the run's model, dataset and step).

    Examples:
        >>> import os, tempfile
        >>> from qkernels.train import TrainConfig, eval_run, train
        >>> out = tempfile.mkdtemp()
        >>> cfg = TrainConfig(model="cliff_ae", dataset="quantized_grid2d", dataset_kwargs={"n": 256}, steps=2,
        ...                   batch_size=32, out=out, progress=False)
        >>> train(cfg, final_eval=False)
        >>> res = eval_run(out, num_samples=200)
        >>> res["step"], "mcc.mcc" in res, os.path.isfile(out + "/metrics.json")
        (2, True, True)
    """
    model, ds, cfg, step = load_run(run_dir, device)
    if protocol is not None:
        cfg.protocol = protocol
    said = EvalProgress(f"qkernels eval: {run_dir} ({cfg.model} on {cfg.dataset}, step {step})", enabled=progress)
    return finish_run(model, ds, cfg, Path(run_dir), step=step, num_samples=num_samples, progress=said)


COLUMNS = (
    "infomec.infom",
    "infomec.infoc",
    "infomec.infoe",
    "dci.disentanglement",
    "dci.completeness",
    "dci.informativeness",
    "mig.mig",
    "mcc.mcc",
    "recon.psnr",
    "recon.psnr_tripod",
    "recon.mse",
)


def scored_with(metrics: dict) -> tuple[str, str]:
    """(protocol, sample counts) a metrics.json was scored with: ``("tripod", "10,000")``, ``("factorqvae",
    "10,000/15,000")`` (per metric, in its order); ``"-"`` where it does not say (2-D data: MCC on every point)."""
    counts = [v for k, v in metrics.items() if k.endswith(".num_samples") and isinstance(v, int)]
    return str(metrics.get("protocol", "-")), "/".join(f"{n:,}" for n in dict.fromkeys(counts)) or "-"


def compare_runs(run_dirs, *, columns=None, width: int = 120) -> str:
    """A plain-text table: one row per run (model, dataset, step, the protocol and sample counts it was scored
    with, and the metric columns present), and a warning under it when the runs were scored with different
    protocols or sample counts (their numbers are then not comparable: ``qkernels eval --protocol P
    --eval-samples N`` re-scores a run). Metrics.json files written before a metric was renamed
    (:data:`~qkernels.train.files.RENAMED_KEYS`) show under the current name.

    ``columns``: the metric keys to show (default: the known ones present). A table wider than ``width``
    characters is wrapped: the metric columns that do not fit go to further tables below, each starting with
    the run's column again. Raises FileNotFoundError for a run without metrics.json.

    Examples:
        >>> import tempfile
        >>> from qkernels.train import TrainConfig, compare_runs, eval_run, train
        >>> out = tempfile.mkdtemp()
        >>> cfg = TrainConfig(model="cliff_ae", dataset="quantized_grid2d", dataset_kwargs={"n": 256}, steps=2,
        ...                   batch_size=32, out=out, progress=False)
        >>> train(cfg, final_eval=False)
        >>> _ = eval_run(out, num_samples=200)
        >>> compare_runs([out]).splitlines()[0].split()  # the header; then a rule and one row per run
        ['run', 'model', 'dataset', 'step', 'mcc.mcc', 'recon.mse']
    """
    rows = []
    for d in run_dirs:
        p = Path(d) / "metrics.json"
        if not p.is_file():
            raise FileNotFoundError(f"{p} not found: train or `qkernels eval {d}` first")
        rows.append((str(d), current_keys(json.loads(p.read_text()))))
    cols = list(columns) if columns else [c for c in COLUMNS if any(c in r for _, r in rows)]
    scored = {name: scored_with(r) for name, r in rows}
    shown = any(s != ("-", "-") for s in scored.values())  # the protocol columns: when some run names one
    fixed = ["run", "model", "dataset", "step", *(["protocol", "samples"] if shown else [])]
    head = [*fixed, *cols]
    body = [
        [
            name,
            str(r.get("model", "")),
            str(r.get("dataset", "")),
            str(r.get("step", "")),
            *(scored[name] if shown else ()),
            *[_fmt(r.get(c)) for c in cols],
        ]
        for name, r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    blocks: list[list[int]] = [list(range(len(fixed)))]  # column indices per table; the others start with the run
    for i in range(len(fixed), len(head)):
        first = len(fixed) if len(blocks) == 1 else 1
        if blocks[-1][first:] and sum(widths[j] + 2 for j in blocks[-1]) + widths[i] > width:
            blocks.append([0])
        blocks[-1].append(i)

    def table(idx: list[int]) -> str:
        def line(cells: list[str]) -> str:
            return "  ".join(cells[j].ljust(widths[j]) for j in idx).rstrip()

        return "\n".join([line(head), line(["-" * w for w in widths]), *(line(b) for b in body)])

    text = "\n\n".join(table(idx) for idx in blocks)
    if len(set(scored.values())) > 1:
        groups: dict[tuple[str, str], list[str]] = {}
        for name, how in scored.items():
            groups.setdefault(how, []).append(name)
        ways = "; ".join(
            f"{'no protocol' if p == '-' else f'{p} protocol on {n} samples'}: {', '.join(names)}"
            for (p, n), names in groups.items()
        )
        text += (
            f"\n\nwarning: these runs were scored differently ({ways}): their metrics are not comparable. "
            "Score them alike with `qkernels eval RUN_DIR --protocol NAME --eval-samples N`"
        )
    return text


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.4g}"
    return str(v)
