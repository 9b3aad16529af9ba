#!/usr/bin/env bash
# Set up .venv with qkernels (native extension included) and its dev tools. Each step prints one line (what it
# does, roughly how long it takes). Idempotent: a second run with nothing changed (same native sources, build
# files, torch, jax, Python and environment switches) installs and builds nothing. It still checks, each time:
# that torch, numpy and jax are installed (without importing them), a hash of what the build depends on against
# the last build's, that qkernels._C loads with torch and the JAX FFI library is there, that qkernels and the dev
# tools import, and then prints the backends (qkernels imported with torch). Those two torch imports take most of
# its time: about 10 s on 2 idle cores, half a minute on 2 cores at load 12, more under heavier load.
# Installs the CPU build of torch 2.13.0 when the venv has none; set QKERNELS_TORCH (pip arguments, e.g.
# "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128") to choose another build.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_RELEASE=2.13.0
say() { echo "bootstrap [${SECONDS}s]: $*"; }
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $PY"
    "$PY" -m venv .venv
fi
# shellcheck source=/dev/null  # created above
. .venv/bin/activate
pip_install() { python -m pip install -q "$@"; }
# pip byte-compiles what it installs one file at a time: 26 of torch's 37 s. Torch installs without it (--no-compile)
# and compileall writes the same .pyc files in the background, beside the next installs
byte_compile() { python -m compileall -qq "$@" >/dev/null 2>&1 || true; }  # -qq: and the files pip would skip too
# PyPI's torch==2.13.0 on Linux x86_64 is the CUDA build (GBs of nvidia-* wheels). The CPU build is 2.13.0+cpu: from a
# local wheel or index that has it, else from PyTorch's CPU index (PyPI holds no local versions: the first command
# fails there in seconds; an unreachable index fails after pip's retries, about 10 s).
install_cpu_torch() {
    pip_install --no-compile "torch==$TORCH_RELEASE+cpu" 2>/dev/null && return
    say "torch==$TORCH_RELEASE+cpu not found: trying https://download.pytorch.org/whl/cpu"
    pip_install --no-compile "torch==$TORCH_RELEASE" --index-url https://download.pytorch.org/whl/cpu && return
    say "no torch installed: set QKERNELS_TORCH to pip arguments that reach a build of torch $TORCH_RELEASE"
    exit 1
}
# is installed: found on the path, not imported (an import of torch takes seconds, many on a loaded machine)
installed() { python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)"; }
if ! installed torch; then
    if [ -n "${QKERNELS_TORCH:-}" ]; then
        say "installing $QKERNELS_TORCH (QKERNELS_TORCH; 1-3 min)"
        # shellcheck disable=SC2086  # QKERNELS_TORCH holds several pip arguments
        pip_install --no-compile $QKERNELS_TORCH
    else
        say "installing torch $TORCH_RELEASE, CPU build (1-3 min)"
        install_cpu_torch
    fi
    byte_compile "$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/torch" &
    compile_pid=$!
fi
# torch warns "Failed to initialize NumPy" at every import without numpy: install it before torch is imported
if ! installed numpy; then
    say "installing numpy (seconds)"
    pip_install "numpy>=1.24"
fi
# the jax extra (pyproject.toml) before the build: setup.py builds qkernels.jax's FFI library only when jax is
# importable (QKERNELS_NO_JAX=1: neither)
# the requirements of pyproject.toml's extra $1, one per line (into a file for pip -r: they hold markers)
extra_requirements() { python -c "
try:
    import tomllib
except ImportError:  # Python 3.10: pip's own copy of tomli
    from pip._vendor import tomli as tomllib
print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['$1']))"; }
reqs=$(mktemp) && trap 'rm -f "$reqs" "$reqs.log"' EXIT
jax_version() { python -c "import importlib.metadata as m; print(m.version('jax'), m.version('jaxlib'))" 2>/dev/null; }
if [ "${QKERNELS_NO_JAX:-0}" != 1 ] && ! jax_version >/dev/null; then
    say "installing JAX, CPU (the jax extra; about 10 s from a warm cache)"
    extra_requirements jax > "$reqs" && pip_install -r "$reqs"
