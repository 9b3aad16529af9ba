"""``shapes3d_procedural``: a Shapes3D-like room corner with one object, with the six Shapes3D
factors and sizes, rendered from simple shaded geometry so Shapes3D pipelines run without the file.

Factors (row-major, as the real file): floor_hue 10, wall_hue 10, object_hue 10 (hue k/10, HSV
saturation 1), scale 8 (``linspace(0.75, 1.25)``), shape 4 (cube, cylinder, sphere, capsule),
orientation 15 (``linspace(-30, 30)`` degrees: the camera's yaw about the scene).

Scene (pixel units for S = 64, scaled with S): two walls meet in a vertical corner whose column
moves with the yaw; their floor lines slope away from it; the floor gets brighter towards the
viewer. The object stands at the bottom centre; a fixed world light, seen from the rotated
camera, gives Lambert shading (0.3 ambient) and a soft contact shadow. The cube and the lying
capsule turn with the yaw; the cylinder's and sphere's shading follows the light.

Speed: the geometry depends only on (scale, shape, orientation) and (orientation), 480 + 15
maps computed once at construction; an image is then a few multiply-adds of those maps with the
three hue colours.
"""

from __future__ import annotations

import math

import torch

from qkernels.data.base import GroundTruthDataset
from qkernels.data.render import convex_polygon_distance, coverage, hsv_to_rgb, segment_distance

FACTORS = ("floor_hue", "wall_hue", "object_hue", "scale", "shape", "orientation")
SIZES = (10, 10, 10, 8, 4, 15)
SHAPES = ("cube", "cylinder", "sphere", "capsule")
LIGHT = (-0.55, 0.65, -0.52)  # world direction towards the light (x right, y up, z away)
AMBIENT, ELEVATION, SHADOW = 0.3, 0.35, 0.45
CORNER_ROW, CORNER_SWING = 30.0, 14.0  # floor-line row at the corner; corner column swing
BASE_ROW, HALF_SIZE = 52.0, 8.0  # object base row; object half-size at scale 1


def _light_in_camera(yaw: torch.Tensor) -> torch.Tensor:
    """World light direction seen by a camera turned by ``yaw`` (n,) -> (n, 3) unit vectors."""
    lx, ly, lz = LIGHT
    c, s = torch.cos(yaw), torch.sin(yaw)
    v = torch.stack([c * lx - s * lz, torch.full_like(yaw, ly), s * lx + c * lz], dim=1)
    return v / v.norm(dim=1, keepdim=True)


def _lambert(nx, ny, nz, light: torch.Tensor) -> torch.Tensor:
    l = light[:, :, None, None]
    return AMBIENT + (1 - AMBIENT) * (nx * l[:, 0] + ny * l[:, 1] + nz * l[:, 2]).clamp_min(0.0)


