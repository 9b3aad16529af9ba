"""Arrival tickets: a kernel's partial sums added in a fixed order by its last program, in the same launch.

A kernel whose programs each write a partial sum would need a second launch to add them. Instead, each program
stores its partials, then takes a ticket from its group's counter (:func:`last_to_arrive`: a barrier of its threads,
then an acquire-release atomic add at GPU scope by one of them); the program that draws the group's last ticket
reads every partial of the group and adds them in the order of their indices, not in the order the programs
arrived. Which program arrives last varies from run to run; what it adds, and in which order, does not: the results
are the same bits on every run.

The counters are int32 zeros between launches: the last program sets its group's counter back to 0. One buffer
serves each (device, stream), made (zero-filled: a launch, once) on first use; launches on one stream never
overlap, so two running kernels never share a counter. While a CUDA graph is being captured each launch gets a
zeroed buffer of its own (its zero fill is captured with it: the graph's replays may run on any stream). Under the
interpreter each thread has its own buffer. A launch that fails part-way drops its buffer, so that a counter left
above 0 is never used again.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import triton
import triton.language as tl

_BUFFERS: dict[tuple[object, ...], torch.Tensor] = {}
MIN_COUNTERS = 64  # a buffer's size at least: a new one is made only for a launch with more groups


@triton.jit
def last_to_arrive(counter_ptr, arrivals):
    """Whether this program takes the last of the ``arrivals`` tickets of the counter at ``counter_ptr`` (it then
    resets the counter to 0). Call it after storing this program's partials; read the other programs' partials
    with ``cache_modifier=".cg"`` (from L2, not from this SM's L1)."""
    tl.debug_barrier()  # every thread's partial stores happen before the ticket's release
    last = tl.atomic_add(counter_ptr, 1, sem="acq_rel", scope="gpu") == arrivals - 1
    if last:
        tl.atomic_xchg(counter_ptr, 0, sem="relaxed", scope="gpu")
    return last


def _key(device: torch.device) -> tuple[object, ...] | None:
    """The buffer's key: (device, stream) on CUDA, None while a CUDA graph is captured (a buffer per launch)."""
    if device.type != "cuda":
        return (device.type, threading.get_ident())
    if torch.cuda.is_current_stream_capturing():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return (device.type, index, torch._C._cuda_getCurrentRawStream(index))  # as Triton's launcher reads it


def launch(kernel: Any, grid: tuple[int, ...], groups: int, *args: Any, **constexprs: Any) -> None:
    """``kernel[grid](*args, counters, **constexprs)``: the counters, ``groups`` or more zeroed int32 on the device
    of ``args[0]``, are the kernel's last positional argument."""
    device = args[0].device
    key = _key(device)
    buf = None if key is None else _BUFFERS.get(key)
    if buf is None or buf.numel() < groups:
        with torch.inference_mode(False):
            buf = torch.zeros(max(groups, MIN_COUNTERS), dtype=torch.int32, device=device)
        if key is not None:
            _BUFFERS[key] = buf
    try:
        kernel[grid](*args, buf, **constexprs)
    except BaseException:
        if key is not None:  # it may have stopped between two programs: its counters may not be 0
            _BUFFERS.pop(key, None)
        raise
