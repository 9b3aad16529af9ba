"""Data-parallel helpers on ``torch.distributed``: global-batch KDE (the latents of every rank, gathered
with autograd), the random draws of a global batch, and rank bookkeeping.

``gather_rows(z, group)`` returns the (sum_r n_r, d) concatenation of every rank's (n_r, d) latents, in rank
order, on every rank. Its backward follows ``torch.distributed.nn.functional.all_gather``: the incoming
gradients of all ranks are summed (one all_reduce) and each rank keeps its own rows, i.e. each rank gets the
gradient of the SUM of all ranks' losses w.r.t. its rows. DistributedDataParallel averages parameter gradients
over ranks, so the gradient a DDP step applies is that of the MEAN of the ranks' losses: for a global loss L
computed alike on every rank (Cliff, KLM) that is exactly dL, the single-process gradient, with no scaling;
for a per-rank mean of per-sample terms (reconstruction, NHP) it is the global mean's gradient (equal
shards); and a term mixing both (Tripod's NHP through the global std of the latents) is exact too. Without
DDP, summing the ranks' gradients and dividing by the world size gives the single-process gradient of L.
(Each rank's gradient is therefore world-size times its share of dL; a share-only backward cannot make the
NHP-through-global-std term exact, because the other ranks' NHP also depend on this rank's rows.)

Cost per call: one all_gather of the shard sizes (read on the host: a sync on GPUs), one of the latents
padded to the largest shard, and in the backward one all_reduce of the (sum_r n_r, d) gradient: (n, d)
floats, tiny next to a model's gradient all-reduce.
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
        ctx.start, ctx.stop, ctx.group = sum(sizes[:rank]), sum(sizes[: rank + 1]), group
        return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)  # every rank's loss depends on these rows
        return grad[ctx.start : ctx.stop], None


def gather_rows(z: torch.Tensor, group) -> torch.Tensor:
    """(n_r, d) local latents -> (sum_r n_r, d) latents of every rank in ``group`` (rank order); the
    backward sums the ranks' gradients and keeps the local rows (see the module docstring)."""
    if not isinstance(z, torch.Tensor) or z.dim() != 2:
        raise TypeError(f"z must be a 2-D torch.Tensor (n, d), got {getattr(z, 'shape', type(z).__name__)}")
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group was given but torch.distributed is not initialized (init_process_group first)")
    return _GatherRows.apply(z, group)


def rank_and_size(group=None) -> tuple[int, int]:
    """(rank, world size) in ``group`` (default: the world); (0, 1) without an initialized process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def rank_rows(full: torch.Tensor, group, dim: int = 0) -> torch.Tensor:
    """This rank's block of ``full`` along ``dim`` (world-size equal blocks, in rank order)."""
    rank, size = rank_and_size(group)
    n = full.shape[dim] // size
    return full.narrow(dim, rank * n, n)


def randn_rows(like: torch.Tensor, group=None) -> torch.Tensor:
    """Standard normal noise shaped like ``like`` (n, ...). Under a data-parallel ``group`` (equal shards,
    every rank's RNG seeded alike): this rank's rows of the (world x n, ...) draw a single process makes
    for the whole global batch, so a multi-process run draws exactly what one process draws."""
    if group is None:
        return torch.randn_like(like)
    _, size = rank_and_size(group)
    full = torch.randn((size * like.shape[0], *like.shape[1:]), dtype=like.dtype, device=like.device)
    return rank_rows(full, group)


def mean_over_ranks(values: dict[str, float], group=None) -> dict[str, float]:
    """Each scalar averaged over the ranks of ``group`` (one all_reduce; float64 on the CPU for gloo,
    on the current CUDA device for nccl)."""
    rank, size = rank_and_size(group)
    if size == 1:
        return dict(values)
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=device)
    dist.all_reduce(t, group=group)
    return dict(zip(values, (t / size).tolist(), strict=True))


def average_gradients(params, group=None) -> None:
    """Replace each parameter's gradient by its mean over the ranks of ``group`` (one all_reduce per
    parameter; parameters without a gradient are skipped): what DistributedDataParallel does, for
    parameters stepped outside it (the trainer's discriminator)."""
    _, size = rank_and_size(group)
    if size == 1:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad /= size
