"""``sprites``: dSprites-like white shapes on black, rendered on the fly on a small factor grid.

Factors (row-major, last fastest): shape (square, ellipse, heart; the first ``n_shapes``),
scale ``linspace(0.5, 1, n_scales)``, orientation ``2 pi k / n_orientations`` (k = 0..n-1; unlike
dSprites, 2 pi is not repeated), pos_x and pos_y ``linspace(0, 1, n)`` (pos_y grows downward, as
image rows). At scale 1 the sprite's half-extent is ``0.16 S`` pixels (S = image size); positions
map to centres in ``[0.2 S, 0.8 S]``. Edges are antialiased (approximate signed distances), so
every factor step changes pixels, up to the shapes' own symmetries (a square turned by 90 degrees,
an ellipse by 180 degrees).
"""

from __future__ import annotations

import math

import torch

from qkernels.data.base import GroundTruthDataset
from qkernels.data.render import coverage

SHAPES = ("square", "ellipse", "heart")
HALF_EXTENT = 0.16  # of the image size, at scale 1
ELLIPSE_AXES = (1.0, 0.5)
HEART_SCALE, HEART_SHIFT = 1.1, 0.12  # unit heart (x^2+y^2-1)^3 = x^2 y^3, centred and fitted


def _square(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    qx, qy = u.abs() - 1.0, v.abs() - 1.0
    outside = torch.hypot(qx.clamp_min(0.0), qy.clamp_min(0.0))
    return outside + torch.maximum(qx, qy).clamp_max(0.0)


def _ellipse(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    a, b = ELLIPSE_AXES
    f = (u / a) ** 2 + (v / b) ** 2 - 1.0
    grad = torch.hypot(2.0 * u / a**2, 2.0 * v / b**2).clamp_min(1e-6)
    return f / grad


def _heart(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    x, y = u * HEART_SCALE, -v * HEART_SCALE + HEART_SHIFT  # y up
    r = x * x + y * y - 1.0
    f = r**3 - x * x * y**3
    fx = 6.0 * x * r * r - 2.0 * x * y**3
    fy = 6.0 * y * r * r - 3.0 * x * x * y * y
    return f / torch.hypot(fx, fy).clamp_min(1e-6) / HEART_SCALE


_SDF = (_square, _ellipse, _heart)


class Sprites(GroundTruthDataset):
    """dSprites-like dataset of all ``n_shapes * n_scales * n_orientations * n_x * n_y`` images,
    each float32 (1, S, S) in [0, 1]. Rendering is deterministic; ``seed`` only seeds the default
    generator of :meth:`sample_factors`. ``factor_values[k]``: the value of each class.

    Examples:
        >>> import torch
        >>> from qkernels.data import Sprites
        >>> ds = Sprites(n_shapes=2, n_scales=2, n_orientations=2, n_x=2, n_y=2, image_size=16)
        >>> len(ds), ds.factor_names  # 2 ** 5 images
        (32, ('shape', 'scale', 'orientation', 'pos_x', 'pos_y'))
        >>> x, factors = ds[31]
        >>> x.shape, factors
        (torch.Size([1, 16, 16]), tensor([1, 1, 1, 1, 1]))
    """

    def __init__(
        self,
        *,
        n_shapes: int = 3,
        n_scales: int = 4,
        n_orientations: int = 8,
        n_x: int = 8,
        n_y: int = 8,
        image_size: int = 64,
        seed: int = 0,
    ):
        for name, v in (
            ("n_shapes", n_shapes),
            ("n_scales", n_scales),
            ("n_orientations", n_orientations),
            ("n_x", n_x),
            ("n_y", n_y),
            ("image_size", image_size),
        ):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if n_shapes > len(SHAPES):
            raise ValueError(f"n_shapes must be <= {len(SHAPES)}, got {n_shapes}")
        self._set_factors(
            ("shape", "scale", "orientation", "pos_x", "pos_y"), (n_shapes, n_scales, n_orientations, n_x, n_y), seed
        )
        self.shapes = SHAPES[:n_shapes]
        self.image_size = image_size
        self.observation_shape = (1, image_size, image_size)
        self.factor_values = [
            torch.arange(n_shapes, dtype=torch.float32),
            torch.linspace(0.5, 1.0, n_scales) if n_scales > 1 else torch.ones(1),
            torch.arange(n_orientations, dtype=torch.float32) * (2 * math.pi / n_orientations),
            torch.linspace(0.0, 1.0, n_x) if n_x > 1 else torch.full((1,), 0.5),
            torch.linspace(0.0, 1.0, n_y) if n_y > 1 else torch.full((1,), 0.5),
        ]

    def _observations(self, factors: torch.Tensor) -> torch.Tensor:
        s = self.image_size
        n = factors.shape[0]
        vals = [self.factor_values[k][factors[:, k]] for k in range(5)]
        half = HALF_EXTENT * s * vals[1]
        c, sn = torch.cos(vals[2]), torch.sin(vals[2])
        cx = s * (0.2 + 0.6 * vals[3]) - 0.5
        cy = s * (0.2 + 0.6 * vals[4]) - 0.5
        # evaluate only a window around each sprite (its reach is < 1.5 half-extents + 1 px)
        win = min(s, 2 * math.ceil(1.5 * HALF_EXTENT * s + 1))
        ox = (cx.round().long() - win // 2).clamp(0, s - win)
        oy = (cy.round().long() - win // 2).clamp(0, s - win)
        ramp = torch.arange(win)
        cols, rows = ox[:, None] + ramp, oy[:, None] + ramp  # (n, win)
        local = torch.empty(n, win, win)
        for k in factors[:, 0].unique().tolist():
            sel = (factors[:, 0] == k).nonzero().flatten()
            h = half[sel, None, None]
            dx = cols[sel, None, :].float() - cx[sel, None, None]
            dy = rows[sel, :, None].float() - cy[sel, None, None]
            cs, ss = c[sel, None, None], sn[sel, None, None]
            u = (cs * dx + ss * dy) / h
            v = (cs * dy - ss * dx) / h
            local[sel] = coverage(_SDF[k](u, v) * h)
        out = torch.zeros(n, s, s)
        out[torch.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]] = local
        return out.unsqueeze(1)
