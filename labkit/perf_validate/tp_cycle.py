"""Tensor parallelism's own work on N gloo ranks beyond its all-reduces (issue #24): what DTensor and
``parallelize_module`` cost per Megatron column/row pair, calibrated on a synthetic stack, never on a GPT.

A tensor-parallel GPT block is two Megatron pairs (Shoeybi et al. 2019 §3): ``qkv`` by columns then ``proj`` by
rows, ``fc`` by columns then ``proj`` by rows (:mod:`labkit.train.tensor_parallel`). Each pair costs per
micro-batch the two all-reduces the model already prices with gloo's α–β (the row split's output in forward,
the column split's input gradient in backward) *and* work that no compute rate of a plain model holds:
DTensor's dispatch of every op on a sharded parameter (sharding propagation, the ``Replicate`` → ``Partial``
redistributions that wrap each collective, the wrappers' input/output hooks), the copies around the
collectives. (Per optimizer step AdamW's update of each pair's four DTensor parameters costs more than a plain
one's too; it is not timed here — a forward, backward and optimizer step is the one training loop's job,
:mod:`labkit.train.loop` — and it is small: 4 DTensor tensors per pair, once per step, not per micro-batch.)

:func:`tp_pair_cycle` measures that on a synthetic module — ``pairs`` units of ``Linear(h, w)`` by columns
then ``Linear(w, h)`` by rows, with biases as the GPT's, ``w`` the GPT's MLP width by default so that each rank
computes between its collectives as a block's rank does — forward + backward of ``rows`` × h inputs (requiring a
gradient, as a block's input does, so the backward all-reduce runs) on N ranks in groups of tp; in the same
processes and interleaved with it, a bare gloo all-reduce of the same rows·h·4 bytes and the same stack as each
rank's **local shard** (``Linear(h, w/tp)``, ``Linear(w/tp, h)``: the same arithmetic on plain tensors, no
DTensor, no collective), all N ranks computing it at once — so it runs at the rate N ranks keep on this
machine's cores, as the model's compute term does. Per pair and micro-batch::

    cost(bytes) = t_N(pair) − 2 · t_N(all-reduce of bytes) − t_N(local pair)   ≈   a + b · bytes

What is left is DTensor's own work and what synchronising costs when ranks compute between collectives: a rank
that reaches an all-reduce first waits for the slowest, and when ranks outnumber cores each collective waits for
a rank the scheduler has set aside (a bare all-reduce sweep, every rank in step, never sees that).
fitted by least squares over a few row counts (:class:`TPCycle`). The all-reduces stay in the model's α–β term:
:meth:`TPCycle.overhead_s` is added beside it, not in place of it.

Layer 3 (ARCHITECTURE.md): it launches ranks (:func:`labkit.launcher.launch`). Used by
:mod:`labkit.perf_validate.model_parallel`. Taught in chapter 24 (choosing a layout: what the TP model prices).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["TP_CYCLE_ROWS", "TPCycle", "fit_tp_cycle", "tp_pair_cycle"]

#: Default input rows of the synthetic pairs at width h = 256: activations of 64 KiB, 256 KiB and 1 MiB (fp32),
#: which bracket the small GPT's b·s·h·4 = 256 KiB at micro-batch 2 (its h = 256, MLP width 1024).
TP_CYCLE_ROWS = (64, 256, 1024)


@dataclass(frozen=True)
class TPCycle:
    """DTensor's own seconds per Megatron pair on ``nranks`` ranks: ``alpha_s`` + ``beta_s_per_byte`` × activation
    bytes per pair and micro-batch (fitted to ``cost_s`` at ``act_bytes``). Taught in chapter 24."""

    nranks: int
    alpha_s: float
    beta_s_per_byte: float
    act_bytes: tuple
    cost_s: tuple
    tp: int = 0                   # ranks per TP group (0: all nranks)

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
        return (f"TP pair cycle on {where} (DTensor's own work beyond the all-reduces): "
                f"{self.alpha_s * 1e6:.0f} us + {self.beta_s_per_byte * 1e9:.3f} ns/B per pair and micro-batch "
                f"(measured: {pts})")


def fit_tp_cycle(act_bytes, cost_s, nranks: int, *, tp: int | None = None) -> TPCycle:
    """Least-squares line cost = a + b·bytes through per-pair costs measured at ``act_bytes`` (at least two
    distinct sizes) on ``nranks`` ranks in groups of ``tp`` (default all). Taught in chapter 24."""
    from labkit.perf_validate.fit import line_fit

    a, b, x, y = line_fit("fit_tp_cycle", "act_bytes", act_bytes, cost_s)
    return TPCycle(nranks=checks.count("nranks", nranks, at_least=2), alpha_s=float(a), beta_s_per_byte=float(b),
                   act_bytes=tuple(x), cost_s=tuple(y), tp=0 if tp is None else checks.count("tp", tp, at_least=2))


def _stack(h: int, w: int, pairs: int):
    import torch.nn as nn

    return nn.Sequential(*(nn.Sequential(nn.Linear(h, w), nn.Linear(w, h)) for _ in range(pairs)))


def _pair_cells(rows: list, h: int, w: int, pairs: int, iters: int, warmup: int, tp: int = 0) -> list:
    """What each rank runs: per row count, medians in seconds of (forward + backward per pair of the stack split by
    columns/rows over groups of ``tp`` ranks (0: all N), every group at once; a bare all-reduce of rows·h fp32 in
    the group; forward + backward per pair of the plain local shard, every rank at once), interleaved."""
    import statistics
    import time

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    n = dist.get_world_size()
    t = tp or n
    mesh = init_device_mesh("cpu", (n // t, t), mesh_dim_names=("rep", "tp"))["tp"]
    out = []
    for r in rows:
        torch.manual_seed(0)
        model, local = _stack(h, w, pairs), _stack(h, w // t, pairs)
        plan = {k: v for i in range(pairs) for k, v in ((f"{i}.0", ColwiseParallel()), (f"{i}.1", RowwiseParallel()))}
        parallelize_module(model, mesh, plan)
        x, buf = torch.randn(r, h, requires_grad=True), torch.randn(r * h)
        fb, ar, lo = [], [], []
        for _ in range(warmup + iters):
            for mod, into in ((model, fb), (local, lo)):
                dist.barrier()
                t0 = time.perf_counter()
                mod(x).sum().backward()
                into.append((time.perf_counter() - t0) / pairs)
                mod.zero_grad(set_to_none=True)
                x.grad = None
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(buf, group=mesh.get_group())
            ar.append(time.perf_counter() - t0)
        out.append(tuple(statistics.median(v[warmup:]) for v in (fb, ar, lo)))
    return out


def tp_pair_cycle(nranks: int, rows=TP_CYCLE_ROWS, *, tp: int | None = None, h: int = 256, width: int = 1024,
                  pairs: int = 4, iters: int = 9, warmup: int = 3, timeout_s: float = 300) -> TPCycle:
    """Measure :class:`TPCycle` on ``nranks`` gloo ranks (module docstring): ``pairs`` column/row pairs of width
    ``h`` (inner width ``width``, divisible by ``tp``; the small GPT's h and MLP width by default) split over
    groups of ``tp`` ranks (default all ``nranks``; e.g. tp = 2 in a world of 4, as a TP2×PP2 cell runs them:
    every group at once), inputs of each of ``rows``; medians of ``iters`` after ``warmup`` on rank 0, a barrier
    before each. One launch, not a training run. Taught in chapter 24."""
    from labkit.launcher.parent import launch

    n = checks.count("nranks", nranks, at_least=2)
    rs = [checks.count("rows", r) for r in rows]
    if len(set(rs)) < 2:
        raise ValueError(f"rows must hold at least two distinct counts to fit a + b·bytes, got {rs}")
    hh, w, k = checks.count("h", h), checks.count("width", width), checks.count("pairs", pairs)
    t = n if tp is None else checks.count("tp", tp, at_least=2)
    if n % t:
        raise ValueError(f"tp={t} must divide nranks={n} (groups of tp ranks)")
    if w % t:
        raise ValueError(f"width={w} must be divisible by tp={t} (a column split of whole columns)")
    it, wu = checks.count("iters", iters), checks.count("warmup", warmup, at_least=0)
    env = {"OMP_NUM_THREADS": "1"}
    cells = launch(_pair_cells, n, args=(rs, hh, w, k, it, wu, t), env=env, timeout_s=timeout_s, stream=False).value
    cost = [fb - 2 * ar - lo for fb, ar, lo in cells]
    return fit_tp_cycle([r * hh * 4 for r in rs], cost, n, tp=t)
