"""Bad input to every raw ``torch.ops.qkernels.*`` entry point, on every backend and device that can
run it: a clear Python exception, never a crash (a kernel handed a wrong shape, a host pointer or an
out-of-range index would read out of bounds). Valid calls with non-contiguous inputs give the
contiguous result. Index *values* are checked on CPU tensors; on a GPU (triton, cuda) reading them
would synchronize, so the kernels guard them and write NaN instead.

Every registered ``qkernels::`` op is declared in :mod:`qkernels.decl`: the valid example calls and the bad inputs
(wrong rank, empty, dtype, device, a dimension that must match another argument's, each rule's counterexample) are
derived from the declarations."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import qkernels
from qkernels import _backend, _ext, decl

ERRORS = (RuntimeError, ValueError, TypeError)


@dataclasses.dataclass
class Arg:
    """role: "data" (float, fixed rank, the op's dtype), "dgrad" (an upstream gradient shaped like an
    output, converted to the op's dtype), "grad" (a one-element upstream gradient, converted),
    "index" (int64; ``hi``: exclusive bound of its values, None when the kernels only compare it),
    "scalar" (a Python number, bool or string)."""

    value: object
    role: str = "data"
    hi: int | None = None


def _ops():
    return torch.ops.qkernels


DECLARED = decl.by_name()


def _tensor(t: decl.Tensor, shape: tuple[int, ...], env: dict, dev: str, gen: torch.Generator) -> torch.Tensor:
    """A valid value of tensor argument ``t`` shaped ``shape``."""
    if t.role == "index":
        return torch.randint(0, env[t.hi] if t.hi else 1, shape, generator=gen).to(dev)
    if t.role == "grad":
        return torch.ones(shape, device=dev)
    if t.example == "uniform":
        return torch.rand(shape, generator=gen).to(dev)
    if t.example == "positive":
        return (torch.rand(shape, generator=gen) + 0.5).to(dev)
    return torch.randn(shape, generator=gen).to(dev)


def example(op: decl.Op, dev: str) -> list[Arg]:
    """The declaration's valid example call (its sizes and scalars), every optional tensor given."""
    env, gen = op.example_env(), torch.Generator().manual_seed(0)
    out = []
    for a in op.args:
        if isinstance(a, decl.Scalar):
            out.append(Arg(a.example, "scalar"))
        else:
            value = _tensor(a, op.example_shape(a, env), env, dev, gen)
            out.append(Arg(value, a.role, env[a.hi] if a.hi else None))
    return out


def declared_bad_calls(op: decl.Op, dev: str) -> list[tuple[str, int, object]]:
    """(what, argument index, bad value) derived from the declaration: one dimension of a tensor changed where it
    must equal another argument's, and each rule's counterexample."""
    env, gen = op.example_env(), torch.Generator().manual_seed(1)
    tensors = {t.name: t for t in op.tensors}
    out = []
    for name, axis, dim in op.dimension_mismatches():
        t = tensors[name]
        shape = list(op.example_shape(t, env))
        shape[axis] += 1
        out.append(
            (
                f"{name} axis {axis} ({dim}) != {shape[axis] - 1}",
                op.index(name),
                _tensor(t, tuple(shape), env, dev, gen),
            )
        )
    for rule in op.rules:
        for name, bad in rule.bad.items():
            if name in tensors and bad is not None:
                bad = _tensor(tensors[name], tuple(bad), env, dev, gen)
            out.append((f"violates {rule.expr}", op.index(name), bad))
    return out


def _runs():
    """(op name, backend, device) for every raw op and every backend/device that can run it."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    out = []
    for dev in devices:
        if _backend.unavailable_reason("cpu" if dev == "cpu" else "cuda", dev) is None:
            # ops without a C++ kernel for the device (gumbel_quantize; Cliff on CUDA, deleted in issue 26) have
            # only the *_triton raw ops there
            key = "CPU" if dev == "cpu" else "CUDA"
            out += [(op, "cpu" if dev == "cpu" else "cuda", dev) for op in DECLARED if _ext.has_kernel(op, key)]
    tdev = "cuda" if torch.cuda.is_available() else "cpu"
    if _backend.unavailable_reason("triton", tdev) is None:
        out += [(op, "triton", tdev) for op in DECLARED]
    return out


RUNS = _runs()


def _call(op: str, backend: str, args: list) -> tuple:
    fn = getattr(_ops(), op + ("_triton" if backend == "triton" else ""))
    out = fn(*args)
    return out if isinstance(out, tuple) else (out,)


def _noncontiguous(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout."""
    if t.dim() == 0:
        return t
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    out = wide[..., ::2]
    out.copy_(t)
    assert not out.is_contiguous() or t.shape[-1] <= 1
    return out


def _mutations(args: list[Arg], dev: str):
    """(what, index, bad value) of the generic bad inputs, each of which must raise."""
    data = [i for i, a in enumerate(args) if a.role == "data"]
    other = "cuda" if dev == "cpu" else "cpu"
    for i, a in enumerate(args):
        t = a.value
        if a.role in ("data", "dgrad", "index"):
            yield "rank", i, t.unsqueeze(0)
            yield "empty", i, t[:0] if t.dim() else t.reshape(1)[:0]
        if a.role == "data":
            yield "int dtype", i, t.long()
            if len(data) > 1:
                yield "dtype mismatch", i, t.double()
        if a.role == "index":
            yield "float index", i, t.double()
        if a.role == "grad":
            yield "empty grad", i, t.reshape(1)[:0]
        # with one tensor argument there is nothing to mismatch: the op runs on that tensor's device
        if a.role != "scalar" and torch.cuda.is_available() and sum(b.role != "scalar" for b in args) > 1:
            yield "device mismatch", i, t.to(other)


def test_every_registered_op_is_declared():
    names = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("qkernels::")}
    assert {n.removesuffix("_triton") for n in names} <= set(DECLARED), "ops registered without a declaration"
    for name in names:
        schema = str(getattr(_ops(), name).default._schema).removeprefix("qkernels::")
        assert schema == name + DECLARED[name.removesuffix("_triton")].schema(name=False)


