"""``balls``: coloured balls on a white canvas (Ahuja et al. 2022; Lachapelle et al. 2023).

Latents ``[x1, y1, x2, y2, ...]`` in [0.1, 0.9]; ball b is a filled antialiased disc of radius
``radius * image_size`` pixels (0.16 * 64 = 10.24 px) centred at column ``S x`` and row
``S - 1 - S y`` (S = image size; y points up); later balls occlude earlier ones.

Samplers:

* ``"iid"``: every coordinate ``U(0.1, 0.9)``, rejecting draws with two centres closer than
  ``2 * radius``.
* ``"scm_linear"`` (2 balls): ball 1 iid; if ``x1 + y1 >= 1`` then ``x2 ~ U(0.1, 0.5)``,
  ``y2 ~ U(0.5, 0.9)``, else ``x2 ~ U(0.5, 0.9)``, ``y2 ~ U(0.1, 0.5)`` (no overlap rejection).
* ``"scm_nonlinear"``: the same with the test ``1.25 (x1^2 + y1^2) >= 1``.
* ``"quantized"``: each ball's (x, y) from its own ManhattanUniform grid (see ``grid2d``), mapped
  affinely onto [0.1, 0.9]^2 — the Cliff paper's balls setting (axis-aligned discontinuities).

For the discrete metrics each coordinate is cut into ``n_bins`` equal bins of [0.1, 0.9]
(``factor_sizes = (n_bins,) * 2 * n_balls``); :meth:`observations_from_factors` renders at bin
centres and :meth:`sample_factors` discretizes draws of the sampler, so metrics see the data
distribution rather than a uniform grid (which the SCM samplers do not cover).
"""

from __future__ import annotations

import numpy as np
import torch

from qkernels.data.base import GroundTruthDataset, as_long_tensor
from qkernels.data.grid2d import manhattan_uniform_params, sample_manhattan_uniform
from qkernels.data.render import coverage, over, pixel_grid

BALL_COLORS = ((2, 156, 154), (222, 100, 100), (149, 59, 123), (74, 114, 179), (27, 159, 119))
SAMPLERS = ("iid", "scm_linear", "scm_nonlinear", "quantized")
LOW, HIGH = 0.1, 0.9


