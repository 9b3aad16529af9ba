#!/usr/bin/env bash
# One-shot GPU check (issue 44's plan for the next GPU window): put the native extension in place (from a prebuilt
# wheel, or built for the local GPU), then every op and backend against float64 on CUDA, the issue's speed table
# with the torch.compile baseline (variants interleaved), one torch.profiler table per slow case, the GPU test files,
# and KLM against KeOps; each step writes its files under OUT_DIR as it goes (a step cut by its timeout keeps its
# rows) and the report OUT_DIR/gpu_check.md. Never needs the network.
#
#   bash gpu/gpu_check.sh OUT_DIR
#   WHEEL=dist/cuda/qkernels-<v>-cp310-abi3-manylinux_2_28_x86_64.whl bash gpu/gpu_check.sh OUT_DIR
#   DRY_RUN=1 bash gpu/gpu_check.sh OUT_DIR     # rehearsal on a CPU: every step at tiny shapes, no build
#
# WHEEL: the CUDA wheel of scripts/build_wheels.sh (built without a GPU; sm_80, sm_90 + PTX): its libraries
# (qkernels/_C.abi3.so, qkernels/_C_cuda.abi3.so) are unpacked into this checkout instead of compiling on the device
# (minutes of device time); the checkout's Python code runs with them. Without WHEEL, or when its CUDA kernels do
# not load here, the extension is built in place for the local GPU as before.
# KEOPS_WHEELS: a folder of pykeops / keopscore wheels (PyPI has sdists only: `pip wheel --no-deps pykeops keopscore
# -w DIR` on a machine with network; keep DIR ignored (.git/info/exclude) and carry it to the device), installed
# with --no-index for the keops step; without it the step reports why.
#
# Works offline with the torch already installed (no pip install): set PYTHON to its interpreter
# (default: .venv/bin/python if present, else python3). Needs nvcc, pytest, pytest-xdist (else
# the suite runs in one process), triton. STEPS picks the steps, run in this order (default "build probe tests warm
# speed correct profile jax keops ab split3 gemm3"; also "roofline" and "bench", the `qkernels bench` tables, before keops): "jax"
# is gpu/gpu_check_jax.py (qkernels.jax's CUDA handlers against its CPU ones and plain JAX; needs jax with its CUDA
# plugin, else its row says so); "warm"
# runs one call of every speed variant beside the tests (gpu_check_ops.py warm: the compiles land in the on-disk
# caches, so speed times compiled code from its start on a quiet GPU); "ab" is gpu/cliff_ab.sh (main's Cliff
# against each gpu/experiments/*.patch); "split3" is gpu/cliff_split3.py (the reference's product as three
# TF32 GEMMs); "gemm3" is gpu/experiments/gemm_3xtf32.py (one 4096^3 product: Triton 3xTF32 on pre-split operands
# against cuBLAS). Time limits per step (seconds): SUITE_TIMEOUT (170, warm included), SPEED_TIMEOUT (150),
# CORRECT_TIMEOUT (75), PROFILE_TIMEOUT (45), JAX_TIMEOUT (90), KEOPS_TIMEOUT (40), AB_TIMEOUT (180), SPLIT3_TIMEOUT (120), GEMM3_TIMEOUT (90),
# BENCH_TIMEOUT (150 per hot path); DEADLINE (seconds from the start, default 0 = none) cuts each step's limit to
# what is left before it, less 20 s for the report, and skips a step with under 10 s left: set it below the
# device call's limit so that the command ends, and its files are packed, in time. A step that runs over is
# reported as such (its rows so far kept) and the report is still written.
# TESTS: the pytest arguments (default: the GPU test files of issue 44), BENCH_HOTPATHS / BENCH_ARGS_<hotpath> as
# before. CASES: words; the warm / speed / correct / profile steps run only the cases whose name holds one of them
# (default: all). Target: under 9 minutes on an H100/H200 with 16 cores.
#
# Issue 53's kernels against the ones they replaced, a few minutes with the build skipped (the speed step's variants
# triton and triton_4launch / triton_symmetric, interleaved; the profile step's kernel times; the roofline step's
# latent_quantize kernel times and launches; KLM beside KeOps where its wheels are carried):
#
#   STEPS="tests warm speed profile roofline keops" CASES="latent_quantize klm" \
#       TESTS="tests/test_quantize.py tests/test_kde.py tests/test_launches.py" bash gpu/gpu_check.sh OUT_DIR
set -uo pipefail
OUT=${1:?usage: gpu/gpu_check.sh OUT_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
export PYTHONUNBUFFERED=1  # a step cut by its timeout still leaves its partial output
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
REPORT="$OUT/gpu_check.md"
STEPS=${STEPS:-build probe tests warm speed correct profile jax keops ab split3 gemm3}
DEADLINE=${DEADLINE:-0}
DRY_RUN=${DRY_RUN:-0}
DRY=""
if [ "$DRY_RUN" = 1 ]; then  # rehearsal: no build, the steps' scripts at tiny shapes on the CPU
    STEPS=$(echo " $STEPS " | sed 's/ build / /')
    DRY="--dry-run"
fi
want() { [[ " $STEPS " == *" $1 "* ]]; }
GPU_TESTS="tests/test_kde.py tests/test_quantize.py tests/test_hessian.py tests/test_launches.py tests/test_backend.py
tests/test_precision.py tests/test_raw_ops.py tests/test_compile.py"
T0=$(date +%s)
step() { echo "[gpu_check $(($(date +%s) - T0))s] $*"; }
limit() {  # limit SECONDS: a step's time limit, cut to what is left before DEADLINE less 20 s (0: skip the step)
    local l=$1 left
    if [ "$DEADLINE" -gt 0 ]; then
        left=$((DEADLINE - ($(date +%s) - T0) - 20))
        [ "$left" -lt "$l" ] && l=$left
        [ "$l" -lt 10 ] && l=0
    fi
    echo "$l"
}
skipped() { step "$1: skipped (DEADLINE)"; printf '\n## %s: skipped, under 10 s left before DEADLINE=%s\n' "$1" "$DEADLINE" >> "$REPORT"; }

# ---------------------------------------------------------------- environment
{
    echo "# qkernels GPU check"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
    echo "- $("$PYTHON" -c 'import torch, triton, sys; print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}")' 2>&1 | tail -1)"
    echo "- nvcc: $(nvcc --version 2>/dev/null | tail -1); cores: $(nproc)"
    [ "$DRY_RUN" = 1 ] && echo "- DRY RUN: a rehearsal on the CPU, tiny shapes, no build, tests only collected"
} > "$REPORT"

