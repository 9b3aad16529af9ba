"""MPI3D (npz key ``images``); variant inferred from N; optional memory-mapped ``.npy``."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from qkernels.data._files import DatasetFormatError, load_npz_array, uint8_hwc_to_float_chw
from qkernels.data.base import GroundTruthDataset

MPI3D_URL = "https://github.com/rr-learning/disentanglement_dataset"
MPI3D_FACTORS = (
    "object_color",
    "object_shape",
    "object_size",
    "camera_height",
    "background_color",
    "horizontal_axis",
    "vertical_axis",
)
#: file name per variant; "complex" is the "MPI3D" of the QLAE / Tripod / FactorQVAE papers.
MPI3D_FILES = {
    "toy": "mpi3d_toy.npz",
    "realistic": "mpi3d_realistic.npz",
    "real": "mpi3d_real.npz",
    "complex": "real3d_complicated_shapes_ordered.npz",
}
MPI3D_SIZES = {
    1_036_800: (6, 6, 2, 3, 3, 40, 40),  # toy / realistic / real
    460_800: (4, 4, 2, 3, 3, 40, 40),  # complex
}


def mpi3d_sizes(n: int) -> tuple[int, ...]:
    """Factor sizes of the MPI3D variant with ``n`` images (ValueError for an unknown N)."""
    if n not in MPI3D_SIZES:
        known = ", ".join(f"{k} -> {v}" for k, v in MPI3D_SIZES.items())
        raise ValueError(f"no MPI3D variant has N={n} images (known: {known})")
    return MPI3D_SIZES[n]


class MPI3D(GroundTruthDataset):
    """MPI3D from ``path`` (npz with ``images`` (N, 64, 64, 3) uint8; row-major, no labels).

    The factor sizes are inferred from N (1,036,800 -> toy/realistic/real, 460,800 -> complex);
    pass ``factor_sizes`` (7 ints) for a sub-grid file, which must then match N exactly.
    If ``<stem>.images.npy`` exists beside the npz (see :func:`qkernels.data.convert_npz_to_npy`)
    it is memory-mapped; otherwise the npz member is read into memory (12.7 GB for a full file).
    ``dataset[i]`` -> (image float32 (3, 64, 64) in [0, 1], factors int64 (7,)).

    Examples:
        A 2-image sub-grid file in a temporary folder:

        >>> import torch
        >>> import tempfile, numpy as np
        >>> from qkernels.data import MPI3D
        >>> path = tempfile.mkdtemp() + "/mpi3d_toy.npz"
        >>> np.savez(path, images=np.full((2, 4, 4, 3), 255, np.uint8))
        >>> ds = MPI3D(path, factor_sizes=(1, 1, 1, 1, 1, 1, 2))
        >>> len(ds), ds[1][0].shape, float(ds[1][0].max()), ds[1][1]
        (2, torch.Size([3, 4, 4]), 1.0, tensor([0, 0, 0, 0, 0, 0, 1]))
    """

    def __init__(self, path: str | os.PathLike, *, factor_sizes: Sequence[int] | None = None, seed: int = 0):
        self.path = Path(path)
        try:
            images = load_npz_array(self.path, "images")
        except (OSError, ValueError) as err:
            if isinstance(err, DatasetFormatError):
                raise
            raise DatasetFormatError(f"{self.path}: not a readable npz ({err})") from None
        if images.ndim != 4 or images.shape[3] != 3 or images.dtype != np.uint8:
            raise DatasetFormatError(
                f"{self.path}: images must be (N, H, W, 3) uint8, got {images.shape} {images.dtype}"
            )
        n = images.shape[0]
        if factor_sizes is None:
            try:
                sizes = mpi3d_sizes(n)
            except ValueError as err:
                raise DatasetFormatError(f"{self.path}: {err}; pass factor_sizes=... for a sub-grid file") from None
        else:
            sizes = tuple(factor_sizes)
            if len(sizes) != len(MPI3D_FACTORS):
                raise ValueError(f"factor_sizes must have {len(MPI3D_FACTORS)} entries, got {sizes}")
            if int(np.prod(sizes)) != n:
                raise DatasetFormatError(
                    f"{self.path}: {n} images but factor_sizes {list(sizes)} give {int(np.prod(sizes))}"
                )
        self._set_factors(MPI3D_FACTORS, sizes, seed)
        self.variant = (
            "complex" if sizes[0] == 4 and n == 460_800 else ("toy/realistic/real" if n == 1_036_800 else "subgrid")
        )
        self.observation_shape = (3, int(images.shape[1]), int(images.shape[2]))
        self._images_array: np.ndarray | None = images

    def _observations(self, factors: torch.Tensor) -> torch.Tensor:
        if self._images_array is None:  # after unpickling: re-map / re-read instead of copying
            self._images_array = load_npz_array(self.path, "images")
        idx = (factors @ self._bases).numpy()
        return torch.from_numpy(uint8_hwc_to_float_chw(self._images_array[idx]))

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_images_array"] = None
        return state
