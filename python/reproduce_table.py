"""The reproduction table: every method with its authors' defaults on the procedural Shapes3D stand-in, scored
with each paper's own evaluation protocol (:mod:`qkernels.metrics.protocols`).

Per method and seed: ``qkernels.train`` for ``--steps`` steps (the method's own batch size, lr, optimizer,
lambdas, input convention and data order; ``--arch small``, 32x32 images), then its authors' protocol (the
table row) and every protocol a paper's claim about it is judged with (a claim compares two methods under
the claiming paper's protocol: QLAE's, Tripod's, FactorQVAE's; D-VAE and Cliff report disentanglement_lib
metrics), on the protocols' sample counts (10,000; DCI with gradient boosting on 10,000 + 5,000) unless
``--eval-samples`` overrides them, plus PSNR. A protocol with a checkpoint selection (Tripod's: the best InfoM
among the evaluations above the dataset's PSNR threshold, :mod:`qkernels.train.selection`) also evaluates every
``--eval-every`` steps and reports the checkpoint its rule selects; the others the final step. Prints a markdown
table of mean +/- std over seeds, with the checkpoint each row reports, and one line per paper saying whether its
claim holds here.

    python python/reproduce_table.py --seeds 2 --steps 300 --eval-every 50 --json runs/table.json

Runs write to ``--out``/<method>-s<seed>; an existing run with results of the same steps and samples is reused.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from qkernels.metrics.protocols import METHOD_PROTOCOL, get_protocol
from qkernels.train import TrainConfig
from qkernels.train.evaluate import evaluate_model
from qkernels.train.loop import Trainer
from qkernels.train.run import scalars
from qkernels.train.selection import psnr_threshold, select_checkpoint

METHODS = ("ae", "qlae", "tripod", "factorqvae", "dvae", "factordvae", "cliff_vae", "beta_tcvae")
DATASET = "shapes3d_procedural"
COLUMNS = (("InfoM", "infomec.infom"), ("InfoC", "infomec.infoc"), ("InfoE", "infomec.infoe"),
           ("D", "dci.disentanglement"), ("C", "dci.completeness"), ("I", "dci.informativeness"),
           ("MIG", "mig.mig"), ("PSNR", "recon.psnr"))
# (paper, protocol, method a, method b, metric keys): "a above b in every metric", under the paper's protocol
CLAIMS = (
    ("QLAE (Hsu et al., 2023)", "qlae", "qlae", "ae", ("infomec.infom", "infomec.infoc")),
    ("Tripod (Hsu et al., 2024)", "tripod", "tripod", "qlae", ("infomec.infom",)),
    ("FactorQVAE (Baykal et al., 2024)", "factorqvae", "factorqvae", "dvae", ("dci.disentanglement",
                                                                             "infomec.infom")),
    ("D-VAE (Friede et al., 2023)", "dlib", "dvae", "beta_tcvae", ("mig.mig", "dci.disentanglement")),
    ("Cliff (Barin-Pacela et al., 2025)", "dlib", "cliff_vae", "beta_tcvae", ("dci.disentanglement", "mig.mig")),
)


def protocols_of(method: str) -> list[str]:
    """The method's own protocol first, then those its claims are judged with."""
    out = [METHOD_PROTOCOL[method]]
    for _, proto, a, b, _ in CLAIMS:
        if method in (a, b) and proto not in out:
            out.append(proto)
    return out


def _scores(tr: Trainer, cfg: TrainConfig, proto: str) -> dict:
    cfg.protocol = proto
    return scalars(evaluate_model(tr.model, tr.ds, cfg))


