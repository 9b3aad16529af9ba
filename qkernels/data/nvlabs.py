"""Falcor3D and Isaac3D (NVlabs high-res disentanglement datasets, 128 x 128 releases):
a folder ``images/{idx:06d}.png`` plus an ``.npy`` label file of factor values."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from qkernels.data._files import DatasetFormatError, grid_from_labels, pil_image
from qkernels.data.base import GroundTruthDataset

NVLABS_URL = "https://github.com/NVlabs/High-res-disentanglement-datasets"
FALCOR3D_FOLDER, FALCOR3D_LABELS = "Falcor3D_down128", "train-rec.labels"
ISAAC3D_FOLDER, ISAAC3D_LABELS = "Isaac3D_down128", "labels.npy"
FALCOR3D_FACTORS = ("lighting_intensity", "lighting_x", "lighting_y", "lighting_z", "camera_x", "camera_y", "camera_z")
ISAAC3D_FACTORS = (
    "object_shape",
    "robot_x",
    "robot_y",
    "camera_height",
    "object_scale",
    "lighting_intensity",
    "lighting_direction",
    "object_color",
    "wall_color",
)


class NVLabs3D(GroundTruthDataset):
    """A folder ``<folder>/images/{idx:06d}.png`` (RGB, index == row-major flat factor index)
    and a label file (an ``.npy``, whatever its suffix) of shape (N, n_factors) factor values.

    Images are decoded per batch and resized to ``image_size`` (default 64; None keeps the stored
    size) with PIL's bicubic filter, which antialiases when downscaling; the uint8 result is
    already clipped to [0, 255], hence [0, 1] after scaling. ``factor_values[k]``: sorted values.

    Examples:
        Two 8x8 images with one two-valued factor, in a temporary folder:

        >>> import torch
        >>> import os, tempfile, numpy as np
        >>> from PIL import Image
        >>> from qkernels.data import NVLabs3D
        >>> root = tempfile.mkdtemp()
        >>> os.mkdir(root + "/images")
        >>> for i in range(2):
        ...     Image.fromarray(np.full((8, 8, 3), 255 * i, np.uint8)).save(f"{root}/images/{i:06d}.png")
        >>> np.save(root + "/labels.npy", np.array([[0.0], [1.0]]))
        >>> ds = NVLabs3D(root, "labels.npy", ("brightness",), image_size=4)
        >>> len(ds), ds[1][0].shape, float(ds[1][0].min()), ds[1][1]
        (2, torch.Size([3, 4, 4]), 1.0, tensor([1]))
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        labels_file: str,
        factor_names: Sequence[str],
        *,
        image_size: int | None = 64,
        seed: int = 0,
    ):
        self.folder = Path(folder)
        self.labels_path = self.folder / labels_file
        if image_size is not None and (
            isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1
        ):
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
                raise DatasetFormatError(f"{self._png(i)}: missing, but {self.labels_path} has {n} rows")
        with pil_image("qkernels.data.NVLabs3D").open(self._png(0)) as im:
            self.stored_size = im.size
        side = image_size or self.stored_size[0]
        self.image_size = image_size
        self.observation_shape = (3, side, side)

    def _png(self, i: int) -> Path:
        return self.folder / "images" / f"{i:06d}.png"

    def _load(self, i: int) -> np.ndarray:
        path, Image = self._png(i), pil_image("qkernels.data.NVLabs3D")
        try:
            with Image.open(path) as im:
                if im.size != self.stored_size:
                    raise DatasetFormatError(f"{path}: size {im.size}, expected {self.stored_size} like image 000000")
                im = im.convert("RGB")
                if self.image_size is not None and im.size != (self.image_size,) * 2:
                    im = im.resize((self.image_size, self.image_size), Image.Resampling.BICUBIC)
                return np.asarray(im)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path}: image file missing") from None

    def _observations(self, factors: torch.Tensor) -> torch.Tensor:
        idx = (factors @ self._bases).tolist()
        cache: dict[int, np.ndarray] = {}
        raw = np.stack([cache[i] if i in cache else cache.setdefault(i, self._load(i)) for i in idx])
        x = torch.from_numpy(raw).permute(0, 3, 1, 2).to(torch.float32) / 255.0
        return x.contiguous()


def falcor3d(root: str | os.PathLike, **kw) -> NVLabs3D:
    """Falcor3D: ``<root>/images/*.png`` + ``<root>/train-rec.labels``; sizes (5, 6, ..., 6).

    ``kw`` go to :class:`NVLabs3D`; the 7 factors are lighting intensity, lighting x / y / z and camera x / y / z.

    Examples:
        A 2-image sub-grid (two lighting intensities) in a temporary folder:

        >>> import torch
        >>> import os, tempfile, numpy as np
        >>> from PIL import Image
        >>> from qkernels.data import falcor3d
        >>> root = tempfile.mkdtemp()
        >>> os.mkdir(root + "/images")
        >>> for i in range(2):
        ...     Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(f"{root}/images/{i:06d}.png")
        >>> with open(root + "/train-rec.labels", "wb") as f:  # an .npy under another name
        ...     np.save(f, np.array([[0.0] * 7, [1.0] + [0.0] * 6]))
        >>> ds = falcor3d(root, image_size=4)
        >>> ds.factor_names[0], ds.factor_sizes, ds[0][0].shape
        ('lighting_intensity', (2, 1, 1, 1, 1, 1, 1), torch.Size([3, 4, 4]))
    """
    return NVLabs3D(root, FALCOR3D_LABELS, FALCOR3D_FACTORS, **kw)


def isaac3d(root: str | os.PathLike, **kw) -> NVLabs3D:
    """Isaac3D: ``<root>/images/*.png`` + ``<root>/labels.npy``; sizes (3, 8, 5, 4, 4, 4, 6, 4, 4).

    ``kw`` go to :class:`NVLabs3D`; the 9 factors are object shape, robot x / y, camera height, object scale,
    lighting intensity and direction, object and wall color.

    Examples:
        A 2-image sub-grid (two wall colors) in a temporary folder:

        >>> import torch
        >>> import os, tempfile, numpy as np
        >>> from PIL import Image
        >>> from qkernels.data import isaac3d
        >>> root = tempfile.mkdtemp()
        >>> os.mkdir(root + "/images")
        >>> for i in range(2):
        ...     Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(f"{root}/images/{i:06d}.png")
        >>> np.save(root + "/labels.npy", np.array([[0.0] * 9, [0.0] * 8 + [1.0]]))
        >>> ds = isaac3d(root, image_size=None)  # keep the stored 8x8
        >>> ds.factor_names[-1], ds.factor_sizes[-1], ds[1][0].shape
        ('wall_color', 2, torch.Size([3, 8, 8]))
    """
    return NVLabs3D(root, ISAAC3D_LABELS, ISAAC3D_FACTORS, **kw)
