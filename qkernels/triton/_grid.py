"""Launch shapes of the Triton kernels: the GPU's SM count, read at run time (never an H100's hard-coded)."""

from __future__ import annotations

import functools

import torch

INTERPRETER_SMS = 132  # CPU tensors (the interpreter has no SMs): grids chosen as on an H100 / H200


@functools.cache
def _sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def min_programs(t: torch.Tensor) -> int:
    """Two programs per SM of the GPU holding ``t``: the grid a kernel's main launch should reach."""
    if t.device.type != "cuda":
        return 2 * INTERPRETER_SMS
    return 2 * _sms(t.device.index if t.device.index is not None else torch.cuda.current_device())


def rows_per_program(rows: int, columns: int, t: torch.Tensor, choices: tuple[int, ...]) -> int:
    """The largest row block of ``choices`` (descending) whose grid cdiv(rows, block) x columns reaches
    :func:`min_programs`; the smallest where none does."""
    need = min_programs(t)
    return next((b for b in choices if cdiv(rows, b) * columns >= need), choices[-1])


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the host-side launch code: ``triton.cdiv`` is a constexpr function in Triton >= 3.6, whose
    call unwraps its arguments (a few microseconds per call, ~10 per forward + backward)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of 2 >= n (n >= 1); ``triton.next_power_of_2`` without its constexpr wrapper."""
    return 1 << (n - 1).bit_length()
