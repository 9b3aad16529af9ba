"""Launch budgets (issue 25): one forward + backward of each public function, set-up included
(standardization, grids, conditioning draws, noise, directions, the loss reduction), launches at
most a handful of GPU kernels on the ``triton`` and ``cuda`` paths.

Counted by :func:`qkernels.bench.launches.count_launches` (Triton launches + aten ops that run a
kernel; value checks off, as on a GPU). Upstream gradients are made before the count and the
inputs' ``.grad`` cleared, so the count is the op's own: no ``ones_like`` of ``loss.backward()``,
no accumulation into an existing ``.grad``. The Hessian penalties are counted beyond ``fn``'s own
forward + backward on the stacked batch. On a GPU the same scenarios are counted by
``torch.profiler`` (the kernels that really ran) and held to the same budgets, for ``cuda`` too,
whose C++ ops the CPU-side counter cannot look into.
"""

from __future__ import annotations

import pytest
import torch

import qkernels
from qkernels.bench.launches import count_launches, profiler_kernels

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# the budgets of issue 25: launches per forward + backward of the public function
BUDGETS = {
    "cliff_loss": 8,
    "klm_loss": 6,
    "latent_quantize": 6,
    "categorical_latent": 5,
    "gumbel_quantize": 6,
    "kde_grid": 3,
    "normalized_hessian_penalty": 8,
    "hessian_penalty": 8,
}
# the triton path's where it is tighter: latent_quantize is one kernel each way (qkernels/triton/quantize.py)
TRITON_BUDGETS = BUDGETS | {"latent_quantize": 2, "klm_loss": 5}


def _leaf(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE).requires_grad_()


def _mlp(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.GELU(), torch.nn.Linear(8, 5)).to(DEVICE, dtype)


def scenarios(dtype=torch.float32):
    """name -> (forward: () -> outputs, leaves whose .grad is cleared, fn's own cost or None)."""
    gen = torch.Generator(DEVICE).manual_seed(0)
    z = _leaf(16, 3, dtype=dtype)
    values = _leaf(3, 5, seed=1, dtype=dtype)
    codebook = _leaf(5, seed=2, dtype=dtype)
    logits = _leaf(16, 3, 5, seed=3, dtype=dtype)
    points = _leaf(3, 8, seed=4, dtype=dtype)
    mlp = _mlp(dtype)
    leaves = (z, values, codebook, logits, points, *mlp.parameters())
    return {
        "cliff_loss": (lambda: qkernels.cliff_loss(z, grid=(-4.0, 4.0, 16), num_cond=4, generator=gen), leaves, None),
        "klm_loss": (lambda: qkernels.klm_loss(z), leaves, None),
        "latent_quantize": (lambda: _quantized(qkernels.latent_quantize(z, values)), leaves, None),
        "categorical_latent": (
            lambda: _differentiable(qkernels.categorical_latent(logits, generator=gen)),
            leaves,
            None,
        ),
        "gumbel_quantize": (
            lambda: _differentiable(qkernels.gumbel_quantize(z, codebook, 0.5, generator=gen)),
            leaves,
            None,
        ),
        "kde_grid": (lambda: qkernels.kde_grid(points, z, 0.3), leaves, None),
        "normalized_hessian_penalty": (
            lambda: qkernels.normalized_hessian_penalty(mlp, z, generator=gen),
            leaves,
            (mlp, 4 * 2 * 16),
        ),
        "hessian_penalty": (lambda: qkernels.hessian_penalty(mlp, z, generator=gen), leaves, (mlp, 2 * 2 * 16)),
    }


def _quantized(q):
    return q.z_q, q.loss_quantize, q.loss_commit


def _differentiable(out):
    return tuple(t for t in out if t.requires_grad)


def forward_backward(forward, leaves):
    """A callable running ``forward()`` and its backward with upstream gradients made beforehand."""
    outs = forward()
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = [torch.randn_like(o) for o in outs]

    def run():
        for t in leaves:
            t.grad = None
        got = forward()
        torch.autograd.backward(got if isinstance(got, tuple) else (got,), grads)

    return run


def fn_cost(fn, rows, leaves):
    """fn's own forward + backward on a stacked batch of ``rows`` rows (its input requiring grad)."""
    x = _leaf(rows, 3, seed=9, dtype=leaves[0].dtype)
    return forward_backward(lambda: fn(x), (*leaves, x))


def _paths():
    out = []
    if qkernels.available_backends(DEVICE).count("triton"):
        out.append("triton")
    if DEVICE == "cuda" and "cuda" in qkernels.available_backends(DEVICE):
        out.append("cuda")
    return out


# the cuda path where it exceeds its budget: gumbel_quantize and the penalties' stacking / reduction have no CUDA
# C++ kernels (torch ops / the reference). The H200 counts of 2026-11-27 (latent_quantize 27, categorical_latent
# 28, kde_grid 19 kernels) were the reference's: the profiler ran outside use_backend (fixed above); their C++
# glue launches 5, 4 and 3 kernels (csrc/cuda/quantize.cu, kde.cu). strict: a pass is reported, to update this
CUDA_OVER_BUDGET = {"gumbel_quantize", "normalized_hessian_penalty", "hessian_penalty"}
NO_CUDA = {"cliff_loss"}  # the CUDA C++ Cliff was deleted (issue 26): the cuda backend does not implement it


