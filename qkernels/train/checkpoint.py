"""Checkpoints that are safe to share: atomic writes, and loads that never execute code.

A checkpoint holds only tensors, numbers, strings, ``None``, lists, tuples and dicts (a ``state_dict``, an
optimizer ``state_dict``, RNG states as uint8 tensors, the config as a dict): :func:`save_atomic` refuses
anything else, and :func:`load` reads with ``torch.load(..., weights_only=True)``, which refuses a pickled
object (a run directory from someone else cannot run code) with a one-line :class:`UnsafeCheckpointError`
naming the file. Writes go to ``<path>.tmp`` then ``os.replace`` so a killed run never leaves a torn file.
"""

from __future__ import annotations

import os
import pickle
import re
from collections import OrderedDict
from pathlib import Path

import torch

# what weights_only=True unpickles (torch.serialization's allow-list, less what checkpoints never need)
_LEAVES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


class UnsafeCheckpointError(ValueError):
    """A checkpoint that holds more than tensors, numbers, strings, lists and dicts (refused, never unpickled)."""


def check_safe(obj, where: str = "checkpoint") -> None:
    """Raise ``TypeError`` naming the first value of ``obj`` that ``torch.load(weights_only=True)`` would refuse."""
    if isinstance(obj, torch.Tensor):
        if type(obj) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(f"{where}: a {type(obj).__qualname__} (tensor subclass) cannot be stored in a checkpoint")
        return
    if type(obj) in _LEAVES:
        return
    if type(obj) in (dict, OrderedDict):
        for k, v in obj.items():
            if not isinstance(k, (str, int, float, bool, type(None))):
                raise TypeError(f"{where}: key {k!r} of type {type(k).__qualname__} cannot be stored in a checkpoint")
            check_safe(v, f"{where}[{k!r}]")
        return
    if type(obj) in (list, tuple):
        for i, v in enumerate(obj):
            check_safe(v, f"{where}[{i}]")
        return
    raise TypeError(
        f"{where}: a {type(obj).__module__}.{type(obj).__qualname__} cannot be stored in a checkpoint "
        "(only tensors, numbers, strings, None, lists, tuples and dicts; it must load with "
        "torch.load(weights_only=True))"
    )


def save_atomic(obj, path: str | Path) -> None:
    """Write ``obj`` (checked by :func:`check_safe`) to ``path`` atomically."""
    path = Path(path)
    check_safe(obj, path.name)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_text_atomic(text: str, path: str | Path) -> None:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load(path: str | Path, map_location="cpu"):
    """Read a checkpoint with ``torch.load(..., weights_only=True)``.

    Raises :class:`UnsafeCheckpointError` (a ``ValueError``; one line naming the file and the refused object)
    when the file holds a pickled object other than tensors, numbers, strings, lists and dicts: such a file is
    never unpickled, so it cannot run code.
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        # torch names the refused object in one of its (multi-line) message's lines: keep just its name
        found = re.search(r"(?:unsupported GLOBAL|Unsupported global: GLOBAL) ([\w.]+)", str(err))
        what = f" ({found.group(1)})" if found else ""
        raise UnsafeCheckpointError(
            f"{path}: refused to load: it holds a pickled Python object{what}, not only tensors, numbers, strings, "
            "lists and dicts; qkernels loads checkpoints with torch.load(weights_only=True) so that a shared run "
            "directory cannot run code (load it yourself with weights_only=False only if you trust its author)"
        ) from None
