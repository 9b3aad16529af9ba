"""Tensor input checks of the torch front-end: clear ``TypeError``/``ValueError`` naming the argument, never a
silent NaN (the rules on numbers and shapes, shared with the JAX front-end: :mod:`qkernels._args`).

Checks of tensor *values* (NaN/inf, index ranges, positivity) read data back to the host: on a GPU
that blocks the CPU until the device catches up, several times per call. They run where
:func:`value_checks` says so: ``QKERNELS_CHECK_FINITE`` unset or ``auto`` (default): on CPU tensors
only; ``1``: on every device (debugging; synchronizes on CUDA); ``0``: never. They are always
skipped while ``torch.compile`` traces (they would break the graph) and on tensors without data
(``meta`` tensors, fake tensors of ``FakeTensorMode`` / ``torch.export``). Shape, dtype and device
checks always run: they read metadata only.
"""

from __future__ import annotations

import math
import os

import torch
from torch._subclasses.fake_tensor import is_fake

from qkernels._args import check_std_number, check_std_shape
from qkernels.reference.kde import population_std

_CHECK_MODES = ("auto", "1", "0")
CHECK_VALUES = os.environ.get("QKERNELS_CHECK_FINITE", "auto") or "auto"
if CHECK_VALUES not in _CHECK_MODES:
    raise ValueError(f"QKERNELS_CHECK_FINITE must be one of {_CHECK_MODES}, got {CHECK_VALUES!r}")
_FAKE_MODE = torch._C._TorchDispatchModeKey.FAKE


def value_checks(t: torch.Tensor) -> bool:
    """Whether value-dependent checks run on ``t`` (see the module docstring)."""
    if CHECK_VALUES == "0" or torch.compiler.is_compiling():
        return False
    if CHECK_VALUES == "auto" and t.device.type != "cpu":
        return False
    return not (t.is_meta or is_fake_data(t))


def is_fake_data(t: torch.Tensor) -> bool:
    """Whether ``t`` is a fake tensor (FakeTensorMode, torch.export) or a FakeTensorMode is active
    (where even a real tensor's read-back fails). Plain tensors and parameters skip the slower
    ``is_fake`` (microseconds, paid on every call)."""
    if torch._C._get_dispatch_mode(_FAKE_MODE) is not None:
        return True
    plain = type(t) in (torch.Tensor, torch.nn.Parameter) and not torch._is_functional_tensor(t)
    return not plain and is_fake(t)


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | tuple[int, ...] | None = None,
    min_ndim: int | None = None,
    floating: bool = True,
    finite: bool = True,
    nonempty: bool = True,
) -> torch.Tensor:
    """Validate ``t`` as argument ``name``; return it unchanged."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if floating and not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if t.dim() not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimensions, got shape {tuple(t.shape)}")
    if nonempty and t.numel() == 0:
        raise ValueError(f"{name} must not be empty, got shape {tuple(t.shape)}")
    if finite:
        check_finite(name, t)
    return t


def check_finite(name: str, t: torch.Tensor) -> None:
    """No NaN or inf in a floating tensor ``t`` (where :func:`value_checks` allows a read-back)."""
    if t.is_floating_point() and value_checks(t) and not all_finite(t):
        raise ValueError(f"{name} contains NaN or inf")


def check_same(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor, *, dtype: bool = True) -> None:
    """Same device (and dtype when ``dtype``) for two tensor arguments; the error says how to fix it."""
    if a.device != b.device:
        raise ValueError(
            f"{name_a} is on device {a.device} but {name_b} is on device {b.device}: move one to the "
            f"other's device, e.g. {name_a}.to({str(b.device)!r}) or {name_b}.to({str(a.device)!r})"
        )
    if dtype and a.dtype != b.dtype:
        raise TypeError(
            f"{name_a} has dtype {a.dtype} but {name_b} has dtype {b.dtype}: convert one to the "
            f"other's dtype, e.g. {name_a}.to({b.dtype}) or {name_b}.to({a.dtype})"
        )


def all_finite(t: torch.Tensor) -> bool:
    """No NaN or inf in ``t`` (reads one value back: call only where :func:`value_checks` allows).
    Any NaN or inf makes the sum non-finite, so one reduction decides the common case; a
    non-finite sum of finite values (overflow) is re-checked exactly."""
    t = t.detach()  # no autograd node for the check
    return math.isfinite(t.sum().item()) or bool(torch.isfinite(t).all())


def in_range(idx: torch.Tensor, hi: int) -> bool:
    """All integer values of ``idx`` in [0, hi) (reads two values back, as :func:`all_finite`)."""
    if idx.numel() == 0:
        return True
    lo, top = torch.aminmax(idx.detach())
    return bool(lo.item() >= 0 and top.item() < hi)


def check_std(std: object, z: torch.Tensor, *, values: bool = True) -> torch.Tensor:
    """Per-latent scales (d,) for latents z (n, d), all > 0 (their values checked unless ``values`` is
    False: a backend that checks them itself).

    ``std``: None -> ``z.std(0, correction=0) + 1e-6`` (differentiable in z, zero gradient for a
    constant column); a number (int or float) or a 0-d tensor -> broadcast to (d,); a (d,) tensor
    as given. Tensors must be on z's device (their dtype is the caller's rule,
    :mod:`qkernels._precision`); gradients flow back through them.
    """
    d = z.shape[1]
    if std is None:
        return population_std(z) + 1e-6
    if isinstance(std, torch.Tensor):
        check_tensor("std", std, ndim=(0, 1), finite=values)
        check_same("std", std, "z", z, dtype=False)
        check_std_shape(std.shape, d)
        if values and value_checks(std) and not bool((std > 0).all()):
            raise ValueError("std must be > 0 everywhere (a zero scale collapses its latent)")
        return std.expand(d).contiguous() if std.dim() == 0 else std
    if isinstance(std, bool) or not isinstance(std, (int, float)):
        raise TypeError(f"std must be None, a number or a tensor (a scalar or (d,)), got {type(std).__name__}")
    return torch.full((d,), check_std_number(std), dtype=z.dtype, device=z.device)
