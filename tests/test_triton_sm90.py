"""Every Triton kernel that the public functions launch compiles for an H100 (sm_90), float32 and
float64, without a GPU.

Under ``TRITON_INTERPRET=1`` a kernel runs as Python: what only Triton's compiler checks passes
there (the two branches of a runtime ``if`` giving a variable different types, ``tl.dot``
operand shapes and dtypes, a float64 kernel argument compiled as float32). Here each launch of the
launch-budget scenarios (tests/test_launches.py), run in float32 and float64 under the interpreter,
is recorded (kernel, argument types, constexprs, num_warps) and compiled ahead of time in a
subprocess without the interpreter: ``triton.compile`` for target ``cuda:90`` down to a cubin with
Triton's bundled ptxas. Compiling is not running: a GPU run still has to confirm speed and values.

``QKERNELS_SM90_TRITON=DIR`` compiles with the Triton installed in DIR instead (``pip install --target DIR
triton==3.6.0``: the release of torch 2.11's CUDA image, whose front end rejected a float64 ``tl.dot``
accumulator that the installed release accepts; H200 run, benchmarks/RESULTS.md). The launches are still
recorded with the installed Triton: 3.6's interpreter cannot run ``range()`` over a runtime bound under
NumPy 2.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pytest
import torch

import qkernels

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() or "triton" not in qkernels.available_backends("cpu"),
    reason="records launches under the Triton interpreter (CPU only; a GPU compiles them for real)",
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {torch.float32: "fp32", torch.float64: "fp64", torch.int64: "i64", torch.int32: "i32", torch.int8: "i8",
          torch.bool: "i1"}


def _signature(fn, args, kwargs) -> tuple[dict, dict]:
    """(signature, constexprs) of one launch, as Triton's JIT would specialize it (ints equal to 1
    become constexprs; floats annotated tl.float64 are fp64)."""
    params = inspect.signature(fn).parameters
    bound = dict(zip(params, args, strict=False))  # the leading positional arguments
    bound.update({k: v for k, v in kwargs.items() if k in params})
    sig, consts = {}, {}
    for name, value in bound.items():
        ann = str(params[name].annotation)
        if "constexpr" in ann or value is None:
            sig[name], consts[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            sig[name] = "*" + DTYPES[value.dtype]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            if value == 1:
                sig[name], consts[name] = "constexpr", 1
            else:
                sig[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            sig[name] = "fp64" if "float64" in ann else "fp32"
        else:
            raise TypeError(f"{fn.__name__}: argument {name} of type {type(value).__name__}")
    return sig, consts


def _record(dtype) -> list[dict]:
    """Every distinct Triton launch of the budget scenarios with ``dtype`` inputs."""
    from test_launches import forward_backward, scenarios
    from triton.runtime import interpreter

    seen: dict[str, dict] = {}
    original = interpreter.InterpretedFunction.run

    def spy(self, *args, grid, warmup, **kwargs):
        sig, consts = _signature(self.fn, args, kwargs)
        entry = {"module": self.fn.__module__, "kernel": self.fn.__name__, "signature": sig, "constexprs": consts,
                 "num_warps": kwargs.get("num_warps", 4)}
        seen.setdefault(json.dumps(entry, sort_keys=True, default=str), entry)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    import qkernels.triton.kde._cliff_common as common
    import qkernels.triton.kde.cliff_fused as fused

    interpreter.InterpretedFunction.run = spy
    before = (torch.get_float32_matmul_precision(), fused.FUSED_MAX_TILE, common.IEEE_MAX_WORK)
    try:
        with qkernels.use_backend("triton"):
            for forward, leaves, _ in scenarios(dtype).values():
                forward_backward(forward, leaves)()
            # Cliff's GEMM path (large tiles) and each float32 precision of its products (tf32x3, tf32; "highest"
            # runs exact FMA products below IEEE_MAX_WORK multiply-adds: 0 here, to compile 3xTF32)
            z = torch.randn(40, 3, dtype=dtype, requires_grad=True)
            fused.FUSED_MAX_TILE, common.IEEE_MAX_WORK = 0, 0
            for mode in ("highest", "high", "medium") if dtype == torch.float32 else ("highest",):
                torch.set_float32_matmul_precision(mode)
                for tile in (0, before[1]):
                    fused.FUSED_MAX_TILE = tile
                    qkernels.cliff_loss(z, num_cond=5, grid=(-3.0, 3.0, 20)).backward()
    finally:
        interpreter.InterpretedFunction.run = original
        torch.set_float32_matmul_precision(before[0])
        fused.FUSED_MAX_TILE, common.IEEE_MAX_WORK = before[1], before[2]
    return list(seen.values())


COMPILE = r"""
import json, os, re, subprocess, sys, glob, importlib, tempfile
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
# the newest bundled ptxas (Triton's PTX version may be newer than the plain one accepts) for -v's report
ptxas = sorted(glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas*")))[-1]
out = []
for e in json.load(sys.stdin):
    fn = getattr(importlib.import_module(e["module"]), e["kernel"])
    src = ASTSource(fn=fn, signature=e["signature"], constexprs=e["constexprs"])
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": e["num_warps"]})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:  # a file per process: pytest -n runs two of these
        f.write(k.asm["ptx"])
        f.flush()
        v = subprocess.run([ptxas, "-v", "-arch=sm_90a", f.name, "-o", "/dev/null"], capture_output=True,
                           text=True).stderr
    regs = re.search(r"Used (\d+) registers", v)
    spills = re.search(r"(\d+) bytes spill stores", v)
    out.append({"kernel": e["kernel"], "cubin": len(k.asm["cubin"]), "regs": int(regs.group(1)) if regs else None,
                "spill_bytes": int(spills.group(1)) if spills else None, "warps": e["num_warps"],
                "precision": e["constexprs"].get("PRECISION"), "shared": k.metadata.shared,
                "wgmma": len(re.findall(r"wgmma\.mma_async", k.asm["ptx"])),
                "mma": len(re.findall(r"\bmma\.sync", k.asm["ptx"]))})
print(json.dumps(out))
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_every_launched_kernel_compiles_for_sm90(dtype):
    launches = _record(dtype)
    kernels = {e["kernel"] for e in launches}
    # the fused paths of issue 25: each hot path's kernels are among them
    assert {"_cliff_fused_fwd", "_cliff_fused_bwd", "_biv_fwd", "_biv_dx", "_biv_dkz", "_klm_tiles", "_klm_fwd_rows",
            "_klm_bwd_rows", "_latent_quantize_fwd", "_kde_grid_by_points", "_fdc_fwd"} <= kernels, sorted(kernels)
    if dtype == torch.float32:  # each precision mode of the bivariate products compiles
        precisions = {e["constexprs"].get("PRECISION") for e in launches if e["kernel"] == "_biv_fwd"}
        assert precisions == {"tf32x3", "tf32"}, precisions
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.environ.get("QKERNELS_SM90_TRITON"), ROOT]))
    res = subprocess.run([sys.executable, "-c", COMPILE], input=json.dumps(launches), capture_output=True, text=True,
                         env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    built = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(built) == len(launches) and all(b["cubin"] > 0 for b in built)
    print(json.dumps(built))  # registers and spills per kernel (benchmarks/RESULTS.md), with -s
