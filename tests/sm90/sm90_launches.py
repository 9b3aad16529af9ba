"""Every Triton launch of the public ops at the benchmark shapes, recorded without running it, and the
sm_90 (H100 / H200) properties of the compiled kernels (used by tests/sm90/test_triton_sm90.py).

:func:`record` runs one forward + backward of a public function on the ``triton`` backend with CPU tensors
under ``TRITON_INTERPRET=1``, the interpreter's launch patched to write down each launch (kernel, arguments,
constexprs, grid, num_warps / num_stages) and return without executing it: the host code runs as on a GPU
(tile choices, grids, workspaces, which kernels; an H100's 132 SMs where a plan reads the SM count), the kernels
do not, so the benchmark shapes (up to (16384, 32, 128, 128)) are recorded in seconds. Outputs are then
uninitialized memory, which no host code reads (value checks are off, as on a GPU). An autotuned kernel records
every config.

:data:`CASES` are the shapes of ``qkernels bench`` (qkernels/bench/quantize.py, kde.py, hessian.py; their own
input makers and loss functions), float32 and float64; Cliff float32 at the bench's two matmul precisions.
:func:`compile_launches` compiles the distinct launches in subprocesses (tests/sm90/sm90_compile.py) with the
Triton in ``QKERNELS_SM90_TRITON`` (default ``.venv/triton36``, torch 2.11's Triton 3.6, where bootstrap put
it; else the installed one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Callable

import torch

if __name__ == "__main__":  # run as a script (refreshing the committed cache): kernels in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: test_launches

import qkernels  # noqa: E402
from qkernels.bench import hessian as bench_hessian  # noqa: E402
from qkernels.bench import kde as bench_kde  # noqa: E402
from qkernels.bench import quantize as bench_quantize  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))  # tests/sm90: this harness, its compiler script and cache
ROOT = os.path.dirname(os.path.dirname(HERE))
SMS = 132  # streaming multiprocessors of an H100 SXM / H200
SHARED_MAX = 232448  # bytes of shared memory one block may use on sm_90 (227 KB)
MIN_PROGRAMS = 2 * SMS  # the heaviest kernel of an op: at least two programs per SM (or persistent)
MIN_DOT = 16  # tl.dot needs every tile dimension >= 16 (Triton 3.6 rejects K < 16 at compile time)
LAUNCH_BOUND_US = 5.0  # an op estimated under this much GPU time (full GPU, roofline) is launch-bound: no
# grid (nor a second launch to reduce a split) would shorten it

# per op, the kernels that do its work (the others reduce a few partials in one program or draw numbers)
HEAVIEST = {
    "latent_quantize": {"_latent_quantize_fwd", "_latent_quantize_bwd"},
    "categorical_latent": {"_relaxed_categorical_fwd", "_relaxed_categorical_bwd"},
    "klm_loss": {"_klm_pairs"},
    "kde_grid": {"_kde_grid_by_points", "_kde_grid_samples_grad"},
    "cliff_loss": {"_cliff_fused_fwd", "_cliff_fused_bwd", "_biv_fwd", "_biv_dx", "_biv_dkz"},
    "normalized_hessian_penalty": {"_fdc_fwd", "_fdc_bwd"},
}

# H100 SXM rates for the launch-bound estimate: HBM bytes/s, MUFU exps/s, 3xTF32 tensor-core FLOP/s
HBM, EXPS, TF32X3 = 3.35e12, 4.0e12, 165e12


@dataclasses.dataclass
class Case:
    """One benchmark shape of one op: ``run()`` is a forward + backward on the current backend; ``gpu_us``
    a roofline estimate of the op's GPU time (full GPU), below :data:`LAUNCH_BOUND_US` launch-bound."""

    op: str
    name: str
    run: Callable[[], None]
    gpu_us: float


def _cast(inputs: tuple, dtype: torch.dtype) -> tuple:
    return tuple(
        x.detach().to(dtype).requires_grad_(x.requires_grad)
        if isinstance(x, torch.Tensor) and x.is_floating_point()
        else x
        for x in inputs
    )


def _backward(loss: Callable[..., torch.Tensor], inputs: tuple) -> Callable[[], None]:
    return lambda: loss(*inputs).backward()


