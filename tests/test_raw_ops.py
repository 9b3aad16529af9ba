"""Bad input to every raw ``torch.ops.qkernels.*`` entry point, on every backend and device that can
run it: a clear Python exception, never a crash (a kernel handed a wrong shape, a host pointer or an
out-of-range index would read out of bounds). Valid calls with non-contiguous inputs give the
contiguous result. Index *values* are checked on CPU tensors; on a GPU (triton, cuda) reading them
would synchronize, so the kernels guard them and write NaN instead.

Every registered ``qkernels::`` op must have a spec here (test_every_op_has_a_spec)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

import qkernels
from qkernels import _backend, _ext

ERRORS = (RuntimeError, ValueError, TypeError)
F, N, D, NV = torch.float32, 5, 3, 4


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


def _latent_quantize(dev, suffix=""):
    z, v = torch.randn(N, D, device=dev), torch.randn(D, NV, device=dev)
    return [Arg(z), Arg(v)]


def _latent_quantize_backward(dev, suffix=""):
    z, v = torch.randn(N, D, device=dev), torch.randn(D, NV, device=dev)
    idx = getattr(_ops(), "latent_quantize" + suffix)(z, v)[1]
    one = torch.ones((), device=dev)
    return [Arg(torch.randn(N, D, device=dev)), Arg(one, "grad"), Arg(one, "grad"), Arg(z), Arg(v),
            Arg(idx, "index", NV)]


def _relaxed(dev, suffix=""):
    lg, v, u = torch.randn(N, D, NV, device=dev), torch.randn(1, NV, device=dev), torch.rand(N, D, NV, device=dev)
    return [Arg(lg), Arg(v), Arg(u), Arg(0.7, "scalar"), Arg(1.0, "scalar"), Arg(False, "scalar")]


def _relaxed_backward(dev, suffix=""):
    lg, v, u = torch.randn(N, D, NV, device=dev), torch.randn(1, NV, device=dev), torch.rand(N, D, NV, device=dev)
    y = getattr(_ops(), "relaxed_categorical" + suffix)(lg, v, u, 0.7, 1.0, False)[1]
    grads = [Arg(torch.randn(N, D, device=dev)), Arg(torch.randn(N, D, NV, device=dev)),
             Arg(torch.randn(N, D, device=dev))]
    return [*grads, Arg(lg), Arg(v), Arg(u), Arg(y), Arg(0.7, "scalar"), Arg(1.0, "scalar")]


def _gumbel(dev, suffix=""):
    z, v, u = torch.randn(N, D, device=dev), torch.randn(D, NV, device=dev), torch.rand(N, D, NV, device=dev)
    return [Arg(z), Arg(v), Arg(u), Arg(0.7, "scalar"), Arg(False, "scalar")]


def _gumbel_backward(dev, suffix=""):
    z, v, u = torch.randn(N, D, device=dev), torch.randn(1, NV, device=dev), torch.rand(N, D, NV, device=dev)
    y = getattr(_ops(), "gumbel_quantize" + suffix)(z, v, u, 0.7, False)[1]
    grads = [Arg(torch.randn(N, D, device=dev)), Arg(torch.randn(N, D, NV, device=dev)),
             Arg(torch.randn(N, D, NV, device=dev)), Arg(torch.randn(N, D, device=dev))]
    return [*grads, Arg(z), Arg(v), Arg(u), Arg(y), Arg(0.7, "scalar")]


def _kde_grid(dev, suffix=""):
    data = [Arg(torch.randn(D, 7, device=dev)), Arg(torch.randn(N, D, device=dev))]
    return [*data, Arg(0.3, "scalar"), Arg(True, "scalar")]


def _kde_grid_backward(dev, suffix=""):
    return [Arg(torch.randn(D, 7, device=dev), "dgrad"), *_kde_grid(dev)]


def _cliff(dev, suffix=""):
    z = torch.randn(6, D, device=dev)
    cond = torch.tensor([[0, 5], [2, 3], [4, 1]], device=dev)
    return [Arg(z), Arg(cond, "index", 6), *(Arg(a, "scalar") for a in (0.4, -3.0, 3.0, 8, 0.5, 1.0, 0.7))]


def _cliff_backward(dev, suffix=""):
    one = torch.ones((), device=dev)
    return [Arg(one, "grad"), Arg(one, "grad"), Arg(one, "grad"), Arg(one, "grad"), *_cliff(dev)]


def _klm(dev, suffix=""):
    return [Arg(torch.randn(6, D, device=dev)), Arg(torch.rand(D, device=dev) + 0.5)]


def _klm_backward(dev, suffix=""):
    z, s = torch.randn(6, D, device=dev), torch.rand(D, device=dev) + 0.5
    lse = getattr(_ops(), "klm" + suffix)(z, s)[1]
    return [Arg(torch.ones((), device=dev), "grad"), Arg(z), Arg(s), Arg(lse)]


FD = (2, 2, 0.1, 2, False, "mean")  # n, k, eps, groups, unbiased, reduce: 16 stacked rows


def _fd(dev, suffix=""):
    return [Arg(torch.randn(16, 3, device=dev)), *(Arg(a, "scalar") for a in FD)]


def _fd_backward(dev, suffix=""):
    x = torch.randn(16, 3, device=dev)
    argmax = getattr(_ops(), "finite_difference_curvature" + suffix)(x, *FD)[1]
    return [Arg(torch.randn(2, 2, device=dev), "dgrad"), Arg(x), Arg(argmax, "index"), *(Arg(a, "scalar") for a in FD)]


PB = (0.1, 1, "std")  # eps, signs, scale: the first of 2 directions as signs, scaled by std


def _pb(dev, suffix=""):
    z, draws, std = torch.randn(N, D, device=dev), torch.randn(2, N, D, device=dev), torch.rand(D, device=dev) + 0.5
    return [Arg(z), Arg(draws), Arg(std), *(Arg(a, "scalar") for a in PB)]


def _pb_backward(dev, suffix=""):
    return [Arg(torch.randn(4 * N, D, device=dev), "dgrad"), *_pb(dev)]


def _cp(dev, suffix=""):
    return [Arg(torch.rand(2, N, device=dev)), Arg(True, "scalar"), Arg("mean", "scalar")]


def _cp_backward(dev, suffix=""):
    return [Arg(torch.ones((), device=dev), "grad"), *_cp(dev)]


# op -> (valid arguments, op-specific bad calls: (what, argument index, replacement value))
SPECS: dict[str, tuple[Callable, list[tuple[str, int, Callable]]]] = {
    "latent_quantize": (_latent_quantize, [("codebook rows != d", 1, lambda dev: torch.randn(D + 1, NV, device=dev))]),
    "latent_quantize_backward": (
        _latent_quantize_backward,
        [("indices shape", 5, lambda dev: torch.zeros(N, D + 1, dtype=torch.long, device=dev)),
         ("grad_zq shape", 0, lambda dev: torch.randn(N + 1, D, device=dev))],
    ),
    "relaxed_categorical": (
        _relaxed,
        [("values K", 1, lambda dev: torch.randn(1, NV + 1, device=dev)),
         ("uniform shape", 2, lambda dev: torch.rand(N, D, NV + 1, device=dev))],
    ),
    "relaxed_categorical_backward": (
        _relaxed_backward,
        [("grad_z shape", 0, lambda dev: torch.randn(N, D + 1, device=dev)),
         ("y shape", 6, lambda dev: torch.randn(N + 1, D, NV, device=dev))],
    ),
    "gumbel_quantize": (  # triton only (no C++ kernel)
        _gumbel,
        [("codebook rows != d", 1, lambda dev: torch.randn(D + 1, NV, device=dev)),
         ("uniform K", 2, lambda dev: torch.rand(N, D, NV + 1, device=dev)), ("tau", 3, lambda dev: 0.0)],
    ),
    "gumbel_quantize_backward": (
        _gumbel_backward,
        [("grad_zq shape", 0, lambda dev: torch.randn(N, D + 1, device=dev)),
         ("grad_logits shape", 2, lambda dev: torch.randn(N, D, NV + 1, device=dev)),
         ("y shape", 7, lambda dev: torch.randn(N + 1, D, NV, device=dev))],
    ),
    "kde_grid": (
        _kde_grid, [("samples d", 1, lambda dev: torch.randn(N, D + 1, device=dev)), ("sigma", 2, lambda dev: 0.0)]
    ),
    "kde_grid_backward": (_kde_grid_backward, [("grad shape", 0, lambda dev: torch.randn(D, 8, device=dev))]),
    "cliff_loss": (
        _cliff,
        [("cond_index rows", 1, lambda dev: torch.zeros(D + 1, 2, dtype=torch.long, device=dev)),
         ("num_points < 2", 5, lambda dev: 1), ("sigma", 2, lambda dev: -1.0), ("a >= b", 3, lambda dev: 3.0)],
    ),
    "cliff_loss_backward": (_cliff_backward, [("grad shape", 0, lambda dev: torch.ones(2, device=dev))]),
    "klm": (_klm, [("std shape", 1, lambda dev: torch.ones(D + 1, device=dev))]),
    "klm_backward": (_klm_backward, [("lse shape", 3, lambda dev: torch.zeros(6, D, device=dev))]),
    "finite_difference_curvature": (
        _fd,
        [("rows", 0, lambda dev: torch.randn(10, 3, device=dev)), ("num_perturbations", 2, lambda dev: 1),
         ("groups", 4, lambda dev: 3), ("reduce", 6, lambda dev: "min"), ("eps", 3, lambda dev: 0.0)],
    ),
    "finite_difference_curvature_backward": (
        _fd_backward,
        [("grad shape", 0, lambda dev: torch.randn(2, 3, device=dev)),
         ("argmax shape", 2, lambda dev: torch.zeros(3, dtype=torch.long, device=dev))],
    ),
    "perturbed_batch": (
        _pb,
        [("draws n", 1, lambda dev: torch.randn(2, N + 1, D, device=dev)),
         ("std shape", 2, lambda dev: torch.ones(D + 1, device=dev)), ("std missing", 2, lambda dev: None),
         ("signs > D", 4, lambda dev: 3), ("signs < 0", 4, lambda dev: -1), ("eps", 3, lambda dev: 0.0),
         ("scale", 5, lambda dev: "unit")],
    ),
    "perturbed_batch_backward": (
        _pb_backward,
        [("grad rows", 0, lambda dev: torch.randn(4 * N + 1, D, device=dev)),
         ("draws d", 2, lambda dev: torch.randn(2, N, D + 1, device=dev))],
    ),
    "curvature_penalty": (
        _cp,
        [("groups without ratio", 1, lambda dev: False), ("reduction", 2, lambda dev: "sum")],
    ),
    "curvature_penalty_backward": (
        _cp_backward,
        [("grad of reduction none", 3, lambda dev: "none"),
         ("values groups", 1, lambda dev: torch.rand(3, N, device=dev))],
    ),
}


def _runs():
    """(op name, backend, device) for every raw op and every backend/device that can run it."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    out = []
    for dev in devices:
        if _backend.unavailable_reason("cpu" if dev == "cpu" else "cuda", dev) is None:
            # ops without a C++ kernel for the device (gumbel_quantize; Cliff on CUDA, deleted in issue 26) have
            # only the *_triton raw ops there
            key = "CPU" if dev == "cpu" else "CUDA"
            out += [(op, "cpu" if dev == "cpu" else "cuda", dev) for op in SPECS if _ext.has_kernel(op, key)]
    tdev = "cuda" if torch.cuda.is_available() else "cpu"
    if _backend.unavailable_reason("triton", tdev) is None:
        out += [(op, "triton", tdev) for op in SPECS]
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
            yield "empty", i, t[:0] if t.dim() else t.reshape(0)
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


