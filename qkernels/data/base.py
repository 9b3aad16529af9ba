"""``GroundTruthDataset``: the interface of every image dataset with discrete ground-truth factors.

A dataset is a complete grid of factor combinations. Factor ``k`` takes class indices
``0 .. factor_sizes[k] - 1``; the flat index of a combination is row-major (last factor fastest),
``index = sum_k factors[k] * bases[k]`` with ``bases[k] = prod(factor_sizes[k + 1:])``.
Observations are float32 CHW tensors in [0, 1].
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset


def row_major_bases(sizes: Sequence[int]) -> tuple[int, ...]:
    """Strides of a row-major grid: ``bases[k] = prod(sizes[k + 1:])``."""
    bases = [1] * len(sizes)
    for k in range(len(sizes) - 2, -1, -1):
        bases[k] = bases[k + 1] * int(sizes[k + 1])
    return tuple(bases)


def as_long_tensor(name: str, value: object) -> torch.Tensor:
    """``value`` (tensor, numpy array, int or nested sequence of ints) as an int64 CPU tensor."""
    if isinstance(value, torch.Tensor):
        t = value
    elif isinstance(value, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(value))
    elif isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must contain integers, got bool")
    elif isinstance(value, (int, np.integer, Sequence)):
        try:
            t = torch.as_tensor(value)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name} must contain integers: {err}") from None
    else:
        raise TypeError(f"{name} must be an integer tensor or array, got {type(value).__name__}")
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"{name} must have an integer dtype, got {t.dtype}")
    return t.to(device="cpu", dtype=torch.int64)


class GroundTruthDataset(Dataset, abc.ABC):
    """Images with discrete ground-truth factors on a complete row-major grid.

    Subclasses set ``factor_names``, ``factor_sizes`` (via :meth:`_set_factors`) and
    ``observation_shape`` and implement :meth:`_observations` (validated factors -> images).

    ``dataset[i]`` -> ``(x, factors)``: x float32 ``observation_shape`` in [0, 1], factors int64
    ``(n_factors,)``. ``__getitems__`` renders/reads a whole DataLoader batch at once.
    ``seed`` seeds the default generator used by :meth:`sample_factors` when none is given.

    Examples:
        A one-factor dataset: a bright pixel at one of 4 positions.

        >>> import torch
        >>> from qkernels.data import GroundTruthDataset
        >>> class Bars(GroundTruthDataset):
        ...     observation_shape = (1, 1, 4)
        ...     def __init__(self):
        ...         self._set_factors(("position",), (4,))
        ...     def _observations(self, factors):
        ...         return torch.nn.functional.one_hot(factors[:, 0], 4).float().reshape(-1, 1, 1, 4)
        >>> ds = Bars()
        >>> len(ds), ds[2]
        (4, (tensor([[[0., 0., 1., 0.]]]), tensor([2])))
        >>> ds.sample_factors(5).shape, ds.index_of([[3]])
        (torch.Size([5, 1]), tensor([3]))
    """

    factor_names: tuple[str, ...]
    factor_sizes: tuple[int, ...]
    observation_shape: tuple[int, int, int]

    def _set_factors(self, names: Sequence[str], sizes: Sequence[int], seed: int = 0) -> None:
        if len(names) != len(sizes):
            raise ValueError(f"{len(names)} factor names for {len(sizes)} factor sizes")
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
                raise ValueError(f"factor sizes must be positive ints, got {list(sizes)}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        self.factor_names = tuple(str(n) for n in names)
        self.factor_sizes = tuple(int(s) for s in sizes)
        self.seed = int(seed)
        self._bases = torch.tensor(row_major_bases(self.factor_sizes), dtype=torch.int64)
        self._sizes = torch.tensor(self.factor_sizes, dtype=torch.int64)
        self._default_generator = torch.Generator().manual_seed(self.seed)

    @property
    def num_factors(self) -> int:
        return len(self.factor_sizes)

    @property
    def factor_bases(self) -> tuple[int, ...]:
        """Row-major strides: ``index = factors @ factor_bases``."""
        return tuple(int(b) for b in self._bases)

    def __len__(self) -> int:
        return int(np.prod(self.factor_sizes, dtype=np.int64))

    # ---- factors <-> flat index ---------------------------------------------------------------
    def check_factors(self, factors: object, name: str = "factors") -> torch.Tensor:
        """Validate an ``(n, n_factors)`` integer array of class indices; return int64 tensor."""
        f = as_long_tensor(name, factors)
        if f.dim() != 2 or f.shape[1] != self.num_factors:
            raise ValueError(f"{name} must have shape (n, {self.num_factors}), got {tuple(f.shape)}")
        if f.numel() and ((f < 0).any() or (f >= self._sizes).any()):
            bad = ((f < 0) | (f >= self._sizes)).any(0).nonzero().flatten().tolist()
            names = [self.factor_names[k] for k in bad]
            raise ValueError(f"{name} out of range for factor(s) {names}; sizes are {list(self.factor_sizes)}")
        return f

    def index_of(self, factors: object) -> torch.Tensor:
        """Flat row-major index of each row of ``factors`` (n, n_factors) -> int64 (n,)."""
        return self.check_factors(factors) @ self._bases

    def factors_of(self, index: object) -> torch.Tensor:
        """Factor classes of flat indices: an int -> int64 (n_factors,); (n,) -> (n, n_factors)."""
        idx = as_long_tensor("index", index)
        if idx.dim() > 1:
            raise ValueError(f"index must be a scalar or 1-D, got shape {tuple(idx.shape)}")
        n = len(self)
        if idx.numel() and ((idx < 0).any() or (idx >= n).any()):
            raise ValueError(f"index out of range [0, {n}) (got min {idx.min()}, max {idx.max()})")
        return torch.div(idx.unsqueeze(-1), self._bases, rounding_mode="floor") % self._sizes

    # ---- sampling and observations ------------------------------------------------------------
    def sample_factors(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """``n`` factor combinations, each factor uniform over its classes -> int64 (n, n_factors).

        Uses ``generator`` (a CPU ``torch.Generator``) or, when None, the dataset's own generator
        seeded with ``seed``.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        g = self._check_generator(generator)
        u = torch.rand(int(n), self.num_factors, generator=g, dtype=torch.float64)
        return (u * self._sizes).long().clamp_(max=self._sizes - 1)

    def observations_from_factors(self, factors: object) -> torch.Tensor:
        """Images of ``factors`` (n, n_factors) class indices -> float32 (n, C, H, W) in [0, 1]."""
        f = self.check_factors(factors)
        if f.shape[0] == 0:
            return torch.empty((0, *self.observation_shape), dtype=torch.float32)
        return self._observations(f)

    @abc.abstractmethod
    def _observations(self, factors: torch.Tensor) -> torch.Tensor:
        """Validated non-empty int64 (n, n_factors) -> float32 (n, C, H, W) in [0, 1]."""

    def _check_generator(self, generator: torch.Generator | None) -> torch.Generator:
        if generator is None:
            return self._default_generator
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        return generator

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"index must be an int, got {type(i).__name__}")
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for dataset of length {n}")
        f = self.factors_of(int(i) % n)
        return self._observations(f.unsqueeze(0))[0], f

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A DataLoader batch in one vectorized read/render (torch calls this when present)."""
        idx = as_long_tensor("indices", list(indices))
        n = len(self)
        if idx.numel() and ((idx < -n).any() or (idx >= n).any()):
            raise IndexError(f"indices out of range for dataset of length {n}")
        f = self.factors_of(idx % n)
        x = self._observations(f) if len(f) else torch.empty(0, *self.observation_shape)
        return list(zip(x.unbind(0), f.unbind(0), strict=True))

    def __repr__(self) -> str:
        pairs = zip(self.factor_names, self.factor_sizes, strict=True)
        sizes = ", ".join(f"{n}={s}" for n, s in pairs)
        return f"{type(self).__name__}({sizes}; observation_shape={self.observation_shape})"
