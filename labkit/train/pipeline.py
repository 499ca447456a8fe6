"""Pipeline parallelism of the reference GPT: stages cut from its blocks, run by a torch schedule.

The GPT's ``n_layers`` blocks are cut into ``pp · virtual_stages`` consecutive chunks (:func:`split_layers`);
the first chunk also runs the embeddings (:meth:`labkit.model.gpt.GPT.embed`), the last the final LayerNorm and
the head (:meth:`labkit.model.gpt.GPT.logits`). Rank r of the ``pp`` mesh dimension holds stage r (GPipe,
1F1B) or stages r, r+pp, r+2·pp, … (interleaved 1F1B, "looped" placement: Narayanan et al. 2021, §2.2).
Each stage is a :class:`torch.distributed.pipelining.PipelineStage`; activations go forward and their
gradients back by send/recv on the ``pp`` process group
(https://pytorch.org/docs/stable/distributed.pipelining.html).

The schedule *is* gradient accumulation: the loop's ``accum`` micro-batches of ``micro_batch`` sequences
are the schedule's micro-batches (m = accum); each micro-batch's loss is divided by m, as in
:func:`labkit.train.loop.forward_backward`, so the gradient is that of the mean loss over the step's batch.
``schedule.step`` replaces the loop's forward/backward; everything else (data, optimizer, record) is the
one loop. Schedules (:data:`SCHEDULES`): ``"gpipe"`` (all forwards, then all backwards: Huang et al. 2019),
``"1f1b"`` (one forward, one backward in the steady state: at most p micro-batches' activations live;
PipeDream-Flush, Narayanan et al. 2021) and ``"interleaved1f1b"`` (v chunks per rank). Idle share of a
step, the bubble: (p−1)/(v·m) of the ideal step's compute (Narayanan et al. 2021, §2.2, eq. for
interleaving) — :func:`bubble_fraction`.

Tied embeddings: the token embedding (first stage) and the head (last stage) share one weight in the GPT;
cut into stages they live on two ranks, so after the schedule their gradients are summed over the
``pp`` group and both copies take the same step (Megatron's embedding group) — :func:`sync_tied`.

Taught in chapter 24 (choosing a parallel layout).
"""
from __future__ import annotations

import torch.nn as nn

SCHEDULES = ("gpipe", "1f1b", "interleaved1f1b")


