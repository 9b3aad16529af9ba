"""Global-batch KDE under ``torch.distributed``: the latents of every rank, gathered with autograd.

``gather_rows(z, group)`` returns the (sum_r n_r, d) concatenation of every rank's (n_r, d) latents, in rank
order, on every rank. Its backward gives each rank the gradient of its OWN rows only (no communication):
when every rank computes the same loss L of the gathered batch, the per-rank gradients are each rank's
share of dL, and their sum over ranks is the single-process gradient of L on the concatenated batch.
DistributedDataParallel AVERAGES gradients over ranks, so a DDP loop that wants dL itself scales such a
loss by the world size. Cost per call: one all_gather of the shard sizes (read on the host: a sync on
GPUs) and one of the latents padded to the largest shard; (n, d) floats are tiny next to a model's
gradient all-reduce.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _sizes(n: int, group, device) -> list[int]:
    local = torch.tensor([n], dtype=torch.long, device=device)
    sizes = [torch.zeros_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, local, group=group)
    return [int(s) for s in sizes]


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z: torch.Tensor, group) -> torch.Tensor:
        sizes = _sizes(z.shape[0], group, z.device)
        top = max(sizes)  # shards may differ in size: gathered padded to the largest, then trimmed
        padded = z.new_zeros((top, *z.shape[1:]))
        padded[: z.shape[0]] = z
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        rank = dist.get_rank(group)
        ctx.start, ctx.stop = sum(sizes[:rank]), sum(sizes[: rank + 1])
        return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad[ctx.start : ctx.stop], None


def gather_rows(z: torch.Tensor, group) -> torch.Tensor:
    """(n_r, d) local latents -> (sum_r n_r, d) latents of every rank in ``group`` (rank order);
    gradients flow back to the local rows only (see the module docstring)."""
    if not isinstance(z, torch.Tensor) or z.dim() != 2:
        raise TypeError(f"z must be a 2-D torch.Tensor (n, d), got {getattr(z, 'shape', type(z).__name__)}")
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group was given but torch.distributed is not initialized (init_process_group first)")
    return _GatherRows.apply(z, group)
