"""Datasets with ground-truth factors: loaders for the standard benchmark files and procedural
stand-ins that need no download.

``load_dataset(name, root=None, **kw)``:

==================== ============================================= ===========================
name                 source                                        class
==================== ============================================= ===========================
shapes3d             ``<root>/3dshapes.h5``                        :class:`Shapes3D`
dsprites             ``<root>/dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz``  :class:`DSprites`
mpi3d                ``<root>/<variant file>`` (``variant=``)      :class:`MPI3D`
falcor3d             ``<root>/Falcor3D_down128/``                  :class:`NVLabs3D`
isaac3d              ``<root>/Isaac3D_down128/``                   :class:`NVLabs3D`
quantized_grid2d     procedural (``seed=``)                        :class:`QuantizedGrid2D`
balls                procedural                                    :class:`Balls`
sprites              procedural                                    :class:`Sprites`
shapes3d_procedural  procedural                                    :class:`Shapes3DProcedural`
==================== ============================================= ===========================

File datasets take ``root`` or ``$QKERNELS_DATA``; other keywords go to the class.

Constants (plain data, no docstrings of their own):

- ``FILE_DATASETS``: the names of the datasets read from files ("shapes3d", "dsprites", "mpi3d", "falcor3d",
  "isaac3d");
- ``PROCEDURAL_DATASETS``: the names of the procedural ones ("quantized_grid2d", "balls", "sprites",
  "shapes3d_procedural");
- ``DATASETS``: both, every name :func:`load_dataset` takes;
- ``ENV_VAR``: ``"QKERNELS_DATA"``, the environment variable naming the data folder when ``root`` is None.
"""

from __future__ import annotations

import os
from pathlib import Path

from qkernels.data._files import (
    ENV_VAR,
    DatasetFormatError,
    DataSource,
    convert_npz_to_npy,
    converted_path,
    require,
    resolve_root,
)
from qkernels.data.balls import Balls
from qkernels.data.base import GroundTruthDataset
from qkernels.data.contact_sheet import contact_sheet
from qkernels.data.dsprites import DSPRITES_FILE, DSPRITES_URL, DSprites
from qkernels.data.grid2d import QuantizedGrid2D
from qkernels.data.mpi3d import MPI3D, MPI3D_FILES, MPI3D_SIZES, MPI3D_URL
from qkernels.data.nvlabs import (
    FALCOR3D_FOLDER,
    FALCOR3D_LABELS,
    ISAAC3D_FOLDER,
    ISAAC3D_LABELS,
    NVLABS_URL,
    NVLabs3D,
    falcor3d,
    isaac3d,
)
from qkernels.data.shapes3d import SHAPES3D_FILE, SHAPES3D_URL, Shapes3D
from qkernels.data.shapes3d_procedural import Shapes3DProcedural
from qkernels.data.sprites import Sprites

FILE_DATASETS = ("shapes3d", "dsprites", "mpi3d", "falcor3d", "isaac3d")
PROCEDURAL_DATASETS = ("quantized_grid2d", "balls", "sprites", "shapes3d_procedural")
DATASETS = FILE_DATASETS + PROCEDURAL_DATASETS

_PROCEDURAL = {
    "quantized_grid2d": QuantizedGrid2D,
    "balls": Balls,
    "sprites": Sprites,
    "shapes3d_procedural": Shapes3DProcedural,
}


def _nvlabs_source(name: str, folder: str, labels: str) -> DataSource:
    return DataSource(name, f"the folder {folder} (holding images/000000.png... and {labels})", NVLABS_URL)


def _mpi3d_source(variant: str) -> DataSource:
    file = MPI3D_FILES[variant]
    converted = converted_path(Path(file), "images").name
    return DataSource(
        "mpi3d", f"the file {file} (variant={variant!r}; or its memory-mappable conversion {converted})", MPI3D_URL
    )


