"""Stateless batch sampling: batch ``step`` is a function of (seed, step) only, so a resumed run reads the same
data. Ground-truth datasets: factors drawn uniformly by a generator seeded from (seed, step, stream), then
rendered. Fixed-size datasets with ``.x`` (quantized_grid2d): one permutation per epoch seeded from (seed, epoch).
"""

from __future__ import annotations

import numpy as np
import torch


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


def get_batch(ds, batch_size: int, seed: int, step: int, stream: int = 0, shard: tuple[int, int] = (0, 1)
              ) -> torch.Tensor:
    """Observations of batch ``step`` (stream 0: model step; 1: the discriminator's second batch).
    ``shard`` = (rank, world size): that rank's equal block of rows of the (global) batch, rendered alone."""
    rank, world = shard
    if is_ground_truth(ds):
        f = ds.sample_factors(batch_size, generator(seed, step, stream, 0))
        return ds.observations_from_factors(f.chunk(world)[rank] if world > 1 else f)
    n = ds.x.shape[0]
    per_epoch = max(n // batch_size, 1)
    epoch, k = divmod(step, per_epoch)
    perm = torch.randperm(n, generator=generator(seed, epoch, stream, 1))
    idx = perm[k * batch_size:(k + 1) * batch_size] if batch_size <= n else perm
    return ds.x[idx.chunk(world)[rank] if world > 1 else idx]
