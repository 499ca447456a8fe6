"""Tensor parallelism of the reference GPT: Megatron's column/row split, applied from outside as DTensor plans.

Megatron-LM (Shoeybi et al. 2019, §3, fig. 3) splits each transformer block over ``tp`` ranks so that a
block costs two collectives in forward and two in backward:

- **attention**: the fused ``qkv`` projection is split by columns — each rank computes ``n_heads/tp``
  whole heads of q, k and v — attention runs on the local heads with no communication, and the output
  projection ``proj`` is split by rows, its partial sums all-reduced (forward); in backward the
  gradient of the block's input is all-reduced where the column split began;
- **MLP**: ``fc`` by columns (GELU is element-wise, so it needs no communication), ``proj`` by rows.

Here that is :func:`torch.distributed.tensor.parallel.parallelize_module` with ``ColwiseParallel`` /
``RowwiseParallel`` on the ``tp`` dimension of the device mesh (torchtitan's ``parallelize`` is the model;
https://pytorch.org/docs/stable/distributed.tensor.parallel.html). Embeddings, the tied head and the
LayerNorms stay replicated.

The fused qkv weight is stored ``[q | k | v]`` (3·d rows); a plain column split would hand rank 0 all of q
and half of k. :func:`interleave_qkv` first reorders its rows to ``[q₀ k₀ v₀ | q₁ k₁ v₁ | …]`` (rank r's
heads of q, k and v together — Megatron's own layout of its fused QKV weight), so each rank's contiguous
shard is its heads; the single-device model then reads its local heads from the width
(:class:`labkit.models.CausalSelfAttention`). A row permutation changes no product, so the loss is that of
the unsharded model; the stored weights are in the interleaved order.

**Sequence parallelism** (``sequence_parallel=True``; Korthikanti et al. 2022, §4.2.2): between the
blocks' tensor-parallel regions the activations — LayerNorms, dropout, the residual stream — are split
along the sequence instead of replicated; each all-reduce becomes a reduce-scatter (leaving a region) and
an all-gather (entering one): the same bytes on a ring, 1/tp of the activation memory in those regions.

Taught in chapter 24 (choosing a parallel layout).
"""
from __future__ import annotations


def interleave_qkv(qkv, tp: int) -> None:
    """Reorder a fused ``qkv`` Linear's output rows in place from ``[q | k | v]`` to tp groups
    ``[q_r k_r v_r]`` of whole heads, so a column split gives rank r its heads of all three (Megatron's
    layout). Taught in chapter 24."""
    import torch

    w = qkv.weight
    d = w.shape[0] // 3
    if d % tp:
        raise ValueError(f"tensor parallelism: d_model={d} is not divisible by tp={tp}")
    idx = torch.arange(3 * d, device=w.device).view(3, tp, d // tp).transpose(0, 1).reshape(-1)
    with torch.no_grad():
        w.copy_(w[idx])
        if qkv.bias is not None:
            qkv.bias.copy_(qkv.bias[idx])


def block_plan(sequence_parallel: bool) -> dict:
    """The plan of one transformer block (module path → ParallelStyle). Taught in chapter 24."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    if not sequence_parallel:
        return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel()}
    def gather():   # the sequence-split stream all-gathered on entering a tensor-parallel region
        return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                  use_local_output=True)

    return {"ln1": SequenceParallel(), "ln2": SequenceParallel(),
            "attn": gather(), "attn.qkv": ColwiseParallel(),
            "attn.proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            "mlp": gather(),
            "mlp.fc": ColwiseParallel(),
            "mlp.proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)}


def apply_tensor_parallel(model, tp_mesh, *, sequence_parallel: bool = False):
    """Split every block of ``model`` (a :class:`labkit.models.GPT`, unwrapped) over ``tp_mesh``, in place:
    qkv rows interleaved, then the block plan (see the module docstring); with ``sequence_parallel`` the
    residual stream enters the first block split along the sequence and is gathered again before the
    final LayerNorm's output reaches the head. Returns ``model``. Taught in chapter 24."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel, parallelize_module

    tp = tp_mesh.size()
    cfg = model.config
    if cfg.n_heads % tp or cfg.ff % tp:
        raise ValueError(f"tensor parallelism: n_heads={cfg.n_heads} and d_ff={cfg.ff} must be divisible by tp={tp}")
    for block in model.blocks:
        interleave_qkv(block.attn.qkv, tp)
        parallelize_module(block, tp_mesh, block_plan(sequence_parallel))
    if sequence_parallel:
        parallelize_module(model, tp_mesh, {
            "blocks.0": PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                           use_local_output=False),
            "ln_f": SequenceParallel(),
            "head": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                       use_local_output=True),
        })
    return model
