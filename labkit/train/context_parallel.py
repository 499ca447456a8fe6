"""Context parallelism of the reference GPT: each sequence split over the ``cp`` ranks, attention by a ring.

With ``TrainConfig(cp=N)`` the ranks form the device mesh ``(pp, dp, cp, tp)`` of
:mod:`labkit.train.parallel`: the ``cp`` ranks of one data-parallel index read the same
micro-batches, and each keeps only its 2 of the 2·cp chunks of every sequence (:func:`labkit.train.ring_attention.
positions`: chunks r and 2cp−1−r with ``cp_balanced``, the default; chunks 2r, 2r+1 without). Everything in
a block but attention is per token, so it runs on the local tokens unchanged; the token and position
embeddings take the tokens' global positions; attention is :func:`labkit.train.ring_attention.ring_attention`
over the ``cp`` dimension's process group, so each query still sees every earlier key of its sequence.

Each rank's loss is the mean over its own tokens; every rank holds the same number, so the mean over the
dp·cp ranks is the loss of the global batch, and the gradient of that mean is the mean of the ranks'
gradients — DDP / FSDP2 over all dp·cp ranks (torchtitan's ``dp_shard_cp``) averages exactly that: the
gradients are all-reduced over cp as over dp. The loss curve therefore equals the single-process run of the
same global batch to float tolerance (``tests/test_context_parallel.py``).

**With tensor parallelism** (``tp`` > 1, chapter 24; tp innermost, so a cp group joins ranks that hold the
same heads) the ring runs inside the tensor-parallel region: each rank's column-split ``qkv`` gives q, k, v
of its n_heads/tp heads only, so the ring passes those heads' K/V — 1/tp of the bytes of cp alone — and the
row-split ``proj`` all-reduces over tp as before. **With pipeline parallelism** (``pp`` > 1) the first
stage cuts each micro-batch to the rank's tokens, later stages attend over the ring of their own stage
(every cp rank of a stage runs the same schedule, so their ring steps pair up), and the loss takes the
targets at the rank's positions. In both, DDP / FSDP2 reduce over the flattened dp·cp dimension
(:func:`labkit.train.parallel.grad_mesh`).

The model learns nothing of this beyond two hooks: ``GPT.context_parallel`` (cuts the batch, gives the
positions) and ``CausalSelfAttention.context_parallel`` (the attention core), set by
:func:`apply_context_parallel` — the same seam as tensor parallelism, applied from outside.

Taught in chapter 26 (long sequences and MoE).
"""
from __future__ import annotations

from labkit import checks


class ContextParallel:
    """This rank's share of each sequence and the ring it attends over. Taught in chapter 26."""

    def __init__(self, group, cp: int, rank: int, balanced: bool = True):
        self.group, self.cp, self.rank, self.balanced = group, checks.count("cp", cp), rank, balanced
        self.pos = None
        self.log = None          # a list: one dict per ring step of every attention call (chapter 26's counts)

    def shard(self, idx, targets=None):
        """(idx, targets, positions) of this rank's tokens of the (batch, seq_len) ``idx``."""
        from labkit.train.ring_attention import positions

        self.pos = positions(idx.shape[1], self.cp, self.rank, self.balanced).to(idx.device)
        return idx[:, self.pos], (None if targets is None else targets[:, self.pos]), self.pos

    def attend(self, q, k, v):
        """Causal ring attention of this rank's q, k, v (batch, heads here, T/cp, head_dim) over the cp group."""
        from labkit.train.ring_attention import positions, ring_attention

        if self.pos is None or self.pos.numel() != q.shape[2]:   # a later pipeline stage never ran shard()
            self.pos = positions(q.shape[2] * self.cp, self.cp, self.rank, self.balanced).to(q.device)
        return ring_attention(q, k, v, self.pos, self.group, log=self.log)


