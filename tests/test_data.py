"""Real dataset formats: tiny files written here in exactly the published layouts are loaded back
(values, factor sizes, index <-> factors, pickling / DataLoader workers, corrupt-file errors)."""

from __future__ import annotations

import pickle

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

from qkernels.data import (
    DatasetFormatError,
    DSprites,
    convert_npz_to_npy,
    load_dataset,
)
from qkernels.data.base import row_major_bases
from qkernels.data.mpi3d import mpi3d_sizes


def grid_rows(sizes):
    """All factor combinations in row-major order: int64 (prod(sizes), len(sizes))."""
    return np.stack(np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij"), -1).reshape(-1, len(sizes))


def coded_images(n, h=4, w=4, c=3):
    """uint8 (n, h, w, c) images whose every pixel encodes the image index (n <= 256)."""
    img = np.zeros((n, h, w, c), np.uint8)
    img[..., 0] = np.arange(n, dtype=np.uint8)[:, None, None]
    img[..., 1:] = 255 - np.arange(n, dtype=np.uint8)[:, None, None, None]
    img[:, 0, 0, 0] = 7  # one pixel not tied to the index, so images are not constant
    return img


def _expected(img_uint8, idx):
    return torch.from_numpy(img_uint8[idx].transpose(0, 3, 1, 2).astype(np.float32) / 255)


# ---- Shapes3D ------------------------------------------------------------------------------------
S3D_SIZES = (2, 3, 2, 2, 2, 3)
S3D_VALUES = [
    np.array([0.0, 0.5]),
    np.array([0.1, 0.4, 0.9]),
    np.array([0.2, 0.3]),
    np.linspace(0.75, 1.25, 8)[[2, 5]],
    np.array([0.0, 3.0]),
    np.linspace(-30, 30, 15)[[0, 7, 14]],
]


def write_shapes3d(path, *, drop=None, images=None, labels=None):
    rows = grid_rows(S3D_SIZES)
    lab = np.stack([S3D_VALUES[k][rows[:, k]] for k in range(6)], 1).astype(np.float64)
    img = coded_images(len(rows))
    images = img if images is None else images
    labels = lab if labels is None else labels
    with h5py.File(path, "w") as f:
        if drop != "images":
            f.create_dataset("images", data=images)
        if drop != "labels":
            f.create_dataset("labels", data=labels)
    return img, lab


def test_shapes3d_loads_values_sizes_and_images(tmp_path):
    img, lab = write_shapes3d(tmp_path / "3dshapes.h5")
    ds = load_dataset("shapes3d", root=tmp_path)
    assert ds.factor_sizes == S3D_SIZES and len(ds) == len(img)
    assert ds.factor_names[0] == "floor_hue" and ds.observation_shape == (3, 4, 4)
    for k in range(6):
        np.testing.assert_allclose(ds.factor_values[k], S3D_VALUES[k])
    x, f = ds[17]
    assert x.dtype == torch.float32 and f.dtype == torch.int64
    torch.testing.assert_close(x, _expected(img, [17])[0])
    assert f.tolist() == grid_rows(S3D_SIZES)[17].tolist()
    # unsorted, duplicated indices: h5py needs sorted unique reads, the result keeps our order
    idx = [70, 3, 3, 140, 0, 69]
    obs = ds.observations_from_factors(ds.factors_of(idx))
    torch.testing.assert_close(obs, _expected(img, idx))
    # a contiguous batch (read as one slice) and __getitems__ agree with __getitem__
    batch = ds.__getitems__([5, 6, 7, 8])
    for i, (xb, fb) in zip([5, 6, 7, 8], batch, strict=True):
        torch.testing.assert_close(xb, ds[i][0])
        assert fb.tolist() == ds[i][1].tolist()


def test_shapes3d_index_factor_round_trip(tmp_path):
    write_shapes3d(tmp_path / "3dshapes.h5")
    ds = load_dataset("shapes3d", root=tmp_path)
    idx = torch.arange(len(ds))
    f = ds.factors_of(idx)
    assert f.tolist() == grid_rows(S3D_SIZES).tolist()
    assert torch.equal(ds.index_of(f), idx)
    assert ds.factor_bases == row_major_bases(S3D_SIZES)
    g = torch.Generator().manual_seed(1)
    s = ds.sample_factors(500, g)
    assert s.dtype == torch.int64 and s.shape == (500, 6)
    assert (s >= 0).all() and (s < torch.tensor(S3D_SIZES)).all()
    assert all(len(s[:, k].unique()) == S3D_SIZES[k] for k in range(6))


def test_shapes3d_pickle_and_dataloader_worker(tmp_path):
    img, _ = write_shapes3d(tmp_path / "3dshapes.h5")
    ds = load_dataset("shapes3d", root=tmp_path)
    ds[0]  # opens the handle; pickling must not try to carry it
    clone = pickle.loads(pickle.dumps(ds))
    torch.testing.assert_close(clone[9][0], _expected(img, [9])[0])
    loader = torch.utils.data.DataLoader(ds, batch_size=16, num_workers=1, shuffle=False)
    xs, fs = zip(*loader, strict=True)
    torch.testing.assert_close(torch.cat(xs), _expected(img, np.arange(len(img))))
    assert torch.cat(fs).tolist() == grid_rows(S3D_SIZES).tolist()


@pytest.mark.parametrize(
    "problem", ["no_images", "no_labels", "no_channels", "wrong_n", "truncated", "shuffled", "label_columns"]
)
def test_shapes3d_corrupt_files_name_file_and_mismatch(tmp_path, problem):
    path = tmp_path / "3dshapes.h5"
    img, lab = write_shapes3d(path)
    if problem == "no_images":
        write_shapes3d(path, drop="images")
        match = "images"
    elif problem == "no_labels":
        write_shapes3d(path, drop="labels")
        match = "labels"
    elif problem == "no_channels":
        write_shapes3d(path, images=img[..., 0])
        match = "images must be"
    elif problem == "wrong_n":
        write_shapes3d(path, images=img[:-1])
        match = "label rows"
    elif problem == "truncated":
        write_shapes3d(path, images=img[:-3], labels=lab[:-3])
        match = "product"
    elif problem == "shuffled":
        perm = lab.copy()
        perm[[4, 40]] = perm[[40, 4]]
        write_shapes3d(path, labels=perm)
        match = "row-major"
    else:
        write_shapes3d(path, labels=lab[:, :5])
        match = "shape"
    with pytest.raises(DatasetFormatError, match=match) as err:
        load_dataset("shapes3d", root=tmp_path)
    assert "3dshapes.h5" in str(err.value)


MISSING = [  # name, what it looks for under the root, a piece of its URL, procedural stand-in
    ("shapes3d", "3dshapes.h5", "https://storage.googleapis.com/3d-shapes/3dshapes.h5", "shapes3d_procedural"),
    (
        "dsprites",
        "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz",
        "https://github.com/deepmind/dsprites-dataset",
        "sprites",
    ),
    ("mpi3d", "real3d_complicated_shapes_ordered.npz", "https://github.com/rr-learning/disentanglement_dataset", None),
    ("falcor3d", "Falcor3D_down128", "https://github.com/NVlabs/High-res-disentanglement-datasets", None),
    ("isaac3d", "Isaac3D_down128", "https://github.com/NVlabs/High-res-disentanglement-datasets", None),
]


@pytest.mark.parametrize("name, where, url, standin", MISSING)
def test_missing_data_says_what_where_and_where_published(name, where, url, standin, tmp_path, monkeypatch):
    def message(**kw):
        with pytest.raises(FileNotFoundError) as err:
            load_dataset(name, **kw)
        msg = str(err.value)
        assert "\n" not in msg  # one line, for a CLI
        assert msg.startswith(f"{name}: ") and where in msg and url in msg
        assert "root=" in msg and "QKERNELS_DATA" in msg
        if standin is not None:
            assert f"load_dataset('{standin}')" in msg and "no download" in msg
        return msg

    monkeypatch.delenv("QKERNELS_DATA", raising=False)
    # the very first error, with no data folder at all, already says everything
    assert "no data folder given" in message()
    monkeypatch.setenv("QKERNELS_DATA", "")
    assert "QKERNELS_DATA is empty" in message()
    monkeypatch.delenv("QKERNELS_DATA")
    assert f"{tmp_path / where} not found" in message(root=tmp_path)  # the full path looked at
    monkeypatch.setenv("QKERNELS_DATA", str(tmp_path))
    assert f"{tmp_path / where} not found" in message()  # ... also when the root is the variable


def test_missing_data_folder_found_through_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("QKERNELS_DATA", str(tmp_path))
    write_shapes3d(tmp_path / "3dshapes.h5")
    assert load_dataset("shapes3d").factor_sizes == S3D_SIZES


def test_missing_data_names_the_mpi3d_variant_and_nvlabs_labels(tmp_path, monkeypatch):
    monkeypatch.delenv("QKERNELS_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="mpi3d_toy.npz") as err:
        load_dataset("mpi3d", variant="toy")
    assert "variant='toy'" in str(err.value) and "mpi3d_toy.images.npy" in str(err.value)
    with pytest.raises(ValueError, match="variant"):  # a bad variant is named before the root
        load_dataset("mpi3d", variant="huge")
    (tmp_path / "Falcor3D_down128").mkdir()
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("falcor3d", root=tmp_path)
    assert str(tmp_path / "Falcor3D_down128" / "train-rec.labels") in str(err.value)
    assert "High-res-disentanglement-datasets" in str(err.value)


def test_load_dataset_rejects_bad_names_and_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("shapes4d", root=tmp_path)
    with pytest.raises(TypeError, match="name"):
        load_dataset(3)
    with pytest.raises(ValueError, match="procedural"):
        load_dataset("sprites", root=tmp_path)
    with pytest.raises(ValueError, match="variant"):
        load_dataset("mpi3d", root=tmp_path, variant="huge")


def test_factor_argument_checks(tmp_path):
    write_shapes3d(tmp_path / "3dshapes.h5")
    ds = load_dataset("shapes3d", root=tmp_path)
    with pytest.raises(ValueError, match="factors out of range.*floor_hue"):
        ds.index_of([[2, 0, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match=r"shape \(n, 6\)"):
        ds.observations_from_factors(torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(TypeError, match="integer dtype"):
        ds.observations_from_factors(torch.zeros(3, 6))
    with pytest.raises(ValueError, match="index out of range"):
        ds.factors_of(len(ds))
    with pytest.raises(IndexError):
        ds[len(ds)]
    with pytest.raises(ValueError, match="n must be"):
        ds.sample_factors(-1)
    with pytest.raises(TypeError, match="generator"):
        ds.sample_factors(3, generator=np.random.default_rng(0))
    assert ds.observations_from_factors(torch.zeros(0, 6, dtype=torch.long)).shape == (0, 3, 4, 4)


# ---- dSprites ------------------------------------------------------------------------------------
DSP_SIZES = (1, 2, 2, 3, 2, 2)
_UNPICKLED: list[int] = []


def _tripwire_hit():
    _UNPICKLED.append(1)
    return {"title": "tripwire"}


class _Tripwire:
    """Pickles to a call of ``_tripwire_hit``: loading the metadata leaves a trace."""

    def __reduce__(self):
        return (_tripwire_hit, ())


def write_dsprites(path, *, values=None, classes=None, imgs=None, drop=None):
    rows = grid_rows(DSP_SIZES)
    n = len(rows)
    bits = (np.arange(n)[:, None] >> np.arange(16)) & 1  # each image encodes its index
    img = bits.reshape(n, 4, 4).astype(np.uint8)
    vals = [
        np.array([1.0]),
        np.array([1.0, 2.0]),
        np.array([0.5, 1.0]),
        np.linspace(0, 2 * np.pi, 3),
        np.array([0.0, 1.0]),
        np.array([0.0, 1.0]),
    ]
    lv = np.stack([vals[k][rows[:, k]] for k in range(6)], 1)
    arrays = {
        "imgs": img if imgs is None else imgs,
        "latents_classes": rows.astype(np.int64) if classes is None else classes,
        "latents_values": lv if values is None else values,
        "metadata": np.array(_Tripwire(), dtype=object),
    }
    arrays.pop(drop, None)
    np.savez(path, **arrays)
    return img, lv


def test_dsprites_loads_without_unpickling_metadata(tmp_path):
    name = "dsprites_ndarray_co1sh3sc6or40x32y32_64x64.npz"
    img, lv = write_dsprites(tmp_path / name)
    _UNPICKLED.clear()
    ds = load_dataset("dsprites", root=tmp_path)
    assert _UNPICKLED == [] and ds.metadata is None
    assert ds.factor_names == ("shape", "scale", "orientation", "pos_x", "pos_y")
    assert ds.factor_sizes == DSP_SIZES[1:] and ds.observation_shape == (1, 4, 4)
    np.testing.assert_allclose(ds.factor_values[2], np.linspace(0, 2 * np.pi, 3))
    idx = [47, 0, 13, 13]
    x = ds.observations_from_factors(ds.factors_of(idx))
    torch.testing.assert_close(x, torch.from_numpy(img[idx].astype(np.float32)).unsqueeze(1))
    assert torch.equal(ds.index_of(ds.factors_of(torch.arange(48))), torch.arange(48))
    # the user opts in: the pickle is loaded
    trusted = load_dataset("dsprites", root=tmp_path, trust_pickle=True)
    assert _UNPICKLED == [1] and trusted.metadata == {"title": "tripwire"}
    # keeping the size-1 color factor does not change the flat index
    with_color = DSprites(tmp_path / name, keep_color=True)
    assert with_color.factor_sizes == DSP_SIZES
    assert torch.equal(with_color.index_of(with_color.factors_of(torch.arange(48))), torch.arange(48))
    clone = pickle.loads(pickle.dumps(ds))
    torch.testing.assert_close(clone[5][0], ds[5][0])


@pytest.mark.parametrize("problem", ["missing_key", "values_differ", "shuffled", "wrong_n", "float_classes"])
def test_dsprites_corrupt_files(tmp_path, problem):
    path = tmp_path / "d.npz"
    img, lv = write_dsprites(path)
    rows = grid_rows(DSP_SIZES)
    if problem == "missing_key":
        write_dsprites(path, drop="latents_classes")
        match = "latents_classes"
    elif problem == "values_differ":
        bad = lv.copy()
        bad[3, 2] = 0.7
        write_dsprites(path, values=bad)
        match = "scale differ"
    elif problem == "shuffled":
        write_dsprites(path, classes=rows[::-1].copy())
        match = "row-major"
    elif problem == "wrong_n":
        write_dsprites(path, imgs=img[:-1])
        match = "to match imgs"
    else:
        write_dsprites(path, classes=rows.astype(np.float64))
        match = "integer"
    with pytest.raises(DatasetFormatError, match=match) as err:
        DSprites(path)
    assert "d.npz" in str(err.value)


# ---- MPI3D ---------------------------------------------------------------------------------------
MPI_SIZES = (2, 2, 1, 1, 2, 2, 3)


def test_mpi3d_sizes_inferred_from_n():
    assert mpi3d_sizes(1_036_800) == (6, 6, 2, 3, 3, 40, 40)
    assert mpi3d_sizes(460_800) == (4, 4, 2, 3, 3, 40, 40)
    with pytest.raises(ValueError, match="N=1000"):
        mpi3d_sizes(1000)


def test_mpi3d_subgrid_conversion_and_pickling(tmp_path):
    img = coded_images(48)
    path = tmp_path / "real3d_complicated_shapes_ordered.npz"
    np.savez_compressed(path, images=img)
    ds = load_dataset("mpi3d", root=tmp_path, factor_sizes=MPI_SIZES)
    assert ds.factor_sizes == MPI_SIZES and ds.factor_names[-1] == "vertical_axis"
    assert not isinstance(ds._images_array, np.memmap)
    torch.testing.assert_close(ds[31][0], _expected(img, [31])[0])
    assert ds[31][1].tolist() == grid_rows(MPI_SIZES)[31].tolist()
    # one-time conversion (streamed, compressed member) -> a memory-mapped array
    out = convert_npz_to_npy(path, "images", chunk_bytes=100)
    assert out == tmp_path / "real3d_complicated_shapes_ordered.images.npy"
    np.testing.assert_array_equal(np.load(out), img)
    mm = load_dataset("mpi3d", root=tmp_path, factor_sizes=MPI_SIZES)
    assert isinstance(mm._images_array, np.memmap)
    idx = [47, 2, 2, 30]
    torch.testing.assert_close(mm.observations_from_factors(mm.factors_of(idx)), _expected(img, idx))
    path.unlink()  # the converted file alone suffices
    clone = pickle.loads(pickle.dumps(load_dataset("mpi3d", root=tmp_path, factor_sizes=MPI_SIZES)))
    torch.testing.assert_close(clone[40][0], _expected(img, [40])[0])


def test_mpi3d_errors(tmp_path):
    path = tmp_path / "mpi3d_toy.npz"
    np.savez(path, images=coded_images(48))
    with pytest.raises(DatasetFormatError, match="N=48") as err:
        load_dataset("mpi3d", root=tmp_path, variant="toy")
    assert "mpi3d_toy.npz" in str(err.value)
    with pytest.raises(DatasetFormatError, match="give 24"):
        load_dataset("mpi3d", root=tmp_path, variant="toy", factor_sizes=(2, 2, 1, 1, 2, 1, 3))
    np.savez(path, imgs=coded_images(48))
    with pytest.raises(DatasetFormatError, match="no array 'images'"):
        load_dataset("mpi3d", root=tmp_path, variant="toy", factor_sizes=MPI_SIZES)
    with pytest.raises(DatasetFormatError, match="no array 'images'"):
        convert_npz_to_npy(path, "images")
    np.savez(path, images=coded_images(48)[..., :2])
    with pytest.raises(DatasetFormatError, match=r"\(N, H, W, 3\)"):
        load_dataset("mpi3d", root=tmp_path, variant="toy", factor_sizes=MPI_SIZES)


# ---- Falcor3D / Isaac3D --------------------------------------------------------------------------
def write_nvlabs(folder, sizes, labels_name, *, shuffle=False, side=16):
    (folder / "images").mkdir(parents=True)
    rows = grid_rows(sizes)
    labels = rows / np.maximum(np.array(sizes) - 1, 1)  # factor values in [0, 1]
    if shuffle:
        labels[[0, 1]] = labels[[1, 0]]
    with open(folder / labels_name, "wb") as f:  # an .npy whatever the suffix
        np.save(f, labels)
    colors = []
    for i in range(len(rows)):
        c = np.array([10 * i, 255 - 10 * i, 100], np.uint8)
        a = np.broadcast_to(c, (side, side, 3)).copy()
        if i == 1:  # a 1-pixel checkerboard: only an antialiased resize turns it grey
            a[(np.indices((side, side)).sum(0) % 2) == 0] = 0
            a[(np.indices((side, side)).sum(0) % 2) == 1] = 255
        Image.fromarray(a).save(folder / "images" / f"{i:06d}.png")
        colors.append(c)
    return np.array(colors)


@pytest.mark.parametrize(
    "name,folder,labels,sizes",
    [
        ("falcor3d", "Falcor3D_down128", "train-rec.labels", (2, 1, 1, 1, 1, 2, 2)),
        ("isaac3d", "Isaac3D_down128", "labels.npy", (2, 1, 1, 1, 1, 1, 1, 1, 3)),
    ],
)
def test_nvlabs_folder_of_pngs(tmp_path, name, folder, labels, sizes):
    colors = write_nvlabs(tmp_path / folder, sizes, labels)
    ds = load_dataset(name, root=tmp_path, image_size=8)
    assert ds.factor_sizes == sizes and len(ds) == int(np.prod(sizes))
    assert ds.observation_shape == (3, 8, 8)
    x = ds.observations_from_factors(ds.factors_of([3, 0, 1]))
    assert x.shape == (3, 3, 8, 8) and x.dtype == torch.float32
    assert 0.0 <= x.min() and x.max() <= 1.0
    expected = torch.from_numpy(colors[[3, 0]].astype(np.float32) / 255)[:, :, None, None]
    torch.testing.assert_close(x[:2], expected.expand(-1, -1, 8, 8), atol=1 / 255, rtol=0)
    assert ((x[2] - 0.5).abs() < 0.15).all()  # 128 -> 64-style halving averages the checkers
    assert torch.equal(ds.index_of(ds.factors_of(torch.arange(len(ds)))), torch.arange(len(ds)))
    native = load_dataset(name, root=tmp_path, image_size=None)
    assert native.observation_shape == (3, 16, 16)
    clone = pickle.loads(pickle.dumps(ds))
    torch.testing.assert_close(clone[2][0], ds[2][0])


def test_nvlabs_errors(tmp_path):
    sizes = (2, 1, 1, 1, 1, 2, 2)
    folder = tmp_path / "Falcor3D_down128"
    write_nvlabs(folder, sizes, "train-rec.labels", shuffle=True)
    with pytest.raises(DatasetFormatError, match="row-major") as err:
        load_dataset("falcor3d", root=tmp_path)
    assert "train-rec.labels" in str(err.value)
    (folder / "train-rec.labels").unlink()
    with pytest.raises(FileNotFoundError, match="train-rec.labels"):
        load_dataset("falcor3d", root=tmp_path)
    write_nvlabs(tmp_path / "Isaac3D_down128", (2, 1, 1, 1, 1, 1, 1, 1, 2), "labels.npy")
    (tmp_path / "Isaac3D_down128" / "images" / "000003.png").unlink()
    with pytest.raises(DatasetFormatError, match="000003.png"):
        load_dataset("isaac3d", root=tmp_path)
    import shutil

    shutil.rmtree(tmp_path / "Isaac3D_down128")
    write_nvlabs(tmp_path / "Isaac3D_down128", (2, 1, 1, 1, 1, 1, 1, 1, 2), "labels.npy")
    (tmp_path / "Isaac3D_down128" / "images" / "000002.png").unlink()
    ds = load_dataset("isaac3d", root=tmp_path, image_size=8)  # first and last exist
    ds[1]
    with pytest.raises(FileNotFoundError, match="000002.png"):
        ds[2]


def test_uint8_hwc_to_float_chw_by_hand():
    from qkernels.data._files import uint8_hwc_to_float_chw

    a = np.arange(2 * 3 * 4 * 3, dtype=np.uint8).reshape(2, 3, 4, 3)  # (n, H=3, W=4, C=3), not square
    out = uint8_hwc_to_float_chw(a)
    assert out.shape == (2, 3, 3, 4) and out.dtype == np.float32 and out.flags.c_contiguous
    for n, c, h, w in ((0, 0, 0, 0), (1, 2, 2, 3), (0, 1, 2, 0), (1, 0, 0, 3)):
        assert out[n, c, h, w] == np.float32(a[n, h, w, c]) / np.float32(255)


# ---- mutation audit 8: edges of the index <-> factor maps and the loaders ------------------------
def test_index_edges_and_negative_indices(tmp_path):
    # the last class of every factor is valid and is the last row; negative factor classes and indices
    # are rejected by the converters, while dataset[-1] (Python indexing) is the last item
    img, _ = write_shapes3d(tmp_path / "3dshapes.h5")
    ds = load_dataset("shapes3d", root=tmp_path)
    last = [s - 1 for s in S3D_SIZES]
    assert ds.index_of([last]).tolist() == [len(ds) - 1]
    assert ds.factors_of(len(ds) - 1).tolist() == last
    # one step in factor k alone moves the flat index by prod(sizes[k + 1:]) (hand-computed strides)
    for k, stride in enumerate((72, 24, 12, 6, 3, 1)):
        f = [0] * 6
        f[k] = 1
        assert ds.index_of([f]).tolist() == [stride]
    with pytest.raises(ValueError, match="out of range"):
        ds.index_of([[0, -1, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="index out of range"):
        ds.factors_of(-1)
    x, f = ds[-1]
    torch.testing.assert_close(x, _expected(img, [len(img) - 1])[0])
    assert f.tolist() == last
    batch = ds.__getitems__([-1, 0, -len(ds)])
    assert [b[1].tolist() for b in batch] == [last, [0] * 6, [0] * 6]
    torch.testing.assert_close(batch[0][0], x)
    with pytest.raises(IndexError):
        ds[-len(ds) - 1]
    # sorted reads with a gap (not one contiguous slice) keep each row
    for idx in ([5, 7], [7, 5, 8]):
        torch.testing.assert_close(ds.observations_from_factors(ds.factors_of(idx)), _expected(img, idx))


def test_default_generator_is_seeded_and_advances(tmp_path):
    # seed seeds ONE generator that successive sample_factors calls advance (not a fresh one per call)
    write_shapes3d(tmp_path / "3dshapes.h5")
    a = load_dataset("shapes3d", root=tmp_path, seed=7)
    first, second = a.sample_factors(30), a.sample_factors(30)
    assert not torch.equal(first, second)
    g = torch.Generator().manual_seed(7)
    assert torch.equal(first, a.sample_factors(30, g)) and torch.equal(second, a.sample_factors(30, g))


def test_float_noise_in_labels_does_not_split_classes(tmp_path):
    # labels are floats: values equal to 6 decimals are one class (a stored 0.1 may read 0.1 + 1e-12)
    path = tmp_path / "3dshapes.h5"
    _, lab = write_shapes3d(path)
    noisy = lab + np.where(np.arange(len(lab)) % 2 == 0, 1e-9, -1e-9)[:, None]
    write_shapes3d(path, labels=noisy)
    ds = load_dataset("shapes3d", root=tmp_path)
    assert ds.factor_sizes == S3D_SIZES
    for k in range(6):
        np.testing.assert_allclose(ds.factor_values[k], S3D_VALUES[k], atol=1e-8)


def test_convert_fortran_ordered_npz_member(tmp_path):
    # an npz member stored in Fortran order is streamed in that order: the converted array equals the stored one
    img = coded_images(48, h=3, w=5)
    path = tmp_path / "f.npz"
    np.savez(path, images=np.asfortranarray(img))
    out = convert_npz_to_npy(path, "images", chunk_bytes=64)
    np.testing.assert_array_equal(np.load(out), img)


def test_mpi3d_full_complex_file_index_and_variant_check(tmp_path):
    # the real complex size N = 460800 (1x1 images to stay small): sizes (4, 4, 2, 3, 3, 40, 40), row-major
    # with strides 115200, 28800, 14400, 4800, 1600, 40, 1; a file of the wrong size for the variant is refused
    n = 460_800
    idx = np.arange(n)
    img = np.stack([idx % 256, (idx // 256) % 256, idx // 65536], 1).astype(np.uint8).reshape(n, 1, 1, 3)
    np.savez(tmp_path / "real3d_complicated_shapes_ordered.npz", images=img)
    ds = load_dataset("mpi3d", root=tmp_path)
    assert ds.factor_sizes == (4, 4, 2, 3, 3, 40, 40) and ds.variant == "complex"
    factors = [
        [3, 3, 1, 2, 2, 39, 39],
        [1, 0, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 1],
    ]
    want = [n - 1, 115200, 28800, 14400, 4800, 1600, 40, 1]
    assert ds.index_of(factors).tolist() == want
    x = ds.observations_from_factors(factors)
    torch.testing.assert_close(x, _expected(img, want))
    (tmp_path / "real3d_complicated_shapes_ordered.npz").rename(tmp_path / "mpi3d_real.npz")
    with pytest.raises(DatasetFormatError, match="another MPI3D variant"):
        load_dataset("mpi3d", root=tmp_path, variant="real")


def test_nvlabs_pixels_keep_their_rows_and_columns(tmp_path):
    # CHW from the PNG's (row, column, channel): a non-symmetric image read at its stored size is exactly
    # its pixels / 255 (no transposition, no resize); a PNG of another size than image 000000 is refused
    folder = tmp_path / "Isaac3D_down128"
    sizes = (2, 1, 1, 1, 1, 1, 1, 1, 1)
    write_nvlabs(folder, sizes, "labels.npy", side=6)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(folder / "images" / "000001.png")
    native = load_dataset("isaac3d", root=tmp_path, image_size=None)
    want = torch.from_numpy(pixels.transpose(2, 0, 1).astype(np.float32) / 255)
    torch.testing.assert_close(native[1][0], want, rtol=0, atol=1e-7)
    same = load_dataset("isaac3d", root=tmp_path, image_size=6)  # the stored size: no resampling
    torch.testing.assert_close(same[1][0], want, rtol=0, atol=1e-7)
    Image.fromarray(pixels[:5]).save(folder / "images" / "000001.png")
    with pytest.raises(DatasetFormatError, match="000001.png"):
        native[1]


def test_dsprites_color_with_several_classes_needs_keep_color(tmp_path):
    # dropping color is only lossless when it is constant (1 class, as in the real file)
    path = tmp_path / "d.npz"
    rows = grid_rows((2, 1, 1, 1, 1, 2))
    imgs = np.zeros((4, 2, 2), np.uint8)
    np.savez(path, imgs=imgs, latents_classes=rows, latents_values=rows.astype(np.float64))
    with pytest.raises(ValueError, match="keep_color"):
        DSprites(path)
    ds = DSprites(path, keep_color=True)
    assert ds.factor_sizes == (2, 1, 1, 1, 1, 2) and ds.factor_names[0] == "color"