def _isz(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


def cases(dtype: torch.dtype) -> list[Case]:
    """The benchmark shapes of every op with a Triton kernel, inputs in ``dtype`` (made lazily by ``run``)."""
    out, b = [], _isz(dtype)

    def add(op, name, make, loss, gpu_us, precision=None):
        def run():
            inputs = _cast(make(), dtype)
            before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision(precision or before)
            try:
                _backward(loss, inputs)()
            finally:
                torch.set_float32_matmul_precision(before)

        out.append(Case(op, f"{name} {str(dtype)[6:]}{f' {precision}' if precision else ''}", run, gpu_us))

    for n, d, nv in bench_quantize.SHAPES:
        for glob in (False, True):
            make = bench_quantize._make(n, d, nv, glob, "cpu")
            # z, z_q, indices (int64), grad_z read / written; n_v compares per element each way
            us = max(n * d * (5 * b + 16) / HBM, 4 * n * d * nv / 67e12) * 1e6
            add(
                "latent_quantize",
                f"latent_quantize n={n} d={d} n_v={nv} {'global' if glob else 'per-dim'}",
                lambda make=make: make(1),
                bench_quantize._loss,
                us,
            )
    for n, d, k in bench_quantize.CATEGORICAL_SHAPES:
        make = bench_quantize._make_categorical(n, d, k, "cpu")
        add(
            "categorical_latent",
            f"categorical_latent n={n} d={d} K={k}",
            lambda make=make: make(1),
            bench_quantize._categorical_loss,
            max(5 * n * d * k * b / HBM, 3 * n * d * k / EXPS) * 1e6,
        )
    for n, d, m, k in bench_kde.CLIFF:
        case = bench_kde._cliff_case((n, d, m, k), "cpu")
        us = 4 * 2 * d * d * n * m * k / TF32X3 * 1e6  # the bivariate products, forward + backward
        for precision in ("highest", "high") if dtype == torch.float32 else (None,):
            add(
                "cliff_loss",
                f"cliff n={n} d={d} M={m} K={k}",
                lambda case=case: case.make(1),
                bench_kde._cliff_loss,
                us,
                precision,
            )
    for n, d in bench_kde.KLM:
        case = bench_kde._klm_case((n, d), "cpu")
        add(
            "klm_loss", f"klm n={n} d={d}", lambda case=case: case.make(1), bench_kde._klm_loss, n * n * d / EXPS * 1e6
        )  # one exp per pair and latent, forward and backward, half by symmetry
    n, d = bench_kde.KLM[2]  # Tripod's call: the std given (its continuous latents'), a kernel variant of its own
    add(
        "klm_loss",
        f"klm n={n} d={d} given std",
        lambda n=n, d=d: (torch.randn(n, d).requires_grad_(), (torch.rand(d) + 0.5).requires_grad_()),
        lambda z, std: qkernels.klm_loss(z, std=std),
        n * n * d / EXPS * 1e6,
    )
    for n, d, k in bench_kde.KDE_GRID:
        case = bench_kde._kde_grid_case((n, d, k), "cpu")
        add(
            "kde_grid",
            f"kde_grid n={n} d={d} K={k}",
            lambda case=case: case.make(1),
            bench_kde._kde_grid_loss,
            3 * n * d * k / EXPS * 1e6,
        )
    for model in bench_hessian.DECODERS:
        make = bench_hessian._make(model, "cpu")

        def nhp_inputs(make=make):
            dec, z, std = make(1)
            return dec.to(dtype), z, std

        columns = sum(a.shape[1:].numel() for a in make(0)[0].activations(torch.zeros(1, bench_hessian.D)))
        stacked = 4 * bench_hessian.K * bench_hessian.N  # rows of the finite-difference batch
        add(
            "normalized_hessian_penalty",
            f"nhp {model} n={bench_hessian.N} d={bench_hessian.D} k={bench_hessian.K}",
            nhp_inputs,
            bench_hessian._nhp_loss,
            3 * stacked * columns * b / HBM * 1e6,
        )
    return out


# ----------------------------------------------------------------------------- recording


def _describe(value):
    """A JSON stand-in for one launch argument (tests/sm90/sm90_compile.py rebuilds it)."""
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype)[6:], "aligned": value.data_ptr() % 16 == 0}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__name__ == "dtype" and type(value).__module__.startswith("triton"):
        return {"tl_dtype": str(value)}
    if type(value).__name__ == "constexpr":
        return _describe(value.value)
    raise TypeError(f"cannot record a launch argument of type {type(value).__name__}")