def cp_group(shape: dict, device):
    """The process group of this rank's ``cp`` dimension of the mesh ``shape`` (``{"pp": …, "dp": …, "cp": …,
    "tp": …}``, :func:`labkit.train.parallel.mesh_shape`); every rank calls this (creating groups is
    collective). Taught in chapter 26."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, tuple(shape.values()), mesh_dim_names=tuple(shape))
    return mesh["cp"].get_group()


def apply_context_parallel(model, group, *, balanced: bool = True) -> ContextParallel:
    """Hook ring attention over ``group`` into ``model`` (a :class:`labkit.model.gpt.GPT`, unwrapped), in place;
    returns the plan (its ``log`` can be set to a list to record the ring steps). Taught in chapter 26."""
    import torch.distributed as dist

    if model.config.dropout:
        raise ValueError(f"context parallelism: the ring has no attention dropout; model dropout="
                         f"{model.config.dropout} must be 0")
    plan = ContextParallel(group, dist.get_world_size(group), dist.get_rank(group), balanced)
    model.context_parallel = plan
    for block in model.blocks:
        block.attn.context_parallel = plan.attend
    return plan


def ring_probe(model, optimizer, cfg) -> dict:
    """A :func:`labkit.train.train` probe (run in every rank after the last step): one forward of a
    (1, seq_len) batch with the ring's log on — per attention layer and ring step, the chunk pairs computed
    and the K/V bytes received (with tp > 1 those of this rank's n_heads/tp heads only). Not for pipelined
    models. Taught in chapter 26."""
    import torch

    inner = getattr(model, "module", model)                 # DDP keeps the model as .module
    plan = getattr(inner, "context_parallel", None)
    if plan is None:
        raise ValueError(f"ring_probe needs a context-parallel, unpipelined model (cp={cfg.cp}, pp={cfg.pp}): "
                         "use cp ≥ 2 and pp = 1")
    device = next(inner.parameters()).device
    plan.log = []
    try:
        with torch.no_grad():
            model(torch.zeros(1, cfg.model_config.seq_len, dtype=torch.long, device=device))
        return {"cp_rank": plan.rank, "log": plan.log}
    finally:
        plan.log = None


def check_config(cfg, bad) -> None:
    """``TrainConfig``'s checks of ``cp`` and ``cp_balanced`` (called from ``config_checks``)."""
    checks.count("TrainConfig.cp", cfg.cp)
    checks.flag("TrainConfig.cp_balanced", cfg.cp_balanced)
    if cfg.cp == 1:
        return
    seq = cfg.model_config.seq_len
    if seq % (2 * cfg.cp):
        bad("cp", f"seq_len={seq} must be divisible by 2·cp={2 * cfg.cp} (the sequence is cut into 2·cp equal "
            "chunks, two per rank)")
    if cfg.parallel not in ("ddp", "fsdp"):
        bad("parallel", f"cp={cfg.cp} splits each sequence over ranks whose gradients must be averaged: use "
            "parallel='ddp' or 'fsdp' (they reduce over all dp·cp ranks)")
    if cfg.sequence_parallel and (seq // cfg.cp) % cfg.tp:
        bad("sequence_parallel", f"each cp rank's seq_len/cp={seq // cfg.cp} tokens must be divisible by tp={cfg.tp}")
    rules = {"checkpoint": cfg.checkpoint_policy != "none",
             "compile": cfg.compile, "cuda_graphs": cfg.cuda_graphs, "inject": cfg.inject != "none",
             "accum": cfg.adaptive, "val_every": cfg.val_every > 0, "comm_hook": cfg.comm_hook is not None,
             "checkpoint_every": cfg.checkpoint_every > 0 or cfg.resume_from is not None,
             "moe_experts": cfg.moe_experts > 0}
    for name, used in rules.items():
        if used:
            bad(name, f"not supported with cp={cfg.cp} in labkit (context parallelism runs "
                "eager, no recomputation, a fixed accum, no injections, evaluation or checkpoints, dense MLPs)")
