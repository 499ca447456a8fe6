"""Rank function of the mini lab (a test fixture of the grader): a seeded sum of squares over 2 ranks."""
from __future__ import annotations


def sum_of_squares(n: int, seed: int) -> dict:
    """Each rank sums the squares of its strided shard of the seeded sample; all_reduce adds them up."""
    import numpy as np
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    x = np.random.default_rng(seed).normal(size=n)
    local = torch.tensor([float(np.sum(x[rank::world] ** 2))], dtype=torch.float64)
    dist.all_reduce(local)
    return {"rank": rank, "world_size": world, "total": float(local.item())}
