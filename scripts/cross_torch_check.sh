#!/usr/bin/env bash
# Issue 37: one built wheel, unchanged, under another torch release than it was built against. Installs WHEEL into a
# fresh scratch venv holding TORCH (pip arguments) and the test tools, then runs the CPU kernel tests there from this
# checkout's tests/ (the installed package, not the source tree, is what they import: QKERNELS_BACKEND unset, no
# PYTHONPATH). Not a CI step: torch is a large download (on this machine `pip install torch==2.14.1` takes a CUDA
# build of 2.14.1 from local disk); its run is recorded in benchmarks/HISTORY.md, "Packaging".
#
#   bash scripts/cross_torch_check.sh WHEEL [VENV]     (VENV default: /tmp/qk-cross-venv, created when missing)
#   TORCH="torch==2.14.1" (default) or e.g. TORCH="torch==2.12.* --index-url https://download.pytorch.org/whl/cpu"
#   TESTS: the pytest arguments (default: the four CPU kernel test files)
# torch 2.11 pins triton 3.6, whose interpreter (the triton cases of these tests on the CPU) fails under NumPy >= 2.4
# ("only 0-dimensional arrays can be converted to Python scalars"): TORCH="torch==2.11.0 numpy<2.4".
set -euo pipefail
WHEEL=$(cd "$(dirname "${1:?usage: scripts/cross_torch_check.sh WHEEL [VENV]}")" && pwd)/$(basename "$1")
VENV=${2:-/tmp/qk-cross-venv}
TORCH=${TORCH:-torch==2.14.1}
TESTS=${TESTS:-tests/test_quantize.py tests/test_kde.py tests/test_hessian.py tests/test_raw_ops.py}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
say() { echo "cross_torch_check [${SECONDS}s]: $*"; }

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    python3 -m venv "$VENV"
fi
PY=$VENV/bin/python
say "installing $TORCH"
# shellcheck disable=SC2086  # TORCH holds pip arguments
"$PY" -m pip install -q $TORCH
say "installing $(basename "$WHEEL") (unchanged) and the test tools"
"$PY" -m pip install -q --force-reinstall --no-deps "$WHEEL"
"$PY" -m pip install -q "$WHEEL" pytest hypothesis "triton>=3.1" vector-quantize-pytorch==1.32.0 2>&1 \
    | grep -v "^WARNING: Location" || true
# from a scratch directory holding only the committed HEAD's tests/ (build_wheels.sh releases HEAD): the wheel's
# qkernels is imported, never the checkout's
RUN=$(mktemp -d)
git -C "$ROOT" archive HEAD tests | tar -x -C "$RUN"
cd "$RUN"
"$PY" - <<'EOF'
import torch, qkernels
from qkernels import _ext
print(f"torch {torch.__version__}, qkernels {qkernels.__version__} from {qkernels.__file__}")
print(f"_C loaded: {_ext.LOADED} ({_ext.path()}); CUDA kernels: {_ext.cuda_built()} ({_ext.CUDA_REASON})")
assert _ext.LOADED, _ext.REASON
assert qkernels.__file__.startswith(__import__("sys").prefix), "the source tree, not the wheel, was imported"
EOF
say "pytest $TESTS"
# shellcheck disable=SC2086  # TESTS holds several pytest arguments
env -u QKERNELS_BACKEND -u PYTHONPATH -u QKERNELS_NO_EXT "$PY" -m pytest $TESTS -q -p no:cacheprovider
