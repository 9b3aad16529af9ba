"""Procedural datasets: determinism per seed, every factor changes the image, ranges, dtypes,
the samplers' rules, the 2-D mixing formulas, and contact sheets."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from qkernels.data import (
    Balls,
    QuantizedGrid2D,
    Shapes3DProcedural,
    Sprites,
    contact_sheet,
    load_dataset,
)


@pytest.fixture(scope="module")
def shapes3d():
    return Shapes3DProcedural()


def small_sprites(**kw):
    return Sprites(n_scales=3, n_orientations=6, n_x=4, n_y=3, **kw)


def image_datasets(shapes3d):
    return [small_sprites(), shapes3d, Balls(64, "iid"), Balls(64, "quantized", n_bins=5)]


def test_interface_shapes_dtypes_ranges(shapes3d):
    g = torch.Generator().manual_seed(0)
    for ds in image_datasets(shapes3d):
        f = ds.sample_factors(40, g)
        assert f.dtype == torch.int64 and f.shape == (40, len(ds.factor_sizes))
        assert (f >= 0).all() and (f < torch.tensor(ds.factor_sizes)).all()
        x = ds.observations_from_factors(f)
        assert x.dtype == torch.float32 and x.shape == (40, *ds.observation_shape)
        assert x.min() >= 0.0 and x.max() <= 1.0 and torch.isfinite(x).all()
        assert x.std() > 0.05  # not blank
        xi, fi = ds[3]
        assert xi.shape == ds.observation_shape and fi.dtype == torch.int64
        batch = ds.__getitems__([3, 0, 3])
        torch.testing.assert_close(batch[0][0], xi)
        assert torch.equal(batch[0][1], fi)


def test_batched_reads_reject_the_indices_single_reads_reject(shapes3d):
    """Issue 48 (7): a DataLoader batch (``__getitems__``) with an index equal to the length, or below -length,
    raises IndexError as ``dataset[i]`` does (never wraps to row 0 or to row length - 1); the last row and
    negative indices read the rows ``dataset[i]`` reads."""
    for ds in [*image_datasets(shapes3d), QuantizedGrid2D(10)]:
        n = len(ds)
        for bad in (n, n + 3, -n - 1):
            with pytest.raises(IndexError):
                ds[bad]
            if hasattr(ds, "__getitems__"):
                with pytest.raises(IndexError):
                    ds.__getitems__([0, bad])
        if hasattr(ds, "__getitems__"):
            batch = ds.__getitems__([n - 1, -1, -n])
            for (x, f), i in zip(batch, (n - 1, n - 1, 0), strict=True):
                xi, fi = ds[i]
                assert torch.equal(x, xi) and torch.equal(f, fi), (type(ds).__name__, i)


def test_grid_datasets_index_getitem_consistency(shapes3d):
    sp = small_sprites()
    assert sp.factor_sizes == (3, 3, 6, 4, 3) and len(sp) == 3 * 3 * 6 * 4 * 3
    assert shapes3d.factor_sizes == (10, 10, 10, 8, 4, 15) and len(shapes3d) == 480_000
    assert shapes3d.factor_names == ("floor_hue", "wall_hue", "object_hue", "scale", "shape", "orientation")
    for ds in (sp, shapes3d):
        idx = torch.tensor([0, 1, 77, len(ds) - 1])
        f = ds.factors_of(idx)
        assert torch.equal(ds.index_of(f), idx)
        x, fi = ds[77]
        assert torch.equal(fi, f[2])
        torch.testing.assert_close(x, ds.observations_from_factors(f[2:3])[0])
    # last factor fastest
    assert shapes3d.factors_of(1).tolist() == [0, 0, 0, 0, 0, 1]
    assert shapes3d.factors_of(15).tolist() == [0, 0, 0, 0, 1, 0]


def test_determinism_per_seed(shapes3d):
    for make in (small_sprites, lambda **kw: Balls(50, "scm_nonlinear", **kw)):
        a, b, c = make(seed=3), make(seed=3), make(seed=4)
        fa, fb = a.sample_factors(20), b.sample_factors(20)
        assert torch.equal(fa, fb) and not torch.equal(fa, c.sample_factors(20))
        torch.testing.assert_close(a.observations_from_factors(fa), b.observations_from_factors(fb), rtol=0, atol=0)
    assert torch.equal(Balls(50, seed=1).latents, Balls(50, seed=1).latents)
    assert not torch.equal(Balls(50, seed=1).latents, Balls(50, seed=2).latents)
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    other = Shapes3DProcedural()
    f = shapes3d.sample_factors(30, g1)
    assert torch.equal(f, other.sample_factors(30, g2))
    torch.testing.assert_close(
        shapes3d.observations_from_factors(f), other.observations_from_factors(f), rtol=0, atol=0
    )


def test_every_factor_step_changes_the_image(shapes3d):
    """For random combinations, moving any factor by one class changes pixels (a factor that
    leaves the image unchanged would be invisible to every model and metric)."""
    g = torch.Generator().manual_seed(1)
    for ds in image_datasets(shapes3d):
        base = ds.sample_factors(6, g)
        for k, size in enumerate(ds.factor_sizes):
            for v in range(size - 1):
                lo, hi = base.clone(), base.clone()
                lo[:, k], hi[:, k] = v, v + 1
                diff = ds.observations_from_factors(lo) - ds.observations_from_factors(hi)
                changed = diff.abs().flatten(1).max(1).values > 1e-3
                assert changed.all(), (type(ds).__name__, ds.factor_names[k], v, base[~changed])


def test_shapes3d_factors_drive_their_regions(shapes3d):
    """Each hue factor recolours exactly its region (floor: the bottom rows, wall: the top rows,
    object: the bottom centre) in its hue; scale grows the object; orientation moves the corner."""
    base = torch.tensor([2, 5, 8, 3, 0, 7])  # orientation 7: yaw 0

    def render(**changes):
        f = base.clone()
        for name, v in changes.items():
            f[shapes3d.factor_names.index(name)] = v
        return shapes3d.observations_from_factors(f[None])[0]

    def changed(a, b):
        return (a - b).abs().amax(0) > 1e-3  # (S, S)

    # the Shapes3D values of each factor's classes
    fv = shapes3d.factor_values
    for k in range(3):
        torch.testing.assert_close(fv[k], torch.tensor([i / 10 for i in range(10)]))
    torch.testing.assert_close(fv[3], torch.tensor([0.75 + i * 0.5 / 7 for i in range(8)]))
    torch.testing.assert_close(fv[5], torch.tensor([-30.0 + i * 60.0 / 14 for i in range(15)]))
    img = render()
    floor, wall = changed(img, render(floor_hue=6)), changed(img, render(wall_hue=0))
    obj = changed(img, render(object_hue=1))
    rows, centre = (slice(60, 64), slice(None)), (slice(40, 50), slice(28, 36))
    assert floor[rows].all() and not floor[:4].any() and not floor[centre].any()
    assert wall[:4].all() and not wall[rows].any() and not wall[centre].any()
    assert obj[centre].all() and not obj[:4].any() and not obj[rows].any()
    # hue k / 10 with saturation 1: hue 0 is red, 1/3 green-ish, 2/3 blue-ish, in the right region
    red_floor = render(floor_hue=0)[:, 62].mean(1)
    assert red_floor[0] > 2 * red_floor[1] and red_floor[0] > 2 * red_floor[2]
    blue_wall = render(wall_hue=7)[:, 1].mean(1)  # hue 0.7: blue dominant
    assert blue_wall[2] > 2 * blue_wall[0] and blue_wall[2] > 2 * blue_wall[1]
    green_object = render(object_hue=3)[:, 45, 32]
    assert green_object[1] > 2 * green_object[0] and green_object[1] > 2 * green_object[2]
    # scale: more object pixels
    small = changed(render(scale=0), render(scale=0, object_hue=1)).sum()
    large = changed(render(scale=7), render(scale=7, object_hue=1)).sum()
    assert large > 1.3 * small

    # orientation (the camera's yaw) moves the wall corner, where the floor line is highest, from
    # the left half (yaw -30) to the right half (yaw +30)
    def floor_line_left_minus_right(o):
        wall_o = changed(render(orientation=o), render(orientation=o, wall_hue=0))
        lowest = (wall_o * torch.arange(64)[:, None]).amax(0).float()  # lowest wall row per column
        return float(lowest[:20].mean() - lowest[44:].mean())  # columns clear of the object

    assert floor_line_left_minus_right(0) < -1.0 and floor_line_left_minus_right(14) > 1.0
    # and the cube's faces meet without a seam: inside the object (one pixel in from its edge) the
    # floor and wall colours show at most faintly (antialiasing near the silhouette's corners, < 0.15;
    # a seam between two faces showed 0.28-0.31 of the floor)
    cube = changed(img, render(object_hue=1))
    inner = cube & torch.roll(cube, 1, 0) & torch.roll(cube, -1, 0) & torch.roll(cube, 1, 1) & torch.roll(cube, -1, 1)
    assert inner.sum() > 200
    for other in (render(floor_hue=6), render(wall_hue=0)):
        assert (img - other).abs().amax(0)[inner].max() < 0.15


def test_sprites_symmetries_and_centres():
    sp = Sprites(n_orientations=4, n_x=3, n_y=3, n_scales=2)
    f = torch.tensor(
        [[0, 1, 0, 1, 1], [0, 1, 1, 1, 1], [1, 1, 0, 1, 1], [1, 1, 2, 1, 1], [2, 1, 0, 1, 1], [2, 1, 2, 1, 1]]
    )
    x = sp.observations_from_factors(f)[:, 0]
    torch.testing.assert_close(x[0], x[1], atol=1e-4, rtol=0)  # square turned 90 degrees
    torch.testing.assert_close(x[2], x[3], atol=1e-4, rtol=0)  # ellipse turned 180 degrees
    assert (x[4] - x[5]).abs().max() > 0.5  # a heart turned upside down is another image
    # a centred sprite covers the centre, not the corners; pos_x moves it right
    assert x[0, 31:33, 31:33].min() == 1.0 and x[0, :8, :8].max() == 0.0
    right = sp.observations_from_factors(torch.tensor([[0, 1, 0, 2, 1]]))[0, 0]
    cols = torch.arange(64.0)
    assert (right.sum(0) * cols).sum() / right.sum() > (x[0].sum(0) * cols).sum() / x[0].sum()


def test_balls_samplers_follow_their_rules():
    r = 0.16
    iid = Balls(2000, "iid").latents
    assert ((iid >= 0.1) & (iid <= 0.9)).all()
    assert (torch.hypot(iid[:, 0] - iid[:, 2], iid[:, 1] - iid[:, 3]) >= 2 * r).all()
    lin = Balls(2000, "scm_linear").latents.double()
    up = lin[:, 0] + lin[:, 1] >= 1
    assert ((lin[up, 2] <= 0.5) & (lin[up, 3] >= 0.5)).all()
    assert ((lin[~up, 2] >= 0.5) & (lin[~up, 3] <= 0.5)).all()
    assert 0.3 < up.double().mean() < 0.7
    non = Balls(2000, "scm_nonlinear").latents.double()
    up = 1.25 * (non[:, 0] ** 2 + non[:, 1] ** 2) >= 1
    assert ((non[up, 2] <= 0.5) & (non[up, 3] >= 0.5)).all()
    assert ((non[~up, 2] >= 0.5) & (non[~up, 3] <= 0.5)).all()
    q = Balls(4000, "quantized")
    assert ((q.latents >= 0.1) & (q.latents <= 0.9)).all()
    # ManhattanUniform: a piecewise-constant density, so the histogram has jumps
    hist = torch.histc(q.latents[:, 0], bins=40, min=0.1, max=0.9)
    assert hist.max() > 2 * hist.min()
    d = q.discretize(q.latents)
    assert d.min() == 0 and d.max() == 7 and torch.equal(d, q.factors)
    s = q.sample_factors(3000, torch.Generator().manual_seed(0))
    assert torch.equal(s, q.discretize(q.sample_latents(3000, torch.Generator().manual_seed(0))))


def test_balls_geometry_y_up_colours_and_occlusion():
    b = Balls(10)
    x = b.render(torch.tensor([[0.5, 0.8, 0.2, 0.2]]))[0]
    teal = torch.tensor([2, 156, 154]) / 255
    red = torch.tensor([222, 100, 100]) / 255
    torch.testing.assert_close(x[:, 63 - 51, 32], teal)  # y = 0.8 is near the top (y up)
    torch.testing.assert_close(x[:, 63 - 13, 13], red)
    torch.testing.assert_close(x[:, 0, 63], torch.ones(3))  # white background
    # radius 0.16 * 64 = 10.24 px: inside at 9.5 px from the centre, outside at 11 px
    torch.testing.assert_close(x[:, 63 - 51, 32 + 9], teal)
    torch.testing.assert_close(x[:, 63 - 51, 32 + 11], torch.ones(3))
    same = b.render(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))[0]
    torch.testing.assert_close(same[:, 31, 32], red)  # the later ball occludes
    assert len(b) == 10 and b.latents.shape == (10, 4)
    xb, zb = b.sample(5, torch.Generator().manual_seed(0))
    assert xb.shape == (5, 3, 64, 64) and zb.shape == (5, 4)


def test_quantized_grid2d_construction_and_mixing():
    ds = QuantizedGrid2D(4000, "nonlinear", seed=5)
    t = ds.thresholds
    assert t.shape == (2, 5) and (t[:, 0] == 0).all()
    spacing = t.diff(dim=1)
    assert ((spacing >= 0.3) & (spacing <= 2.5)).all()
    assert ds.priors.shape == (16,) and math.isclose(ds.priors.sum().item(), 1.0)
    for m in (ds.A, ds.B):
        assert torch.linalg.cond(m) <= 2.0 + 1e-9
    # z lies in the grid, in the recorded cells, with cell frequencies following the priors
    assert torch.equal(ds.quantize(ds.z), ds.cells)
    lo = t.gather(1, ds.cells.T).T.float()
    hi = t.gather(1, ds.cells.T + 1).T.float()
    assert ((ds.z >= lo - 1e-5) & (ds.z <= hi + 1e-5)).all()
    freq = torch.bincount(ds.cells[:, 0] + 4 * ds.cells[:, 1], minlength=16) / len(ds)
    assert (freq - ds.priors).abs().max() < 0.03
    # the documented formulas, recomputed in numpy
    z = ds.z.double().numpy()
    c = ds.center.numpy()
    np.testing.assert_allclose(ds.center.numpy(), (t[:, 0] + t[:, -1]).numpy() / 2)
    x_nl = np.tanh((0.5 * (z - c)) @ ds.A.numpy().T) @ ds.B.numpy().T
    np.testing.assert_allclose(ds.x.numpy(), x_nl, rtol=0, atol=1e-5)
    lin = QuantizedGrid2D(100, "linear", seed=5)
    np.testing.assert_allclose(lin.x.numpy(), (lin.z.double().numpy() - c) @ ds.A.numpy().T, rtol=0, atol=1e-5)
    assert torch.equal(lin.thresholds, ds.thresholds)  # the seed fixes the grid, not the mixing
    x0, z0 = ds[0]
    assert x0.shape == (2,) and torch.equal(z0, ds.z[0])


def test_quantized_grid2d_determinism_and_arguments():
    a, b, c = QuantizedGrid2D(50, seed=1), QuantizedGrid2D(50, seed=1), QuantizedGrid2D(50, seed=2)
    assert torch.equal(a.x, b.x) and torch.equal(a.A, b.A) and not torch.equal(a.x, c.x)
    xs, zs = a.sample(10, torch.Generator().manual_seed(0))
    xs2, zs2 = a.sample(10, torch.Generator().manual_seed(0))
    assert torch.equal(xs, xs2) and torch.equal(zs, zs2) and xs.dtype == torch.float32
    with pytest.raises(ValueError, match="mixing"):
        QuantizedGrid2D(10, "cubic")
    with pytest.raises(ValueError, match="n must"):
        QuantizedGrid2D(0)
    with pytest.raises(TypeError, match="generator"):
        a.sample(3, generator=0)
    assert isinstance(load_dataset("quantized_grid2d", n=20, mixing="linear", seed=1), QuantizedGrid2D)


def test_procedural_argument_checks_and_pickling():
    with pytest.raises(ValueError, match="sampler"):
        Balls(10, "gaussian")
    with pytest.raises(ValueError, match="n_balls=2"):
        Balls(10, "scm_linear", n_balls=3)
    with pytest.raises(ValueError, match="n_shapes"):
        Sprites(n_shapes=4)
    with pytest.raises(ValueError, match="n_x"):
        Sprites(n_x=0)
    with pytest.raises(ValueError, match="latents"):
        Balls(10).render(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="image_size"):
        Shapes3DProcedural(image_size=2)
    three = Balls(20, "iid", n_balls=3)
    assert three.factor_names == ("x1", "y1", "x2", "y2", "x3", "y3")
    sp = small_sprites()
    clone = pickle.loads(pickle.dumps(sp))
    torch.testing.assert_close(clone[11][0], sp[11][0])
    assert isinstance(load_dataset("sprites", n_scales=2), Sprites)


def test_contact_sheets(tmp_path, shapes3d):
    for i, ds in enumerate([small_sprites(), shapes3d, Balls(30)]):
        path = contact_sheet(ds, tmp_path / f"s{i}.png", rows=2, cols=3, scale=1, pad=2)
        with Image.open(path) as im:
            assert im.size == (3 * 66 + 2, 2 * 66 + 2)
            assert np.asarray(im).std() > 5
    path = contact_sheet(shapes3d, tmp_path / "v.png", rows=2, cols=20, vary=4, scale=1)
    with Image.open(path) as im:
        assert im.size == (4 * 66 + 2, 2 * 66 + 2)  # shape has 4 classes
    path = contact_sheet(QuantizedGrid2D(200), tmp_path / "g.png", scale=1)
    with Image.open(path) as im:
        assert im.size == (256, 256) and np.asarray(im).std() > 5
    with pytest.raises(ValueError, match="vary"):
        contact_sheet(shapes3d, tmp_path / "x.png", vary=6)
    with pytest.raises(ValueError, match="rows"):
        contact_sheet(shapes3d, tmp_path / "x.png", rows=0)


def test_contact_sheet_pixels(tmp_path):
    # tile (r, c) at [pad + r (h + pad), pad + c (w + pad)] holds round(255 x) of its image; pads are grey 128;
    # vary=k: the tiles of a row differ only in factor k, swept over evenly spaced classes
    ds = small_sprites()
    path = contact_sheet(
        ds, tmp_path / "v.png", rows=2, cols=3, vary=1, scale=1, pad=2, generator=torch.Generator().manual_seed(4)
    )
    sheet = np.asarray(Image.open(path)).astype(np.int64)
    base = ds.sample_factors(2, torch.Generator().manual_seed(4))
    h = ds.observation_shape[1]
    steps = np.round(np.linspace(0, ds.factor_sizes[1] - 1, 3)).astype(int)
    for r in range(2):
        for c in range(3):
            f = base[r : r + 1].clone()
            f[0, 1] = int(steps[c])
            want = np.round(255 * ds.observations_from_factors(f)[0, 0].numpy()).astype(np.int64)
            top, left = 2 + r * (h + 2), 2 + c * (h + 2)
            tile = sheet[top : top + h, left : left + h]
            assert (tile == want[:, :, None]).all(), (r, c)
    mask = np.ones(sheet.shape[:2], bool)
    for r in range(2):
        for c in range(3):
            mask[2 + r * (h + 2) : 2 + r * (h + 2) + h, 2 + c * (h + 2) : 2 + c * (h + 2) + h] = False
    assert (sheet[mask] == 128).all()


def test_render_primitives_by_hand():
    from qkernels.data.render import convex_polygon_distance, hsv_to_rgb, segment_distance

    rgb = hsv_to_rgb(torch.tensor([0.0, 1 / 3, 2 / 3, 1 / 6]))
    torch.testing.assert_close(rgb, torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]]))
    torch.testing.assert_close(hsv_to_rgb(torch.tensor([0.3]), s=0.0, v=0.4), torch.full((1, 3), 0.4))
    torch.testing.assert_close(hsv_to_rgb(torch.tensor([0.0]), s=0.5, v=1.0), torch.tensor([[1.0, 0.5, 0.5]]))
    one = torch.ones(1, 1, 1)
    x, y = torch.tensor([[[0.0, 3.0, 1.0]]]), torch.tensor([[[1.0, 0.0, -2.0]]])
    d = segment_distance(x, y, 0 * one, 0 * one, 2 * one, 0 * one)  # segment (0, 0)-(2, 0)
    torch.testing.assert_close(d, torch.tensor([[[1.0, 1.0, 2.0]]]))
    sq_x, sq_y = torch.tensor([[0.0, 1.0, 1.0, 0.0]]), torch.tensor([[0.0, 0.0, 1.0, 1.0]])  # unit square
    px, py = torch.tensor([[[0.5, 2.0, 0.5]]]), torch.tensor([[[0.5, 0.5, 0.9]]])
    torch.testing.assert_close(convex_polygon_distance(px, py, sq_x, sq_y), torch.tensor([[[-0.5, 1.0, -0.1]]]))
    # the same square in the other winding, and a degenerate (zero-area) polygon: empty everywhere
    torch.testing.assert_close(
        convex_polygon_distance(px, py, sq_x.flip(1), sq_y.flip(1)), torch.tensor([[[-0.5, 1.0, -0.1]]])
    )
    flat = convex_polygon_distance(px, py, torch.tensor([[0.0, 1.0, 2.0]]), torch.tensor([[0.0, 0.0, 0.0]]))
    assert (flat >= 1e4).all()


def test_balls_bins_by_hand():
    # n_bins equal bins of [0.1, 0.9]: a coordinate 70% into bin k is in bin k (floor, not round); the
    # bin centres map back to their own bins; the ends clamp into the first / last bin
    ds = Balls(8, n_bins=4)
    k = torch.tensor([0, 1, 2, 3])
    lat = (0.1 + 0.8 * (k + 0.7) / 4).double()[:, None].expand(4, 4).float()
    assert ds.discretize(lat)[:, 0].tolist() == [0, 1, 2, 3]
    assert ds.discretize(torch.tensor([[0.1, 0.9, 0.0999, 0.5]])).tolist() == [[0, 3, 0, 2]]
    centres = ds.bin_centers(torch.tensor([[0, 1, 2, 3]]))
    torch.testing.assert_close(centres, torch.tensor([[0.2, 0.4, 0.6, 0.8]]))
    assert ds.discretize(centres).tolist() == [[0, 1, 2, 3]]


def test_sprites_scale_grows_the_shape_quadratically():
    # scale class k has value linspace(0.5, 1, n)[k] times the half extent: the covered area grows with k,
    # ~ the square of the scale (a square of half extent h covers (2 h)^2 pixels)
    sp = Sprites(n_shapes=1, n_scales=3, n_orientations=1, n_x=1, n_y=1, image_size=64)
    torch.testing.assert_close(sp.factor_values[1], torch.tensor([0.5, 0.75, 1.0]))
    area = sp.observations_from_factors(torch.tensor([[0, k, 0, 0, 0] for k in range(3)])).sum((1, 2, 3))
    assert area[0] < area[1] < area[2]
    assert float(area[2] / area[0]) == pytest.approx(4.0, rel=0.1)


def test_grid2d_cells_are_half_open_on_the_right():
    # cell i of an axis is [t_i, t_{i+1}): a latent exactly on an inner threshold belongs to the upper cell
    ds = QuantizedGrid2D(50)
    t = ds.thresholds.to(torch.float32)
    z = torch.stack([t[0, :4], t[1, :4]], 1)  # (4, 2): t_0..t_3 on each axis
    assert ds.quantize(z).tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert torch.equal(ds.quantize(ds.z), ds.cells)


def test_sample_factors_is_uniform_over_every_factors_classes():
    # GroundTruthDataset.sample_factors: each factor uniform over its classes 0..size-1 (the metrics and
    # the trainer's batches rely on it). Mutation audit 7: round(u * (size - 1)) -- the end classes drawn
    # half as often -- passed every other test (they check ranges, dtypes and that every class occurs).
    sizes = (3, 2, 5, 2, 7)
    ds = Sprites(n_shapes=3, n_scales=2, n_orientations=5, n_x=2, n_y=7, image_size=8)
    assert ds.factor_sizes == sizes
    n = 70_000
    f = ds.sample_factors(n, torch.Generator().manual_seed(0))
    for k, size in enumerate(sizes):
        freq = torch.bincount(f[:, k], minlength=size).double() / n
        assert len(freq) == size
        # binomial sd <= sqrt(0.25 / 70000) ~ 0.0019: 0.01 is > 5 sd, the mutant misses by >= 0.06
        torch.testing.assert_close(freq, torch.full((size,), 1.0 / size, dtype=torch.float64), rtol=0, atol=0.01)


# ---- mutation audit 8: geometry, samplers and reporting paths pinned to independent values -------
def test_coverage_over_and_pixel_grid_by_hand():
    from qkernels.data.render import coverage, over, pixel_grid

    # coverage = clamp(0.5 - d, 0, 1): half covered on the boundary, linear over one pixel
    d = torch.tensor([-1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 2.0])
    torch.testing.assert_close(coverage(d), torch.tensor([1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]))
    # over: canvas (1 - a) + color a, per pixel, for (n, C) and (n, C, H, W) colours
    canvas = torch.ones(1, 3, 1, 2)
    color = torch.tensor([[0.2, 0.4, 0.6]])
    over(canvas, color, torch.tensor([[[0.25, 1.0]]]))
    want = torch.tensor([[0.8, 0.2], [0.85, 0.4], [0.9, 0.6]])[None, :, None]
    torch.testing.assert_close(canvas, want)
    canvas = torch.zeros(1, 3, 1, 2)
    over(canvas, torch.full((1, 3, 1, 2), 0.5), torch.tensor([[[0.5, 0.0]]]))
    torch.testing.assert_close(canvas[0, :, 0], torch.tensor([[0.25, 0.0]] * 3))
    # pixel centres: x = column, y = row
    x, y = pixel_grid(2, 3)
    assert x.tolist() == [[[0.0, 1.0, 2.0], [0.0, 1.0, 2.0]]]
    assert y.tolist() == [[[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]]


def test_balls_quantized_latents_follow_each_balls_grid():
    # the quantized sampler maps ball b's ManhattanUniform grid affinely onto [0.1, 0.9]^2: the mapped thresholds
    # 0.1 + 0.8 (t_i - t_0) / (t_4 - t_0) cut each coordinate into 4 cells whose frequencies are the marginal cell
    # priors (cell k = (k % 4, k // 4)); each ball has its own grid
    n = 6000
    q = Balls(n, "quantized")
    assert len(q.grids) == 2 and not torch.equal(q.grids[0][0], q.grids[1][0])
    for b, (t, priors) in enumerate(q.grids):
        p = priors.double().numpy().reshape(4, 4)  # [k // 4, k % 4]
        for axis, marginal in ((0, p.sum(0)), (1, p.sum(1))):
            ta = t[axis].double().numpy()
            edges = 0.1 + 0.8 * (ta - ta[0]) / (ta[-1] - ta[0])
            lat = q.latents[:, 2 * b + axis].double().numpy()
            assert lat.min() < edges[0] + 0.02 and lat.max() > edges[-1] - 0.02  # fills [0.1, 0.9]
            freq = np.bincount(np.searchsorted(edges[1:-1], lat, side="right"), minlength=4) / n
            np.testing.assert_allclose(freq, marginal, atol=0.03, err_msg=f"ball {b} axis {axis}")


def test_balls_scm_children_fill_their_whole_quadrant():
    # ball 2 of the SCM samplers: U(0.1, 0.5) x U(0.5, 0.9) or U(0.5, 0.9) x U(0.1, 0.5), each side reached
    for sampler in ("scm_linear", "scm_nonlinear"):
        z = Balls(3000, sampler).latents.double()
        x1, y1 = z[:, 0], z[:, 1]
        up = (x1 + y1 >= 1) if sampler == "scm_linear" else (1.25 * (x1**2 + y1**2) >= 1)
        for col in (0, 1):
            assert z[:, col].min() < 0.12 and z[:, col].max() > 0.88  # ball 1: U(0.1, 0.9)
        for sel, (xlo, xhi), (ylo, yhi) in ((up, (0.1, 0.5), (0.5, 0.9)), (~up, (0.5, 0.9), (0.1, 0.5))):
            x2, y2 = z[sel, 2], z[sel, 3]
            assert x2.min() < xlo + 0.02 and x2.max() > xhi - 0.02, sampler
            assert y2.min() < ylo + 0.02 and y2.max() > yhi - 0.02, sampler
            # uniform: the mean is the interval's midpoint
            assert abs(float(x2.mean()) - (xlo + xhi) / 2) < 0.02 and abs(float(y2.mean()) - (ylo + yhi) / 2) < 0.02


def test_balls_items_render_the_stored_latents():
    # dataset[i]: the image of the stored continuous latents (not of a bin centre) and their bins
    b = Balls(6, "iid", seed=2)
    lat = b.latents.double()
    bins = ((lat - 0.1) / 0.8 * 8).floor().clamp(0, 7).long()
    for i in (0, 5):
        x, f = b[i]
        torch.testing.assert_close(x, b.render(b.latents[i : i + 1])[0], rtol=0, atol=0)
        assert f.tolist() == bins[i].tolist()
    batch = b.__getitems__([4, 1])
    for (x, f), i in zip(batch, (4, 1), strict=True):
        torch.testing.assert_close(x, b.render(b.latents[i : i + 1])[0], rtol=0, atol=0)
        assert f.tolist() == bins[i].tolist()
    # observations_from_factors renders at bin centres: a bin-centre latent renders identically
    centre = (0.1 + 0.8 * (bins[:1].double() + 0.5) / 8).float()
    torch.testing.assert_close(b.observations_from_factors(bins[:1]), b.render(centre), rtol=0, atol=1e-6)


def test_grid2d_mixing_singular_values_and_fresh_samples():
    # A and B = R diag(s) R with s ~ U(0.5, 1): singular values in [0.5, 1]; sample() returns (mix(z), z)
    ds = QuantizedGrid2D(20, "nonlinear", seed=3)
    for m in (ds.A, ds.B):
        sv = torch.linalg.svdvals(m)
        assert ((sv >= 0.5 - 1e-12) & (sv <= 1.0 + 1e-12)).all()
    x, z = ds.sample(40, torch.Generator().manual_seed(1))
    zc = z.double().numpy() - ds.center.numpy()
    want = np.tanh((0.5 * zc) @ ds.A.numpy().T) @ ds.B.numpy().T
    np.testing.assert_allclose(x.numpy(), want, rtol=0, atol=1e-5)
    lo, hi = ds.thresholds[:, 0].numpy(), ds.thresholds[:, -1].numpy()
    assert ((z.numpy() >= lo - 1e-5) & (z.numpy() <= hi + 1e-5)).all()


def test_contact_sheet_scale_is_a_nearest_neighbour_upscale(tmp_path):
    ds = small_sprites()
    one = contact_sheet(ds, tmp_path / "1.png", rows=2, cols=2, scale=1, generator=torch.Generator().manual_seed(3))
    three = contact_sheet(ds, tmp_path / "3.png", rows=2, cols=2, scale=3, generator=torch.Generator().manual_seed(3))
    a, b = np.asarray(Image.open(one)), np.asarray(Image.open(three))
    assert b.shape == (3 * a.shape[0], 3 * a.shape[1], 3)
    np.testing.assert_array_equal(b, np.repeat(np.repeat(a, 3, 0), 3, 1))


class _ThreePoints:
    """A 2-D dataset stand-in for the contact sheet's scatter: three fixed points and their cells."""

    priors = torch.full((16,), 1 / 16)
    points = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    cells = torch.tensor([[0, 0], [3, 0], [1, 2]])

    def sample(self, n, generator):
        i = torch.arange(n) % 3
        return self.points[i], i

    def quantize(self, z):
        return self.cells[z]


