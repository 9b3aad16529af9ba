"""Compile recorded Triton launches for an H100 / H200 (sm_90) without a GPU and report their properties.

Run by tests/sm90/sm90_launches.py in a subprocess without ``TRITON_INTERPRET`` (the Triton on its ``PYTHONPATH``:
3.6, torch 2.11's, when installed): ``python tests/sm90/sm90_compile.py CACHE_DIR SEED < launches.json`` prints one
JSON list, a result per launch ({"key", ...properties} or {"key", "error"}). Each launch is compiled exactly
as Triton's JIT would compile it on the GPU: ``kernel.warmup(...)`` with the recorded arguments (tensors as
dtype-only stand-ins, ints and floats as they were) under a stub driver that says "sm_90" and
launches nothing, so the specialization (ints equal to 1 or divisible by 16, aligned pointers, float
annotations, constexprs) is Triton's own. Per kernel: shared memory, registers and spill bytes (the ptxas
``-v`` log of the compile itself), the ``tt.dot`` shapes and input precisions of the TTIR, and whether the
PTX holds tensor-core instructions (``mma``: either of ``wgmma``, Hopper's warp-group MMAs, and ``mma_sync``,
Ampere's ``mma.sync``, which Triton falls back to for small tiles: a fraction of the rate on sm_90). Results are
cached, keyed by SCHEMA, Triton's version, the kernel's source hash (``cache_key``: its callees included) and the
specialization Triton compiles from (argument types and divisibility, constexprs, num_warps / num_stages): read
from SEED (the committed tests/sm90/sm90_cache.json, {key: result}) or CACHE_DIR, written to CACHE_DIR. A changed
kernel or a new specialization has a new key and is compiled.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import os
import re
import sys

os.environ.pop("TRITON_INTERPRET", None)
os.environ["TRITON_ALWAYS_COMPILE"] = "1"  # Triton's own cache would skip ptxas, whose log is read here

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SCHEMA = 2  # part of every result's key: raise it when a result gains a field (2: "wgmma", "mma_sync")
DOT = re.compile(
    r"tt\.dot %\S+, %\S+, %[^,\s]+(?:, inputPrecision = (\w+))?[^:]*: tensor<(\d+)x(\d+)x(\w+)> \* "
    r"tensor<(\d+)x(\d+)x\w+>"
)


class StubDriver:
    """Says "sm_90, device 0, stream 0" and launches nothing (warmup compiles only)."""

    def get_current_target(self):
        return TARGET

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


class Tensor:
    """A tensor argument: dtype and the alignment of its address (as Triton specializes on it)."""

    def __init__(self, dtype: str, aligned: bool):
        self.dtype = getattr(torch, dtype)
        self._ptr = 0 if aligned else 4

    def data_ptr(self):
        return self._ptr


def _arg(v):
    if isinstance(v, dict) and "tensor" in v:
        return Tensor(v["tensor"], v["aligned"])
    if isinstance(v, dict) and "tl_dtype" in v:
        return getattr(triton.language, v["tl_dtype"])
    return v


def _properties(kernel, ptxas_log: str) -> dict:
    ttir, ptx = kernel.asm["ttir"], kernel.asm["ptx"]
    dots = [
        {
            "precision": m.group(1) or "ieee",
            "m": int(m.group(2)),
            "k": int(m.group(3)),
            "dtype": m.group(4),
            "n": int(m.group(6)),
        }
        for m in DOT.finditer(ttir)
    ]
    if ttir.count("tt.dot ") != len(dots):
        raise RuntimeError(f"unparsed tt.dot in the TTIR of {kernel.name}")
    regs = re.search(r"Used (\d+) registers", ptxas_log)
    if regs is None:
        raise RuntimeError(f"no ptxas -v report for {kernel.name}")
    spills = [int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", ptxas_log)]
    return {
        "shared": kernel.metadata.shared,
        "regs": int(regs.group(1)),
        "spill_bytes": sum(spills),
        "dots": dots,
        "mma": bool(re.search(r"\bw?gmma\.|\bmma\.sync", ptx)),
        "wgmma": bool(re.search(r"\bwgmma\.", ptx)),
        "mma_sync": bool(re.search(r"\bmma\.sync", ptx)),
        "num_warps": kernel.metadata.num_warps,
        "num_stages": kernel.metadata.num_stages,
    }


def _identity(repr_: str, fn, compile_: dict) -> str:
    spec = json.loads(compile_["specialization_data"])
    spec["options"].pop("extern_libs", None)  # absolute paths of this install: not part of the identity
    ident = [SCHEMA, triton.__version__, fn.jit_function.cache_key, repr_, spec]
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:32]


def compile_one(launch: dict, cache_dir: str, seed: dict) -> dict:
    fn = getattr(importlib.import_module(launch["module"]), launch["kernel"])

    def hook(*, repr: str, fn, compile: dict, **_):  # noqa: A002 - Triton's keywords
        hook.key = _identity(repr, fn, compile)
        return hook.key in seed or os.path.exists(os.path.join(cache_dir, hook.key + ".json"))  # True: skip

    knobs.runtime.jit_cache_hook = hook
    knobs.nvidia.dump_ptxas_log = True
    args = [_arg(a) for a in launch["args"]]
    kwargs = {k: _arg(v) for k, v in launch["kwargs"].items()}
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            kernel = fn.warmup(*args, grid=tuple(launch["grid"]), **kwargs)
        path = os.path.join(cache_dir, hook.key + ".json")
        if kernel is None:  # the hook found it in a cache
            if hook.key in seed:
                return seed[hook.key] | {"key": hook.key}
            with open(path) as f:
                return json.load(f) | {"key": hook.key}
        result = _properties(kernel, log.getvalue())
    except Exception as exc:  # noqa: BLE001 - reported per launch (a compile error is cached like a result)
        if not hasattr(hook, "key"):  # failed before compiling (binding the arguments)
            return {"key": None, "error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
        result = {"error": f"{type(exc).__name__}: {str(exc)[-2000:]}"}
        path = os.path.join(cache_dir, hook.key + ".json")
    finally:
        knobs.runtime.jit_cache_hook = None
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)
    return result | {"key": hook.key}


def main() -> None:
    cache_dir, seed_file = sys.argv[1], sys.argv[2]
    os.makedirs(cache_dir, exist_ok=True)
    seed = {}
    if os.path.exists(seed_file):
        with open(seed_file) as f:
            seed = json.load(f)
    driver.set_active(StubDriver())
    launches = json.load(sys.stdin)
    print(json.dumps([compile_one(launch, cache_dir, seed) for launch in launches]))


if __name__ == "__main__":
    main()