# ---------------------------------------------------------------- the native extension: prebuilt wheel or build
BUILT=""
if want build && [ -n "${WHEEL:-}" ]; then
    step "libraries of $WHEEL"
    rm -f qkernels/_C*.so qkernels/jax/_kernels*.so
    W0=$(date +%s)
    "$PYTHON" - "$WHEEL" > "$OUT/wheel.log" 2>&1 <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zf:
    for name in zf.namelist():
        if (name.startswith(("qkernels/_C", "qkernels/jax/_kernels")) and name.endswith(".so")
                or name == "qkernels/_build_info.py"):
            zf.extract(name, ".")
            print("unpacked", name)
EOF
    BACKENDS=$("$PYTHON" -c 'import qkernels; from qkernels import _ext; print(qkernels.available_backends("cuda"), "- cuda kernels:", _ext.CUDA_REASON or "loaded")' 2>&1 | tail -1)
    {
        echo
        echo "## Extension: prebuilt wheel"
        echo
        echo "\`$(basename "$WHEEL")\`: $(grep -c unpacked "$OUT/wheel.log") files unpacked in $(($(date +%s) - W0)) s; backends on cuda: $BACKENDS"
    } >> "$REPORT"
    if "$PYTHON" -c 'from qkernels import _ext; assert _ext.cuda_built()' 2>/dev/null; then
        BUILT=wheel
    else
        echo "the wheel's CUDA kernels do not load here: building in place instead" >> "$REPORT"
    fi
