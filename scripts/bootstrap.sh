#!/usr/bin/env bash
# Set up .venv with qkernels (native extension included) and its dev tools. Idempotent: a second run with
# nothing changed (same native sources, build files, torch and environment switches) installs and builds
# nothing and takes seconds.
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
# what the build depends on: native sources, build files, torch, python, the build switches
stamp_file=.venv/.qkernels-build-stamp
stamp=$( { cat setup.py pyproject.toml; find csrc -type f | LC_ALL=C sort | xargs cat;
           python -c "import sys, torch; print(sys.version, torch.__version__, torch.version.cuda)";
           echo "${QKERNELS_NO_EXT:-0} ${QKERNELS_NO_CUDA:-0} ${TORCH_CUDA_ARCH_LIST:-}"; } | sha256sum | cut -d' ' -f1)
ext_ok() {
    [ "${QKERNELS_NO_EXT:-0}" = 1 ] || python -c "import qkernels._C" >/dev/null 2>&1
}
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && ext_ok \
        && python -c "import qkernels, pytest, ruff" >/dev/null 2>&1; then
    echo "bootstrap: .venv is up to date (nothing to install or build)"
else
    python -m pip install -q "setuptools>=77" wheel ninja
    python -m pip install -q --no-build-isolation -e ".[dev]"
    echo "$stamp" > "$stamp_file"
fi
python -c "import qkernels; print('qkernels', qkernels.__version__, 'backends:', qkernels.available_backends())"