class Shapes3DProcedural(GroundTruthDataset):
    """All 480,000 Shapes3D factor combinations, rendered on demand: float32 (3, S, S) in [0, 1].

    Rendering is deterministic; ``seed`` only seeds the default generator of
    :meth:`sample_factors`. ``factor_values[k]``: the Shapes3D value of each class.

    Examples:
        >>> import torch
        >>> from qkernels.data import Shapes3DProcedural
        >>> ds = Shapes3DProcedural(image_size=16)
        >>> len(ds), ds.factor_sizes
        (480000, (10, 10, 10, 8, 4, 15))
        >>> factors = ds.sample_factors(3, torch.Generator().manual_seed(0))
        >>> ds.observations_from_factors(factors).shape
        torch.Size([3, 3, 16, 16])
    """

    def __init__(self, *, image_size: int = 64, seed: int = 0):
        if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8:
            raise ValueError(f"image_size must be an int >= 8, got {image_size!r}")
        self._set_factors(FACTORS, SIZES, seed)
        self.image_size = image_size
        self.observation_shape = (3, image_size, image_size)
        self.factor_values = [
            torch.arange(10) / 10.0,
            torch.arange(10) / 10.0,
            torch.arange(10) / 10.0,
            torch.linspace(0.75, 1.25, 8),
            torch.arange(4.0),
            torch.linspace(-30.0, 30.0, 15),
        ]
        self._hues = hsv_to_rgb(torch.arange(10) / 10.0)  # (10, 3)
        self._build_maps()

    # ---- one-time geometry ---------------------------------------------------------------------
    def _grid(self):
        k = self.image_size / 64.0
        r = (torch.arange(self.image_size, dtype=torch.float32) + 0.5) / k
        y, x = torch.meshgrid(r, r, indexing="ij")  # 64-pixel units, pixel centres
        return x.unsqueeze(0), y.unsqueeze(0), k

    def _build_maps(self) -> None:
        x, y, k = self._grid()
        yaw = torch.deg2rad(self.factor_values[5])  # (15,)
        light = _light_in_camera(yaw)
        # background: floor (1 - wall) coverage and shading per orientation
        xc = (32.0 + CORNER_SWING * torch.sin(yaw) / math.sin(math.radians(30)))[:, None, None]
        slope_l = (0.32 * (1 - 0.5 * torch.sin(yaw)))[:, None, None]
        slope_r = (0.32 * (1 + 0.5 * torch.sin(yaw)))[:, None, None]
        slope = torch.where(x < xc, -slope_l, slope_r)
        line = CORNER_ROW + slope * (x - xc)
        floor = coverage((line - y) / torch.sqrt(1 + slope**2) * k)
        floor_shade = 0.55 + 0.4 * ((y - CORNER_ROW) / (64.0 - CORNER_ROW)).clamp(0, 1)
        left = coverage((x - xc) * k)  # 1 on the left wall
        wall_l = 0.9 + 0.08 * torch.sin(yaw)[:, None, None]
        wall_r = 0.68 - 0.08 * torch.sin(yaw)[:, None, None]
        wall_shade = (left * wall_l + (1 - left) * wall_r) * (0.92 + 0.08 * y / CORNER_ROW)
        self._floor = floor * floor_shade  # (15, H, W)
        self._wall = (1 - floor) * wall_shade

        # objects: every (scale, shape, orientation) -> coverage and shaded coverage
        sc = self.factor_values[3].repeat_interleave(4 * 15)
        sh = torch.arange(4).repeat_interleave(15).repeat(8)
        o = torch.arange(15).repeat(32)
        h = HALF_SIZE * sc[:, None, None]
        lit = light[o]
        alpha = torch.zeros(480, *x.shape[1:])
        shade = torch.zeros_like(alpha)
        for s, draw in enumerate((self._cube, self._cylinder, self._sphere, self._capsule)):
            sel = (sh == s).nonzero().flatten()
            a, d = draw(x, y, k, h[sel], yaw[o[sel]], lit[sel])
            alpha[sel], shade[sel] = a, d
        self._obj_alpha = alpha.view(8, 4, 15, *alpha.shape[1:])
        self._obj_shaded = (alpha * shade).view_as(self._obj_alpha)

        # contact shadow per (scale, orientation): a soft ellipse pushed away from the light
        hs = HALF_SIZE * self.factor_values[3][:, None, None, None]  # (8, 1, 1, 1)
        off = -light[:, 0][None, :, None, None] * hs * 0.8
        e = (((x - 32.0 - off) / (1.5 * hs)) ** 2 + ((y - BASE_ROW) / (0.5 * hs)) ** 2).sqrt()
        shadow = SHADOW * (1.0 - e).clamp(0, 0.35) / 0.35  # (8, 15, H, W)
        self._floor_shadowed = (self._floor * (1.0 - shadow)).contiguous()

    @staticmethod
    def _cube(x, y, k, h, yaw, light):
        phi = (yaw + 0.45)[:, None]
        corners = torch.tensor([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]])  # ccw (X, Z)
        c, s = torch.cos(phi), torch.sin(phi)
        hx = h[:, 0]  # (m, 1)
        wx = hx * (c * corners[:, 0] - s * corners[:, 1])  # world X of the 4 base corners (m, 4)
        wz = hx * (s * corners[:, 0] + c * corners[:, 1])
        px = 32.0 + wx
        bottom = BASE_ROW - ELEVATION * wz - 0.3 * hx  # base sits a little above the base row
        top = bottom - 2 * hx
        dists, shades = [convex_polygon_distance(x, y, px, top)], []
        shades.append(_lambert(torch.zeros(()), torch.ones(()), torch.zeros(()), light).expand(-1, *x.shape[1:]))
        big = torch.full_like(dists[0], 1e4)
        for f in range(4):
            g = (f + 1) % 4
            nx = (wx[:, f] + wx[:, g])[:, None, None]
            nz = (wz[:, f] + wz[:, g])[:, None, None]
            norm = torch.hypot(nx, nz)
            nx, nz = nx / norm, nz / norm
            qx = torch.stack([px[:, f], px[:, g], px[:, g], px[:, f]], 1)
            qy = torch.stack([bottom[:, f], bottom[:, g], top[:, g], top[:, f]], 1)
            d = convex_polygon_distance(x, y, qx, qy)
            dists.append(torch.where(nz < -0.05, d, big))  # only faces turned to the camera
            shades.append(_lambert(nx, torch.zeros(()), nz, light).expand_as(d))
        d = torch.stack(dists)  # (5, m, H, W)
        face = d.argmin(0, keepdim=True)
        shade = torch.gather(torch.stack(shades), 0, face)[0]
        # the visible faces tile the silhouette: their coverages sum to 1 across a shared edge
        # (coverage is linear in the signed distance), where min(distance) would leave a seam
        # of 50% background between two faces
        return (coverage(d * k).sum(0)).clamp_(max=1.0), shade

    @staticmethod
    def _cylinder(x, y, k, h, yaw, light):
        r, ey = h, ELEVATION * h
        base = BASE_ROW - 0.2 * h
        top = base - 2.2 * h
        u = ((x - 32.0) / r).clamp(-1, 1)
        side = torch.maximum((x - 32.0).abs() - r, torch.maximum(top - y, y - base))
        top_d = (torch.hypot((x - 32.0) / r, (y - top) / ey) - 1) * ey
        bot_d = (torch.hypot((x - 32.0) / r, (y - base) / ey) - 1) * ey
        d = torch.minimum(torch.minimum(side, top_d), bot_d)
        side_shade = _lambert(u, torch.zeros(()), -(1 - u * u).clamp_min(0).sqrt(), light)
        top_shade = _lambert(torch.zeros(()), torch.ones(()), torch.zeros(()), light)
        shade = torch.where(top_d < 0, top_shade.expand_as(side_shade), side_shade)
        return coverage(d * k), shade

    @staticmethod
    def _sphere(x, y, k, h, yaw, light):
        r = 1.15 * h
        u, v = (x - 32.0) / r, (y - (BASE_ROW - r)) / r
        rho = torch.hypot(u, v)
        nz = -(1 - (u * u + v * v)).clamp_min(0).sqrt()
        return coverage((rho - 1) * r * k), _lambert(u, -v, nz, light)

    @staticmethod
    def _capsule(x, y, k, h, yaw, light):
        r = 0.75 * h
        length = 1.3 * h
        c, s = torch.cos(yaw + 0.9)[:, None, None], torch.sin(yaw + 0.9)[:, None, None]
        cy = BASE_ROW - r
        ax, ay = 32.0 - length * c, cy + ELEVATION * length * s
        bx, by = 32.0 + length * c, cy - ELEVATION * length * s
        dist = segment_distance(x, y, ax, ay, bx, by)
        dx, dy = bx - ax, by - ay
        t = (((x - ax) * dx + (y - ay) * dy) / (dx * dx + dy * dy).clamp_min(1e-9)).clamp(0, 1)
        u, v = (x - ax - t * dx) / r, (y - ay - t * dy) / r
        nz = -(1 - (u * u + v * v)).clamp_min(0).sqrt()
        return coverage((dist - r) * k), _lambert(u, -v, nz, light)

    # ---- per-batch composition -----------------------------------------------------------------
    def _observations(self, factors: torch.Tensor) -> torch.Tensor:
        fh, wh, oh, sc, sh, o = factors.unbind(1)
        hue = self._hues
        # background without the object's footprint, then the premultiplied object on top
        keep = 1.0 - self._obj_alpha[sc, sh, o].unsqueeze(1)
        img = hue[fh][:, :, None, None] * (self._floor_shadowed[sc, o].unsqueeze(1) * keep)
        img.addcmul_(hue[wh][:, :, None, None], self._wall[o].unsqueeze(1) * keep)
        img.addcmul_(hue[oh][:, :, None, None], self._obj_shaded[sc, sh, o].unsqueeze(1))
        return img.clamp_(0.0, 1.0)