def test_every_op_has_a_spec():
    names = {n.split("::")[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("qkernels::")}
    names = {n.removesuffix("_triton") for n in names}
    assert names == set(SPECS), f"ops without a bad-input spec: {sorted(names - set(SPECS))}"


@pytest.mark.parametrize("op,backend,dev", RUNS, ids=lambda v: str(v))
def test_bad_input_raises_and_valid_input_runs(op, backend, dev):
    make, bad = SPECS[op]
    suffix = "_triton" if backend == "triton" else ""
    args = make(dev, suffix)
    values = [a.value for a in args]
    want = _call(op, backend, values)  # the valid call runs
    for t in want:
        if t.is_floating_point():
            assert torch.isfinite(t).all(), f"{op}: valid call gave non-finite output"
    cases = list(_mutations(args, dev)) + [(what, i, fn(dev)) for what, i, fn in bad]
    for what, i, value in cases:
        call = values[:i] + [value] + values[i + 1:]
        with pytest.raises(ERRORS):
            _call(op, backend, call)
            pytest.fail(f"{op} [{backend}, {dev}]: {what} of argument {i} was accepted")
    # non-contiguous tensors: the contiguous result
    for i, a in enumerate(args):
        if isinstance(a.value, torch.Tensor) and a.value.dim() >= 1 and a.value.shape[-1] > 1:
            got = _call(op, backend, values[:i] + [_noncontiguous(a.value)] + values[i + 1:])
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(g, w, equal_nan=True, msg=f"{op}: non-contiguous argument {i}")


INDEXED = {"latent_quantize_backward", "cliff_loss", "cliff_loss_backward"}  # ops with an Arg(..., hi=...)


@pytest.mark.parametrize("op,backend,dev", [r for r in RUNS if r[0] in INDEXED], ids=lambda v: str(v))
def test_out_of_range_indices(op, backend, dev):
    """CPU kernels raise; GPU kernels (and Triton anywhere) never read out of bounds: NaN outputs."""
    make, _ = SPECS[op]
    suffix = "_triton" if backend == "triton" else ""
    args = make(dev, suffix)
    values = [a.value for a in args]
    assert any(a.hi for a in args), f"{op} is in INDEXED but has no bounded index argument"
    for i, a in enumerate(args):
        if a.role != "index" or a.hi is None:
            continue
        for bad_value in (a.hi, -1):
            idx = a.value.clone()
            idx.view(-1)[0] = bad_value
            call = values[:i] + [idx] + values[i + 1:]
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
    for op, (make, _) in SPECS.items():
        _call(op, "triton", [a.value for a in make("cpu", "_triton")])
    want = {"_cliff_fused_fwd", "_cliff_fused_bwd", "_klm_tiles", "_latent_quantize_bwd", "_fdc_fwd"}
    assert want <= set(seen), sorted(seen)
