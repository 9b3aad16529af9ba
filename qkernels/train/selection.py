"""Which checkpoint of a run its table row reports: the final one, or the Tripod paper's selection.

Tripod (Hsu et al., ICML 2024), experiments section: "We filter checkpoints for adequate reconstruction: we
threshold based on the peak signal-to-noise ratio (PSNR) for each dataset at which reconstruction errors are
imperceptible (Appendix B.1) ... and report for each run the results given by the checkpoint with the best InfoM."
The thresholds are App. B.1's Table 2 (for 64 x 64 images, :data:`TRIPOD_PSNR_THRESHOLDS`); the authors' script
evaluates every 10,000 steps (tripod ``configs/train_autoencoder.yaml`` line 87, ``eval.period: 1e4``;
``scripts/train_autoencoder.py`` lines 317-323: also before the first step and every 2,000 steps of the first
10,000) and computes the PSNR on uint8 images, whose arithmetic wraps (:func:`qkernels.metrics.psnr_uint8`).

Here the candidates are the run's evaluations (``TrainConfig.eval_every``, :func:`eval_steps`) and the final one.
Under the ``tripod`` selection the cadence is on by default (``eval_every="auto"`` -> ``"tripod"``): the authors'
loop evaluates at its index ``step`` BEFORE that index's update, when ``step == 0``, ``(step + 1) % 10000 == 0``, or
``step + 1 < 10000`` and ``(step + 1) % 2000 == 0``; here that is the model after 0, 1,999, 3,999, 5,999, 7,999,
9,999, 19,999, ... updates (a run of 250,000 steps: 30 evaluations, the last after 249,999; qkernels also scores the
final step, one update later, which the authors' loop never evaluates). A run shorter than 50,000 steps (five of
the authors' periods) is scaled so that it still has several candidates at a bearable cost (each evaluation scores
10,000 images): it evaluates after ``k * (steps // 5) - 1`` updates for k = 1..4 and at the end, five candidates (a
CPU-sized run of 600 steps: after 119, 239, 359, 479 updates and at 600). ``"tripod"`` keeps the evaluations
whose ``recon.psnr_tripod`` reaches the dataset's threshold and picks the highest InfoM (ties: the earliest; a NaN InfoM
never wins); when none reaches it, the final step is reported and the record says so (``"fallback": true``): a
CPU-sized run at 32 x 32 does not reach 38 dB. The PSNR is computed on the images the protocol scores (Tripod's: the
10,000 InfoMEC images; :func:`qkernels.train.evaluate.evaluate_model`), as the authors' ``evaluate`` does on their
``num_val`` 10,000. ``"final"``: the last evaluation. ``metrics.json`` keeps the final step's metrics at its top level
and adds ``"selection"`` (the rule, step, threshold and counts) and ``"selected"`` (the chosen evaluation's metrics);
the chosen weights are saved as ``selected.pt`` when they are not the final ones.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from qkernels.train import checkpoint as ckpt
from qkernels.train.files import CHECKPOINT, LOG, METRICS_FILE, SELECTED, current_keys

SELECTIONS = ("final", "tripod")
#: Tripod paper App. B.1, Table 2: "PSNR threshold (dB) for 64x64"; another dataset takes Shapes3D's, a
#: procedural stand-in its real dataset's (as :data:`qkernels.models.registry.DATASET_SETTINGS`)
TRIPOD_PSNR_THRESHOLDS = {"shapes3d": 38.0, "mpi3d": 42.0, "falcor3d": 34.0, "isaac3d": 40.0}
#: tripod configs/train_autoencoder.yaml ``eval.period``: the authors' steps between evaluations
TRIPOD_EVAL_PERIOD = 10_000
#: a run shorter than this many periods evaluates on a scaled period (:func:`tripod_period`)
TRIPOD_MIN_PERIODS = 5
INFOM, PSNR = "infomec.infom", "recon.psnr_tripod"


def psnr_threshold(dataset: str) -> float:
    """The Tripod paper's PSNR threshold (dB) for ``dataset`` (:data:`TRIPOD_PSNR_THRESHOLDS`).

    Examples:
        >>> from qkernels.train.selection import psnr_threshold
        >>> psnr_threshold("mpi3d"), psnr_threshold("shapes3d_procedural"), psnr_threshold("sprites")
        (42.0, 38.0, 38.0)
    """
    from qkernels.models.registry import STAND_INS

    name = STAND_INS.get(dataset, dataset)
    return TRIPOD_PSNR_THRESHOLDS.get(name, TRIPOD_PSNR_THRESHOLDS["shapes3d"])


def tripod_period(steps: int) -> int:
    """The evaluation period of Tripod's cadence for a run of ``steps``: the authors' 10,000 from 50,000 steps on,
    else ``steps // 5`` (at least 1; the short-run scaling of the module docstring).

    Examples:
        >>> from qkernels.train.selection import tripod_period
        >>> tripod_period(250_000), tripod_period(50_000), tripod_period(600), tripod_period(3)
        (10000, 10000, 120, 1)
    """
    if steps >= TRIPOD_MIN_PERIODS * TRIPOD_EVAL_PERIOD:
        return TRIPOD_EVAL_PERIOD
    return max(1, steps // TRIPOD_MIN_PERIODS)


def eval_steps(cfg) -> list[int]:
    """The steps (updates done) after which a resolved config's run evaluates, besides the final step.

    ``cfg.eval_every`` N > 0: N, 2N, ... below ``cfg.steps``; 0: none; ``"tripod"``: the Tripod authors' cadence
    (module docstring): from 50,000 steps on 0, then ``k * 2000 - 1`` for k = 1..4, then ``k * 10000 - 1``; below,
    ``k * (steps // 5) - 1`` for k = 1..4; all below ``cfg.steps``.

    Examples:
        >>> from types import SimpleNamespace as C
        >>> from qkernels.train.selection import eval_steps
        >>> eval_steps(C(eval_every="tripod", steps=600))
        [119, 239, 359, 479]
        >>> at = eval_steps(C(eval_every="tripod", steps=250_000))
        >>> len(at), at[:7], at[-1]
        (30, [0, 1999, 3999, 5999, 7999, 9999, 19999], 249999)
        >>> eval_steps(C(eval_every=3, steps=10)), eval_steps(C(eval_every=0, steps=10))
        ([3, 6, 9], [])
    """
    total, every = int(cfg.steps), cfg.eval_every
    if every == "tripod":
        period = tripod_period(total)
        if period == TRIPOD_EVAL_PERIOD:
            at = {0, *(k * period // 5 - 1 for k in range(1, 5)), *range(period - 1, total, period)}
        else:
            at = {k * period - 1 for k in range(1, TRIPOD_MIN_PERIODS)}
        return sorted(s for s in at if 0 <= s < total)
    if isinstance(every, bool) or not isinstance(every, int) or every < 0:
        raise ValueError(f"eval_every must be an integer >= 0 or 'tripod' (resolve 'auto' first), got {every!r}")
    return list(range(every, total, every)) if every else []


def describe_cadence(cfg) -> str:
    """One phrase for the ``training ...`` line: when the run evaluates (a resolved config)."""
    at = eval_steps(cfg)
    if not at:
        return "evaluating at the end"
    shown = ", ".join(f"{s:,}" for s in at[:10]) + (f", ... ({len(at)} in all)" if len(at) > 10 else "")
    if cfg.eval_every != "tripod":
        return f"evaluating every {cfg.eval_every:,} steps ({shown}) and at the end"
    period = tripod_period(int(cfg.steps))
    scaled = (
        ""
        if period == TRIPOD_EVAL_PERIOD
        else (
            f", scaled for a run of {int(cfg.steps):,} steps: the authors' evaluate every 10,000 steps and every 2,000 "
            "of the first 10,000"
        )
    )
    return (
        f"evaluating after {shown} updates and at the end: Tripod's checkpoint cadence{scaled}; "
        f"{len(at) + 1} candidates; --eval-every N or 0 to change"
    )


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def select_checkpoint(records: list[dict], rule: str = "final", threshold: float | None = None) -> dict:
    """The evaluation ``rule`` picks among ``records`` (dicts with ``"step"`` and the metrics, in step order).

    ``"final"``: the last record. ``"tripod"``: among the records whose ``recon.psnr_tripod`` is >= ``threshold``
    (dB), the highest finite ``infomec.infom`` (ties: the earliest); none passes -> the last record, with
    ``"fallback": True``.

    Returns:
        ``{"rule", "step", "evaluated", "passed", "fallback", "why"}`` (+ ``"threshold_db"`` for ``"tripod"``;
        :meth:`CheckpointSelector.finish` adds ``"weights"``, the file holding the chosen weights).

    Raises:
        ValueError: an unknown rule, no records, or ``"tripod"`` without a threshold.

    Examples:
        >>> from qkernels.train.selection import select_checkpoint
        >>> recs = [{"step": 100, "infomec.infom": 0.9, "recon.psnr_tripod": 30.0},
        ...         {"step": 200, "infomec.infom": 0.7, "recon.psnr_tripod": 39.0},
        ...         {"step": 300, "infomec.infom": 0.6, "recon.psnr_tripod": 40.0}]
        >>> select_checkpoint(recs, "tripod", 38.0)["step"]  # step 100 is filtered out
        200
        >>> select_checkpoint(recs, "tripod", 45.0)["fallback"], select_checkpoint(recs)["step"]
        (True, 300)
    """
    if rule not in SELECTIONS:
        raise ValueError(f"selection must be one of {SELECTIONS}, got {rule!r}")
    if not records:
        raise ValueError("select_checkpoint needs at least one evaluation record")
    last = records[-1]
    out = {
        "rule": rule,
        "step": last["step"],
        "evaluated": len(records),
        "passed": len(records),
        "fallback": False,
        "why": "the final step",
    }
    if rule == "final":
        return out
    if threshold is None:
        raise ValueError("selection 'tripod' needs a PSNR threshold (psnr_threshold(dataset))")
    passed = [r for r in records if _finite(r.get(PSNR)) and r[PSNR] >= threshold]
    ranked = [r for r in passed if _finite(r.get(INFOM))]
    out.update(threshold_db=threshold, passed=len(passed))
    if not ranked:
        best = max((r[PSNR] for r in records if _finite(r.get(PSNR))), default=float("nan"))
        out.update(fallback=True, why=f"no evaluation reached {threshold:g} dB (best {best:.1f} dB): the final step")
        return out
    top = max(r[INFOM] for r in ranked)
    chosen = next(r for r in ranked if r[INFOM] == top)
    out.update(
        step=chosen["step"],
        why=f"the best InfoM of the {len(passed)} of {len(records)} evaluations at >= {threshold:g} dB",
    )
    return out


def eval_records(out: str | Path) -> list[dict]:
    """The evaluation lines of a run's log (``log.jsonl``), in order (keys renamed since: their current names)."""
    log = Path(out) / LOG
    if not log.is_file():
        return []
    rows = [json.loads(ln) for ln in log.read_text().splitlines() if ln]
    return [current_keys(r) for r in rows if r.get("type") == "eval"]


class CheckpointSelector:
    """Applies a run's selection rule (``cfg.select``; ``"auto"``: its protocol's) as the trainer evaluates.

    :meth:`observe` after each periodic evaluation (its line already in the log): saves the weights as
    ``selected.pt`` when that evaluation becomes the chosen one. :meth:`finish` with the final metrics: adds
    ``"selection"`` and ``"selected"`` to ``metrics.json`` and returns the metrics so extended."""

    def __init__(self, cfg, out: str | Path) -> None:
        rule = cfg.selection_rule()
        self.rule, self.out, self.periodic = rule, Path(out), bool(eval_steps(cfg))
        self.threshold = psnr_threshold(cfg.dataset) if rule == "tripod" else None

    def current(self) -> dict | None:
        recs = eval_records(self.out)
        return select_checkpoint(recs, self.rule, self.threshold) if recs else None

    def observe(self, step: int, model) -> None:
        if self.rule == "final":
            return
        sel = self.current()
        if sel is not None and sel["step"] == step and not sel["fallback"]:
            ckpt.save_atomic({"step": step, "model": model.state_dict(), "selection": sel}, self.out / SELECTED)

    def finish(self, res: dict) -> dict:
        recs = eval_records(self.out)
        sel = select_checkpoint(recs, self.rule, self.threshold)
        if not self.periodic and self.rule != "final":
            sel["why"] += " (no periodic evaluation: --eval-every 0)"
        chosen = next(r for r in recs if r["step"] == sel["step"])
        sel["weights"] = CHECKPOINT if sel["step"] == res["step"] else SELECTED
        held = self.out / SELECTED
        if held.is_file() and (sel["weights"] != SELECTED or ckpt.load(held)["step"] != sel["step"]):
            held.unlink()  # an earlier choice that a later evaluation displaced
        res = {**res, "selection": sel, "selected": {k: v for k, v in chosen.items() if k != "type"}}
        ckpt.write_text_atomic(json.dumps(res, indent=1) + "\n", self.out / METRICS_FILE)
        return res
