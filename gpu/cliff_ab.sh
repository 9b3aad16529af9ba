#!/usr/bin/env bash
# Issue 44's A/B for a GPU: main's Triton Cliff against each prepared experiment (gpu/experiments/*.patch, each a
# diff of the package: cliff_highest_ieee.patch = float32 "highest" products as exact FMA at every size instead of
# 3xTF32 above IEEE_MAX_WORK). Correctness against float64 and fwd + bwd ms of triton "highest" / "high" at the
# four benchmark shapes, plus one profiler table per shape, from alternating processes (main, each variant; twice):
#
#   bash gpu/cliff_ab.sh OUT_DIR               # a GPU: about 1 minute per variant
#   TRITON_INTERPRET=1 bash gpu/cliff_ab.sh OUT_DIR --rehearse   # tiny shapes on the CPU
#
# Rows: OUT_DIR/main/cliff.jsonl and OUT_DIR/<patch name>/cliff.jsonl (each speed row names the qkernels directory
# it ran). A variant is the installed qkernels package copied and patched (its compiled extension too).
set -euo pipefail
OUT=${1:?usage: cliff_ab.sh OUT_DIR [--rehearse]}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=$(command -v "${PYTHON:-python}")
[[ $PY = /* ]] || PY=$PWD/$PY  # absolute: the package is located from /tmp
PKG=$(cd /tmp && "$PY" -c "import os, qkernels; print(os.path.dirname(qkernels.__file__))")
declare -A VARIANTS
for PATCH in "$ROOT"/gpu/experiments/*.patch; do
    name=$(basename "$PATCH" .patch)
    dir=$(mktemp -d)
    cp -r "$PKG" "$dir/qkernels"
    (cd "$dir" && { git apply -p1 "$PATCH" 2>/dev/null || patch -p1 -s < "$PATCH"; })
    got=$(cd /tmp && PYTHONPATH="$dir" "$PY" -c "import os, qkernels; print(os.path.dirname(qkernels.__file__))")
    [ "$got" = "$dir/qkernels" ] || { echo "cliff_ab.sh: $name imports $got, not $dir/qkernels" >&2; exit 1; }
    VARIANTS[$name]=$dir
done
for round in 1 2; do
    echo "== round $round: main ($PKG)"
    "$PY" "$ROOT/gpu/cliff_gpu_check.py" "$OUT/main" --triton-only "$@"
    for name in "${!VARIANTS[@]}"; do
        echo "== round $round: $name (${VARIANTS[$name]}/qkernels)"
        PYTHONPATH="${VARIANTS[$name]}" "$PY" "$ROOT/gpu/cliff_gpu_check.py" "$OUT/$name" --triton-only "$@"
    done
done
