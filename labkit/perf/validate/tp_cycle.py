"""Tensor parallelism's cost on N gloo ranks beyond a rank's own arithmetic (issue #24): what the all-reduces,
DTensor and the waits cost per Megatron column/row pair, measured on the GPT's own blocks, never on a GPT.

A tensor-parallel GPT block is two Megatron pairs (Shoeybi et al. 2019 §3): ``qkv`` by columns then ``proj`` by
rows, ``fc`` by columns then ``proj`` by rows (:mod:`labkit.train.tensor_parallel`). Beyond the arithmetic of its
local shard (:func:`labkit.perf.validate.stage_times.shard_block`: n_heads/tp heads, ff/tp columns, the LayerNorms
whole), each pair costs per micro-batch its two all-reduces (the row split's output in forward, the column
split's input gradient in backward), DTensor's dispatch of every op on a sharded parameter (sharding
propagation, the ``Replicate`` → ``Partial`` redistributions around each collective, the wrappers' hooks) and
the **wait** at each all-reduce: a rank that arrives first waits for the slowest, and when ranks outnumber cores
each collective waits for a rank the scheduler has set aside. A bare all-reduce sweep — every rank in step,
nothing computed between calls — sees none of the last.

:func:`tp_block_cycle` measures it all at once: 2 blocks of the GPT split by the trainer's own plan over groups
of tp ranks among N (every group at once, as a TP×PP cell runs them), forward + backward of a micro-batch, 4
micro-batches a run as a step runs them; then, in the same processes, the same blocks' plain local shards run by
all N ranks at once — at the rate N ranks keep on this machine's cores, as the model's compute term is. Per pair
and micro-batch::

    cost(bytes) = [t_N(TP block) − t_N(local shard block)] / 2   ≈   a + b · (b·s·h·4 bytes)

fitted by least squares over a few micro-batch sizes (:class:`TPCycle`). It holds the all-reduces, so the
model prints their α–β beside it and does not add it. (An earlier form timed a synthetic stack of
column/row ``Linear`` pairs and took its bare all-reduces out: on 4 ranks on 2 cores it read a third of what
the GPT's blocks cost, alternating its runs with the local shard's put the ranks back in step, and the
difference of three noisy medians went negative.) AdamW's per-step update of each pair's DTensor parameters is
not timed here (≈ 1 ms per pair and step measured on 2 ranks: under 2 % of the small GPT's TP step).

Layer 3 (ARCHITECTURE.md): it launches ranks (:func:`labkit.launcher.launch`). Used by
:mod:`labkit.perf.validate.model_parallel`. Taught in chapter 24 (choosing a layout: what the TP model prices).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["TPCycle", "fit_tp_cycle", "tp_block_cycle"]

@dataclass(frozen=True)
class TPCycle:
    """TP's seconds per Megatron pair and micro-batch on ``nranks`` ranks beyond the local shard's arithmetic:
    ``alpha_s`` + ``beta_s_per_byte`` × activation bytes (fitted to ``cost_s`` at ``act_bytes``);
    ``includes_all_reduces``: measured on the GPT's blocks, the pairs' all-reduces inside it. Taught in chapter 24."""

    nranks: int
    alpha_s: float
    beta_s_per_byte: float
    act_bytes: tuple
    cost_s: tuple
    tp: int = 0                   # ranks per TP group (0: all nranks)
    includes_all_reduces: bool = False    # True: measured on the GPT's own blocks, the all-reduces inside

    def __post_init__(self):
        from labkit.perf.validate.fit import _check_cycle

        _check_cycle(self)
        object.__setattr__(self, "includes_all_reduces",
                           checks.flag("TPCycle.includes_all_reduces", self.includes_all_reduces))

    def cost(self, act_bytes: float) -> float:
        """Seconds per pair and micro-batch at ``act_bytes`` (≥ 0: a negative fit is clamped)."""
        return max(0.0, self.alpha_s + self.beta_s_per_byte * checks.positive("act_bytes", act_bytes))

    def overhead_s(self, pairs: int, micro_batches: int, act_bytes: float) -> float:
        """TP's own seconds per optimizer step of a rank holding ``pairs`` Megatron pairs (2 per GPT block):
        pairs × micro_batches × cost(act_bytes). Taught in chapter 24."""
        p, m = checks.count("pairs", pairs, at_least=0), checks.count("micro_batches", micro_batches)
        return p * m * self.cost(act_bytes)

    def format(self) -> str:
        pts = ", ".join(f"{b / 1e3:.0f} kB {c * 1e6:.0f} us" for b, c in zip(self.act_bytes, self.cost_s, strict=True))
        where = f"{self.nranks} ranks" + (f" (groups of tp={self.tp})" if self.tp not in (0, self.nranks) else "")
        what = ("GPT blocks: all-reduces, DTensor and waits, per Megatron pair" if self.includes_all_reduces
                else "beyond the all-reduces")
        return (f"TP cycle on {where} ({what}): "
                f"{self.alpha_s * 1e6:.0f} us + {self.beta_s_per_byte * 1e9:.3f} ns/B per pair and micro-batch "
                f"(measured: {pts})")


def fit_tp_cycle(act_bytes, cost_s, nranks: int, *, tp: int | None = None,
                 includes_all_reduces: bool = False) -> TPCycle:
    """Least-squares line cost = a + b·bytes through per-pair costs measured at ``act_bytes`` (at least two
    distinct sizes) on ``nranks`` ranks in groups of ``tp`` (default all); ``includes_all_reduces``: the costs
    hold the pairs' all-reduces (:func:`tp_block_cycle`). Taught in chapter 24."""
    from labkit.perf.validate.fit import line_fit

    a, b, x, y = line_fit("fit_tp_cycle", "act_bytes", act_bytes, cost_s)
    return TPCycle(nranks=checks.count("nranks", nranks, at_least=2), alpha_s=float(a), beta_s_per_byte=float(b),
                   act_bytes=tuple(x), cost_s=tuple(y), tp=0 if tp is None else checks.count("tp", tp, at_least=2),
                   includes_all_reduces=checks.flag("includes_all_reduces", includes_all_reduces))


