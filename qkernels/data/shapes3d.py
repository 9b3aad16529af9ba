"""Shapes3D (``3dshapes.h5``): lazily read HDF5, one handle per process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from qkernels._extras import needs
from qkernels.data._files import (
    DatasetFormatError,
    grid_from_labels,
    h5_rows,
    read_sorted,
    uint8_hwc_to_float_chw,
)
from qkernels.data.base import GroundTruthDataset

if TYPE_CHECKING:
    import h5py

SHAPES3D_FILE = "3dshapes.h5"
SHAPES3D_URL = "https://storage.googleapis.com/3d-shapes/3dshapes.h5 (github.com/deepmind/3d-shapes)"
SHAPES3D_FACTORS = ("floor_hue", "wall_hue", "object_hue", "scale", "shape", "orientation")


def _h5py():
    with needs("qkernels.data.Shapes3D", "data"):
        import h5py

    return h5py


class Shapes3D(GroundTruthDataset):
    """Shapes3D from ``path`` (an ``.h5`` with ``images`` (N, 64, 64, 3) uint8 and ``labels``
    (N, 6) float factor values). The full file has sizes (10, 10, 10, 8, 4, 15); any complete
    row-major sub-grid works too.

    Only ``labels`` is read at construction (to derive and verify the grid); images are read per
    batch. The h5py handle is opened on first read and reopened after pickling or in a forked
    DataLoader worker. ``factor_values[k]``: the sorted label values of factor k.
    ``dataset[i]`` -> (image float32 (3, H, W) in [0, 1], factors int64 (6,)).

    Examples:
        A 2-image sub-grid file (two floor hues) in a temporary folder:

        >>> import tempfile, h5py, numpy as np
        >>> from qkernels.data import Shapes3D
        >>> path = tempfile.mkdtemp() + "/3dshapes.h5"
        >>> with h5py.File(path, "w") as f:
        ...     _ = f.create_dataset("images", data=np.zeros((2, 4, 4, 3), np.uint8))
        ...     _ = f.create_dataset("labels", data=[[0.0, 0, 0, 1, 0, 0], [0.5, 0, 0, 1, 0, 0]])
        >>> ds = Shapes3D(path)
        >>> ds.factor_sizes, ds.factor_values[0].tolist(), ds[1][1]
        ((2, 1, 1, 1, 1, 1), [0.0, 0.5], tensor([1, 0, 0, 0, 0, 0]))
    """

    def __init__(self, path: str | os.PathLike, *, seed: int = 0):
        self.path = Path(path)
        try:
            with _h5py().File(self.path, "r") as f:
                for key in ("images", "labels"):
                    if key not in f:
                        raise DatasetFormatError(f"{self.path}: missing dataset {key!r} (has {sorted(f.keys())})")
                images, labels = f["images"], f["labels"][()]
                img_shape, img_dtype = images.shape, images.dtype
        except OSError as err:
            raise DatasetFormatError(f"{self.path}: not a readable HDF5 file ({err})") from None
        if len(img_shape) != 4 or img_shape[3] != 3 or img_dtype != np.uint8:
            raise DatasetFormatError(f"{self.path}: images must be (N, H, W, 3) uint8, got {img_shape} {img_dtype}")
        if img_shape[0] != labels.shape[0]:
            raise DatasetFormatError(f"{self.path}: {img_shape[0]} images but {labels.shape[0]} label rows")
        sizes, self.factor_values = grid_from_labels(labels, self.path, SHAPES3D_FACTORS)
        self._set_factors(SHAPES3D_FACTORS, sizes, seed)
        self.observation_shape = (3, int(img_shape[1]), int(img_shape[2]))
        self._h5: h5py.File | None = None
        self._pid = -1

    def _images(self):
        if self._h5 is None or self._pid != os.getpid():
            self._h5 = _h5py().File(self.path, "r")
            self._pid = os.getpid()
        return self._h5["images"]

    def _observations(self, factors: torch.Tensor) -> torch.Tensor:
        idx = (factors @ self._bases).numpy()
        images = self._images()
        raw = read_sorted(lambda u: h5_rows(images, u), idx)
        return torch.from_numpy(uint8_hwc_to_float_chw(raw))

    def close(self) -> None:
        """Close the HDF5 handle (it is reopened on the next read)."""
        if self._h5 is not None:
            if self._pid == os.getpid():
                self._h5.close()
            self._h5 = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_h5"], state["_pid"] = None, -1
        return state