fi
# what the build depends on: native sources, build files, torch, jax, python, the build switches
stamp_file=.venv/.qkernels-build-stamp
stamp=$( { cat setup.py pyproject.toml; find csrc -type f | LC_ALL=C sort | xargs cat;
           python -c "import importlib.util, sys; v = {}  # torch/version.py: torch.__version__, torch.version.cuda
exec(open(importlib.util.find_spec('torch').submodule_search_locations[0] + '/version.py').read(), v)
print(sys.version, v['__version__'], v['cuda'])";
           jax_version || true;
           echo "${QKERNELS_NO_EXT:-0} ${QKERNELS_NO_CUDA:-0} ${QKERNELS_NO_JAX:-0} ${QKERNELS_JAX_CUDA:-0} ${TORCH_CUDA_ARCH_LIST:-}"; } | sha256sum | cut -d' ' -f1)
ext_ok() {
    [ "${QKERNELS_NO_EXT:-0}" = 1 ] || { python -c "import torch, qkernels._C" >/dev/null 2>&1 &&  # torch's libraries first
        { [ "${QKERNELS_NO_JAX:-0}" = 1 ] || compgen -G "qkernels/jax/_kernels*.so" >/dev/null; }; }
}
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] && ext_ok \
        && python -c "import qkernels, pytest, ruff" >/dev/null 2>&1; then
    say ".venv is up to date (nothing to install or build)"
else
    say "installing the build tools (seconds)"
    pip_install "setuptools>=77" wheel ninja
    # the dev extra (nothing the build uses) installs in the background while the native code compiles: both
    # take a minute or more from scratch; the build installs qkernels alone (--no-deps), so the two pip runs
    # never write the same package
    say "installing the dev tools (the dev extra; 1-2 min the first time), meanwhile pip install" \
        "--no-build-isolation --no-deps -e . compiles qkernels._C and the JAX FFI library (about 1.5 min on 2 cores" \
        "from scratch, only changed sources after that)"
    extra_requirements dev > "$reqs"
    pip_install -r "$reqs" > "$reqs.log" 2>&1 &
    dev_pid=$!
    pip_install --no-build-isolation --no-deps -e . || { kill "$dev_pid" 2>/dev/null; exit 1; }
    wait "$dev_pid" || { cat "$reqs.log"; say "installing the dev extra failed (above)"; exit 1; }
    echo "$stamp" > "$stamp_file"
    say "done"
fi
# Triton 3.6 (torch 2.11's, the GPU machines' release) beside the installed one, for tests/sm90/test_triton_sm90.py's
# sm_90 compiles (issue 44): about 640 MB, 20-60 s once; not imported by anything else. QKERNELS_NO_SM90_TRITON=1
# skips it (the test then compiles with the installed Triton). A failed install does not fail the set-up.
SM90_TRITON=3.6.0
if [ "${QKERNELS_NO_SM90_TRITON:-0}" != 1 ] && [ "$(cat .venv/triton36/.version 2>/dev/null)" != "$SM90_TRITON" ]; then
    say "installing triton==$SM90_TRITON into .venv/triton36 (sm_90 compile checks; 20-60 s once)"
    rm -rf .venv/triton36
    if pip_install --no-deps --target .venv/triton36 "triton==$SM90_TRITON"; then
        echo "$SM90_TRITON" > .venv/triton36/.version
    else
        rm -rf .venv/triton36
        say "could not install triton==$SM90_TRITON: tests/sm90/test_triton_sm90.py compiles with the installed Triton"
    fi
fi
[ -z "${compile_pid:-}" ] || wait "$compile_pid"  # torch's .pyc files
python -c "import qkernels; print('qkernels', qkernels.__version__, 'backends:', qkernels.available_backends())"
