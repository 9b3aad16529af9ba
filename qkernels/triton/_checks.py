"""Argument checks of the ``*_triton`` ops (the raw ops; the functional API validates user input
first). A Triton kernel handed a wrong shape, a host pointer or an index out of range would read
out of bounds, so every op checks shapes, dtypes and devices here; index *values* are guarded in
the kernels (reading them on the host would synchronize with the device)."""

from __future__ import annotations

import torch


def fail(op: str, msg: str) -> None:
    raise ValueError(f"{op}: {msg}")


def floating(t: torch.Tensor, name: str, op: str) -> None:
    if t.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{op}: {name} must be float32 or float64, got {t.dtype}")


def like(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str, op: str) -> None:
    """``t`` on ``ref``'s device with ``ref``'s dtype."""
    if t.device != ref.device:
        fail(op, f"{name} is on {t.device} but {ref_name} is on {ref.device}")
    if t.dtype != ref.dtype:
        raise TypeError(f"{op}: {name} has dtype {t.dtype} but {ref_name} has dtype {ref.dtype}")


def index(t: torch.Tensor, name: str, ref: torch.Tensor, op: str) -> None:
    if t.dtype != torch.long:
        raise TypeError(f"{op}: {name} must be int64, got {t.dtype}")
    if t.device != ref.device:
        fail(op, f"{name} is on {t.device} but the data is on {ref.device}")


def scalar_grad(g: torch.Tensor, name: str, ref: torch.Tensor, op: str) -> None:
    if g.numel() != 1:
        fail(op, f"{name} must hold one element, got shape {tuple(g.shape)}")
    if g.device != ref.device:
        fail(op, f"{name} is on {g.device} but the data is on {ref.device}")


def matrix(t: torch.Tensor, name: str, op: str) -> None:
    """A non-empty 2-D floating tensor."""
    if t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1:
        fail(op, f"{name} must be a non-empty 2-D tensor, got shape {tuple(t.shape)}")
    floating(t, name, op)
