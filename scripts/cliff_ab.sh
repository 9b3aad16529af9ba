#!/usr/bin/env bash
# Issue 44's A/B for a GPU: main's fused Cliff kernels against the standardize-once variant
# (scripts/experiments/cliff_standardize_once.patch = branch cliff-standardize-once: the samples standardized once
# in a launch of its own, read coalesced and without divisions by the product kernels; +2 launches per forward +
# backward). Correctness against float64 and fwd + bwd ms of triton "highest" / "high" at the four benchmark
# shapes, plus one profiler table per shape, from alternating processes (main, variant, main, variant):
#
#   bash scripts/cliff_ab.sh OUT_DIR               # a GPU: about 3 minutes
#   TRITON_INTERPRET=1 bash scripts/cliff_ab.sh OUT_DIR --rehearse   # tiny shapes on the CPU
#
# Rows: OUT_DIR/main/cliff.jsonl and OUT_DIR/standardize_once/cliff.jsonl (each speed row names the qkernels
# directory it ran). The variant is the installed qkernels package copied and patched (its compiled extension too).
set -euo pipefail
OUT=${1:?usage: cliff_ab.sh OUT_DIR [--rehearse]}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$(command -v "${PYTHON:-python}")
[[ $PY = /* ]] || PY=$PWD/$PY  # absolute: the package is located from /tmp
PKG=$(cd /tmp && "$PY" -c "import os, qkernels; print(os.path.dirname(qkernels.__file__))")
VARIANT=$(mktemp -d)
cp -r "$PKG" "$VARIANT/qkernels"
PATCH="$ROOT/scripts/experiments/cliff_standardize_once.patch"
(cd "$VARIANT" && { git apply -p1 "$PATCH" 2>/dev/null || patch -p1 -s < "$PATCH"; })
got=$(cd /tmp && PYTHONPATH="$VARIANT" "$PY" -c "import os, qkernels; print(os.path.dirname(qkernels.__file__))")
[ "$got" = "$VARIANT/qkernels" ] || { echo "cliff_ab.sh: the variant imports $got, not $VARIANT/qkernels" >&2; exit 1; }
for round in 1 2; do
    echo "== round $round: main ($PKG)"
    "$PY" "$ROOT/scripts/cliff_gpu_check.py" "$OUT/main" --triton-only "$@"
    echo "== round $round: standardize-once ($VARIANT/qkernels)"
    PYTHONPATH="$VARIANT" "$PY" "$ROOT/scripts/cliff_gpu_check.py" "$OUT/standardize_once" --triton-only "$@"
done
