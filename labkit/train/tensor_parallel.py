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
https://pytorch.org/docs/stable/distributed.tensor.parallel.html). The LayerNorms and the position
embedding stay replicated.

**The vocabulary-parallel head and loss** (``vocab_parallel=True``, the default; Megatron-LM's
``VocabParallelEmbedding`` and parallel cross-entropy, §3; torchtitan's llama ``parallelize``): the head
``d → V`` is the largest matmul of a small GPT — per token 2·d·V forward FLOPs against 24·d² + 4·T·d per block
(Kaplan et al. 2020, table 1), i.e. V / (V + 12·d·L + 2·T·L) of the forward's matmul FLOPs: 55 % for the tiny
GPT (V = 4096, d = 128, L = 2, T = 64), 24 % for the small one (d = 256, L = 4, T = 128) — so computing it whole
on every tp rank duplicates that share (``benchmarks/bench_tp_head.py`` measures what it cost). Here the head
is split by columns over the vocabulary (``ColwiseParallel``, output ``Shard(-1)`` kept as a DTensor: each rank
holds V/tp logits of every token) and the cross-entropy runs under
:func:`torch.distributed.tensor.parallel.loss_parallel`: each rank takes the max and the sum of exponentials
over its own V/tp columns and two small all-reduces of B·T numbers (max, then sum) give the global
log-sum-exp — the B·T·V logits are never gathered. The GPT ties the head to the token embedding, so the
embedding is split on the vocabulary too (``RowwiseParallel(input_layouts=Replicate())`` on ``nn.Embedding``:
each rank looks up the ids in its V/tp rows, zeros elsewhere, and one all-reduce sums the partial
embeddings) — both hold rows ``[r·V/tp, (r+1)·V/tp)`` of the one ``[V, d]`` weight, ``Shard(0)``, and after
the plan the head's weight is pointed back at the embedding's so they stay one parameter. The loop runs the
forward and the backward under :func:`loss_context` and reads the replicated loss with :func:`local_loss`.
``vocab_parallel=False`` keeps the older plan (head, loss and embedding whole on every rank) to measure
against.

The fused qkv weight is stored ``[q | k | v]`` (3·d rows); a plain column split would hand rank 0 all of q
and half of k. :func:`interleave_qkv` first reorders its rows to ``[q₀ k₀ v₀ | q₁ k₁ v₁ | …]`` (rank r's
heads of q, k and v together — Megatron's own layout of its fused QKV weight), so each rank's contiguous
shard is its heads; the single-device model then reads its local heads from the width
(:class:`labkit.model.gpt.CausalSelfAttention`). A row permutation changes no product, so the loss is that of
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


def head_plan(sequence_parallel: bool, vocab_parallel: bool) -> dict:
    """The plan of the GPT's ends (module path → ParallelStyle): with ``vocab_parallel`` the token embedding
    split on the vocabulary (rows) and the tied head on the vocabulary (columns, output ``Shard(-1)`` as a
    DTensor for :func:`loss_context`); with ``sequence_parallel`` the stream split along the sequence from
    the first block to the final LayerNorm and gathered again on entering the head. Taught in chapter 24."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {}
    if vocab_parallel:     # partial embeddings all-reduced to a replicated (B, T, d); + pos_emb as before
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if sequence_parallel:
        plan["blocks.0"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                              use_local_output=False)
        plan["ln_f"] = SequenceParallel()
    stream = Shard(1) if sequence_parallel else Replicate()
    if vocab_parallel:     # the stream all-gathered (sp) or taken as is; V/tp logits per rank, not gathered
        plan["head"] = ColwiseParallel(input_layouts=stream, output_layouts=Shard(-1), use_local_output=False)
    elif sequence_parallel:
        plan["head"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                          use_local_output=True)
    return plan


def apply_tensor_parallel(model, tp_mesh, *, sequence_parallel: bool = False, vocab_parallel: bool = True):
    """Split every block of ``model`` (a :class:`labkit.model.gpt.GPT`, unwrapped) over ``tp_mesh``, in place:
    qkv rows interleaved, then the block plan (see the module docstring); with ``sequence_parallel`` the
    residual stream enters the first block split along the sequence and is gathered again before the
    head; with ``vocab_parallel`` the tied embedding and head split over the vocabulary (:func:`head_plan`)
    and tied again. Returns ``model``. Taught in chapter 24."""
    from torch.distributed.tensor.parallel import parallelize_module

    tp = tp_mesh.size()
    cfg = model.config
    if cfg.n_heads % tp or cfg.ff % tp:
        raise ValueError(f"tensor parallelism: n_heads={cfg.n_heads} and d_ff={cfg.ff} must be divisible by tp={tp}")
    if vocab_parallel and cfg.vocab_size % tp:
        raise ValueError(f"tensor parallelism: vocab_size={cfg.vocab_size} must be divisible by tp={tp} for the "
                         "vocabulary-parallel head (pad the vocabulary, as Megatron does, or vocab_parallel=False)")
    for block in model.blocks:
        interleave_qkv(block.attn.qkv, tp)
        parallelize_module(block, tp_mesh, block_plan(sequence_parallel))
    plan = head_plan(sequence_parallel, vocab_parallel)
    if plan:
        parallelize_module(model, tp_mesh, plan)
    if vocab_parallel:     # both styles made a new Parameter of the one tied weight: keep one (Shard(0) in both)
        model.head.weight = model.tok_emb.weight
        model.tok_emb.weight.register_post_accumulate_grad_hook(_grad_like_param)
    model.loss_parallel = vocab_parallel
    return model


def _grad_like_param(param) -> None:
    """DTensor's embedding backward has no vocabulary-sharded rule: it returns the tied weight's gradient
    replicated ([V, d] on every rank; seen with torch 2.13). Keep this rank's rows only (a local slice, no
    communication), so the gradient is laid out as the weight — what the pipeline's tied-gradient sum and the
    optimizer expect."""
    g = param.grad
    if g is not None and hasattr(g, "placements") and g.placements != param.placements:
        param.grad = g.redistribute(param.device_mesh, param.placements)


def loss_context(model):
    """:func:`torch.distributed.tensor.parallel.loss_parallel` when ``model``'s head is vocabulary-parallel
    (the cross-entropy of ``Shard(-1)`` logits without gathering them; its backward must run inside too),
    else a null context. Taught in chapter 24."""
    import contextlib

    if not getattr(unwrap(model), "loss_parallel", False):
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


def unwrap(model):
    """The module under torch.compile's and DDP's wrappers. Taught in chapter 24."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def local_loss(loss):
    """The loss as a plain tensor: a vocabulary-parallel loss is a DTensor replicated over the tp ranks (each
    holds the same value). Taught in chapter 24."""
    return _local(loss)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def untie_for_ddp(module):
    """Before torch's TP+DDP bridge (``_pre_dp_module_transform``): that bridge swaps each DTensor parameter
    for a local one module by module, once per parameter, so the head would keep the old tied DTensor — a
    second, untrained copy. Unregister the head's weight here; the returned ``retie()`` (called after the
    bridge) adds a forward pre-hook that points the head at the embedding's weight as the bridge rebuilt it,
    so both uses feed the one local parameter DDP reduces. Taught in chapter 24."""
    head, emb = getattr(module, "head", None), getattr(module, "tok_emb", None)
    if head is None or emb is None or head.weight is not emb.weight:
        return lambda: None
    del head.weight

    def hook(mod, _args):
        mod.head.weight = mod.tok_emb.weight

    def retie():
        module.register_forward_pre_hook(hook)     # after the bridge's own pre-hook: runs on its DTensor

    return retie


def head_flops(model, optimizer=None, cfg=None) -> dict:
    """This rank's FLOPs of the head (forward and backward) on one micro-batch of ``cfg`` — a
    :func:`labkit.train.train` probe. A forward captures the head's input and output as this rank holds
    them; the rank's own matmul (its input × its local weight rows) is run again on plain tensors under
    :class:`torch.utils.flop_counter.FlopCounterMode` — which on DTensors would count the global op — and
    checked to give this rank's logits. Returns the FLOPs, the local logits' shape and whether the head is
    vocabulary-parallel. Taught in chapter 24."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    gpt = unwrap(model)
    if getattr(gpt, "schedule", None) is not None or not hasattr(gpt, "head"):
        raise ValueError("head_flops needs an unpipelined GPT (pp = 1): a pipelined model has no single head")
    if cfg is None:
        raise ValueError("head_flops needs the run's TrainConfig (cfg) for its micro-batch")
    seen = {}

    def grab(_mod, args, out):
        seen["x"], seen["y"] = args[0], out

    weight = gpt.tok_emb.weight if getattr(gpt.head, "weight", None) is None else gpt.head.weight
    device = weight.device
    idx = torch.randint(0, gpt.config.vocab_size, (cfg.micro_batch, gpt.config.seq_len),
                        generator=torch.Generator().manual_seed(cfg.seed)).to(device)
    handle = gpt.head.register_forward_hook(grab)
    try:
        with torch.no_grad():
            model(idx)
    finally:
        handle.remove()
    x = _local(seen["x"]).detach().float().requires_grad_()
    w = _local(gpt.head.weight).detach().float().requires_grad_()
    with FlopCounterMode(display=False) as counter:
        y = F.linear(x, w)
        y.backward(torch.ones_like(y))
    mine = _local(seen["y"]).float()
    if y.shape != mine.shape or not torch.allclose(y, mine, rtol=1e-4, atol=1e-5):
        raise RuntimeError(f"head_flops: the local matmul ({tuple(y.shape)}) does not give this rank's logits "
                           f"({tuple(mine.shape)})")
    return {"head_flops": int(counter.get_total_flops()), "logits_local_shape": list(y.shape),
            "vocab_parallel": bool(getattr(gpt, "loss_parallel", False))}