def _budget_cases():
    cases = []
    for path in _paths():
        for name in BUDGETS:
            if path == "cuda" and name in NO_CUDA:
                cases.append(pytest.param(name, path, marks=pytest.mark.skip(reason="no CUDA C++ kernel")))
            elif path == "cuda" and name in CUDA_OVER_BUDGET:
                cases.append(
                    pytest.param(
                        name,
                        path,
                        marks=pytest.mark.xfail(
                            strict=True, reason="the CUDA C++ path is not fused: issue 25, CUDA_OVER_BUDGET"
                        ),
                    )
                )
            else:
                cases.append((name, path))
    return cases


@pytest.mark.parametrize("name,path", _budget_cases())
def test_launch_budget(name, path):
    forward, leaves, fn = scenarios()[name]
    seen = None
    # the profiler runs inside the forced backend too: outside it, auto ran the reference on a GPU (the H200's
    # "27 kernels" for latent_quantize on cuda were the reference's abs / argmin / gather / scatter_add ops)
    with qkernels.use_backend(path):
        run = forward_backward(forward, leaves)
        run()  # lazy set-up (compilation, caches) is not counted
        tally = count_launches(run)
        own = 0
        if fn is not None:
            fn_run = fn_cost(fn[0], fn[1], leaves)
            fn_run()
            own = count_launches(fn_run).total
        if path == "cuda":  # C++ ops are opaque to the dispatch-mode counter: the profiler decides
            seen = profiler_kernels(run)
            if fn is not None:
                seen.subtract(profiler_kernels(fn_run))
    used = tally.total - own if seen is None else sum(seen.values())
    budget = (TRITON_BUDGETS if path == "triton" else BUDGETS)[name]
    assert tally.syncs == 0, f"{name} [{path}] reads back to the host: {tally}"
    assert used <= budget, (
        f"{name} [{path}]: {used} launches > budget {budget} ({tally}; fn: {own}; "
        f"profiler: {dict(seen.most_common()) if seen else '-'})"
    )


# ----------------------------------------------------------------------------- the counter itself


def test_counter_counts_kernels_not_views_or_allocations():
    x = torch.randn(4, 3, device=DEVICE)
    tally = count_launches(
        lambda: (x.view(12), x.t(), torch.empty(5, device=DEVICE), x[1:], torch.add(x, x), x.sum(), x.clone())
    )
    assert tally.total == 3 and tally.triton == 0, tally
    assert dict(tally.names) == {"add": 1, "sum": 1, "clone": 1}


def test_counter_counts_reads_back_apart():
    x = torch.randn(4, device=DEVICE)
    tally = count_launches(lambda: x.sum().item())
    assert (tally.total, tally.syncs) == (1, 1), tally


@pytest.mark.skipif("triton" not in qkernels.available_backends(DEVICE), reason="needs Triton (or its interpreter)")
def test_counter_enters_python_custom_ops_and_counts_triton_launches():
    """The kde_grid Triton op: one kernel forward, two backward; the op itself and the
    interpreter's host copies are not counted."""
    points = torch.randn(2, 5, device=DEVICE)
    samples = torch.randn(7, 2, device=DEVICE)
    fwd = count_launches(lambda: torch.ops.qkernels.kde_grid_triton(points, samples, 0.5, False))
    assert (fwd.total, fwd.triton) == (1, 1), fwd
    grad = torch.randn(2, 5, device=DEVICE)
    bwd = count_launches(lambda: torch.ops.qkernels.kde_grid_backward_triton(grad, points, samples, 0.5, False))
    assert (bwd.total, bwd.triton) == (2, 2), bwd


def test_counter_switches_value_checks_off_and_restores_them():
    from qkernels import _validation

    before = _validation.CHECK_VALUES
    seen = []
    count_launches(lambda: seen.append(_validation.CHECK_VALUES))
    assert seen == ["0"] and _validation.CHECK_VALUES == before


@pytest.mark.skipif(DEVICE != "cuda", reason="the profiler cross-check needs a GPU")
@pytest.mark.parametrize("name", list(BUDGETS))
def test_counter_agrees_with_the_profiler_on_a_gpu(name):
    """On a GPU: the dispatch-mode count against the kernels torch.profiler saw (triton path), both without
    the user function's own forward + backward (the penalties' MLP), as the budgets count: cuBLAS may run more
    than one kernel for an aten matmul (an H200 saw 22-24 kernels where the counter, MLP included, said 17)."""
    forward, leaves, fn = scenarios()[name]
    with qkernels.use_backend("triton"):
        run = forward_backward(forward, leaves)
        run()
        tally, seen = count_launches(run), profiler_kernels(run)
        counted = tally.total
        if fn is not None:
            fn_run = fn_cost(fn[0], fn[1], leaves)
            fn_run()
            counted -= count_launches(fn_run).total
            seen.subtract(profiler_kernels(fn_run))
    total = sum(seen.values())
    assert abs(total - counted) <= max(2, counted // 4), (
        f"{name}: counted {counted} ({dict(tally.names)}), the profiler saw {total} ({dict(seen.most_common())})"
    )
