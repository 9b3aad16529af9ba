"""``quantized_grid2d``: the 2-D "ManhattanUniform" latents of Barin-Pacela et al. (2024) with a
linear or nonlinear mixing, as in the Cliff paper's synthetic experiment (ICML 2025, App. F.2/G.1).

Everything is drawn from ``torch.Generator().manual_seed(seed)`` in this order:

1. thresholds, per axis: ``t_0 = 0``, ``t_{i+1} = t_i + U(0.3, 2.5)``, i = 0..3 -> (2, 5);
2. cell priors: ``u_k ~ U(0.1, 1)``, ``priors = u / sum(u)`` over the 16 cells (our choice; the
   paper does not publish them; 0.1 keeps every cell populated);
3. ``A`` then ``B`` (2 x 2): ``R(alpha) diag(s1, s2) R(beta)`` with angles ``U(0, 2 pi)`` and
   singular values ``U(0.5, 1.0)``, so each is invertible with condition number <= 2;
4. the ``n`` samples of the fixed dataset.

A sample: cell ``k ~ Categorical(priors)`` with coordinates ``(k % 4, k // 4)``, then ``z`` uniform
inside that cell. Mixing, with ``c`` the grid centre (``(t_0 + t_4) / 2`` per axis):

* ``"linear"``:    ``x = A (z - c)``
* ``"nonlinear"``: ``x = B tanh(A (0.5 (z - c)))``  (the paper's ``B tanh(A (0.5 z))``, centred
  so the tanh does not saturate on the far cells; centring is our documented choice, the default);
* ``"paper"``:     ``x = B tanh(A (0.5 z))``, App. G.1's "Ground-truth decoder" as printed (``qkernels train
  --paper``). With these thresholds (t_0 = 0, so z lies in [0, t_4], t_4 about 5.6 on average) ``|A (0.5 z)|``
  reaches about 2.8 and the far cells are squeezed by the tanh's flat ends (their images still differ in float32).

Both mixings are diffeomorphisms onto their image, so the cells stay identifiable.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

SPACING_RANGE = (0.3, 2.5)
PRIOR_RANGE = (0.1, 1.0)
SINGULAR_RANGE = (0.5, 1.0)
N_BINS = 4
MIXINGS = ("linear", "nonlinear", "paper")


def _uniform(g: torch.Generator, shape, lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)


def _well_conditioned(g: torch.Generator) -> torch.Tensor:
    def rot(a):
        return torch.stack([torch.stack([torch.cos(a), -torch.sin(a)]), torch.stack([torch.sin(a), torch.cos(a)])])

    angles = _uniform(g, (2,), 0.0, 2 * math.pi)
    s = _uniform(g, (2,), *SINGULAR_RANGE)
    return rot(angles[0]) @ torch.diag(s) @ rot(angles[1])


def manhattan_uniform_params(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ManhattanUniform grid: thresholds float64 (2, 5) and cell priors float64 (16,)."""
    spacings = _uniform(g, (2, N_BINS), *SPACING_RANGE)
    thresholds = torch.cat([torch.zeros(2, 1, dtype=torch.float64), spacings.cumsum(1)], dim=1)
    u = _uniform(g, (N_BINS * N_BINS,), *PRIOR_RANGE)
    return thresholds, u / u.sum()


def sample_manhattan_uniform(
    thresholds: torch.Tensor, priors: torch.Tensor, n: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` points: float32 (n, 2) uniform inside cells drawn from ``priors``, and the int64
    (n, 2) cell coordinates ``(k % 4, k // 4)``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    k = torch.multinomial(priors, n, replacement=True, generator=generator) if n else torch.zeros(0, dtype=torch.int64)
    cell = torch.stack([k % N_BINS, k // N_BINS], dim=1)
    lo = torch.gather(thresholds, 1, cell.T).T
    hi = torch.gather(thresholds, 1, cell.T + 1).T
    u = torch.rand(n, 2, generator=generator, dtype=torch.float64)
    return (lo + u * (hi - lo)).to(torch.float32), cell


class QuantizedGrid2D(Dataset):
    """Fixed dataset of ``n`` pairs ``(x, z)`` (float32 (2,) each); ``dataset[i] -> (x_i, z_i)``.

    Attributes: ``x``, ``z`` (n, 2) float32; ``cells`` (n, 2) int64 cell coordinates in 0..3
    (the discrete ground truth); ``thresholds`` (2, 5), ``priors`` (16,), ``A``, ``B``,
    ``center`` (2,) float64. :meth:`sample` draws fresh pairs, :meth:`mix` maps z -> x.

    Examples:
        >>> import torch
        >>> from qkernels.data import QuantizedGrid2D
        >>> ds = QuantizedGrid2D(n=10, seed=0)
        >>> x, z = ds[0]
        >>> len(ds), x.shape, z.dtype
        (10, torch.Size([2]), torch.float32)
        >>> torch.equal(ds.quantize(ds.z), ds.cells), torch.allclose(ds.mix(ds.z), ds.x)
        (True, True)
    """

    factor_names = ("z1", "z2")
    factor_sizes = (N_BINS, N_BINS)
    observation_shape = (2,)

    def __init__(self, n: int = 5000, mixing: str = "nonlinear", *, seed: int = 0):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive int, got {n!r}")
        if mixing not in MIXINGS:
            raise ValueError(f"mixing must be one of {MIXINGS}, got {mixing!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.mixing, self.seed = mixing, seed
        g = torch.Generator().manual_seed(seed)
        self.thresholds, self.priors = manhattan_uniform_params(g)
        self.A = _well_conditioned(g)
        self.B = _well_conditioned(g)
        self.center = 0.5 * (self.thresholds[:, 0] + self.thresholds[:, -1])
        self.z, self.cells = self._sample(n, g)
        self.x = self.mix(self.z)

    def sample_latents(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` latents from the ManhattanUniform density -> float32 (n, 2)."""
        return self._sample(n, generator)[0]

    def _sample(self, n, generator):
        return sample_manhattan_uniform(self.thresholds, self.priors, n, generator)

    def mix(self, z: torch.Tensor) -> torch.Tensor:
        """Observations of latents ``z`` (n, 2) -> float32 (n, 2) (computed in float64)."""
        if not isinstance(z, torch.Tensor) or z.dim() != 2 or z.shape[1] != 2:
            raise ValueError(f"z must be a tensor of shape (n, 2), got {getattr(z, 'shape', z)}")
        zc = z.to(torch.float64) - (0.0 if self.mixing == "paper" else self.center)
        if self.mixing == "linear":
            x = zc @ self.A.T
        else:
            x = torch.tanh((0.5 * zc) @ self.A.T) @ self.B.T
        return x.to(torch.float32)

    def sample(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh pairs: ``(x, z)``, both float32 (n, 2)."""
        z = self.sample_latents(n, generator)
        return self.mix(z), z

    def quantize(self, z: torch.Tensor) -> torch.Tensor:
        """Cell coordinates of latents ``z`` (n, 2) -> int64 (n, 2) in 0..3."""
        inner = self.thresholds[:, 1:-1].to(torch.float32)
        cells = [torch.bucketize(z[:, a].contiguous(), inner[a], right=True) for a in range(2)]
        return torch.stack(cells, dim=1)

    def __len__(self) -> int:
        return self.z.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.z[i]

    def __repr__(self) -> str:
        return f"QuantizedGrid2D(n={len(self)}, mixing={self.mixing!r}, seed={self.seed})"
