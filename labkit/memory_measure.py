"""Measured memory: exact bytes of parameters, gradients and optimizer state, and a predicted-vs-measured
report across ranks (DDP, FSDP2) on a real model.

Taught in chapter 13 (memory anatomy) and chapter 20 (FSDP / ZeRO). Public names are re-exported by
:mod:`labkit.memory`.
"""
from __future__ import annotations

import pandas as pd

from labkit.memory import MemoryBreakdown, canonical_strategy, model_state_bytes


def _local(t):
    """The tensor this rank stores: a DTensor's local shard (FSDP2), else the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(tensors) -> int:
    """Bytes of distinct tensors, deduplicating views that alias the same storage bytes."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        t = _local(t)
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), t.dtype)
        if key in seen or t.numel() == 0 and key[0] == 0:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def measure_model_state(model, optimizer=None, *, strategy: str = "", n_ranks: int = 1,
                        precision: str = "") -> MemoryBreakdown:
    """Exact bytes this rank holds in parameters, gradients and optimizer state.

    Iterates the tensors (FSDP2 DTensors → ``to_local()``), deduplicating tied / aliased storages.
    Optimizer state counts every tensor in ``optimizer.state`` (Adam's exp_avg, exp_avg_sq and the
    scalar ``step``). Taught in chapter 13 (memory anatomy).
    """
    params = list(dict.fromkeys(model.parameters()))  # tied weights appear once
    p_bytes = _nbytes(params)
    g_bytes = _nbytes(p.grad for p in params)
    o_bytes = 0
    if optimizer is not None:
        import torch

        o_bytes = _nbytes(v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))
    n = sum(_local(p).numel() for p in params)
    return MemoryBreakdown(params=p_bytes, grads=g_bytes, optimizer=o_bytes, n_params=n, strategy=strategy,
                           n_ranks=n_ranks, precision=precision, source="measured")


def _one_strategy(strat: str, model: str, steps: int, micro_batch: int, overrides: dict | None, device) -> dict:
    import torch
    import torch.distributed as dist

    from labkit.models import GPT, gpt_config

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    cfg = gpt_config(model, **(overrides or {}))
    net = GPT(cfg).to(device)
    predicted = model_state_bytes(net, strategy=strat, n_ranks=world, precision="fp32", rank=rank)
    if strat in ("ddp", "fsdp_no_shard"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    elif strat in ("fsdp_full", "fsdp_grad_op"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        reshard = strat == "fsdp_full"
        for block in net.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        wrapped = fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
    else:
        raise ValueError(f"strategy={strat!r}: model_state_rank runs ddp, fsdp_no_shard, fsdp_full or fsdp_grad_op")
    opt = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        idx = torch.randint(0, cfg.vocab_size, (micro_batch, cfg.seq_len), generator=g).to(device)
        _, loss = wrapped(idx, idx)
        loss.backward()
        opt.step()
    measured = measure_model_state(net, opt, strategy=strat, n_ranks=world, precision="fp32")
    out = {"rank": rank, "strategy": strat, "measured": measured.as_dict(), "predicted": predicted.as_dict(),
           "n_params_local": measured.n_params}
    if device.type == "cuda":
        out["cuda_max_allocated"] = torch.cuda.max_memory_allocated(device)
    dist.barrier()
    return out


def model_state_rank(strategies=("ddp",), model: str = "tiny", steps: int = 1, micro_batch: int = 2,
                     overrides: dict | None = None) -> list[dict]:
    """Per-rank body of :func:`predict_vs_measure`: for each strategy build a labkit GPT, wrap it (DDP or
    FSDP2), take ``steps`` Adam steps (fp32) and return this rank's measured and predicted model-state
    bytes. On CUDA also ``torch.cuda.max_memory_allocated``. Taught in chapter 13 and chapter 20.
    """
    import torch
    import torch.distributed as dist

    device = (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl"
              else torch.device("cpu"))
    if isinstance(strategies, str):
        strategies = (strategies,)
    return [_one_strategy(canonical_strategy(s), model, steps, micro_batch, overrides, device) for s in strategies]


def predict_vs_measure(strategy="ddp", nprocs: int = 2, *, model: str = "tiny", timeout_s: float = 120,
                       overrides: dict | None = None) -> pd.DataFrame:
    """Predicted vs measured per-rank model-state bytes for every rank (fp32 Adam, after one step).

    ``strategy``: one name or a list (all run in the same launch). Columns: strategy, nprocs, rank,
    category, predicted, measured, error (measured/predicted − 1). Taught in chapter 13 and chapter 20.
    """
    from labkit.launcher import launch

    strategies = (strategy,) if isinstance(strategy, str) else tuple(strategy)
    for s in strategies:
        canonical_strategy(s)
    res = launch(model_state_rank, nprocs, timeout_s=timeout_s, args=(strategies, model),
                 kwargs={"overrides": overrides}, stream=False)
    rows = []
    for per_rank in res.values:
        for v in per_rank:
            for cat in ("params", "grads", "optimizer", "model_states"):
                p, m = v["predicted"][cat], v["measured"][cat]
                rows.append({"strategy": v["strategy"], "nprocs": nprocs, "rank": v["rank"], "category": cat,
                             "predicted": p, "measured": m, "error": (m / p - 1.0) if p else float("nan")})
    return pd.DataFrame(rows)


def measure_activation_bytes(model, idx, targets=None, *, autocast_dtype=None) -> int:
    """Exact bytes of the tensors autograd saves for backward during one forward of ``model(idx, targets)``.

    Uses ``torch.autograd.graph.saved_tensors_hooks`` and deduplicates storages (a tensor saved by two
    ops, or a view of a parameter, is counted once; parameters themselves are excluded) — the
    "activations" of Korthikanti et al. 2022, measured on any device. Taught in chapter 13 and chapter 21.
    """
    import contextlib

    import torch

    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        try:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in param_ptrs and ptr != 0:
                seen[ptr] = max(seen.get(ptr, 0), st.nbytes())
        except (RuntimeError, NotImplementedError):
            seen[id(t)] = t.numel() * t.element_size()
        return t

    ctx = (torch.autocast(device_type=idx.device.type, dtype=autocast_dtype) if autocast_dtype
           else contextlib.nullcontext())
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), ctx:
        out = model(idx, targets)
    del out
    return int(sum(seen.values()))
