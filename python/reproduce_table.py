"""The reproduction table: every method with its authors' defaults on the procedural Shapes3D stand-in.

Per method and seed: ``qkernels.train`` for ``--steps`` steps (the method's own batch size, lr, optimizer and
lambdas; ``--arch small``, 32x32 images), then InfoM / InfoC / InfoE, DCI under both published conventions
(``preset="tripod"`` and ``"dlib"``), MIG and PSNR on ``--eval-samples`` fresh samples. Prints a markdown table
of mean +/- std over seeds and one line per paper saying whether its qualitative claim holds here.

    python python/reproduce_table.py --seeds 3 --steps 500 --json runs/table.json

Runs write to ``--out``/<method>-s<seed>; an existing run with a metrics file of the same steps is reused.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from qkernels.metrics import evaluate
from qkernels.train import TrainConfig
from qkernels.train.evaluate import encode_fn, evaluate_model
from qkernels.train.loop import Trainer

METHODS = ("ae", "qlae", "tripod", "factorqvae", "dvae", "cliff_vae", "beta_tcvae")
COLUMNS = (("InfoM", "infomec.infom"), ("InfoC", "infomec.infoc"), ("InfoE", "infomec.infoe"),
           ("D (tripod)", "dci.disentanglement"), ("C (tripod)", "dci.completeness"),
           ("D (dlib)", "dci_dlib.disentanglement"), ("C (dlib)", "dci_dlib.completeness"),
           ("MIG", "mig.mig"), ("PSNR", "recon.psnr"))
# (paper, claim, method a, method b, metric keys): "a above b in every metric"
CLAIMS = (
    ("QLAE (Hsu et al., 2023)", "qlae", "ae", ("infomec.infom", "infomec.infoc")),
    ("Tripod (Hsu et al., 2024)", "tripod", "qlae", ("infomec.infom",)),
    ("FactorQVAE (Baykal et al., 2024)", "factorqvae", "dvae", ("dci.disentanglement", "infomec.infom")),
    ("D-VAE (Friede et al., 2023)", "dvae", "beta_tcvae", ("mig.mig", "dci.disentanglement")),
    ("Cliff (Barin-Pacela et al., 2025)", "cliff_vae", "beta_tcvae", ("dci.disentanglement", "infomec.infom")),
)


def run_one(method: str, seed: int, steps: int, out: Path, eval_samples: int) -> dict:
    run_dir = out / f"{method}-s{seed}"
    done = run_dir / "table.json"
    if done.is_file():
        res = json.loads(done.read_text())
        if res.get("steps") == steps:
            return res
    cfg = TrainConfig(model=method, dataset="shapes3d_procedural", steps=steps, seed=seed, out=str(run_dir),
                      eval_samples=eval_samples, metrics=("infomec", "dci", "mig"), progress=False,
                      checkpoint_every=steps, log_every=max(steps // 20, 1))
    t0 = time.perf_counter()
    tr = Trainer(cfg)
    tr.run(final_eval=False)
    model = tr.model.eval()
    res = {k: v for k, v in evaluate_model(model, tr.ds, cfg, num_samples=eval_samples).items()
           if isinstance(v, (int, float))}
    dlib = evaluate(encode_fn(model), tr.ds, metrics=("dci",), options={"dci": {"preset": "dlib"}},
                    num_samples=eval_samples, seed=cfg.seed + 1)
    res.update({f"dci_dlib.{k[4:]}": v for k, v in dlib.items() if isinstance(v, float)})
    res.update({"method": method, "seed": seed, "steps": steps, "seconds": round(time.perf_counter() - t0, 1)})
    done.write_text(json.dumps(res, indent=1) + "\n")
    return res


def mean_std(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else float("nan")
    return m, s


def table(rows: list[dict], methods) -> str:
    head = "| method | " + " | ".join(c for c, _ in COLUMNS) + " | s/run |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for m in methods:
        rs = [r for r in rows if r["method"] == m]
        if not rs:
            continue
        cells = []
        for _, key in COLUMNS:
            v = [r[key] for r in rs if key in r]
            mu, sd = mean_std(v) if v else (float("nan"), float("nan"))
            cells.append(f"{mu:.1f} ± {sd:.1f}" if key == "recon.psnr" else f"{mu:.3f} ± {sd:.3f}")
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {mean_std([r['seconds'] for r in rs])[0]:.0f} |")
    return "\n".join(lines)


def claims(rows: list[dict]) -> list[str]:
    out = []
    for paper, a, b, keys in CLAIMS:
        ra, rb = [r for r in rows if r["method"] == a], [r for r in rows if r["method"] == b]
        if not ra or not rb:
            continue
        parts, holds = [], True
        for k in keys:
            (ma, sa), (mb, sb) = mean_std([r[k] for r in ra]), mean_std([r[k] for r in rb])
            holds &= ma > mb
            parts.append(f"{k} {ma:.3f} ± {sa:.3f} vs {mb:.3f} ± {sb:.3f}")
        out.append(f"- {paper}: {a} above {b} ({'; '.join(parts)}): {'holds' if holds else 'does NOT hold'} here")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", nargs="+", default=list(METHODS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--eval-samples", type=int, default=2000)
    p.add_argument("--out", default="runs/table")
    p.add_argument("--json", help="write every run's results here")
    a = p.parse_args(argv)
    rows = []
    for seed in range(a.seeds):
        for m in a.methods:
            rows.append(run_one(m, seed, a.steps, Path(a.out), a.eval_samples))
            print(f"{m} seed {seed}: " + ", ".join(f"{c} {rows[-1].get(k, float('nan')):.3f}" for c, k in COLUMNS)
                  + f" [{rows[-1]['seconds']} s]", flush=True)
    print(f"\n{a.seeds} seeds, {a.steps} steps each, procedural Shapes3D 32x32, eval on {a.eval_samples} samples\n")
    print(table(rows, a.methods))
    print("\n" + "\n".join(claims(rows)))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
