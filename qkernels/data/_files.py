"""Helpers shared by the real-file loaders: locating files, checking that labels form a complete
row-major factor grid, sorted batched reads, and npz -> memory-mappable npy conversion."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from qkernels._extras import needs
from qkernels.data.base import row_major_bases

ENV_VAR = "QKERNELS_DATA"


class DatasetFormatError(ValueError):
    """A dataset file exists but is not in the expected format (names the file and the mismatch); a ValueError.

    Examples:
        >>> import tempfile, numpy as np
        >>> from qkernels.data import DatasetFormatError, DSprites
        >>> path = tempfile.mkdtemp() + "/not_dsprites.npz"
        >>> np.savez(path, x=np.zeros(2))
        >>> try:
        ...     DSprites(path)
        ... except DatasetFormatError as err:
        ...     print("missing array(s) ['imgs'" in str(err))
        True
    """


@dataclass(frozen=True)
class DataSource:
    """What a file dataset reads from the data folder and where it is published: everything a
    missing-data error must say (see :func:`missing_data_message`).

    ``expected``: a phrase naming the file or folder, e.g. ``"the file 3dshapes.h5"``; ``standin``:
    the procedural dataset that stands in without a download, if any.
    """

    dataset: str
    expected: str
    url: str
    standin: str | None = None


def missing_data_message(source: DataSource, problem: str) -> str:
    """The one-line message of every missing-data error: ``problem``, what is expected where, the
    two ways to give the data folder, the publishing URL and the procedural stand-in."""
    msg = (
        f"{source.dataset}: {problem}; it expects {source.expected} in the data folder, given "
        f"as root=<folder> or by the environment variable {ENV_VAR}; published at {source.url}"
    )
    if source.standin:
        msg += f"; or use load_dataset({source.standin!r}), a procedural stand-in that needs no download"
    return msg


def resolve_root(root: str | os.PathLike | None, source: DataSource) -> Path:
    """``root`` if given, else ``$QKERNELS_DATA``; FileNotFoundError when neither is set."""
    if root is None:
        root = os.environ.get(ENV_VAR)
        if not root:
            state = "unset" if root is None else "empty"
            raise FileNotFoundError(
                missing_data_message(source, f"no data folder given (root=None and ${ENV_VAR} is {state})")
            )
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"root must be a path, got {type(root).__name__}")
    return Path(root)


def require(path: Path, source: DataSource, *, folder: bool = False) -> Path:
    """Return ``path`` if it exists, else FileNotFoundError naming it (see
    :func:`missing_data_message`)."""
    ok = path.is_dir() if folder else path.is_file()
    if not ok:
        kind = "folder" if folder else "file"
        raise FileNotFoundError(missing_data_message(source, f"{kind} {path} not found"))
    return path


def grid_from_labels(
    labels: np.ndarray, file: Path | str, names: Sequence[str], *, decimals: int = 6
) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """Factor sizes and per-factor sorted values from an ``(N, k)`` label array of factor values.

    Classes are the sorted unique values of each column (rounded to ``decimals`` so float noise
    in a stored value never splits a class). Raises DatasetFormatError (naming ``file``) unless
    ``N == prod(sizes)`` and every row's classes equal the row-major factors of its index.
    """
    if labels.ndim != 2 or labels.shape[1] != len(names):
        raise DatasetFormatError(
            f"{file}: labels must have shape (N, {len(names)}) for factors {list(names)}, got {labels.shape}"
        )
    n = labels.shape[0]
    if n == 0:
        raise DatasetFormatError(f"{file}: labels are empty")
    if labels.dtype.kind == "f" and not np.isfinite(labels).all():
        raise DatasetFormatError(f"{file}: labels contain NaN or inf")
    values, classes = [], []
    for k in range(labels.shape[1]):
        col = labels[:, k]
        key = np.round(col, decimals) if col.dtype.kind == "f" else col
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        values.append(col[first])  # the stored value (first occurrence) of each class
        classes.append(inv.reshape(-1))
    sizes = tuple(len(v) for v in values)
    total = int(np.prod(sizes, dtype=np.int64))
    if total != n:
        detail = ", ".join(f"{nm}={s}" for nm, s in zip(names, sizes, strict=True))
        raise DatasetFormatError(
            f"{file}: {n} rows but the label values give factor sizes ({detail}) whose product "
            f"is {total}; the file is truncated or not a complete factor grid"
        )
    rows = np.arange(n, dtype=np.int64)
    for k, base in enumerate(row_major_bases(sizes)):
        expected = (rows // base) % sizes[k]
        bad = np.flatnonzero(classes[k] != expected)
        if bad.size:
            i = int(bad[0])
            raise DatasetFormatError(
                f"{file}: labels are not in row-major factor order: row {i} has "
                f"{names[k]} class {int(classes[k][i])} but its index implies class "
                f"{int(expected[i])} ({bad.size} rows disagree)"
            )
    return sizes, values


def read_sorted(read: Callable[[np.ndarray], np.ndarray], indices: np.ndarray) -> np.ndarray:
    """``read(sorted unique indices)`` then un-sort: rows of ``indices`` in the given order.

    HDF5 fancy selection needs increasing unique indices; contiguous runs become one slice.
    """
    uniq, inv = np.unique(indices, return_inverse=True)
    return read(uniq)[inv.reshape(-1)]


def h5_rows(dataset, uniq: np.ndarray) -> np.ndarray:
    """Rows ``uniq`` (sorted, unique) of an h5py dataset; one slice when they are contiguous."""
    lo, hi = int(uniq[0]), int(uniq[-1]) + 1
    if hi - lo == len(uniq):
        return dataset[lo:hi]
    return dataset[uniq]


def converted_path(npz_path: Path, key: str) -> Path:
    """Where :func:`convert_npz_to_npy` writes member ``key`` of ``npz_path`` by default."""
    return npz_path.with_name(f"{npz_path.stem}.{key}.npy")


def convert_npz_to_npy(
    npz_path: str | os.PathLike,
    key: str = "images",
    out: str | os.PathLike | None = None,
    *,
    chunk_bytes: int = 64 << 20,
) -> Path:
    """One-time copy of npz member ``key`` to a raw ``.npy`` that ``np.load(mmap_mode="r")``
    can map.

    Streams the (possibly compressed) member in chunks, so memory stays ~``chunk_bytes`` even for
    the 12.7 GB MPI3D arrays. Default output: ``<stem>.<key>.npy`` beside the npz, where the
    loaders look for it. Returns the output path.

    Examples:
        >>> import tempfile, numpy as np
        >>> from qkernels.data import convert_npz_to_npy
        >>> npz = tempfile.mkdtemp() + "/images.npz"
        >>> np.savez_compressed(npz, images=np.arange(24, dtype=np.uint8).reshape(2, 3, 4))
        >>> out = convert_npz_to_npy(npz)
        >>> out.name, np.load(out, mmap_mode="r")[1, 2].tolist()
        ('images.images.npy', [20, 21, 22, 23])
    """
    npz_path = Path(npz_path)
    out = converted_path(npz_path, key) if out is None else Path(out)
    with zipfile.ZipFile(npz_path) as zf:
        member = f"{key}.npy"
        if member not in zf.namelist():
            raise DatasetFormatError(f"{npz_path}: no array {key!r} (has {[m[:-4] for m in zf.namelist()]})")
        with zf.open(member) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            if dtype.hasobject:
                raise DatasetFormatError(f"{npz_path}: {key!r} is an object array; refusing")
            tmp = out.with_name(out.name + ".partial")
            dst = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape, fortran_order=fortran)
            flat = dst.reshape(-1, order="F" if fortran else "C")
            step = max(1, chunk_bytes // max(1, dtype.itemsize))
            pos = 0
            while pos < flat.size:
                count = min(step, flat.size - pos)
                buf = f.read(count * dtype.itemsize)
                if len(buf) != count * dtype.itemsize:
                    raise DatasetFormatError(f"{npz_path}: member {key!r} is truncated")
                flat[pos : pos + count] = np.frombuffer(buf, dtype=dtype)
                pos += count
            dst.flush()
            del flat, dst
    os.replace(tmp, out)
    return out


def load_npz_array(npz_path: Path, key: str, *, allow_pickle: bool = False) -> np.ndarray:
    """Member ``key`` of an npz: memory-mapped from its converted ``.npy`` if one exists beside it,
    else read into memory. Never unpickles unless ``allow_pickle``."""
    conv = converted_path(npz_path, key)
    if conv.is_file():
        return np.load(conv, mmap_mode="r", allow_pickle=False)
    with np.load(npz_path, allow_pickle=allow_pickle) as z:
        if key not in z.files:
            raise DatasetFormatError(f"{npz_path}: no array {key!r} (has {sorted(z.files)})")
        try:
            return z[key]
        except ValueError as err:  # object array without allow_pickle
            raise DatasetFormatError(f"{npz_path}: cannot read {key!r}: {err}") from None


def uint8_hwc_to_float_chw(a: np.ndarray) -> np.ndarray:
    """(n, H, W, C) uint8 -> (n, C, H, W) float32 in [0, 1]."""
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2), dtype=np.float32) / np.float32(255)


def pil_image(feature: str):
    """The ``PIL.Image`` module, for ``feature`` (pillow comes with the data extra: a one-line error without it)."""
    with needs(feature, "data"):
        from PIL import Image

    return Image
