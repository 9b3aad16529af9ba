"""Data throughput: images per second for each procedural dataset (batch of 512, 64 x 64) and for
batched reads of a Shapes3D-format HDF5 file. Run: pytest benchmarks/test_data.py --benchmark-only.
``extra_info["images_per_s"]`` holds the rate (from the benchmark's mean time). Warm-up and rounds:
qkernels.bench.pedantic (from the time per batch; see benchmarks/conftest.py)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from qkernels.bench import pedantic
from qkernels.data import Balls, Shapes3D, Shapes3DProcedural, Sprites

BATCH = 512


def _rate(benchmark, n):
    benchmark.extra_info["images_per_s"] = round(n / benchmark.stats.stats.mean)


@pytest.mark.parametrize("name", ["sprites", "balls", "shapes3d_procedural"])
def test_procedural_render_throughput(benchmark, name):
    ds = {
        "sprites": lambda: Sprites(),
        "balls": lambda: Balls(BATCH),
        "shapes3d_procedural": lambda: Shapes3DProcedural(),
    }[name]()
    f = ds.sample_factors(BATCH, torch.Generator().manual_seed(0))
    x = pedantic(benchmark, ds.observations_from_factors, (f,))
    assert x.shape == (BATCH, *ds.observation_shape)
    _rate(benchmark, BATCH)


def test_balls_continuous_render_throughput(benchmark):
    ds = Balls(BATCH, "iid")
    x = pedantic(benchmark, ds.render, (ds.latents,))
    assert x.shape == (BATCH, 3, 64, 64)
    _rate(benchmark, BATCH)


def test_dataloader_batch_throughput(benchmark):
    """``__getitems__``: one vectorized render per DataLoader batch (main process)."""
    ds = Shapes3DProcedural()
    loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
    it = iter(loader)
    x, _ = pedantic(benchmark, next, (it,))
    assert x.shape == (BATCH, 3, 64, 64)
    _rate(benchmark, BATCH)


def test_shapes3d_h5_random_batch_read(benchmark, tmp_path):
    sizes = (4, 4, 4, 2, 4, 4)  # 2048 images, the real file's layout
    n = int(np.prod(sizes))
    rows = np.stack(np.meshgrid(*[np.arange(s) for s in sizes], indexing="ij"), -1).reshape(n, 6)
    rng = np.random.default_rng(0)
    with h5py.File(tmp_path / "3dshapes.h5", "w") as f:
        f.create_dataset("images", data=rng.integers(0, 256, (n, 64, 64, 3), dtype=np.uint8))
        f.create_dataset("labels", data=rows.astype(np.float64) / 10)
    ds = Shapes3D(tmp_path / "3dshapes.h5")
    f = ds.sample_factors(BATCH, torch.Generator().manual_seed(0))
    x = pedantic(benchmark, ds.observations_from_factors, (f,))
    assert x.shape == (BATCH, 3, 64, 64)
    _rate(benchmark, BATCH)