fi
if want build && [ -z "$BUILT" ]; then
step "build"
ARCH=$("$PYTHON" -c 'import torch; c = torch.cuda.get_device_capability(); print(f"{c[0]}.{c[1]}")')
mv pyproject.toml pyproject.toml.gpu_check  # setup.py alone: no PEP 517 metadata checks, no pip
trap 'mv -f "$ROOT/pyproject.toml.gpu_check" "$ROOT/pyproject.toml" 2>/dev/null' EXIT
B0=$(date +%s)
TORCH_CUDA_ARCH_LIST="$ARCH" MAX_JOBS=$(nproc) "$PYTHON" setup.py build_ext --inplace > "$OUT/build.log" 2>&1
BUILD_RC=$?
mv -f pyproject.toml.gpu_check pyproject.toml
BUILD_S=$(($(date +%s) - B0))
BACKENDS=$("$PYTHON" -c 'import qkernels; print(qkernels.available_backends("cuda"))' 2>&1 | tail -1)
{
    echo
    echo "## Build"
    echo
    echo "\`TORCH_CUDA_ARCH_LIST=$ARCH MAX_JOBS=$(nproc) setup.py build_ext --inplace\`: exit $BUILD_RC in ${BUILD_S} s;"
    echo "backends on cuda: $BACKENDS"
} >> "$REPORT"
[ $BUILD_RC -ne 0 ] && tail -40 "$OUT/build.log" | sed 's/^/    /' >> "$REPORT"
fi

# ---------------------------------------------------------------- bad input must not kill the process
if want probe; then
    step "crash probe"
    "$PYTHON" -X faulthandler -c '
import torch, qkernels.ops
try:
    torch.ops.qkernels.finite_difference_curvature(torch.randn(10, 3), 2, 2, 0.1, 2, False, "mean")
    print("accepted (wrong)")
except RuntimeError as e:
    print("RuntimeError:", str(e).splitlines()[0][:150])
' > "$OUT/crash_probe.log" 2>&1
    PROBE_RC=$?
    if [ $PROBE_RC -gt 128 ] && command -v gdb >/dev/null; then  # killed by a signal: where
        gdb -batch -ex run -ex bt --args "$PYTHON" -c 'import torch, qkernels.ops
torch.ops.qkernels.finite_difference_curvature(torch.randn(10, 3), 2, 2, 0.1, 2, False, "mean")' \
            > "$OUT/crash_probe_gdb.log" 2>&1
    fi
    {
        echo
        echo "## Crash probe (shared/gpu/h200-2026-11-26.md: this call killed the process)"
        echo
        echo "exit $PROBE_RC: $(tail -1 "$OUT/crash_probe.log")"
        [ -f "$OUT/crash_probe_gdb.log" ] && { echo; echo '```'; grep -E "^#|signal" "$OUT/crash_probe_gdb.log" | head -30; echo '```'; }
    } >> "$REPORT"
fi

# ---------------------------------------------------------------- one step of gpu/gpu_check_ops.py
ops_step() {  # ops_step STEP FILE TIMEOUT: one step of gpu/gpu_check_ops.py, its rows in OUT/FILE as it goes
    # (-X faulthandler: a crash leaves its Python stack in OUT/STEP.log; KeOps died with SIGSEGV on an H200)
    local name=$1 file=$2 limit t0 rc
    limit=$(limit "$3")
    [ "$limit" = 0 ] && { skipped "$name"; return; }
    step "$name"
    t0=$(date +%s)
    # shellcheck disable=SC2086  # DRY is one optional word
    TORCHINDUCTOR_COMPILE_THREADS=4 timeout -k 10 "$limit" "$PYTHON" -X faulthandler gpu/gpu_check_ops.py "$name" "$OUT/$file" $DRY \
        --cases "${CASES:-}" > "$OUT/$name.log" 2>&1
    rc=$?
    {
        echo
        echo "## \`gpu_check_ops.py $name\` ($OUT/$file): exit $rc in $(($(date +%s) - t0)) s$([ $rc -eq 124 ] && echo ' (TIMED OUT: partial)')"
        echo
        echo '```'
        if [ "$name" = profile ]; then grep -c "^=====" "$OUT/$file" 2>/dev/null | sed 's/$/ profiler tables/'; else cat "$OUT/$file" 2>/dev/null; fi
        tail -3 "$OUT/$name.log"
        echo '```'
    } >> "$REPORT"
}

