"""PNG figures of a run, drawn with PIL: reconstructions, decoded latent interventions (QLAE Fig. 4 style), the
NMI heatmap (QLAE Fig. 3 style); for 2-D data a scatter of the learned latents coloured by ground-truth cell; the
loss curves of ``log.jsonl`` (one panel per logged term, log scale where it spans a decade), also for several
runs on one figure (``qkernels compare --curves``). Each figure is titled with model, dataset and step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from qkernels._extras import needs
from qkernels.train.data import generator, is_ground_truth
from qkernels.train.files import FIGURES, LOG, METRICS_FILE

with needs("qkernels.train.figures", "train"):
    from PIL import Image, ImageDraw, ImageFont

PAD = 2
# tab10: one colour per run
PALETTE = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
]
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


def image_grid(
    rows: list[list[torch.Tensor]], labels: list[str] | None = None, col_labels: list[str] | None = None
) -> Image.Image:
    """Grid of images (rows of (C, H, W) tensors) with optional row labels on the left (lines split at "\\n",
    centred on the row) and column labels on top."""
    tiles = [[_to_pil(t) for t in r] for r in rows]
    w, h = tiles[0][0].size
    font = ImageFont.load_default()
    left = 8 + 6 * max(len(line) for t in labels for line in t.split("\n")) if labels else 0
    top = 14 if col_labels else 0
    ncol = max(len(r) for r in tiles)
    canvas = Image.new("RGB", (left + ncol * (w + PAD) + PAD, top + len(tiles) * (h + PAD) + PAD), "white")
    draw = ImageDraw.Draw(canvas)
    for j, text in enumerate(col_labels or []):
        draw.text((left + PAD + j * (w + PAD) + 2, 1), text[: max(w // 6, 1)], fill="black", font=font)
    for i, r in enumerate(tiles):
        y = top + PAD + i * (h + PAD)
        if labels:
            lines = labels[i].split("\n")
            for k, line in enumerate(lines):
                draw.text((4, y + h // 2 - 6 * len(lines) + 12 * k + 1), line, fill="black", font=font)
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
    latent j set to each of its values (codebook / range, low to high; the row label names the latent and the
    range, "z3" over "-1 to 1")."""
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
        labels.append(f"z{j}\n{float(v.min()):.2g} to {float(v.max()):.2g}")
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
            d.text(
                (x0 + 3, y0 + cell // 2 - 5),
                f"{v:.2f}"[1:] if 0 <= v < 1 else f"{v:.0f}",
                fill="white" if v < 0.6 else "black",
                font=font,
            )
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


def _font(size: int = 12):
    return ImageFont.load_default(size=size)  # FreeType's scalable font where PIL has it, else the bitmap one


def _text_size(draw: ImageDraw.ImageDraw, text: str, font) -> tuple[int, int]:
    box = draw.textbbox((0, 0), text, font=font)
    return box[2] - box[0], box[3] - box[1]


def titled(img: Image.Image, title: str, note: str | None = None) -> Image.Image:
    """``img`` under a white band holding ``title`` (and a smaller ``note`` line); widened to fit the text."""
    lines = [(title, _font(13))] + ([(note, _font(11))] if note else [])
    probe = ImageDraw.Draw(img)
    sizes = [_text_size(probe, t, f) for t, f in lines]
    band = 6 + sum(h + 6 for _, h in sizes)
    canvas = Image.new("RGB", (max(img.width, 12 + max(w for w, _ in sizes)), band + img.height), "white")
    d = ImageDraw.Draw(canvas)
    y = 4
    for (text, font), (_, h) in zip(lines, sizes, strict=True):
        d.text((6, y), text, fill="black", font=font)
        y += h + 6
    canvas.paste(img, (0, band))
    return canvas


def run_title(cfg, step: int) -> str:
    return f"{cfg.model} on {cfg.dataset}, step {step}"


# ---------------------------------------------------------------------------------------------- loss curves
def read_log(path: str | Path) -> list[dict]:
    """The ``{"type": "train"}`` records of a log.jsonl (empty when there is no file)."""
    path = Path(path)
    if not path.is_file():
        return []
    recs = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    return [r for r in recs if r.get("type") == "train"]


def _terms(runs) -> list[str]:
    seen: dict[str, None] = {}
    for _, recs in runs:
        for r in recs:
            for k, v in r.items():
                if k not in ("type", "step") and isinstance(v, (int, float)) and not isinstance(v, bool):
                    seen.setdefault(k)
    names = list(seen)
    return sorted(names, key=lambda k: (k != "total", names.index(k)))


def log_scale(values) -> bool:
    """Log axis for positive values that span a decade or more."""
    v = [x for x in values if math.isfinite(x)]
    return bool(v) and min(v) > 0 and max(v) / min(v) >= 10


def nice_ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    """About ``n`` round ticks (1, 2, 2.5, 5 x 10^k apart) inside [lo, hi]."""
    if not hi > lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * 0.999)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