class Balls(GroundTruthDataset):
    """Fixed dataset of ``n`` latents drawn with ``sampler`` from ``seed``.

    ``dataset[i] -> (image float32 (3, S, S), factors int64 (2 n_balls,))``; the continuous
    latents are ``dataset.latents`` (n, 2 n_balls) float32 in [0.1, 0.9]; the factors are their bins
    (``n_bins`` per coordinate). Fresh draws: :meth:`sample` -> ``(images, latents)``. Any latents render
    with :meth:`render`.

    Examples:
        >>> import torch
        >>> from qkernels.data import Balls
        >>> ds = Balls(n=8, n_balls=2, image_size=16)
        >>> x, factors = ds[0]
        >>> x.shape, x.dtype, factors.shape, ds.factor_sizes
        (torch.Size([3, 16, 16]), torch.float32, torch.Size([4]), (8, 8, 8, 8))
        >>> torch.equal(ds.discretize(ds.latents), ds.factors)
        True
    """

    def __init__(
        self,
        n: int = 20000,
        sampler: str = "iid",
        *,
        n_balls: int = 2,
        n_bins: int = 8,
        radius: float = 0.16,
        image_size: int = 64,
        seed: int = 0,
    ):
        for name, v in (("n", n), ("n_balls", n_balls), ("n_bins", n_bins), ("image_size", image_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        if n_balls > len(BALL_COLORS):
            raise ValueError(f"n_balls must be <= {len(BALL_COLORS)}, got {n_balls}")
        if sampler.startswith("scm") and n_balls != 2:
            raise ValueError(f"sampler {sampler!r} needs n_balls=2, got {n_balls}")
        if not isinstance(radius, (int, float)) or not 0 < radius < 0.5:
            raise ValueError(f"radius must be in (0, 0.5), got {radius!r}")
        names = [f"{a}{b + 1}" for b in range(n_balls) for a in ("x", "y")]
        self._set_factors(names, [n_bins] * (2 * n_balls), seed)
        self.sampler, self.n_balls, self.n_bins = sampler, n_balls, n_bins
        self.radius, self.image_size = float(radius), image_size
        self.observation_shape = (3, image_size, image_size)
        self.colors = torch.tensor(BALL_COLORS[:n_balls], dtype=torch.float32) / 255.0
        g = torch.Generator().manual_seed(seed)
        self.grids = [manhattan_uniform_params(g) for _ in range(n_balls)] if sampler == "quantized" else []
        self.latents = self.sample_latents(n, g)
        self.factors = self.discretize(self.latents)
        self._x, self._y = pixel_grid(image_size, image_size)

    # ---- latents -------------------------------------------------------------------------------
    def sample_latents(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` latents from the sampler -> float32 (n, 2 n_balls) in [0.1, 0.9]."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        g = self._check_generator(generator)

        def u(m, k, lo=LOW, hi=HIGH):
            return lo + (hi - lo) * torch.rand(m, k, generator=g, dtype=torch.float64)

        if self.sampler == "iid":
            out = torch.empty(0, 2 * self.n_balls, dtype=torch.float64)
            for _ in range(1000):
                if out.shape[0] >= n:
                    break
                z = u(max(2 * (n - out.shape[0]), 64), 2 * self.n_balls)
                c = z.view(-1, self.n_balls, 2)
                d = torch.cdist(c, c) + 4.0 * torch.eye(self.n_balls, dtype=z.dtype)
                out = torch.cat([out, z[d.flatten(1).min(1).values >= 2 * self.radius]])
            else:
                raise ValueError(f"radius {self.radius} leaves almost no room for {self.n_balls} non-overlapping balls")
            out = out[:n]
        elif self.sampler == "quantized":
            cols = []
            for thresholds, priors in self.grids:
                z, _ = sample_manhattan_uniform(thresholds, priors, n, g)
                lo, hi = thresholds[:, 0].float(), thresholds[:, -1].float()
                cols.append(LOW + (HIGH - LOW) * (z - lo) / (hi - lo))
            out = torch.cat(cols, dim=1).double()
        else:
            b1 = u(n, 2)
            x1, y1 = b1[:, 0], b1[:, 1]
            test = (x1 + y1 >= 1) if self.sampler == "scm_linear" else (1.25 * (x1**2 + y1**2) >= 1)
            r = u(n, 2, 0.0, 0.4)
            x2 = torch.where(test, LOW + r[:, 0], 0.5 + r[:, 0])
            y2 = torch.where(test, 0.5 + r[:, 1], LOW + r[:, 1])
            out = torch.stack([x1, y1, x2, y2], dim=1)
        return out.to(torch.float32).clamp_(LOW, HIGH)

    def discretize(self, latents: torch.Tensor) -> torch.Tensor:
        """Bin of each coordinate (``n_bins`` bins of [0.1, 0.9]): float (n, 2 n_balls) -> int64."""
        self._check_latents(latents)
        k = ((latents.double() - LOW) / (HIGH - LOW) * self.n_bins).floor().long()
        return k.clamp_(0, self.n_bins - 1)

    def bin_centers(self, factors: object) -> torch.Tensor:
        """Latents at the centres of the bins ``factors`` (n, 2 n_balls) -> float32."""
        f = self.check_factors(factors)
        return (LOW + (HIGH - LOW) * (f.double() + 0.5) / self.n_bins).float()

    def _check_latents(self, latents: object) -> None:
        k = 2 * self.n_balls
        if not isinstance(latents, torch.Tensor) or latents.dim() != 2 or latents.shape[1] != k:
            raise ValueError(
                f"latents must be a tensor of shape (n, {k}), got {getattr(latents, 'shape', type(latents).__name__)}"
            )
        if not latents.is_floating_point():
            raise TypeError(f"latents must be floating point, got {latents.dtype}")

    # ---- rendering -----------------------------------------------------------------------------
    def render(self, latents: torch.Tensor) -> torch.Tensor:
        """Images of latents (n, 2 n_balls) -> float32 (n, 3, S, S) in [0, 1]."""
        self._check_latents(latents)
        s = self.image_size
        z = latents.to(torch.float32)
        img = torch.ones(z.shape[0], 3, s, s)
        r = self.radius * s
        for b in range(self.n_balls):
            cx = (s * z[:, 2 * b])[:, None, None]
            cy = (s - 1 - s * z[:, 2 * b + 1])[:, None, None]
            alpha = coverage(torch.hypot(self._x - cx, self._y - cy) - r)
            over(img, self.colors[b].expand(z.shape[0], 3), alpha)
        return img.clamp_(0.0, 1.0)

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh draws: ``(images (n, 3, S, S), latents (n, 2 n_balls))``."""
        z = self.sample_latents(n, generator)
        return self.render(z), z

    # ---- GroundTruthDataset --------------------------------------------------------------------
    def sample_factors(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Discretized draws of the sampler (not uniform over the grid) -> int64 (n, 2 n_balls)."""
        return self.discretize(self.sample_latents(n, generator))

    def _observations(self, factors: torch.Tensor) -> torch.Tensor:
        return self.render(self.bin_centers(factors))

    def __len__(self) -> int:
        return self.latents.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"index must be an int, got {type(i).__name__}")
        return self.render(self.latents[int(i)].unsqueeze(0))[0], self.factors[int(i)]

    def __getitems__(self, indices):
        idx = as_long_tensor("indices", list(indices))
        x = self.render(self.latents[idx])
        return list(zip(x.unbind(0), self.factors[idx].unbind(0), strict=True))