@pytest.mark.parametrize("op,backend,dev", RUNS, ids=lambda v: str(v))
def test_bad_input_raises_and_valid_input_runs(op, backend, dev):
    args = example(DECLARED[op], dev)
    values = [a.value for a in args]
    want = _call(op, backend, values)  # the valid call runs
    for t in want:
        if t.is_floating_point():
            assert torch.isfinite(t).all(), f"{op}: valid call gave non-finite output"
    cases = list(_mutations(args, dev)) + declared_bad_calls(DECLARED[op], dev)
    for what, i, value in cases:
        call = values[:i] + [value] + values[i + 1 :]
        with pytest.raises(ERRORS):
            _call(op, backend, call)
            pytest.fail(f"{op} [{backend}, {dev}]: {what} of argument {i} was accepted")
    # non-contiguous tensors: the contiguous result
    for i, a in enumerate(args):
        if isinstance(a.value, torch.Tensor) and a.value.dim() >= 1 and a.value.shape[-1] > 1:
            got = _call(op, backend, values[:i] + [_noncontiguous(a.value)] + values[i + 1 :])
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, equal_nan=True, msg=f"{op}: non-contiguous argument {i}")


INDEXED = {name for name, op in DECLARED.items() if any(t.hi for t in op.tensors)}  # ops with a bounded index


def test_the_bounded_indices_are_declared():
    assert INDEXED == {"latent_quantize_backward", "cliff_loss", "cliff_loss_backward"}


@pytest.mark.parametrize("op,backend,dev", [r for r in RUNS if r[0] in INDEXED], ids=lambda v: str(v))
def test_out_of_range_indices(op, backend, dev):
    """CPU kernels raise; GPU kernels (and Triton anywhere) never read out of bounds: NaN outputs."""
    args = example(DECLARED[op], dev)
    values = [a.value for a in args]
    for i, a in enumerate(args):
        if a.role != "index" or a.hi is None:
            continue
        for bad_value in (a.hi, -1):
            idx = a.value.clone()
            idx.view(-1)[0] = bad_value
            call = values[:i] + [idx] + values[i + 1 :]
            if backend == "cpu":
                with pytest.raises(ERRORS, match="must hold values in"):
                    _call(op, backend, call)
            else:
                out = _call(op, backend, call)
                floats = [t for t in out if t.is_floating_point()]
                assert any(torch.isnan(t).any() for t in floats), f"{op} [{backend}]: index {bad_value} not flagged"


def test_the_gpu_report_call_raises():
    """The call that killed the process on the GPU machine (shared/gpu/h200-2026-11-26.md)."""
    if "cpu" not in qkernels.available_backends("cpu"):
        pytest.skip("native extension not built")
    with pytest.raises(RuntimeError, match="rows"):
        torch.ops.qkernels.finite_difference_curvature(torch.randn(10, 3), 2, 2, 0.1, 2, False, "mean")


@pytest.mark.skipif(not any(r[1] == "triton" and r[2] == "cpu" for r in RUNS), reason="needs the Triton interpreter")
def test_triton_float_scalars_are_declared_float64(monkeypatch):
    """A Python float passed to a Triton kernel is a float32 argument on a GPU unless the parameter
    is annotated ``tl.float64`` (the interpreter keeps full precision, so the float64 tests cannot
    see it): every float a kernel receives must be declared float64 and cast in the kernel."""
    import inspect

    from triton.runtime import interpreter

    seen: dict[str, set[str]] = {}
    original = interpreter.GridExecutor.__call__

    def spy(self, *args, **kwargs):
        params = inspect.signature(self.fn).parameters  # launch options (num_warps, ...) are not arguments
        bound = inspect.signature(self.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in params})
        for name, value in bound.arguments.items():
            if isinstance(value, float):
                seen.setdefault(self.fn.__name__, set()).add(name)
                ann = str(self.fn.__annotations__.get(name, ""))
                assert ann in ("tl.float64", "triton.language.float64", "fp64"), (
                    f"{self.fn.__name__}: float argument {name!r} is not annotated tl.float64 (got {ann!r})"
                )
        return original(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", spy)
    for op in DECLARED:
        _call(op, "triton", [a.value for a in example(DECLARED[op], "cpu")])
    want = {"_cliff_fused_fwd", "_cliff_fused_bwd", "_klm_pairs", "_latent_quantize_bwd", "_fdc_fwd"}
    assert want <= set(seen), sorted(seen)