def _panel(img: Image.Image, box, name: str, series, font, small, xrange: tuple[float, float]) -> None:
    """One term: axes in ``box`` (x0, y0, x1, y1) over steps ``xrange``, one polyline per (colour,
    [(step, value)]); the y axis labelled with the term (", log scale" where it is)."""
    d = ImageDraw.Draw(img)
    x0, y0, x1, y1 = box
    left, bottom, top = x0 + 68, y1 - 24, y0 + 20
    right = x1 - 10
    d.text((left, y0 + 2), name, fill="black", font=font)
    ys = [v for _, pts in series for _, v in pts]
    logy = log_scale(ys)
    _vertical_text(img, (x0 + 4, (top + bottom) / 2), name + (", log scale" if logy else ""), small)
    if logy:
        lo_e, hi_e = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
        hi_e = max(hi_e, lo_e + 1)
        ylo, yhi = float(lo_e), float(hi_e)
        every = max(1, math.ceil((hi_e - lo_e) / 6))
        yticks = [(float(e), f"{10.0**e:g}") for e in range(lo_e, hi_e + 1, every)]
        fy = math.log10
    else:
        lo, hi = min(ys), max(ys)
        pad = (hi - lo) * 0.06 or abs(lo) * 0.06 or 1.0
        ylo, yhi = lo - pad, hi + pad
        yticks = [(t, f"{t:.3g}") for t in nice_ticks(ylo, yhi)]
        fy = float
    xlo, xhi = xrange
    if xhi == xlo:
        xlo, xhi = xlo - 1, xhi + 1

    def px(s: float) -> float:
        return left + (s - xlo) / (xhi - xlo) * (right - left)

    def py(v: float) -> float:
        return bottom - (fy(v) - ylo) / (yhi - ylo) * (bottom - top)

    d.rectangle([left, top, right, bottom], outline=(90, 90, 90))
    for t, label in yticks:
        yy = bottom - (t - ylo) / (yhi - ylo) * (bottom - top)
        d.line([left, yy, right, yy], fill=(225, 225, 225))
        d.line([left - 3, yy, left, yy], fill=(90, 90, 90))
        w, h = _text_size(d, label, small)
        d.text((left - 5 - w, yy - h / 2 - 2), label, fill="black", font=small)
    for t in nice_ticks(xlo, xhi):
        xx = px(t)
        d.line([xx, bottom, xx, bottom + 3], fill=(90, 90, 90))
        label = f"{t:g}"
        w, _ = _text_size(d, label, small)
        d.text((xx - w / 2, bottom + 5), label, fill="black", font=small)
    for colour, pts in series:
        xy = [(px(s), py(v)) for s, v in pts]
        if len(xy) == 1:
            d.ellipse([xy[0][0] - 2, xy[0][1] - 2, xy[0][0] + 2, xy[0][1] + 2], fill=colour)
        else:
            d.line(xy, fill=colour, width=2)


def _vertical_text(img: Image.Image, at: tuple[float, float], text: str, font) -> None:
    """``text`` rotated 90 degrees (read bottom to top), its left edge at x = at[0], centred on y = at[1]."""
    w, h = _text_size(ImageDraw.Draw(img), text, font)
    strip = Image.new("RGB", (w + 4, h + 6), "white")
    ImageDraw.Draw(strip).text((2, 0), text, fill="black", font=font)
    strip = strip.rotate(90, expand=True)
    img.paste(strip, (int(at[0]), int(at[1] - strip.height / 2)))