def run_one(method: str, seed: int, steps: int, out: Path, eval_samples: int | None, eval_every: int) -> dict:
    """Train one run, evaluating every ``eval_every`` steps under the protocols that select a checkpoint, and
    score it under each of its protocols: the selected checkpoint's metrics as ``"<protocol>:<metric>"``, the
    rule's record as ``"<protocol>:selection"``."""
    run_dir = out / f"{method}-s{seed}"
    done = run_dir / "table.json"
    if done.is_file():
        res = json.loads(done.read_text())
        if (res.get("steps"), res.get("eval_samples"), res.get("eval_every")) == (steps, eval_samples, eval_every):
            return res
    cfg = TrainConfig(model=method, dataset=DATASET, steps=steps, seed=seed, out=str(run_dir),
                      eval_samples=eval_samples, progress=False, checkpoint_every=steps,
                      log_every=max(steps // 20, 1))
    t0 = time.perf_counter()
    tr = Trainer(cfg)
    protos = protocols_of(method)
    selecting = [p for p in protos if get_protocol(p).selection != "final"]
    history: dict[str, list[dict]] = {p: [] for p in protos}
    for k in range(eval_every, steps, eval_every) if eval_every and selecting else ():
        tr.run(stop_after=k, final_eval=False)  # the same steps as one straight run (the RNG is per step)
        for p in selecting:
            history[p].append({"step": k, **_scores(tr, cfg, p)})
    tr.run(final_eval=False)
    res = {"method": method, "seed": seed, "steps": steps, "eval_samples": eval_samples, "eval_every": eval_every,
           "train_seconds": round(time.perf_counter() - t0, 1)}
    for proto in protos:
        history[proto].append({"step": steps, **_scores(tr, cfg, proto)})
        rule = get_protocol(proto).selection
        sel = select_checkpoint(history[proto], rule, psnr_threshold(DATASET) if rule == "tripod" else None)
        chosen = next(r for r in history[proto] if r["step"] == sel["step"])
        res.update({f"{proto}:{k}": v for k, v in chosen.items() if k != "step"})
        res[f"{proto}:selection"] = sel
    res["seconds"] = round(time.perf_counter() - t0, 1)
    done.write_text(json.dumps(res, indent=1) + "\n")
    return res


def checkpoint_cell(rs: list[dict], proto: str) -> str:
    """Which checkpoint a row reports, over its seeds: "final", or the rule's choice and why."""
    sels = [r[f"{proto}:selection"] for r in rs]
    if all(s["rule"] == "final" for s in sels):
        return "final"
    steps = ", ".join(str(s["step"]) for s in sels)
    passed = ", ".join(f"{s['passed']}/{s['evaluated']}" for s in sels)
    fallback = " (none passed: final)" if all(s["fallback"] for s in sels) else ""
    return f"{sels[0]['rule']}: step {steps}; >= {sels[0]['threshold_db']:g} dB: {passed}{fallback}"


def mean_std(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else float("nan")
    return m, s


def table(rows: list[dict], methods) -> str:
    """One row per method under its authors' protocol ("-": the protocol does not report the metric)."""
    head = "| method | protocol | checkpoint | " + " | ".join(c for c, _ in COLUMNS) + " | s/run |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 4)]
    for m in methods:
        rs = [r for r in rows if r["method"] == m]
        if not rs:
            continue
        proto, cells = METHOD_PROTOCOL[m], []
        for _, key in COLUMNS:
            v = [r[f"{proto}:{key}"] for r in rs if f"{proto}:{key}" in r]
            if not v:
                cells.append("-")
                continue
            mu, sd = mean_std(v)
            cells.append(f"{mu:.1f} ± {sd:.1f}" if key == "recon.psnr" else f"{mu:.3f} ± {sd:.3f}")
        lines.append(f"| {m} | {proto} | {checkpoint_cell(rs, proto)} | " + " | ".join(cells)
                     + f" | {mean_std([r['seconds'] for r in rs])[0]:.0f} |")
    return "\n".join(lines)


def claims(rows: list[dict]) -> list[str]:
    out = []
    for paper, proto, a, b, keys in CLAIMS:
        ra, rb = [r for r in rows if r["method"] == a], [r for r in rows if r["method"] == b]
        if not ra or not rb:
            continue
        parts, holds = [], True
        for k in keys:
            key = f"{proto}:{k}"
            (ma, sa), (mb, sb) = mean_std([r[key] for r in ra]), mean_std([r[key] for r in rb])
            holds &= ma > mb
            parts.append(f"{k} {ma:.3f} ± {sa:.3f} vs {mb:.3f} ± {sb:.3f}")
        out.append(f"- {paper}, {proto} protocol: {a} above {b} ({'; '.join(parts)}): "
                   f"{'holds' if holds else 'does NOT hold'} here")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--eval-samples", type=int, help="samples for every metric (default: each protocol's)")
    p.add_argument("--eval-every", type=int, default=50,
                   help="steps between the evaluations a selecting protocol (tripod) chooses from; 0: final only")
    p.add_argument("--out", default="runs/table")
    p.add_argument("--json", help="write every run's results here")
    a = p.parse_args(argv)
    rows = []
    for seed in range(a.seeds):
        for m in a.methods:
            rows.append(run_one(m, seed, a.steps, Path(a.out), a.eval_samples, a.eval_every))
            proto = METHOD_PROTOCOL[m]
            print(f"{m} seed {seed} ({proto}): " + ", ".join(
                f"{c} {rows[-1].get(f'{proto}:{k}', float('nan')):.3f}" for c, k in COLUMNS)
                + f" [{rows[-1]['seconds']} s]", flush=True)
    samples = a.eval_samples or "each protocol's"
    print(f"\n{a.seeds} seeds, {a.steps} steps each, procedural Shapes3D 32x32, eval on {samples} samples, "
          f"selecting protocols every {a.eval_every} steps\n")
    print(table(rows, a.methods))
    print("\n" + "\n".join(claims(rows)))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
