"""How a GPT's time divides between its parts — embeddings, one block, the tail (final norm, tied head, loss) — for
the pipeline and tensor-parallel cells of :mod:`labkit.perf.validate.model_parallel` (issue #24).

A pipeline rank's micro-batch time sets the compute (the slowest rank × m) and the bubble (the others' times). By
FLOPs (PaLM's count) the small GPT's head is about half the model (6·V·h of 6N per token with V = 4096, h = 256),
so the last stage looks far heavier than the others; but FLOPs are not seconds: the head is one large,
efficient GEMM while a block holds attention, norms and element-wise work that a FLOP count does not see. The
model then prices each rank's share of the *time* of a whole forward + backward as measured part by part::

    share(rank) = [blocks on the rank × t_block / tp + t_embed·(first stage) + t_tail·(last stage)] / t_model
    t_mb(rank)  = share(rank) × (hardware FLOPs per token × tokens per micro-batch ÷ the calibrated rate)

t_model = t_embed + L·t_block + t_tail, each a forward + backward of that part alone (median of ``iters``), on one
rank with one thread (:func:`measure_part_times`): the calibrated rate still sets the whole model's seconds, the
measured parts only divide them. A block split over tp ranks is priced at the measured time of its **local shard**
(``t_block(tp)``): the same block with ``n_heads/tp`` heads in qkv and proj and ``ff/tp`` columns in the MLP, as
one tensor-parallel rank computes it (Shoeybi et al. 2019 §3: the LayerNorms, the residual adds and dropout stay
whole on every rank), on plain tensors — not t_block / tp, which prices the replicated work as split. Its DTensor
work and its all-reduces are other terms (:mod:`labkit.perf.validate.tp_cycle`, the α–β). None of this times a
TP or PP run.

Layer 3 (ARCHITECTURE.md): it launches a rank (:func:`labkit.launcher.launch`). Taught in chapter 24 (what a FLOP
count says about a pipeline stage's time, and what it does not).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["PartTimes", "measure_part_times", "rank_time_shares", "shard_block"]


@dataclass(frozen=True)
class PartTimes:
    """Seconds of one micro-batch's forward + backward of each part of a GPT on one rank: ``embed_s``,
    ``block_s`` (one block, the median over the blocks), ``tail_s`` (final norm, head, loss) and ``n_layers``;
    ``block_tp_s``: ((tp, seconds of one block's local shard on a tp-way split), …), measured where asked.
    Taught in chapter 24."""

    embed_s: float
    block_s: float
    tail_s: float
    n_layers: int
    block_tp_s: tuple = ()

    def __post_init__(self):
        """Each time finite and ≥ 0 (the block's > 0: it divides), ``n_layers`` a count, ``block_tp_s`` pairs of
        (tp ≥ 2, seconds > 0): a negative embedding time made rank shares [1.055, −0.055]."""
        for name in ("embed_s", "tail_s"):
            object.__setattr__(self, name, checks.nonneg(f"PartTimes.{name}", getattr(self, name)))
        object.__setattr__(self, "block_s", checks.positive("PartTimes.block_s", self.block_s))
        object.__setattr__(self, "n_layers", checks.count("PartTimes.n_layers", self.n_layers, at_most=100_000))
        try:
            pairs = tuple(tuple(p) for p in self.block_tp_s)
        except TypeError:
            raise checks.ArgumentTypeError(f"PartTimes.block_tp_s must be ((tp, seconds), …), got "
                                           f"{type(self.block_tp_s).__name__} {checks.short_repr(self.block_tp_s)}"
                                           ) from None
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"PartTimes.block_tp_s={checks.short_repr(self.block_tp_s)} is not valid: use "
                             "((tp, seconds), …) pairs")
        object.__setattr__(self, "block_tp_s", tuple(
            (checks.count("PartTimes.block_tp_s tp", t, at_least=2), checks.positive("PartTimes.block_tp_s seconds", x))
            for t, x in pairs))
        checks.finite_result("PartTimes.model_s", self.model_s, positive=True, embed_s=self.embed_s,
                             block_s=self.block_s, tail_s=self.tail_s, n_layers=self.n_layers)

    def block_shard_s(self, tp: int) -> float:
        """One block's seconds on a rank of a ``tp``-way split: its measured local shard, else block_s / tp."""
        if tp == 1:
            return self.block_s
        return dict(self.block_tp_s).get(tp, self.block_s / tp)

    @property
    def model_s(self) -> float:
        return self.embed_s + self.n_layers * self.block_s + self.tail_s

    def format(self) -> str:
        return (f"GPT parts, one micro-batch forward + backward on 1 rank: embeddings {self.embed_s * 1e3:.1f} ms, "
                f"block {self.block_s * 1e3:.1f} ms (x{self.n_layers}), tail (norm, head, loss) "
                f"{self.tail_s * 1e3:.1f} ms: the tail is {self.tail_s / self.model_s:.0%} of the time"
                + "".join(f"; a block's tp={t} local shard {x * 1e3:.1f} ms ({x / self.block_s:.0%} of the block, "
                          f"not {1 / t:.0%})" for t, x in self.block_tp_s))


def rank_time_shares(cfg, parts: PartTimes) -> list:
    """Per pipeline rank of ``cfg`` (tp, pp, virtual stages as the trainer cuts them), its share of a whole
    model's forward + backward time (module docstring); TP ranks of a stage share alike; with tp > 1 and
    ``vocab_parallel`` the tail (head and loss split over the vocabulary) counts 1/tp — its FLOPs' share, not a
    measured local shard as ``block_tp_s`` is for a block. Taught in chapter 24."""
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
        t = sum(spans[k][1] - spans[k][0] for k in here) * parts.block_shard_s(cfg.tp)
        tail = parts.tail_s / (cfg.tp if cfg.vocab_parallel else 1)     # the vocabulary-parallel head and loss
        t += (parts.embed_s if 0 in here else 0.0) + (tail if len(spans) - 1 in here else 0.0)
        out.append(t / parts.model_s)
    return out


def shard_block(mc, tp: int):
    """One GPT block as a ``tp``-way tensor-parallel rank holds it, on plain tensors: qkv and proj over
    ``n_heads/tp`` heads, fc and proj over ``ff/tp`` columns, the LayerNorms whole (the attention reads its head
    count from qkv's width: :class:`labkit.model.gpt.CausalSelfAttention`). Taught in chapter 24."""
    import torch.nn as nn

    from labkit.model.gpt import Block

    t = checks.count("tp", tp, at_least=2)
    if mc.n_heads % t or mc.ff % t:
        raise ValueError(f"tp={t} must divide n_heads={mc.n_heads} and ff={mc.ff} (whole heads and columns per rank)")
    if mc.n_experts:
        raise ValueError(f"shard_block prices a dense MLP; this model has n_experts={mc.n_experts}")
    blk, h = Block(mc), mc.d_model
    blk.attn.qkv, blk.attn.proj = nn.Linear(h, 3 * h // t), nn.Linear(h // t, h)
    blk.mlp.fc, blk.mlp.proj = nn.Linear(h, mc.ff // t), nn.Linear(mc.ff // t, h)
    return blk


def _part_cells(model_name: str, micro_batch: int, iters: int, warmup: int, tps: tuple = ()) -> tuple:
    """What the rank runs: each part of a fresh GPT, and each tp's local shard of a block, forward + backward on
    one micro-batch; medians (seconds)."""
    import statistics
    import time

    import torch
    import torch.nn.functional as F

    from labkit.model.config import SIZES
    from labkit.model.gpt import GPT
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
            **{f"block{i}": (lambda blk=blk: blk(act()).sum().backward()) for i, blk in enumerate(gpt.blocks)},
            **{f"shard{t}": (lambda blk=shard_block(mc, t): blk(act()).sum().backward()) for t in tps}}
    times = {k: [] for k in runs}
    for i in range(warmup + iters):          # interleaved: a slow moment hits every part alike
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            if i >= warmup:
                times[k].append(time.perf_counter() - t0)
        gpt.zero_grad(set_to_none=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return (med["embed"], statistics.median(med[f"block{i}"] for i in range(L)), med["tail"], L,
            tuple((t, med[f"shard{t}"]) for t in tps))


def measure_part_times(model: str = "small", micro_batch: int = 2, *, tps=(), iters: int = 7, warmup: int = 2,
                       timeout_s: float = 300) -> PartTimes:
    """Time each part of the ``model`` GPT (embeddings, every block, tail) and, for each of ``tps``, a block's
    tp-way local shard (:func:`shard_block`) forward + backward on ``micro_batch`` sequences, interleaved, on
    one fresh rank with one thread (a launch, never a training run); medians of ``iters`` after ``warmup``.
    Taught in chapter 24."""
    from labkit.launcher.parent import launch
    from labkit.model.config import SIZES

    checks.one_of("model", model, SIZES)
    b, it = checks.count("micro_batch", micro_batch), checks.count("iters", iters)
    wu = checks.count("warmup", warmup, at_least=0)
    ts = tuple(sorted({checks.count("tps", t, at_least=2) for t in tps}))
    for t in ts:
        shard_block(SIZES[model], t)                       # a clear error here, not in the rank
    e, blk, t, L, sh = launch(_part_cells, 1, args=(model, b, it, wu, ts), env={"OMP_NUM_THREADS": "1"},
                              timeout_s=timeout_s, stream=False).value
    return PartTimes(embed_s=e, block_s=blk, tail_s=t, n_layers=L, block_tp_s=tuple(tuple(x) for x in sh))
