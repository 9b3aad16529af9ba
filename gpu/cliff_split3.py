"""Issue 44's experiment for Cliff at large shapes on a GPU: the reference's bivariate product (its one GEMM,
``einsum("ikn,jmn->ijmk")``, forward and both backward products) as three cuBLAS TF32 GEMMs on a hi / lo split of
each operand ("3xTF32": hi = the operand rounded to TF32, lo = the rest; hi @ hi + (hi @ lo + lo @ hi), float32
accumulation), the rest of the reference unchanged, eager and under ``torch.compile``; against the compiled
reference with float32 "highest" GEMMs, at the four benchmark shapes. Is the issue's "products through cuBLAS in
TF32 with a hi / lo split" worth building into the triton backend: how fast, and how close to float64?

    python gpu/cliff_split3.py OUT_DIR             # a GPU: about 1.5 minutes (two compiles per shape)
    python gpu/cliff_split3.py OUT_DIR --rehearse  # tiny shapes on the CPU (its matmuls ignore TF32)

Rows in OUT_DIR/split3.jsonl as they are taken: ``correct`` (relative loss / gradient errors against the float64
reference) and ``speed`` (fwd + bwd median ms, CUDA events, after two warm-ups) of ``split3``, ``split3_compiled``,
``triton3`` (issue 53: the three products on gpu/experiments/gemm_3xtf32.py's Triton 3xTF32 kernel, operands split
once, the rest of the reference eager) and ``reference_compiled`` (float32 "highest"), the variants of a shape timed
in turn.
"""

from __future__ import annotations

import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "experiments")]  # cliff_gpu_check; experiments/cliff_precision_emulation
from cliff_gpu_check import REHEARSAL, SHAPES, fwd_bwd, inputs, timed  # noqa: E402
from cliff_precision_emulation import MODES, _Torch  # noqa: E402  (its einsum: a product of MODES' kind)

from qkernels.reference import kde as ref  # noqa: E402


def _loss(k):
    def plain(z, idx):
        return ref.cliff_loss(z, idx, 0.1, -5.0, 5.0, k, 0.5, 1.0, 0.7)[0]

    return plain


def main(argv: list[str]) -> None:
    out_dir, rehearse = argv[0], "--rehearse" in argv
    os.makedirs(out_dir, exist_ok=True)
    device = "cpu" if rehearse else "cuda"
    rows = open(os.path.join(out_dir, "split3.jsonl"), "a")

    def emit(row):
        print(json.dumps(row), flush=True)
        rows.write(json.dumps(row) + "\n")
        rows.flush()

    plain_torch = ref.torch
    for n, d, m, k in REHEARSAL if rehearse else SHAPES:
        case = f"{n}x{d} M{m} K{k}"
        z, idx = inputs(n, d, m, device)
        torch.set_float32_matmul_precision("highest")
        want, gwant = fwd_bwd(_loss(k), z.double(), idx)
        plain = _loss(k)
        variants = {  # (function, the module's torch, matmul precision, emulation modes)
            "reference_compiled": (torch.compile(plain, dynamic=False), plain_torch, "highest", set()),
            "split3": (plain, _Torch(), "high", {"split3"}),
            "split3_compiled": (torch.compile(_loss(k), dynamic=False), _Torch(), "high", {"split3"}),
            # the products on gpu/experiments/gemm_3xtf32.py's Triton kernel (pre-split operands), the rest eager
            "triton3": (plain, _Torch(), "highest", {"triton3"}),
        }
        for name, (fn, module_torch, mode, modes) in variants.items():
            ref.torch = module_torch
            MODES.clear()
            MODES.update(modes)
            torch.set_float32_matmul_precision(mode)
            try:
                got, g = fwd_bwd(fn, z, idx)
                emit(
                    {
                        "kind": "correct",
                        "case": case,
                        "variant": name,
                        "loss_rel": abs(got.double() - want).item() / abs(want).item(),
                        "grad_rel": ((g.double() - gwant).norm() / gwant.norm()).item(),
                        "grad_max_rel": ((g.double() - gwant).abs().max() / gwant.abs().max()).item(),
                    }
                )
                emit({"kind": "speed", "case": case, "variant": name, "ms": timed(fn, z, idx, 3 if rehearse else 20)})
            except Exception as e:  # noqa: BLE001 (a failure is a row, the run goes on)
                emit({"kind": "error", "case": case, "variant": name, "error": repr(e)[:300]})
            finally:
                ref.torch = plain_torch
                torch.set_float32_matmul_precision("highest")


if __name__ == "__main__":
    main(sys.argv[1:])