def _block_cells(model_name: str, micro_batches: list, blocks: int, iters: int, warmup: int, tp: int) -> list:
    """What each rank runs: per micro-batch size, medians in seconds per block of (forward + backward of ``blocks``
    GPT blocks split over groups of ``tp`` ranks by the trainer's own plan, every group at once; the same blocks'
    plain local shards, every rank at once), each a run of consecutive iterations as a step's micro-batches."""
    import statistics
    import time

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from labkit.model.config import SIZES
    from labkit.model.gpt import Block
    from labkit.perf.validate.stage_times import shard_block
    from labkit.train.tensor_parallel import block_plan, interleave_qkv

    n, mc = dist.get_world_size(), SIZES[model_name]
    mesh = init_device_mesh("cpu", (n // tp, tp), mesh_dim_names=("rep", "tp"))["tp"]
    torch.manual_seed(0)
    split = nn.Sequential(*(Block(mc) for _ in range(blocks)))
    for blk in split:
        interleave_qkv(blk.attn.qkv, tp)
        parallelize_module(blk, mesh, block_plan(False))
    local = nn.Sequential(*(shard_block(mc, tp) for _ in range(blocks)))
    out = []
    for b in micro_batches:
        x = torch.randn(b, mc.seq_len, mc.d_model, requires_grad=True)
        meds = []
        for mod in (split, local):
            runs = []
            for _ in range(warmup + iters):              # a run of 4 micro-batches, as a step; no barrier inside
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(4):
                    mod(x).sum().backward()
                runs.append((time.perf_counter() - t0) / (4 * blocks))
                mod.zero_grad(set_to_none=True)
                x.grad = None
            meds.append(statistics.median(runs[warmup:]))
        out.append(tuple(meds))
    return out


def tp_block_cycle(nranks: int, model: str = "small", micro_batches=(1, 2, 4), *, tp: int | None = None,
                   blocks: int = 2, iters: int = 9, warmup: int = 3, timeout_s: float = 300) -> TPCycle:
    """TP's whole cost per Megatron pair and micro-batch on the ``model`` GPT's own blocks: ``blocks`` blocks (not a
    GPT: no embeddings, head, loss, optimizer or data) split by :mod:`labkit.train.tensor_parallel`'s plan over
    groups of ``tp`` ranks among ``nranks`` (default all), forward + backward of each of ``micro_batches``
    sequences, iteration after iteration; minus the same blocks' plain local shards
    (:func:`labkit.perf.validate.stage_times.shard_block`) run by all ranks at once in the same processes::

        cost(bytes) = [t_N(TP block) − t_N(local shard block)] / 2 pairs   ≈   a + b · (b·s·h·4 bytes)

    What is left holds the 4 all-reduces of a block, DTensor's work around them and the wait at each one when
    ranks compute between them (a rank a little slower, or set aside by the scheduler when ranks outnumber
    cores, holds the others) — so the α–β all-reduce term is printed beside it, not added
    (``includes_all_reduces``), as FSDP2's unit cycle replaces its collectives' α–β. One launch. Taught in
    chapter 24."""
    from labkit.launcher.parent import launch
    from labkit.model.config import SIZES
    from labkit.perf.validate.stage_times import shard_block

    n = checks.count("nranks", nranks, at_least=2)
    checks.one_of("model", model, SIZES)
    bs = [checks.count("micro_batches", b) for b in micro_batches]
    if len(set(bs)) < 2:
        raise ValueError(f"micro_batches must hold at least two distinct sizes to fit a + b·bytes, got {bs}")
    t = n if tp is None else checks.count("tp", tp, at_least=2)
    if n % t:
        raise ValueError(f"tp={t} must divide nranks={n} (groups of tp ranks)")
    mc = SIZES[model]
    shard_block(mc, t)                                     # a clear error here, not in the ranks
    k, it = checks.count("blocks", blocks), checks.count("iters", iters)
    wu = checks.count("warmup", warmup, at_least=0)
    cells = launch(_block_cells, n, args=(model, bs, k, it, wu, t), env={"OMP_NUM_THREADS": "1"},
                   timeout_s=timeout_s, stream=False).value
    cost = [(tb - lo) / 2 for tb, lo in cells]
    return fit_tp_cycle([b * mc.seq_len * mc.d_model * 4 for b in bs], cost, n, tp=t, includes_all_reduces=True)