def split_layers(n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """[lo, hi) block ranges of ``n_stages`` consecutive stages, sizes differing by at most one (the earlier
    stages take the extra blocks). Taught in chapter 24."""
    if n_stages < 1 or n_layers < n_stages:
        raise ValueError(f"cannot cut {n_layers} blocks into {n_stages} pipeline stages: each stage needs ≥ 1 block "
                         "(n_layers ≥ pp · virtual_stages)")
    base, extra = divmod(n_layers, n_stages)
    out, lo = [], 0
    for s in range(n_stages):
        hi = lo + base + (1 if s < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def stage_indices(pp_rank: int, pp: int, virtual_stages: int) -> list[int]:
    """The stages rank ``pp_rank`` holds: r, r+pp, … (looped placement). Taught in chapter 24."""
    return [pp_rank + k * pp for k in range(virtual_stages)]


def bubble_fraction(pp: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """The pipeline bubble as a share of the ideal (bubble-free) step: (p−1)/(v·m) (Narayanan et al. 2021,
    §2.2). Taught in chapter 24."""
    from labkit import checks

    p, m = checks.count("pp", pp), checks.count("micro_batches", micro_batches)
    return (p - 1) / (checks.count("virtual_stages", virtual_stages) * m)


class Stage(nn.Module):
    """One stage of a :class:`labkit.model.gpt.GPT`: its blocks ``[lo, hi)``, plus the embeddings on the first
    stage and the final norm and head on the last (the modules are the GPT's own, not copies).
    Taught in chapter 24."""

    def __init__(self, gpt, lo: int, hi: int, *, first: bool, last: bool):
        super().__init__()
        self.config, self.first, self.last, self.span = gpt.config, first, last, (lo, hi)
        if first:
            self.tok_emb, self.pos_emb, self.drop = gpt.tok_emb, gpt.pos_emb, gpt.drop
        self.context_parallel = gpt.context_parallel     # chapter 26: cp > 1 cuts the sequence on entry
        self.blocks = nn.ModuleList(gpt.blocks[lo:hi])
        if last:
            self.ln_f, self.head = gpt.ln_f, gpt.head

    def forward(self, x):
        from labkit.model.gpt import GPT

        if self.first:
            pos = None
            if self.context_parallel is not None:     # this rank's share of each sequence (chapter 26)
                x, _, pos = self.context_parallel.shard(x)
            x = GPT.embed(self, x, pos)
        for block in self.blocks:
            x = block(x)
        return GPT.logits(self, x) if self.last else x


class Pipelined(nn.Module):
    """This rank's stages (``parameters()`` are what its optimizer steps) and the schedule that runs them;
    the loop calls :func:`step` instead of forward/backward. Taught in chapter 24."""

    def __init__(self, stages, schedule, *, pp_group, holds_first: bool, holds_last: bool, tied):
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.schedule, self.pp_group = schedule, pp_group
        self.holds_first, self.holds_last, self.tied = holds_first, holds_last, tied
        self.loss_parallel = False        # the gpt's vocabulary-parallel head (tp > 1): set by build

    def forward(self, *args, **kwargs):
        raise RuntimeError("a pipelined model runs through its schedule (labkit.train.pipeline.step), not forward()")


def _loss_fn(accum: int, cp=None):
    import torch.nn.functional as F

    def loss(logits, targets):      # the loop's loss / accum on each micro-batch (chapter 15)
        if cp is not None:          # chapter 26: the logits are of this rank's tokens only
            targets = cp.shard(targets)[0]
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1)) / accum

    return loss


def _labelled_stage():
    """``PipelineStage`` whose forward and backward of each micro-batch are profiler ranges
    ``labkit:stage{s}:forward`` / ``:backward`` — compute only: the schedule waits for its inputs before
    calling them (what :mod:`labkit.trace.pipeline` measures the bubble from)."""
    from torch.distributed.pipelining import PipelineStage
    from torch.profiler import record_function

    class LabelledStage(PipelineStage):
        def forward_one_chunk(self, *args, **kwargs):
            with record_function(f"labkit:stage{self.stage_index}:forward"):
                return super().forward_one_chunk(*args, **kwargs)

        def backward_one_chunk(self, *args, **kwargs):
            with record_function(f"labkit:stage{self.stage_index}:backward"):
                return super().backward_one_chunk(*args, **kwargs)

    return LabelledStage


def build(gpt, cfg, mesh, device, wrap, dp_mesh=None):
    """Cut ``gpt`` (already tensor-parallel if tp > 1, with its ring attention hooked in if cp > 1) into this
    rank's stages, wrap each with ``wrap`` (checkpointing, DDP/FSDP2 over ``dp_mesh``: ``dp``, or dp·cp) and
    build ``cfg.pp_schedule`` over the ``pp`` group. Taught in chapter 24."""
    from torch.distributed.pipelining import (
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    pp, v = cfg.pp, cfg.virtual_stages
    n_stages = pp * v
    spans = split_layers(gpt.config.n_layers, n_stages)
    group = mesh["pp"].get_group()
    here = stage_indices(mesh["pp"].get_local_rank(), pp, v)
    modules, stages, kind = [], [], _labelled_stage()
    for s in here:
        mod = wrap(Stage(gpt, *spans[s], first=s == 0, last=s == n_stages - 1))
        modules.append(mod)
        stages.append(kind(mod, s, n_stages, device, group=group))
    loss = _loss_fn(cfg.accum, gpt.context_parallel)
    if cfg.pp_schedule == "interleaved1f1b":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=cfg.accum, loss_fn=loss, scale_grads=False)
    else:
        kind = ScheduleGPipe if cfg.pp_schedule == "gpipe" else Schedule1F1B
        schedule = kind(stages[0], n_microbatches=cfg.accum, loss_fn=loss, scale_grads=False)
    out = Pipelined(modules, schedule, pp_group=group, holds_first=0 in here, holds_last=n_stages - 1 in here,
                    tied=_tied_here(modules, gpt, cfg, mesh["dp"] if dp_mesh is None else dp_mesh))
    out.loss_parallel = getattr(gpt, "loss_parallel", False)    # the last stage's loss under loss_parallel
    return out


def _tied_here(modules, gpt, cfg, dp):
    """The tied weight as this rank's wrapped stages hold it (FSDP2 swaps in a sharded parameter; DDP
    wraps the stage), or None and the shape of the zeros a middle stage contributes."""
    import torch

    for mod in modules:
        inner = getattr(mod, "module", mod)           # DDP keeps the stage as .module
        if inner.first:
            return inner.tok_emb.weight
        if inner.last:
            return inner.head.weight
    shape = tuple(gpt.tok_emb.weight.shape)
    if cfg.parallel == "fsdp":                         # FSDP2 shards dim 0 over dp (·cp) like torch.chunk
        shape = tuple(torch.empty(shape, device="meta").chunk(dp.size())[dp.get_local_rank()].shape)
    return shape


def sync_tied(model) -> None:
    """Sum the tied embedding/head weight's gradient over the ``pp`` group: the first stage's (embedding) and
    the last stage's (head) contributions, zeros from the middle stages. Taught in chapter 24."""
    import torch
    import torch.distributed as dist

    w = model.tied
    holds = isinstance(w, torch.nn.Parameter)
    if holds and w.grad is None:
        raise RuntimeError("the tied embedding weight has no gradient after the pipeline step")
    g = (w.grad.to_local() if hasattr(w.grad, "to_local") else w.grad) if holds else None
    buf = g.clone() if holds else torch.zeros(w)
    dist.all_reduce(buf, group=model.pp_group)
    if holds:
        g.copy_(buf)


def step(model, micro_batches, cfg, device, phase, autocast):
    """One step's forward and backward through the schedule: the ``accum`` micro-batches drawn (phase
    "data"), concatenated and run by ``schedule.step`` (phase "pipeline": forwards, backwards and the
    send/recv between stages interleaved), then the tied weight's gradient summed (phase "comm").
    Returns the step's loss (the sum of the micro-batches' loss/accum) on ranks holding the last stage,
    0 elsewhere. Taught in chapter 24."""
    import torch
    from torch.profiler import record_function

    from labkit.train.tensor_parallel import local_loss, loss_context

    xs, ys = [], []
    with phase("data"):
        for _ in range(cfg.accum):
            x, y = next(micro_batches)
            xs.append(x.to(device, non_blocking=True))
            ys.append(y.to(device, non_blocking=True))
    args = (torch.cat(xs),) if model.holds_first else ()
    losses: list = []
    with phase("pipeline"), record_function("labkit:pipeline"), autocast, loss_context(model):   # read by labkit.trace.pipeline
        model.schedule.step(*args, target=torch.cat(ys) if model.holds_last else None, losses=losses)
    with phase("comm"):
        sync_tied(model)
    total = torch.zeros((), device=device)
    for loss in losses:
        total += local_loss(loss).detach().float()
    return total