@contextlib.contextmanager
def recording():
    """Inside: every Triton launch is appended to the yielded list instead of running."""
    from triton.runtime import autotuner, interpreter

    launches: list[dict] = []
    run, tuned = interpreter.InterpretedFunction.run, autotuner.Autotuner.run

    def record(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        names = list(inspect.signature(fn).parameters)
        bound = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
        grid = grid(bound) if callable(grid) else grid
        params = inspect.signature(fn).parameters
        launches.append(
            {
                "module": fn.__module__,
                "kernel": fn.__name__,
                "args": [_describe(a) for a in args],
                "kwargs": {k: _describe(v) for k, v in kwargs.items()},
                "constexpr_args": [i for i, name in enumerate(names[: len(args)]) if _is_constexpr(params[name])],
                "grid": [int(g) for g in (grid if isinstance(grid, (tuple, list)) else (grid,))],
            }
        )

    def every_config(self, *args, **kwargs):  # an autotuned kernel: each config may be the one picked on a GPU
        for config in self.configs:
            self.fn.run(*args, **kwargs, **config.all_kwargs())

    from qkernels import _validation
    from qkernels.triton.kde import cliff_fused

    checks, _validation.CHECK_VALUES = _validation.CHECK_VALUES, "0"
    # Cliff plans its chunks from the device's SM count, off a GPU from one SM (the interpreter runs one program
    # at a time); recorded, it plans for an H100's (the other kernels' plans assume 132 off a GPU already)
    sm_count, cliff_fused._sm_count = cliff_fused._sm_count, lambda device: SMS
    interpreter.InterpretedFunction.run, autotuner.Autotuner.run = record, every_config
    try:
        yield launches
    finally:
        interpreter.InterpretedFunction.run, autotuner.Autotuner.run = run, tuned
        _validation.CHECK_VALUES, cliff_fused._sm_count = checks, sm_count


def record(run: Callable[[], None]) -> list[dict]:
    """The Triton launches of ``run()`` on the triton backend, in order (not executed)."""
    with recording() as launches, qkernels.use_backend("triton"):
        run()
    return launches


def _is_constexpr(param: inspect.Parameter) -> bool:
    ann = param.annotation  # a string under ``from __future__ import annotations``
    return ann is not inspect.Parameter.empty and "constexpr" in (ann if isinstance(ann, str) else repr(ann))


def key(launch: dict) -> str:
    """Identity of a launch for compiling: everything but the grid; runtime ints only as Triton specializes them
    (1, divisible by 16, other), floats only as floats. Constexprs (the keyword arguments, as every kernel here
    takes them, and positional ones) and launch options (num_warps) are kept whole: 32 and 64 are one
    specialization of a runtime int but two kernels as a tile size."""

    def spec(a):
        if isinstance(a, float):
            return "float"
        if isinstance(a, bool) or not isinstance(a, int):
            return a
        return "1" if a == 1 else "d16" if a % 16 == 0 else "int"

    const = set(launch.get("constexpr_args", ()))
    args = [a if i in const else spec(a) for i, a in enumerate(launch["args"])]
    return json.dumps([launch["module"], launch["kernel"], args, sorted(launch["kwargs"].items())], default=str)


def sm90_triton() -> str | None:
    """Directory holding the Triton to compile with: QKERNELS_SM90_TRITON, else bootstrap's .venv/triton36."""
    path = os.environ.get("QKERNELS_SM90_TRITON") or os.path.join(ROOT, ".venv", "triton36")
    return path if os.path.isdir(path) else None


SEED = os.path.join(HERE, "sm90_cache.json")  # committed results, refreshed by running this file


def compile_launches(launches: list[dict], workers: int = 2) -> list[dict]:
    """Results of tests/sm90/sm90_compile.py for ``launches`` (one per launch), in ``workers`` subprocesses. Cached:
    the committed :data:`SEED`, then ``QKERNELS_SM90_CACHE`` (default ~/.cache/qkernels-sm90)."""
    cache = os.environ.get("QKERNELS_SM90_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "qkernels-sm90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [sm90_triton(), ROOT]))
    chunks = [launches[i::workers] for i in range(workers)]
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.join(HERE, "sm90_compile.py"), cache, SEED],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for chunk in chunks
        if chunk
    ]
    outs = [p.communicate(json.dumps(chunk), timeout=1500) for p, chunk in zip(procs, chunks, strict=False)]
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(f"sm90_compile.py failed:\n{err[-4000:]}")
    results: list[dict] = [{}] * len(launches)
    for i, (stdout, _) in enumerate(outs):
        for j, res in enumerate(json.loads(stdout.strip().splitlines()[-1])):
            results[i + j * workers] = res
    return results


@contextlib.contextmanager
def cliff_gemm_path(blocks: dict | None = None):
    """Inside: Cliff takes its GEMM path at any shape (the fused path off; "highest" products, exact FMA below
    IEEE_MAX_WORK multiply-adds, compiled as 3xTF32: 0 here), with ``blocks`` as its tiles (default: its own)."""
    import qkernels.triton.kde._cliff_common as common
    import qkernels.triton.kde.cliff_fused as fused
    import qkernels.triton.kde.cliff_gemm as gemm

    before = fused.FUSED_MAX_TILE, common.IEEE_MAX_WORK, gemm.GEMM_BLOCKS
    fused.FUSED_MAX_TILE, common.IEEE_MAX_WORK, gemm.GEMM_BLOCKS = 0, 0, blocks or gemm.GEMM_BLOCKS
    try:
        yield
    finally:
        fused.FUSED_MAX_TILE, common.IEEE_MAX_WORK, gemm.GEMM_BLOCKS = before