# ---------------------------------------------------------------- the whole suite on the GPU
SUITE_LIMIT=$(limit "${SUITE_TIMEOUT:-170}")
if want tests && [ "$SUITE_LIMIT" = 0 ]; then skipped tests; elif want tests; then
    step "tests"
    if want warm; then  # beside the tests: one call of every speed variant, compiles into the on-disk caches
        TORCHINDUCTOR_COMPILE_THREADS=4 timeout -k 10 "$SUITE_LIMIT" "$PYTHON" gpu/gpu_check_ops.py warm \
            "$OUT/warm.jsonl" $DRY --cases "${CASES:-}" > "$OUT/warm.log" 2>&1 &
        WARM_PID=$!
    fi
    XDIST=""
    SPARE=$(want warm && echo 4 || echo 2)  # cores left to the warm-up beside the workers
    "$PYTHON" -c 'import xdist' 2>/dev/null && XDIST="-n $(( $(nproc) > 2 * SPARE ? $(nproc) - SPARE : 2 ))"
    S0=$(date +%s)
    # -v: one line per test as it ends, so a run cut by the timeout still names its failures; SIGINT
    # makes pytest print its summary; its own process group, killed afterwards, takes the xdist workers
    # with it (2026-11-26 H100: orphaned workers kept loading the GPU and CPUs after a timeout);
    # one inductor compile thread per worker (16 workers x 16 threads overloaded 16 cores)
    # shellcheck disable=SC2086  # TESTS / GPU_TESTS hold several words
    TORCHINDUCTOR_COMPILE_THREADS=1 setsid timeout -s INT -k 20 "$SUITE_LIMIT" "$PYTHON" -m pytest ${TESTS:-$GPU_TESTS} \
        $XDIST -v -rfE -p no:cacheprovider --durations=25 $([ "$DRY_RUN" = 1 ] && echo --collect-only -q) \
        > "$OUT/tests.log" 2>&1 &
    SUITE_PID=$!
    wait $SUITE_PID
    SUITE_RC=$?
    kill -9 -- -$SUITE_PID 2>/dev/null
    SUITE_S=$(($(date +%s) - S0))
    if [ -n "${WARM_PID:-}" ]; then
        wait "$WARM_PID"
        WARM_RC=$?
        { echo; echo "## \`gpu_check_ops.py warm\` beside the tests: exit $WARM_RC"; echo; echo '```'; cat "$OUT/warm.jsonl" 2>/dev/null; tail -3 "$OUT/warm.log"; echo '```'; } >> "$REPORT"
    fi
    {
        echo
        echo "## Tests (\`pytest ${TESTS:-the GPU test files} $XDIST\`): exit $SUITE_RC in ${SUITE_S} s (limit $SUITE_LIMIT)$([ $SUITE_RC -eq 124 ] && echo ' (TIMED OUT)')"
        echo
        echo "$(grep -cE ' PASSED ' "$OUT/tests.log") passed, $(grep -cE ' FAILED ' "$OUT/tests.log") failed, $(grep -cE ' SKIPPED ' "$OUT/tests.log") skipped (per-test lines)"
        echo
        echo '```'
        grep -E "^(FAILED|ERROR)| FAILED | ERROR |passed|crashed|Segmentation" "$OUT/tests.log" | tail -60
        echo '```'
        echo
        echo "Slowest tests:"
        echo
        echo '```'
        sed -n '/slowest 25 durations/,/^$/p' "$OUT/tests.log" | head -28
        echo '```'
    } >> "$REPORT"
fi
want warm && ! want tests && ops_step warm warm.jsonl "${SUITE_TIMEOUT:-170}"