#: what each file dataset reads and where it is published (mpi3d: per variant, _mpi3d_source).
_SOURCES = {
    "shapes3d": DataSource("shapes3d", f"the file {SHAPES3D_FILE}", SHAPES3D_URL, standin="shapes3d_procedural"),
    "dsprites": DataSource("dsprites", f"the file {DSPRITES_FILE}", DSPRITES_URL, standin="sprites"),
    "falcor3d": _nvlabs_source("falcor3d", FALCOR3D_FOLDER, FALCOR3D_LABELS),
    "isaac3d": _nvlabs_source("isaac3d", ISAAC3D_FOLDER, ISAAC3D_LABELS),
}


def load_dataset(name: str, root: str | os.PathLike | None = None, **kw):
    """Dataset ``name`` (see the module table); ``root`` (or ``$QKERNELS_DATA``) for file datasets.

    Missing data (no data folder, or no file in it) raises FileNotFoundError saying which file
    or folder is expected, the path looked at, how to give the data folder, where the data is
    published and the procedural stand-in if there is one; a malformed file raises
    :class:`DatasetFormatError` naming file and mismatch. An unknown name, or ``root`` for a procedural
    dataset, raises ValueError.

    Examples:
        >>> import torch
        >>> from qkernels.data import Balls, load_dataset
        >>> ds = load_dataset("balls", n=8, image_size=16)  # procedural: no files
        >>> isinstance(ds, Balls), len(ds), ds[0][0].shape
        (True, 8, torch.Size([3, 16, 16]))
        >>> load_dataset("cifar10")
        Traceback (most recent call last):
            ...
        ValueError: unknown dataset 'cifar10'; known: shapes3d, dsprites, mpi3d, ...
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if name in _PROCEDURAL:
        if root is not None:
            raise ValueError(f"{name} is procedural and reads no files; got root={root!r}")
        return _PROCEDURAL[name](**kw)
    if name not in FILE_DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    if name == "mpi3d":
        return _load_mpi3d(root, **kw)
    source = _SOURCES[name]
    base = resolve_root(root, source)
    if name == "shapes3d":
        return Shapes3D(require(base / SHAPES3D_FILE, source), **kw)
    if name == "dsprites":
        return DSprites(require(base / DSPRITES_FILE, source), **kw)
    folder_name, labels, make = (
        (FALCOR3D_FOLDER, FALCOR3D_LABELS, falcor3d)
        if name == "falcor3d"
        else (ISAAC3D_FOLDER, ISAAC3D_LABELS, isaac3d)
    )
    folder = require(base / folder_name, source, folder=True)
    require(folder / labels, source)
    return make(folder, **kw)


def _load_mpi3d(root: str | os.PathLike | None, *, variant: str = "complex", **kw) -> MPI3D:
    if variant not in MPI3D_FILES:
        raise ValueError(f"variant must be one of {tuple(MPI3D_FILES)}, got {variant!r}")
    source = _mpi3d_source(variant)
    path = resolve_root(root, source) / MPI3D_FILES[variant]
    if not converted_path(path, "images").is_file():
        require(path, source)
    ds = MPI3D(path, **kw)
    if kw.get("factor_sizes") is None:
        want = MPI3D_SIZES[460_800 if variant == "complex" else 1_036_800]
        if ds.factor_sizes != want:
            raise DatasetFormatError(
                f"{path}: has {len(ds)} images, the size of another MPI3D variant than "
                f"{variant!r} (expected sizes {list(want)})"
            )
    return ds


__all__ = [
    "DATASETS",
    "ENV_VAR",
    "FILE_DATASETS",
    "PROCEDURAL_DATASETS",
    "Balls",
    "DSprites",
    "DatasetFormatError",
    "GroundTruthDataset",
    "MPI3D",
    "NVLabs3D",
    "QuantizedGrid2D",
    "Shapes3D",
    "Shapes3DProcedural",
    "Sprites",
    "contact_sheet",
    "convert_npz_to_npy",
    "falcor3d",
    "isaac3d",
    "load_dataset",
]