def test_contact_sheet_scatter_places_and_colours_points(tmp_path):
    # points scaled to [2, size - 3] with y up (the lowest y on the bottom row), 3 x 3 dots, coloured by
    # cell k = c0 + 4 c1 with hue (0.618034 k) mod 1, HSV (hue, 0.8, 0.85) (colorsys as the oracle)
    import colorsys

    path = contact_sheet(_ThreePoints(), tmp_path / "s.png", scale=1)
    im = np.asarray(Image.open(path)).astype(int)
    size = 256
    assert im.shape == (size, size, 3)

    def rgb(k):
        return np.array(colorsys.hsv_to_rgb((0.618034 * k) % 1.0, 0.8, 0.85)) * 255

    for (row, col), k in (((size - 3, 2), 0), ((size - 3, size - 3), 3), ((2, 2), 9)):
        block = im[row - 1 : row + 2, col - 1 : col + 2].reshape(-1, 3)
        assert (np.abs(block - rgb(k)) <= 1.0).all(), (row, col, block[4], rgb(k))
    assert (im[2, size - 3] == 255).all() and (im[size // 2, size // 2] == 255).all()
    assert (im != 255).any(-1).sum() == 27  # three 3 x 3 dots, nothing else


def test_shapes3d_sphere_silhouette_geometry(shapes3d):
    # the fully covered pixels (where no floor / wall colour shows) of the sphere: a disc of radius
    # 1.15 x 8 x scale px standing on row 52 at the centre column, the same at every orientation (the sphere is
    # round), mirror-symmetric about the centre; the cube's silhouette turns with the orientation
    def solid(scale, shape, o):
        f = torch.tensor([[2, 5, 8, scale, shape, o], [6, 0, 8, scale, shape, o]])
        a, b = shapes3d.observations_from_factors(f)
        return (a - b).abs().amax(0) == 0  # background hidden exactly

    sphere = solid(7, 2, 0)
    r = 1.15 * 8 * 1.25
    assert math.pi * (r - 1.5) ** 2 < sphere.sum() < math.pi * (r + 0.5) ** 2
    assert torch.equal(sphere, sphere.flip(1))
    rows, cols = sphere.nonzero().double().unbind(1)
    assert abs(cols.mean().item() - 31.5) < 1e-9
    assert abs(rows.mean().item() - (52.0 - r - 0.5)) < 0.3  # pixel i has its centre at i + 0.5
    for o in (7, 14):
        assert torch.equal(solid(7, 2, o), sphere)
        assert torch.equal(solid(3, 1, o), solid(3, 1, 0))  # cylinder: round too
    r0 = 1.15 * 8 * 0.75  # scale class 0
    assert math.pi * (r0 - 1.5) ** 2 < solid(0, 2, 0).sum() < math.pi * (r0 + 0.5) ** 2
    assert not torch.equal(solid(7, 0, 0), solid(7, 0, 14))  # the cube turns


def test_sprites_position_extent_orientation_by_hand():
    # square half extent 0.16 S at scale 1 (area (0.32 S)^2), centred at S (0.2 + 0.6 pos) - 0.5 (pixel-centre
    # coordinates; pos_y grows down; the corners' approximate distances shift it by ~0.01 px); area is rotation
    # invariant (45 degrees: nothing is cut off);
    # the ellipse (axes 1 : 0.5) lies along x at orientation 0; the heart's lobes are on top
    sp = Sprites(n_shapes=3, n_scales=1, n_orientations=8, n_x=3, n_y=3, image_size=64)
    f = torch.tensor(
        [[0, 0, 0, 0, 2], [0, 0, 0, 1, 1], [0, 0, 1, 1, 1], [1, 0, 0, 1, 1], [1, 0, 2, 1, 1], [2, 0, 0, 1, 1]]
    )
    x = sp.observations_from_factors(f)[:, 0].double()
    cols, rows = torch.arange(64.0, dtype=torch.float64)[None, :], torch.arange(64.0, dtype=torch.float64)[:, None]

    def moments(img):
        m = img.sum()
        cx, cy = (img * cols).sum() / m, (img * rows).sum() / m
        return (
            m.item(),
            cx.item(),
            cy.item(),
            ((img * (cols - cx) ** 2).sum() / m).item(),
            ((img * (rows - cy) ** 2).sum() / m).item(),
        )

    h = 0.16 * 64
    area, cx, cy, _, _ = moments(x[0])
    assert area == pytest.approx((2 * h) ** 2, rel=0.005)
    assert cx == pytest.approx(0.2 * 64 - 0.5, abs=0.05) and cy == pytest.approx(0.8 * 64 - 0.5, abs=0.05)
    area_c, cx, cy, _, _ = moments(x[1])
    assert cx == pytest.approx(31.5, abs=0.01) and cy == pytest.approx(31.5, abs=0.01)
    assert moments(x[2])[0] == pytest.approx(area_c, rel=0.01)  # turned by 45 degrees
    # ... and still whole: its tips reach sqrt(2) h from the centre, mirror-symmetric about it
    torch.testing.assert_close(x[2], x[2].flip(1), rtol=0, atol=1e-4)
    torch.testing.assert_close(x[2], x[2].flip(0), rtol=0, atol=1e-4)
    assert x[2][31, round(31.5 - math.sqrt(2) * h)] > 0 and x[2][:, :17].max() == 0
    area_e, _, _, vx, vy = moments(x[3])
    assert area_e == pytest.approx(math.pi * 0.5 * h**2, rel=0.03)
    assert vx / vy == pytest.approx(4.0, rel=0.1)  # (a / b)^2
    _, _, _, vx90, vy90 = moments(x[4])  # turned by 90 degrees
    assert vy90 / vx90 == pytest.approx(4.0, rel=0.1)
    # a single position class is the centre of the image
    one = Sprites(n_shapes=1, n_scales=1, n_orientations=1, n_x=1, n_y=1, image_size=64)
    assert one.factor_values[3].tolist() == [0.5] and one.factor_values[4].tolist() == [0.5]
    _, cx, cy, _, _ = moments(one.observations_from_factors(torch.zeros(1, 5, dtype=torch.long))[0, 0].double())
    assert cx == pytest.approx(31.5, abs=0.05) and cy == pytest.approx(31.5, abs=0.05)
    heart = x[5]
    filled = heart.sum(1).nonzero().flatten()
    assert moments(heart)[2] < (filled.min() + filled.max()).item() / 2 - 1.0  # mass above the box centre


def test_balls_antialiased_edge_pixels_by_hand():
    # ball 1 at (x, y) = (0.5, 0.5): centre column 64 x = 32, row 63 - 64 y = 31, radius 10.24 px; a pixel
    # 10 px from the centre is covered 0.5 - (10 - 10.24) = 0.74 (white behind it), one 11 px away not at all
    b = Balls(4)
    x = b.render(torch.tensor([[0.5, 0.5, 0.15, 0.15]]))[0]
    teal = torch.tensor([2, 156, 154]) / 255
    edge = 0.26 * torch.ones(3) + 0.74 * teal
    for row, col in ((31, 42), (31, 22), (21, 32), (41, 32)):
        torch.testing.assert_close(x[:, row, col], edge, rtol=0, atol=1e-5)
    for row, col in ((31, 43), (31, 21), (20, 32), (42, 32)):
        torch.testing.assert_close(x[:, row, col], torch.ones(3))


def test_shapes3d_lambert_shading_floor_gradient_and_contact_shadow(shapes3d):
    # at yaw 0 (orientation 7) the camera sees the world light L = (-0.55, 0.65, -0.52) / |L| (x right, y up,
    # z away). A red sphere's fully covered pixels have red = 0.3 + 0.7 max(0, n . L) (Lambert, ambient 0.3)
    # with n its outward normal at the pixel centre; the floor brightens towards the viewer; the contact
    # shadow is pushed away from the light (to the right).
    def render(f):
        return shapes3d.observations_from_factors(torch.tensor([f]))[0].double()

    img = render([0, 5, 0, 7, 2, 7])  # red floor, red sphere at scale 1.25
    other = render([6, 0, 0, 7, 2, 7])
    solid = (img - other).abs().amax(0) == 0
    r = 1.15 * 8 * 1.25
    light = torch.tensor([-0.55, 0.65, -0.52], dtype=torch.float64)
    light = light / light.norm()
    rows, cols = solid.nonzero().unbind(1)
    u, v = (cols.double() + 0.5 - 32.0) / r, (rows.double() + 0.5 - (52.0 - r)) / r
    normal = torch.stack([u, -v, -(1 - u * u - v * v).clamp_min(0).sqrt()], 1)
    want = 0.3 + 0.7 * (normal @ light).clamp_min(0)
    torch.testing.assert_close(img[0, rows, cols], want, rtol=0, atol=1e-4)
    assert img[1:, rows, cols].abs().max() < 1e-6  # hue 0 is pure red
    # the floor (red) at a column clear of the object and its shadow: brighter on every lower row
    floor = img[0, 45:64, 2]
    assert (floor.diff() > 0).all() and floor[-1] > floor[0] + 0.15
    # the shadow below the base: darker right of the object (away from the light) than at the mirrored column
    assert img[0, 53, 42] < 0.7 * img[0, 53, 21]
    assert img[0, 53, 21] > 0.9 * img[0, 53, 2]  # the lit side: (almost) no shadow