# ---------------------------------------------------------------- issue 44: values, speed, profiles (gpu/gpu_check_ops.py)
want speed && ops_step speed speed.jsonl "${SPEED_TIMEOUT:-150}"
want correct && ops_step correct correct.jsonl "${CORRECT_TIMEOUT:-75}"
want profile && ops_step profile profiles.txt "${PROFILE_TIMEOUT:-45}"

# ---------------------------------------------------------------- issue 56: qkernels.jax's CUDA handlers
if want jax; then
    JAX_LIMIT=$(limit "${JAX_TIMEOUT:-90}")
    if [ "$JAX_LIMIT" = 0 ]; then skipped jax; else
        step "jax"
        J0=$(date +%s)
        # shellcheck disable=SC2086  # DRY is one optional word
        timeout -k 10 "$JAX_LIMIT" "$PYTHON" -X faulthandler gpu/gpu_check_jax.py "$OUT/jax.jsonl" $DRY \
            > "$OUT/jax.log" 2>&1
        JAX_RC=$?
        {
            echo
            echo "## \`gpu/gpu_check_jax.py\` ($OUT/jax.jsonl): exit $JAX_RC in $(($(date +%s) - J0)) s$([ $JAX_RC -eq 124 ] && echo ' (TIMED OUT: partial)')"
            echo
            echo '```'
            cat "$OUT/jax.jsonl" 2>/dev/null
            [ $JAX_RC -ne 0 ] && tail -5 "$OUT/jax.log"  # the error, where it failed
            echo '```'
        } >> "$REPORT"
    fi
fi

# ---------------------------------------------------------------- quantize against the HBM floor
if want roofline; then
    step "roofline"
    # shellcheck disable=SC2086  # DRY is one optional word
    timeout 120 "$PYTHON" gpu/gpu_quantize_roofline.py $DRY > "$OUT/roofline.md" 2>&1
    { echo; echo "## gpu/gpu_quantize_roofline.py: exit $?"; echo; cat "$OUT/roofline.md"; } >> "$REPORT"
fi

# ---------------------------------------------------------------- benchmarks on the GPU
if want bench; then
    # the KDE cases first: they decide auto's order on CUDA (qkernels/_backend.py AUTO_ORDER)
    for HP in ${BENCH_HOTPATHS:-kde quantize hessian overhead}; do
        step "bench $HP"
        Q0=$(date +%s)
        EXTRA="BENCH_ARGS_$HP"
        eval "ARGS=(${!EXTRA:-})"  # shell words: quotes kept (--case 'cliff n=64 ')
        timeout "${BENCH_TIMEOUT:-150}" "$PYTHON" -m qkernels bench --all --hotpath "$HP" "${ARGS[@]}" \
            --min-time "${BENCH_MIN_TIME:-0.5}" --save "$OUT/results" > "$OUT/bench_$HP.md" 2>&1
        BENCH_RC=$?
        {
            echo
            echo "## \`qkernels bench --all --hotpath $HP ${!EXTRA:-}\`: exit $BENCH_RC in $(($(date +%s) - Q0)) s$([ $BENCH_RC -eq 124 ] && echo ' (TIMED OUT: partial table)')"
            echo
            echo "Times: interleaved forward + backward runs, torch.cuda.synchronize() around each; ratios: median of"
            echo "the per-round ratios (legend under each table); peak MiB: growth of"
            echo "torch.cuda.max_memory_allocated over one run."
            echo
            echo '```'
            cat "$OUT/bench_$HP.md"
            echo '```'
        } >> "$REPORT"
    done
fi
# ---------------------------------------------------------------- issue 44: KLM against KeOps (carried wheels, no network)
if want keops; then
    if [ -n "${KEOPS_WHEELS:-}" ]; then
        "$PYTHON" -m pip install -q --no-index --find-links "$KEOPS_WHEELS" pykeops keopscore > "$OUT/keops_install.log" 2>&1
    fi
    ops_step keops keops.jsonl "${KEOPS_TIMEOUT:-40}"