def loss_curves(
    runs: list[tuple[str, list[dict]]],
    title: str,
    *,
    panel: tuple[int, int] = (320, 180),
    cols: int = 2,
    note: str = "",
) -> Image.Image:
    """Each logged term of each run over steps: one panel per term that varies (log y where it spans a decade),
    one colour per run (legend when several); terms constant in every run are listed below. ``runs``: (label,
    train records of a log.jsonl); ``note``: added to the line under the title."""
    font, small = _font(12), _font(11)
    terms = _terms(runs)
    series_of, constant = {}, []
    for k in terms:
        series = [
            (PALETTE[i % len(PALETTE)], [(r["step"], float(r[k])) for r in recs if k in r])
            for i, (_, recs) in enumerate(runs)
        ]
        series = [(c, pts) for c, pts in series if pts]
        values = {v for _, pts in series for _, v in pts}
        if len(values) > 1:
            series_of[k] = series
        elif values:
            constant.append(f"{k} {next(iter(values)):.4g}")
    cols = max(1, min(cols, len(series_of)))
    rows = -(-len(series_of) // cols)
    legend = [label for label, _ in runs] if len(runs) > 1 else []
    head = 8 + 16 * len(legend)
    foot = 20 if constant else 4
    img = Image.new("RGB", (max(cols * panel[0], 280), head + rows * panel[1] + foot), "white")
    d = ImageDraw.Draw(img)
    for i, label in enumerate(legend):
        y = 6 + 16 * i
        colour = PALETTE[i % len(PALETTE)]
        d.line([10, y + 7, 34, y + 7], fill=colour, width=3)
        d.text((40, y), label, fill="black", font=font)
    steps = [r["step"] for _, recs in runs for r in recs]
    xrange = (min(steps), max(steps)) if steps else (0, 1)
    for n, (k, series) in enumerate(series_of.items()):
        r, c = divmod(n, cols)
        x0, y0 = c * panel[0], head + r * panel[1]
        _panel(img, (x0, y0, x0 + panel[0], y0 + panel[1]), k, series, font, small, xrange)
    if not series_of:
        d.text((10, head + 4), "no term changed over the logged steps", fill="black", font=font)
    if constant:
        d.text((10, img.height - 17), "constant: " + ", ".join(constant), fill=(80, 80, 80), font=small)
    return titled(img, title, "x: optimizer step; one panel per logged term (log.jsonl)" + note)


def loss_figure(out: str | Path, cfg, step: int | None = None) -> Path | None:
    """figures/loss.png of the run in ``out`` from its log.jsonl (None when the log has no training lines), titled
    with ``step``, the step of the weights the other figures and metrics.json show (default: the last logged one);
    when the log ends before it (losses are logged every ``log_every`` steps; a stopped run's checkpoint can come
    later), the note under the title says where."""
    out = Path(out)
    recs = read_log(out / LOG)
    if not recs:
        return None
    last = recs[-1]["step"]
    step = last if step is None else step
    note = f"; logged every {cfg.log_every} steps, the last at step {last}" if last != step else ""
    path = out / FIGURES / "loss.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    loss_curves([(str(out), recs)], f"{run_title(cfg, step)}: training losses", note=note).save(path)
    return path


def compare_curves(run_dirs, path: str | Path) -> Path:
    """The loss curves of several runs on one figure (one colour per run; the legend names each run's model,
    dataset and steps) written to ``path``."""
    runs, models, datasets = [], set(), set()
    for d in run_dirs:
        d = Path(d)
        recs = read_log(d / LOG)
        if not recs:
            raise FileNotFoundError(f"{d / LOG}: no training lines to draw")
        meta = json.loads((d / METRICS_FILE).read_text()) if (d / METRICS_FILE).is_file() else {}
        model, dataset = meta.get("model", "?"), meta.get("dataset", "?")
        models.add(model)
        datasets.add(dataset)
        runs.append((f"{d}: {model} on {dataset}, {recs[-1]['step']} steps", recs))
    what = " vs ".join(sorted(models))
    on = f" on {next(iter(datasets))}" if len(datasets) == 1 else ""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    loss_curves(runs, f"training losses of {len(runs)} runs: {what}{on}").save(path)
    return path


def make_all(model, ds, cfg, folder: Path, metrics: dict) -> list[Path]:
    """Write the run's figures into ``folder`` (each titled with model, dataset and step); returns the paths.
    The loss curves (:func:`loss_figure`) are drawn from the log by :func:`~qkernels.train.evaluate.finish_run`."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    was = model.training
    model.eval()
    head = run_title(cfg, metrics.get("step", "?"))
    try:
        if is_ground_truth(ds):
            figs = {
                "reconstructions.png": titled(
                    reconstructions(model, ds, cfg.seed),
                    f"{head}: reconstructions",
                    "top: data, bottom: reconstruction",
                ),
                "interventions.png": titled(
                    interventions(model, ds, cfg.seed),
                    f"{head}: interventions",
                    "row zj: the input decoded with latent j set to each of its values, "
                    "low (v1) to high (the row's range)",
                ),
            }
            if "infomec.nmi" in metrics:
                figs["nmi.png"] = titled(
                    nmi_heatmap(metrics["infomec.nmi"], getattr(ds, "factor_names", None)),
                    f"{head}: NMI",
                    "normalized mutual information, sources x latents",
                )
        else:
            figs = {
                "latents.png": titled(
                    latent_scatter(model, ds),
                    f"{head}: latents",
                    "first two latents of every sample, coloured by ground-truth cell",
                )
            }
        for name, im in figs.items():
            im.save(folder / name)
            out.append(folder / name)
    finally:
        model.train(was)
    return out