def budget_scenarios(dtype: torch.dtype) -> list[Case]:
    """The launch-budget scenarios of tests/test_launches.py (every public op, n = 16, d = 3: the branches the
    benchmark shapes do not take, e.g. gumbel_quantize, hessian_penalty), and Cliff's GEMM path at a small shape
    with each float32 matmul precision, and with tests/test_kde.py's 16-wide tiles (an H200 failed its tl.dot
    K >= 16 there). Not held to the grid rule (tiny shapes)."""
    from test_launches import forward_backward, scenarios

    out = [
        Case(name, f"{name} budget scenario {str(dtype)[6:]}", lambda f=f, lv=lv: forward_backward(f, lv)(), 0.0)
        for name, (f, lv, _) in scenarios(dtype).items()
    ]

    def gemm_path(precision, blocks=None):
        def run():
            z = torch.randn(40, 3, dtype=dtype, requires_grad=True)
            before = torch.get_float32_matmul_precision()
            torch.set_float32_matmul_precision(precision)
            try:
                with cliff_gemm_path(blocks):
                    qkernels.cliff_loss(z, num_cond=5, grid=(-3.0, 3.0, 20)).backward()
            finally:
                torch.set_float32_matmul_precision(before)

        return run

    kind = str(dtype)[6:]
    for precision in ("highest", "high", "medium") if dtype == torch.float32 else ("highest",):
        out.append(Case("cliff_loss", f"cliff GEMM path n=40 d=3 {kind} {precision}", gemm_path(precision), 0.0))
    small = {"R": 16, "S": 16, "K": 16, "warps": 4}
    out.append(Case("cliff_loss", f"cliff GEMM path 16-wide tiles n=40 d=3 {kind}", gemm_path("highest", small), 0.0))
    return out


def edge_scenarios(dtype: torch.dtype) -> list[Case]:
    """Specializations of the latent_quantize kernels that neither the benchmark shapes nor the budget scenarios
    compile: one value and one latent (n_v = 1 and d = 1 arrive as constexpr 1), and 200 values (the backward's
    codebook sums in 4 passes of 64). Not held to the grid rule (small shapes)."""
    out = []
    for n, d, nv in ((100, 1, 1), (100, 3, 200)):
        for glob in (False, True):
            make = bench_quantize._make(n, d, nv, glob, "cpu")
            kind = "global" if glob else "per-dim"

            def run(make=make):
                bench_quantize._loss(*_cast(make(1), dtype)).backward()

            out.append(
                Case("latent_quantize", f"latent_quantize edge n={n} d={d} n_v={nv} {kind} {str(dtype)[6:]}", run, 0.0)
            )
    return out


@functools.cache
def properties(dtypes=(torch.float32, torch.float64)) -> dict[str, tuple[Case, list[tuple[dict, dict]]]]:
    """Every case (benchmark shapes, budget and edge scenarios) -> (case, [(launch, compile result)]). Made once per
    process (read it, do not change it): test_triton_sm90.py and test_triton_cliff_gpu_shape.py share it, so one
    run of the folder starts the compiler subprocesses once."""
    recorded = {}
    for dtype in dtypes:
        for case in cases(dtype) + budget_scenarios(dtype) + edge_scenarios(dtype):
            recorded[case.name] = (case, record(case.run))
    distinct = {key(launch): launch for _, launches in recorded.values() for launch in launches}
    results = dict(zip(distinct, compile_launches(list(distinct.values())), strict=True))
    return {
        name: (case, [(launch, results[key(launch)]) for launch in launches])
        for name, (case, launches) in recorded.items()
    }


def main() -> None:
    """Refresh :data:`SEED` with the results of every current launch and print one line per kernel."""
    table = properties()
    seed = {}
    for _, launches in table.values():
        for _launch, res in launches:
            seed[res["key"]] = {k: v for k, v in res.items() if k != "key"}
    with open(SEED, "w") as f:
        json.dump(dict(sorted(seed.items())), f, indent=0, sort_keys=True)
        f.write("\n")
    for name, (_case, launches) in table.items():
        for launch, res in launches:
            grid = 1
            for g in launch["grid"]:
                grid *= g
            print(f"{name:55s} {launch['kernel']:26s} grid {grid:6d} {json.dumps(res)[:150]}")


if __name__ == "__main__":
    main()
