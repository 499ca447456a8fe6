"""How a GPT's time divides between its parts — embeddings, one block, the tail (final norm, tied head, loss) — for
the pipeline and tensor-parallel cells of :mod:`labkit.perf_validate.model_parallel` (issue #24).

A pipeline rank's micro-batch time sets the compute (the slowest rank × m) and the bubble (the others' times). By
FLOPs (PaLM's count) the small GPT's head is about half the model (6·V·h of 6N per token with V = 4096, h = 256),
so the last stage looks far heavier than the others; but FLOPs are not seconds: the head is one large,
efficient GEMM while a block holds attention, norms and element-wise work that a FLOP count does not see. The
model then prices each rank's share of the *time* of a whole forward + backward as measured part by part::

    share(rank) = [blocks on the rank × t_block / tp + t_embed·(first stage) + t_tail·(last stage)] / t_model
    t_mb(rank)  = share(rank) × (hardware FLOPs per token × tokens per micro-batch ÷ the calibrated rate)

t_model = t_embed + L·t_block + t_tail, each a forward + backward of that part alone (median of ``iters``), on one
rank with one thread (:func:`measure_part_times`): the calibrated rate still sets the whole model's seconds, the
measured parts only divide them. A block split over tp ranks is priced at t_block / tp (its DTensor work is
:mod:`labkit.perf_validate.tp_cycle`'s term). None of this times a TP or PP run.

Layer 3 (ARCHITECTURE.md): it launches a rank (:func:`labkit.launcher.launch`). Taught in chapter 24 (what a FLOP
count says about a pipeline stage's time, and what it does not).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["PartTimes", "measure_part_times", "rank_time_shares"]


@dataclass(frozen=True)
class PartTimes:
    """Seconds of one micro-batch's forward + backward of each part of a GPT on one rank: ``embed_s``,
    ``block_s`` (one block, the median over the blocks), ``tail_s`` (final norm, head, loss) and ``n_layers``.
    Taught in chapter 24."""

    embed_s: float
    block_s: float
    tail_s: float
    n_layers: int

    @property
    def model_s(self) -> float:
        return self.embed_s + self.n_layers * self.block_s + self.tail_s

    def format(self) -> str:
        return (f"GPT parts, one micro-batch forward + backward on 1 rank: embeddings {self.embed_s * 1e3:.1f} ms, "
                f"block {self.block_s * 1e3:.1f} ms (x{self.n_layers}), tail (norm, head, loss) "
                f"{self.tail_s * 1e3:.1f} ms: the tail is {self.tail_s / self.model_s:.0%} of the time")


def rank_time_shares(cfg, parts: PartTimes) -> list:
    """Per pipeline rank of ``cfg`` (tp, pp, virtual stages as the trainer cuts them), its share of a whole
    model's forward + backward time (module docstring); TP ranks of a stage share alike. Taught in chapter 24."""
    from labkit.train.pipeline import split_layers, stage_indices

    if not isinstance(parts, PartTimes):
        raise checks.ArgumentTypeError(f"parts must be a PartTimes (measure_part_times), got {type(parts).__name__}")
    L = cfg.model_config.n_layers
    if parts.n_layers != L:
        raise ValueError(f"parts were measured on a GPT of {parts.n_layers} blocks, cfg's has n_layers={L}")
    spans = split_layers(L, cfg.pp * cfg.virtual_stages)
    out = []
    for r in range(cfg.pp):
        here = stage_indices(r, cfg.pp, cfg.virtual_stages)
        t = sum(spans[k][1] - spans[k][0] for k in here) * parts.block_s / cfg.tp
        t += (parts.embed_s if 0 in here else 0.0) + (parts.tail_s if len(spans) - 1 in here else 0.0)
        out.append(t / parts.model_s)
    return out


def _part_cells(model_name: str, micro_batch: int, iters: int, warmup: int) -> tuple:
    """What the rank runs: each part of a fresh GPT forward + backward on one micro-batch; medians (seconds)."""
    import statistics
    import time

    import torch
    import torch.nn.functional as F

    from labkit.model_config import SIZES
    from labkit.models import GPT
    from labkit.train.pipeline import Stage

    torch.manual_seed(0)
    mc = SIZES[model_name]
    gpt = GPT(mc)
    L, b, s, h, V = mc.n_layers, micro_batch, mc.seq_len, mc.d_model, mc.vocab_size
    idx, tgt = torch.randint(0, V, (b, s)), torch.randint(0, V, (b, s))
    embed, tail = Stage(gpt, 0, 0, first=True, last=False), Stage(gpt, L, L, first=False, last=True)

    def act():
        return torch.randn(b, s, h, requires_grad=True)

    runs = {"embed": lambda: embed(idx).sum().backward(),
            "tail": lambda: F.cross_entropy(tail(act()).view(-1, V), tgt.view(-1)).backward(),
            **{f"block{i}": (lambda blk=blk: blk(act()).sum().backward()) for i, blk in enumerate(gpt.blocks)}}
    times = {k: [] for k in runs}
    for i in range(warmup + iters):          # interleaved: a slow moment hits every part alike
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            if i >= warmup:
                times[k].append(time.perf_counter() - t0)
        gpt.zero_grad(set_to_none=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return med["embed"], statistics.median(med[f"block{i}"] for i in range(L)), med["tail"], L


def measure_part_times(model: str = "small", micro_batch: int = 2, *, iters: int = 7, warmup: int = 2,
                       timeout_s: float = 300) -> PartTimes:
    """Time each part of the ``model`` GPT (embeddings, every block, tail) forward + backward on ``micro_batch``
    sequences, interleaved, on one fresh rank with one thread (a launch, never a training run); medians of
    ``iters`` after ``warmup``. Taught in chapter 24."""
    from labkit.launcher.parent import launch
    from labkit.model_config import SIZES

    checks.one_of("model", model, SIZES)
    b, it = checks.count("micro_batch", micro_batch), checks.count("iters", iters)
    wu = checks.count("warmup", warmup, at_least=0)
    e, blk, t, L = launch(_part_cells, 1, args=(model, b, it, wu), env={"OMP_NUM_THREADS": "1"}, timeout_s=timeout_s,
                          stream=False).value
    return PartTimes(embed_s=e, block_s=blk, tail_s=t, n_layers=L)