fi
# ---------------------------------------------------------------- issue 44: Cliff, main against gpu/experiments/*.patch
if want ab; then
    AB_LIMIT=$(limit "${AB_TIMEOUT:-180}")
    if [ "$AB_LIMIT" = 0 ]; then skipped ab; else
        step "ab"
        A0=$(date +%s)
        # shellcheck disable=SC2046  # the optional rehearsal flag
        ( [ "$DRY_RUN" = 1 ] && export TRITON_INTERPRET=1
          PYTHON=$PYTHON timeout -k 10 "$AB_LIMIT" bash gpu/cliff_ab.sh "$OUT/ab" $([ "$DRY_RUN" = 1 ] && echo --rehearse) ) \
            > "$OUT/ab.log" 2>&1
        AB_RC=$?
        {
            echo
            echo "## \`gpu/cliff_ab.sh\` ($OUT/ab): exit $AB_RC in $(($(date +%s) - A0)) s (limit $AB_LIMIT)"
            echo
            echo '```'
            grep -h '"speed"' "$OUT"/ab/*/cliff.jsonl 2>/dev/null
            grep -h '"correct"' "$OUT"/ab/*/cliff.jsonl 2>/dev/null | head -20
            tail -3 "$OUT/ab.log"
            echo '```'
        } >> "$REPORT"
    fi
fi
# ---------------------------------------------------------------- issue 44: Cliff's product as three cuBLAS TF32 GEMMs
if want split3; then
    SPLIT3_LIMIT=$(limit "${SPLIT3_TIMEOUT:-120}")
    if [ "$SPLIT3_LIMIT" = 0 ]; then skipped split3; else
        step "split3"
        P0=$(date +%s)
        # shellcheck disable=SC2046  # the optional rehearsal flag
        TORCHINDUCTOR_COMPILE_THREADS=$(nproc) timeout -k 10 "$SPLIT3_LIMIT" "$PYTHON" gpu/cliff_split3.py \
            "$OUT/split3" $([ "$DRY_RUN" = 1 ] && echo --rehearse) > "$OUT/split3.log" 2>&1
        SPLIT3_RC=$?
        {
            echo
            echo "## \`gpu/cliff_split3.py\` ($OUT/split3): exit $SPLIT3_RC in $(($(date +%s) - P0)) s (limit $SPLIT3_LIMIT)"
            echo
            echo '```'
            cat "$OUT/split3/split3.jsonl" 2>/dev/null
            tail -3 "$OUT/split3.log"
            echo '```'
        } >> "$REPORT"
    fi
fi
# ---------------------------------------------------------------- one Cliff product as 3xTF32 on pre-split operands
if want gemm3; then
    GEMM3_LIMIT=$(limit "${GEMM3_TIMEOUT:-90}")
    if [ "$GEMM3_LIMIT" = 0 ]; then skipped gemm3; else
        step "gemm3"
        P0=$(date +%s)
        if [ "$DRY_RUN" = 1 ]; then
            TRITON_INTERPRET=1 timeout -k 10 "$GEMM3_LIMIT" "$PYTHON" gpu/experiments/gemm_3xtf32.py "$OUT/gemm3" \
                --rehearse > "$OUT/gemm3.log" 2>&1
        else
            timeout -k 10 "$GEMM3_LIMIT" "$PYTHON" gpu/experiments/gemm_3xtf32.py "$OUT/gemm3" > "$OUT/gemm3.log" 2>&1
        fi
        GEMM3_RC=$?
        {
            echo
            echo "## \`gpu/experiments/gemm_3xtf32.py\`: exit $GEMM3_RC in $(($(date +%s) - P0)) s (limit $GEMM3_LIMIT)"
            echo
            echo '```'
            cat "$OUT/gemm3/gemm3.jsonl" 2>/dev/null
            tail -3 "$OUT/gemm3.log"
            echo '```'
        } >> "$REPORT"
    fi
fi
step "done: $REPORT ($(($(date +%s) - T0)) s)"
echo "- total: $(($(date +%s) - T0)) s" >> "$REPORT"
