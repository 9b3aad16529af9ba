"""Atomic checkpoints: write ``<path>.tmp`` then ``os.replace`` so a killed run never leaves a torn file."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def save_atomic(obj, path: str | Path) -> None:
    path = Path(path)
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
    return torch.load(path, map_location=map_location, weights_only=False)
