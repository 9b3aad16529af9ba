"""Stateless batch sampling: batch ``step`` is a function of (seed, step) only, so a resumed run reads the same
data. Ground-truth datasets, by ``order`` (:data:`DATA_ORDERS`; each method's authors' in the registry):

* ``"iid"``: factors drawn uniformly (with replacement) by a generator seeded from (seed, step, stream), then
  rendered (disentanglement_lib's ``sample_observations``);
* ``"epochs"``: shuffled epochs over every factor combination of the dataset, one permutation per (seed,
  epoch) (Tripod's and QLAE's ``tf.data`` shuffles of the whole dataset, buffers 10k / 100k: a full shuffle
  here);
* ``"split"``: shuffled epochs over a fixed 80% of the combinations: FactorQVAE's ``random_split`` 80/10/10
  (``data/shapes3d.py``, ``isaac3d.py``, ``mpi3d_complex.py``), whose generator is seeded with the configs'
  ``train.seed: 1`` whatever the run: the first 80% of ``torch.randperm(n, generator=manual_seed(1))``
  (:data:`SPLIT_SEED`), the same rows for every run seed.

With ``streams`` = 2 (a discriminator's second batch, stream 1), a step's two batches are consecutive blocks of
the epoch, as the authors split one batch of 2B in halves. Fixed-size datasets with ``.x`` (quantized_grid2d):
one permutation per epoch seeded from (seed, epoch).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from qkernels.data.base import row_major_bases

DATA_ORDERS = ("iid", "epochs", "split")
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)  # FactorQVAE data/*.py: random_split(dataset, [0.8, 0.1, 0.1]); trains on the first
SPLIT_SEED = 1  # FactorQVAE configs/*/qvae.yaml, factorqvae.yaml: train.seed


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (numpy SeedSequence hashing)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def generator(*keys: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*keys))


def is_ground_truth(ds) -> bool:
    return hasattr(ds, "sample_factors") and hasattr(ds, "observations_from_factors")


def observation_shape(ds) -> tuple[int, ...]:
    if is_ground_truth(ds):
        return tuple(ds.observation_shape)
    return tuple(ds.x.shape[1:])


def num_sources(ds) -> int:
    return len(ds.factor_sizes)


def get_batch(
    ds,
    batch_size: int,
    seed: int,
    step: int,
    stream: int = 0,
    shard: tuple[int, int] = (0, 1),
    *,
    order: str = "iid",
    streams: int = 1,
) -> torch.Tensor:
    """Observations of batch ``step`` (stream 0: model step; 1: the discriminator's second batch).
    ``shard`` = (rank, world size): that rank's equal block of rows of the (global) batch, rendered alone.
    ``order``: how a ground-truth dataset is read (module docstring); ``streams``: batches per step."""
    if order not in DATA_ORDERS:
        raise ValueError(f"order must be one of {DATA_ORDERS}, got {order!r}")
    rank, world = shard
    if is_ground_truth(ds) and order == "iid":
        f = ds.sample_factors(batch_size, generator(seed, step, stream, 0))
        return ds.observations_from_factors(f.chunk(world)[rank] if world > 1 else f)
    if is_ground_truth(ds):
        sizes = tuple(int(k) for k in ds.factor_sizes)
        pool = _pool(sizes, order == "split")
        idx = _epoch_block(
            pool.shape[0], batch_size, seed, step, stream, streams, lambda n, g: pool[torch.randperm(n, generator=g)]
        )
        idx = idx.chunk(world)[rank] if world > 1 else idx
        bases = torch.tensor(row_major_bases(sizes))
        return ds.observations_from_factors(idx[:, None] // bases % torch.tensor(sizes))
    idx = _epoch_block(
        ds.x.shape[0], batch_size, seed, step, stream, streams, lambda n, g: torch.randperm(n, generator=g)
    )
    return ds.x[idx.chunk(world)[rank] if world > 1 else idx]


def _epoch_block(n: int, batch_size: int, seed: int, step: int, stream: int, streams: int, permute):
    """Rows of (step, stream) in a per-epoch permutation of n rows: block step * streams + stream."""
    per_epoch = max(n // (batch_size * streams), 1)
    epoch, k = divmod(step, per_epoch)
    perm = permute(n, generator(seed, epoch, 1)) if streams > 1 else permute(n, generator(seed, epoch, stream, 1))
    if batch_size * streams > n:
        return perm[:batch_size] if streams == 1 else perm[torch.arange(batch_size) % n]
    b = (k * streams + stream if streams > 1 else k) * batch_size
    return perm[b : b + batch_size]


@lru_cache(maxsize=4)
def _pool(sizes: tuple[int, ...], split: bool) -> torch.Tensor:
    """Flat indices of the factor combinations a run trains on: all, or FactorQVAE's training 80%."""
    n = int(np.prod(sizes))
    if not split:
        return torch.arange(n)
    # random_split's lengths: each part floor(fraction * n), the rows left over given to the parts in turn from the
    # first (so the first part is one row longer than int(0.8 n) where 0.8 n is not whole)
    lengths = [math.floor(f * n) for f in SPLIT_FRACTIONS]
    first = lengths[0] + (n - sum(lengths) > 0)
    return torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED))[:first]
