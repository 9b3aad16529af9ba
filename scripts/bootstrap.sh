#!/usr/bin/env bash
# Set up .venv with qkernels (native extension included) and its dev tools. Idempotent.
# Picks the CPU PyTorch wheel (torch==2.13.0) when no torch is installed in the venv;
# set QKERNELS_TORCH (e.g. "torch==2.13.0 --index-url ...") to choose another build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
if ! python -c "import torch" >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    python -m pip install -q ${QKERNELS_TORCH:-torch==2.13.0}
fi
python -m pip install -q "setuptools>=77" wheel ninja
python -m pip install -q --no-build-isolation -e ".[dev]"
python -c "import qkernels; print('qkernels', qkernels.__version__, 'backends:', qkernels.available_backends())"
