"""Vectorized drawing helpers (torch, whole batches at once) for the procedural datasets.

Conventions: images are (n, C, H, W) float32 in [0, 1]; pixel (row i, col j) has its centre at
``(x, y) = (j, i)`` in pixel units; shapes are antialiased by converting a signed distance ``d``
(pixels, negative inside) into coverage ``clamp(0.5 - d, 0, 1)``.
"""

from __future__ import annotations

import torch


def pixel_grid(height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Column and row coordinates of pixel centres: two float32 (1, H, W) tensors ``(x, y)``."""
    y, x = torch.meshgrid(
        torch.arange(height, dtype=torch.float32), torch.arange(width, dtype=torch.float32), indexing="ij"
    )
    return x.unsqueeze(0), y.unsqueeze(0)


def coverage(distance: torch.Tensor) -> torch.Tensor:
    """Antialiased coverage in [0, 1] from a signed distance in pixels (negative inside)."""
    return (0.5 - distance).clamp_(0.0, 1.0)


def over(canvas: torch.Tensor, color: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Paint ``color`` (n, C) or (n, C, H, W) with coverage ``alpha`` (n, H, W) over ``canvas``
    (n, C, H, W), in place; returns canvas."""
    a = alpha.unsqueeze(1)
    if color.dim() == 2:
        color = color[:, :, None, None]
    canvas.mul_(1.0 - a).add_(color * a)
    return canvas


def hsv_to_rgb(h: torch.Tensor, s: float | torch.Tensor = 1.0, v: float | torch.Tensor = 1.0) -> torch.Tensor:
    """HSV (hue in [0, 1), cyclic) -> RGB in [0, 1]; output shape ``h.shape + (3,)``."""
    k = (torch.tensor([5.0, 3.0, 1.0], dtype=h.dtype) + h.unsqueeze(-1) * 6.0) % 6.0
    s = torch.as_tensor(s, dtype=h.dtype)
    v = torch.as_tensor(v, dtype=h.dtype)
    if s.dim():
        s = s.unsqueeze(-1)
    if v.dim():
        v = v.unsqueeze(-1)
    return v - v * s * torch.minimum(k, 4.0 - k).clamp(0.0, 1.0)


def segment_distance(
    x: torch.Tensor, y: torch.Tensor, ax: torch.Tensor, ay: torch.Tensor, bx: torch.Tensor, by: torch.Tensor
) -> torch.Tensor:
    """Distance from points (x, y) to segments a-b (endpoints broadcast as (n, 1, 1))."""
    dx, dy = bx - ax, by - ay
    t = (((x - ax) * dx + (y - ay) * dy) / (dx * dx + dy * dy).clamp_min(1e-12)).clamp(0.0, 1.0)
    return torch.hypot(x - ax - t * dx, y - ay - t * dy)


def convex_polygon_distance(x: torch.Tensor, y: torch.Tensor, px: torch.Tensor, py: torch.Tensor) -> torch.Tensor:
    """Approximate signed distance (max over edge half-planes) to convex polygons.

    ``px``, ``py``: (n, V) vertices in counter-clockwise order on screen (x right, y down means
    clockwise in the usual maths orientation; orientation is normalized here). Exact on edges,
    slightly short outside corners, which is all antialiasing needs. Degenerate (zero-area)
    polygons are empty. Returns (n, H, W).
    """
    qx, qy = px.roll(-1, dims=1), py.roll(-1, dims=1)
    ex, ey = qx - px, qy - py
    length = torch.hypot(ex, ey).clamp_min(1e-12)
    # signed area fixes the winding so that "inside" is negative for either orientation
    area = (px * qy - qx * py).sum(1, keepdim=True)
    sign = torch.where(area >= 0, 1.0, -1.0)
    nx, ny = sign * ey / length, -sign * ex / length  # outward normals
    d = torch.where(area.abs() < 1e-6, 1e4, -1e4)[:, :, None].expand(-1, *x.shape[1:]).clone()
    for v in range(px.shape[1]):
        dv = (x - px[:, v, None, None]) * nx[:, v, None, None] + (y - py[:, v, None, None]) * ny[:, v, None, None]
        d = torch.maximum(d, dv)
    return d
