"""Exact bytes of live tensors: a model's parameters, gradients and optimizer state, and the activations
autograd saves for backward — measured on any device, FSDP2 shards included.

Taught in chapter 13 (memory anatomy) and chapter 21 (activation checkpointing).
"""
from __future__ import annotations

import contextlib

from labkit.memory.estimate import MemoryBreakdown


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


def measure_activation_bytes(model, idx, targets=None, *, autocast_dtype=None) -> int:
    """Exact bytes of the tensors autograd saves for backward during one forward of ``model(idx, targets)``.

    Uses ``torch.autograd.graph.saved_tensors_hooks`` and deduplicates storages (a tensor saved by two
    ops, or a view of a parameter, is counted once; parameters themselves are excluded) — the
    "activations" of Korthikanti et al. 2022, measured on any device. Taught in chapter 13 and chapter 21.
    """
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
