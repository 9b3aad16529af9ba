"""``contact_sheet``: a PNG grid of dataset images, for humans to check a dataset at a glance."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from qkernels.data._files import pil_image


def contact_sheet(
    dataset,
    path: str | os.PathLike,
    *,
    rows: int = 8,
    cols: int = 8,
    vary: int | None = None,
    scale: int = 2,
    pad: int = 2,
    generator: torch.Generator | None = None,
) -> Path:
    """Write a ``rows x cols`` grid of ``dataset`` images to ``path`` (PNG); returns the path.

    ``vary=None``: random images (``dataset.sample_factors``). ``vary=k`` (a factor index):
    each row is one random factor combination with factor ``k`` swept over up to ``cols``
    evenly spaced classes, which shows what that factor does. Datasets without factors but with
    :meth:`sample` (``quantized_grid2d``) are drawn as a scatter of x coloured by cell.

    Examples:
        >>> import tempfile
        >>> from PIL import Image
        >>> from qkernels.data import Sprites, contact_sheet
        >>> ds = Sprites(n_shapes=2, n_scales=2, n_orientations=2, n_x=2, n_y=2, image_size=16)
        >>> path = contact_sheet(ds, tempfile.mkdtemp() + "/sheet.png", rows=2, cols=2, vary=0)
        >>> path.suffix, Image.open(path).format
        ('.png', 'PNG')
    """
    for name, v in (("rows", rows), ("cols", cols), ("scale", scale)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if isinstance(pad, bool) or not isinstance(pad, int) or pad < 0:
        raise ValueError(f"pad must be a non-negative int, got {pad!r}")
    Image = pil_image("qkernels.data.contact_sheet")  # before any work
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    path = Path(path)
    if not hasattr(dataset, "observations_from_factors"):
        if not hasattr(dataset, "sample"):
            raise TypeError(f"dataset must be a GroundTruthDataset or have .sample, got {type(dataset).__name__}")
        _scatter(dataset, path, size=64 * scale * 4, generator=g)
        return path
    if vary is None:
        factors = dataset.sample_factors(rows * cols, g)
    else:
        if isinstance(vary, bool) or not isinstance(vary, int) or not 0 <= vary < len(dataset.factor_sizes):
            raise ValueError(f"vary must be a factor index in [0, {len(dataset.factor_sizes)}), got {vary!r}")
        size = dataset.factor_sizes[vary]
        steps = torch.linspace(0, size - 1, min(cols, size)).round().long()
        cols = len(steps)
        base = dataset.sample_factors(rows, g)
        factors = base.repeat_interleave(cols, dim=0)
        factors[:, vary] = steps.repeat(rows)
    x = dataset.observations_from_factors(factors)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    n, _, h, w = x.shape
    sheet = torch.full((3, rows * (h + pad) + pad, cols * (w + pad) + pad), 0.5)
    for i in range(n):
        r, c = divmod(i, cols)
        top, left = pad + r * (h + pad), pad + c * (w + pad)
        sheet[:, top : top + h, left : left + w] = x[i]
    img = (sheet.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    im = Image.fromarray(np.ascontiguousarray(img))
    if scale > 1:
        im = im.resize((im.width * scale, im.height * scale), Image.Resampling.NEAREST)
    im.save(path)
    return path


def _scatter(dataset, path: Path, *, size: int, generator: torch.Generator) -> None:
    """2-D observations as points on a white square, coloured by ground-truth cell."""
    x, z = dataset.sample(4000, generator)
    cells = dataset.quantize(z)
    k = (cells[:, 0] + len(dataset.priors) ** 0.5 * cells[:, 1]).long() % 16
    hue = (k.float() * 0.618034) % 1.0
    from qkernels.data.render import hsv_to_rgb

    rgb = (hsv_to_rgb(hue, 0.8, 0.85) * 255).to(torch.uint8).numpy()
    lo, hi = x.min(0).values, x.max(0).values
    p = ((x - lo) / (hi - lo).clamp_min(1e-9) * (size - 5) + 2).long().numpy()
    canvas = np.full((size, size, 3), 255, np.uint8)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            canvas[size - 1 - (p[:, 1] + dy), p[:, 0] + dx] = rgb
    pil_image("qkernels.data.contact_sheet").fromarray(canvas).save(path)
