"""Falcor3D and Isaac3D (NVlabs high-res disentanglement datasets, 128 x 128 releases):
a folder ``images/{idx:06d}.png`` plus an ``.npy`` label file of factor values."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from qkernels.data._files import DatasetFormatError, grid_from_labels
from qkernels.data.base import GroundTruthDataset

NVLABS_URL = "https://github.com/NVlabs/High-res-disentanglement-datasets"
FALCOR3D_FOLDER, FALCOR3D_LABELS = "Falcor3D_down128", "train-rec.labels"
ISAAC3D_FOLDER, ISAAC3D_LABELS = "Isaac3D_down128", "labels.npy"
FALCOR3D_FACTORS = ("lighting_intensity", "lighting_x", "lighting_y", "lighting_z",
                    "camera_x", "camera_y", "camera_z")
ISAAC3D_FACTORS = ("object_shape", "robot_x", "robot_y", "camera_height", "object_scale",
                   "lighting_intensity", "lighting_direction", "object_color", "wall_color")


class NVLabs3D(GroundTruthDataset):
    """A folder ``<folder>/images/{idx:06d}.png`` (RGB, index == row-major flat factor index)
    and a label file (an ``.npy``, whatever its suffix) of shape (N, n_factors) factor values.

    Images are decoded per batch and resized to ``image_size`` (default 64; None keeps the stored
    size) with PIL's bicubic filter, which antialiases when downscaling; the uint8 result is
    already clipped to [0, 255], hence [0, 1] after scaling. ``factor_values[k]``: sorted values.
    """

    def __init__(self, folder: str | os.PathLike, labels_file: str, factor_names: Sequence[str],
                 *, image_size: int | None = 64, seed: int = 0):
        self.folder = Path(folder)
        self.labels_path = self.folder / labels_file
        if image_size is not None and (isinstance(image_size, bool)
                                       or not isinstance(image_size, int) or image_size < 1):
            raise ValueError(f"image_size must be a positive int or None, got {image_size!r}")
        try:
            labels = np.load(self.labels_path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise DatasetFormatError(f"{self.labels_path}: not a readable .npy ({err})") from None
        sizes, self.factor_values = grid_from_labels(labels, self.labels_path, factor_names)
        self._set_factors(factor_names, sizes, seed)
        n = labels.shape[0]
        for i in (0, n - 1):  # cheap completeness check; every read checks its own files
            if not self._png(i).is_file():
                raise DatasetFormatError(
                    f"{self._png(i)}: missing, but {self.labels_path} has {n} rows"
                )
        with Image.open(self._png(0)) as im:
            self.stored_size = im.size
        side = image_size or self.stored_size[0]
        self.image_size = image_size
        self.observation_shape = (3, side, side)

    def _png(self, i: int) -> Path:
        return self.folder / "images" / f"{i:06d}.png"

    def _load(self, i: int) -> np.ndarray:
        path = self._png(i)
        try:
            with Image.open(path) as im:
                if im.size != self.stored_size:
                    raise DatasetFormatError(
                        f"{path}: size {im.size}, expected {self.stored_size} like image 000000"
                    )
                im = im.convert("RGB")
                if self.image_size is not None and im.size != (self.image_size,) * 2:
                    im = im.resize((self.image_size, self.image_size), Image.Resampling.BICUBIC)
                return np.asarray(im)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: image file missing") from None

    def _observations(self, factors: torch.Tensor) -> torch.Tensor:
        idx = (factors @ self._bases).tolist()
        cache: dict[int, np.ndarray] = {}
        raw = np.stack([cache[i] if i in cache else cache.setdefault(i, self._load(i))
                        for i in idx])
        x = torch.from_numpy(raw).permute(0, 3, 1, 2).to(torch.float32) / 255.0
        return x.contiguous()


def falcor3d(root: str | os.PathLike, **kw) -> NVLabs3D:
    """Falcor3D: ``<root>/images/*.png`` + ``<root>/train-rec.labels``; sizes (5, 6, ..., 6)."""
    return NVLabs3D(root, FALCOR3D_LABELS, FALCOR3D_FACTORS, **kw)


def isaac3d(root: str | os.PathLike, **kw) -> NVLabs3D:
    """Isaac3D: ``<root>/images/*.png`` + ``<root>/labels.npy``; sizes (3, 8, 5, 4, 4, 4, 6, 4, 4).
    """
    return NVLabs3D(root, ISAAC3D_LABELS, ISAAC3D_FACTORS, **kw)
