"""PNG figures of a run, drawn with PIL: reconstructions, decoded latent interventions (QLAE Fig. 4 style), the
NMI heatmap (QLAE Fig. 3 style); for 2-D data a scatter of the learned latents coloured by ground-truth cell."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from qkernels.train.data import generator, is_ground_truth

PAD = 2
# viridis-like colour ramp: value in [0, 1] -> RGB, linear between these stops
_STOPS = np.array([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], dtype=np.float64)


def colormap(v: float) -> tuple[int, int, int]:
    v = float(np.clip(v, 0, 1)) * (len(_STOPS) - 1)
    i = min(int(v), len(_STOPS) - 2)
    c = _STOPS[i] + (v - i) * (_STOPS[i + 1] - _STOPS[i])
    return tuple(int(round(x)) for x in c)


def _to_pil(img: torch.Tensor, min_size: int = 64) -> Image.Image:
    """(C, H, W) in [0, 1] -> PIL image, upscaled (nearest) to at least ``min_size`` pixels."""
    a = (img.detach().cpu().clamp(0, 1).numpy() * 255).round().astype(np.uint8)
    im = Image.fromarray(a[0], "L") if a.shape[0] == 1 else Image.fromarray(a.transpose(1, 2, 0), "RGB")
    if im.width < min_size:
        k = -(-min_size // im.width)
        im = im.resize((im.width * k, im.height * k), Image.NEAREST)
    return im.convert("RGB")


def image_grid(rows: list[list[torch.Tensor]], labels: list[str] | None = None,
               col_labels: list[str] | None = None) -> Image.Image:
    """Grid of images (rows of (C, H, W) tensors) with optional row labels on the left and column labels on
    top."""
    tiles = [[_to_pil(t) for t in r] for r in rows]
    w, h = tiles[0][0].size
    font = ImageFont.load_default()
    left = 8 + 6 * max(len(t) for t in labels) if labels else 0
    top = 14 if col_labels else 0
    ncol = max(len(r) for r in tiles)
    canvas = Image.new("RGB", (left + ncol * (w + PAD) + PAD, top + len(tiles) * (h + PAD) + PAD), "white")
    draw = ImageDraw.Draw(canvas)
    for j, text in enumerate(col_labels or []):
        draw.text((left + PAD + j * (w + PAD) + 2, 1), text[: max(w // 6, 1)], fill="black", font=font)
    for i, r in enumerate(tiles):
        y = top + PAD + i * (h + PAD)
        if labels:
            draw.text((4, y + h // 2 - 5), labels[i], fill="black", font=font)
        for j, t in enumerate(r):
            canvas.paste(t, (left + PAD + j * (w + PAD), y))
    return canvas


@torch.no_grad()
def reconstructions(model, ds, seed: int, n: int = 8) -> Image.Image:
    x = ds.observations_from_factors(ds.sample_factors(n, generator(seed, 5)))
    dev = next(model.parameters()).device
    xh = model.decode(model.encode(x.to(dev))).cpu()
    return image_grid([list(x), list(xh)], ["data", "recon"])


@torch.no_grad()
def interventions(model, ds, seed: int, max_values: int = 10) -> Image.Image:
    """Columns: the input image, its reconstruction, then row j's decodings of the input's latents with
    latent j set to each of its values (codebook / range, low to high; the row label gives the range)."""
    dev = next(model.parameters()).device
    x = ds.observations_from_factors(ds.sample_factors(256, generator(seed, 6))).to(dev)
    z = model.encode(x)
    values = model.latent_values(z.cpu())
    base = z[:1]
    recon = model.decode(base).cpu()[0]
    rows, labels = [], []
    for j, v in enumerate(values):
        if len(v) > max_values:
            v = v[torch.linspace(0, len(v) - 1, max_values).round().long()]
        zz = base.repeat(len(v), 1)
        zz[:, j] = v.to(zz)
        rows.append([x[0].cpu(), recon, *model.decode(zz).cpu()])
        labels.append(f"z{j} {float(v.min()):.2g}..{float(v.max()):.2g}")
    ncol = max(len(r) for r in rows)
    return image_grid(rows, labels, ["input", "recon", *(f"v{k + 1}" for k in range(ncol - 2))])


def nmi_heatmap(nmi, factor_names, cell: int = 30) -> Image.Image:
    """Heatmap of an (n_sources, n_latents) NMI matrix with values printed in the cells and a colour bar
    (0 to 1) on the right."""
    m = np.asarray(nmi, dtype=np.float64)
    ns, nz = m.shape
    font = ImageFont.load_default()
    left, top, bar = 90, 24, 14
    height = top + ns * cell + 8
    img = Image.new("RGB", (left + nz * cell + 16 + bar + 30, height), "white")
    d = ImageDraw.Draw(img)
    for j in range(nz):
        d.text((left + j * cell + cell // 2 - 6, 6), f"z{j}", fill="black", font=font)
    for i in range(ns):
        name = factor_names[i] if factor_names is not None else f"s{i}"
        d.text((4, top + i * cell + cell // 2 - 5), str(name)[:14], fill="black", font=font)
        for j in range(nz):
            v = m[i, j]
            x0, y0 = left + j * cell, top + i * cell
            d.rectangle([x0, y0, x0 + cell - 1, y0 + cell - 1], fill=colormap(v))
            d.text((x0 + 3, y0 + cell // 2 - 5), f"{v:.2f}"[1:] if 0 <= v < 1 else f"{v:.0f}",
                   fill="white" if v < 0.6 else "black", font=font)
    x0, y_top, y_bot = left + nz * cell + 12, top, top + ns * cell - 1
    for y in range(y_top, y_bot + 1):  # colour bar: 1 at the top, 0 at the bottom
        d.line([x0, y, x0 + bar - 1, y], fill=colormap((y_bot - y) / max(y_bot - y_top, 1)))
    d.text((x0 + bar + 3, y_top - 2), "1", fill="black", font=font)
    d.text((x0 + bar + 3, y_bot - 9), "0", fill="black", font=font)
    d.text((x0 - 4, 6), "NMI", fill="black", font=font)
    return img


@torch.no_grad()
def latent_scatter(model, ds, size: int = 400) -> Image.Image:
    """2-D data: learned latents (first two) of every sample, coloured by ground-truth cell."""
    dev = next(model.parameters()).device
    z = model.encode(ds.x.to(dev)).cpu().numpy()[:, :2]
    cells = ds.cells.numpy()
    k = cells[:, 0] + 4 * cells[:, 1]
    lo, hi = np.percentile(z, 0.5, axis=0), np.percentile(z, 99.5, axis=0)
    p = (z - lo) / np.maximum(hi - lo, 1e-9) * (size - 20) + 10
    img = Image.new("RGB", (size, size), "white")
    d = ImageDraw.Draw(img)
    for (u, v), c in zip(p, k, strict=True):
        col = colormap(c / 15.0)
        d.point((float(u), float(size - v)), fill=col)
    return img


def make_all(model, ds, cfg, folder: Path, metrics: dict) -> list[Path]:
    """Write the run's figures into ``folder``; returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    was = model.training
    model.eval()
    try:
        if is_ground_truth(ds):
            figs = {"reconstructions.png": reconstructions(model, ds, cfg.seed),
                    "interventions.png": interventions(model, ds, cfg.seed)}
            if "infomec.nmi" in metrics:
                figs["nmi.png"] = nmi_heatmap(metrics["infomec.nmi"], getattr(ds, "factor_names", None))
        else:
            figs = {"latents.png": latent_scatter(model, ds)}
        for name, im in figs.items():
            im.save(folder / name)
            out.append(folder / name)
    finally:
        model.train(was)
    return out
