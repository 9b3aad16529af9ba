"""dSprites (``dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz``) without unpickling by default."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from qkernels.data._files import DatasetFormatError, grid_from_labels, load_npz_array
from qkernels.data.base import GroundTruthDataset

DSPRITES_FILE = "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz"
DSPRITES_URL = "https://github.com/deepmind/dsprites-dataset"
DSPRITES_FACTORS = ("color", "shape", "scale", "orientation", "pos_x", "pos_y")


class DSprites(GroundTruthDataset):
    """dSprites from ``path``: npz with ``imgs`` (N, 64, 64) uint8 0/1, ``latents_classes`` (N, 6)
    and ``latents_values`` (N, 6). Full sizes (1, 3, 6, 40, 32, 32); sub-grids work too.

    Classes come from ``latents_classes`` (sorted unique per column), verified to form a complete
    row-major grid, and ``latents_values`` must be constant within each class
    (``factor_values[k]``: the value of each class). ``keep_color=False`` drops the constant
    color factor (it does not change the flat index). The pickled ``metadata`` member is read only
    when ``trust_pickle=True`` (then ``self.metadata`` holds it; otherwise it is None): unpickling
    a file can run arbitrary code. ``imgs`` is memory-mapped if converted with
    :func:`qkernels.data.convert_npz_to_npy` (``key="imgs"``), else held in memory (3 GB full).

    Raises:
        DatasetFormatError: missing arrays, or classes that do not form a complete row-major grid.

    Examples:
        A 2-image sub-grid (two x positions) in a temporary folder:

        >>> import torch
        >>> import tempfile, numpy as np
        >>> from qkernels.data import DSprites
        >>> path = tempfile.mkdtemp() + "/dsprites.npz"
        >>> classes = np.array([[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0]])  # color shape scale orient. x y
        >>> np.savez(path, imgs=np.ones((2, 4, 4), np.uint8), latents_classes=classes,
        ...          latents_values=classes.astype(float))
        >>> ds = DSprites(path)  # drops the constant color factor
        >>> ds.factor_sizes, ds[1][0].shape, ds[1][1]
        ((1, 1, 1, 2, 1), torch.Size([1, 4, 4]), tensor([0, 0, 0, 1, 0]))
    """

    def __init__(self, path: str | os.PathLike, *, keep_color: bool = False, trust_pickle: bool = False, seed: int = 0):
        self.path = Path(path)
        if not isinstance(keep_color, bool) or not isinstance(trust_pickle, bool):
            raise TypeError("keep_color and trust_pickle must be bools")
        try:
            with np.load(self.path, allow_pickle=False) as z:
                missing = {"imgs", "latents_classes", "latents_values"} - set(z.files)
                if missing:
                    raise DatasetFormatError(f"{self.path}: missing array(s) {sorted(missing)} (has {sorted(z.files)})")
                classes, values = z["latents_classes"], z["latents_values"]
        except (OSError, ValueError) as err:
            if isinstance(err, DatasetFormatError):
                raise
            raise DatasetFormatError(f"{self.path}: not a readable npz ({err})") from None
        imgs = load_npz_array(self.path, "imgs")
        if imgs.ndim != 3 or imgs.dtype != np.uint8:
            raise DatasetFormatError(f"{self.path}: imgs must be (N, H, W) uint8, got {imgs.shape} {imgs.dtype}")
        if classes.dtype.kind not in "iu":
            raise DatasetFormatError(f"{self.path}: latents_classes must be integer, got {classes.dtype}")
        n = imgs.shape[0]
        for key, a in (("latents_classes", classes), ("latents_values", values)):
            if a.shape != (n, len(DSPRITES_FACTORS)):
                raise DatasetFormatError(
                    f"{self.path}: {key} must have shape ({n}, {len(DSPRITES_FACTORS)}) to match imgs, got {a.shape}"
                )
        sizes, class_ids = grid_from_labels(classes, self.path, DSPRITES_FACTORS)
        factor_values = []
        for k, name in enumerate(DSPRITES_FACTORS):
            cls = np.searchsorted(class_ids[k], classes[:, k])
            per_class = np.full(sizes[k], np.nan)
            per_class[cls] = values[:, k]
            if not np.allclose(per_class[cls], values[:, k], rtol=0, atol=1e-6):
                raise DatasetFormatError(
                    f"{self.path}: latents_values of {name} differ within one class of latents_classes"
                )
            factor_values.append(per_class)
        if not keep_color and sizes[0] != 1:
            raise ValueError(f"{self.path}: color has {sizes[0]} classes; pass keep_color=True to keep it")
        keep = [k for k in range(6) if keep_color or k != 0]
        self._set_factors([DSPRITES_FACTORS[k] for k in keep], [sizes[k] for k in keep], seed)
        self.factor_values = [factor_values[k] for k in keep]
        self.keep_color = keep_color
        self.observation_shape = (1, int(imgs.shape[1]), int(imgs.shape[2]))
        self._imgs: np.ndarray | None = imgs
        self.metadata = None
        if trust_pickle:
            with np.load(self.path, allow_pickle=True) as z:
                if "metadata" in z.files:
                    m = z["metadata"]
                    self.metadata = m.item() if m.dtype == object and m.ndim == 0 else m

    def _observations(self, factors: torch.Tensor) -> torch.Tensor:
        if self._imgs is None:  # after unpickling: re-map / re-read instead of copying
            self._imgs = load_npz_array(self.path, "imgs")
        idx = (factors @ self._bases).numpy()
        x = np.asarray(self._imgs[idx], dtype=np.float32)
        return torch.from_numpy(x).unsqueeze(1)

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_imgs"] = None
        return state
