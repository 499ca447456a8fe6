"""A naive ring all-reduce, for learning: reduce-scatter then all-gather with point-to-point sends.

Not used in practice — NCCL and gloo run the same schedule in C++, pipelined in small slices over several
channels. This is the schedule itself, 2(N−1) steps, short enough to read in one screen
(Patarasuk & Yuan 2009, *Bandwidth optimal all-reduce algorithms for clusters of workstations*, §3;
the same two phases as NCCL's ring, ``nccl-tests`` doc/PERFORMANCE.md)::

    from labkit.comm import ring
    demo = ring.run_ring(4)          # 4 gloo ranks: the ring vs dist.all_reduce, and the log of every step
    demo.log                         # one row per (step, rank): which chunk went where, what it now holds
    labkit.teaching.viz.ring_allreduce(demo.log)

Taught in chapter 11 (communication diagnostics, §1).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from labkit import checks

__all__ = ["ring_all_reduce", "ring_demo_rank", "run_ring", "RingDemo", "contributors"]


def ring_all_reduce(x, log: list | None = None):
    """Sum ``x`` over all ranks in place with a ring of sends, like ``dist.all_reduce(x)``; returns ``x``.

    The buffer is cut into N chunks. Reduce-scatter (N−1 steps): rank r sends chunk (r − s) to its right
    neighbour and adds the chunk (r − s − 1) it receives from its left; afterwards rank r holds the full
    sum of chunk (r + 1). All-gather (N−1 steps): the summed chunks travel once more round the ring,
    copied instead of added. Each step moves one chunk, S/N bytes, per rank: 2(N−1)/N·S in all.
    ``log``: a list that gets one dict per step (what this rank sent and received). Chapter 11.
    """
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(x.view(-1).tensor_split(n))       # views into x: adding to a chunk updates x
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1)):
        reduce = step < n - 1                         # first half: reduce-scatter; second: all-gather
        s = step if reduce else step - (n - 1)
        send = (rank - s) % n if reduce else (rank + 1 - s) % n
        recv = (send - 1) % n                         # what the left neighbour sends this step
        buf = torch.empty_like(chunks[recv])
        reqs = [dist.isend(chunks[send], right), dist.irecv(buf, left)]
        for req in reqs:
            req.wait()
        if reduce:
            chunks[recv] += buf                       # add the neighbour's partial sum to ours
        else:
            chunks[recv].copy_(buf)                   # a finished sum: just keep it
        if log is not None:
            log.append({"step": step, "phase": "reduce-scatter" if reduce else "all-gather", "rank": rank,
                        "send_chunk": send, "to": right, "recv_chunk": recv, "from": left,
                        "bytes_sent": chunks[send].numel() * x.element_size(),
                        "recv_value": float(chunks[recv].view(-1)[0]) if chunks[recv].numel() else 0.0})
    return x


def contributors(value: float, n: int) -> tuple[int, ...]:
    """The ranks whose inputs a chunk holds, read from its value when rank r contributed 2**r
    (:func:`ring_demo_rank`'s inputs): 2**0 + 2**2 = 5 → (0, 2). Taught in chapter 11."""
    v = int(round(value))
    if v != value or v < 0 or v >= 2**n:
        raise ValueError(f"value={value!r} is not a sum of distinct 2**r for r < {n}")
    return tuple(r for r in range(n) if v >> r & 1)


def ring_demo_rank(numel: int = 64) -> dict:
    """One rank of :func:`run_ring`: rank r fills ``numel`` float64 elements with 2**r (so a chunk's value
    names the ranks summed into it), runs :func:`ring_all_reduce` and ``dist.all_reduce`` on copies and
    returns both results and the log. Chapter 11."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    x = torch.full((numel,), float(2**rank), dtype=torch.float64)
    expected = x.clone()
    dist.all_reduce(expected)
    log: list[dict] = []
    got = ring_all_reduce(x.clone(), log)
    return {"rank": rank, "ring": got.tolist(), "all_reduce": expected.tolist(), "log": log,
            "bytes": numel * x.element_size()}


@dataclass
class RingDemo:
    """:func:`run_ring`'s result: ``log`` (one row per step and rank, with ``holds``: the ranks whose
    inputs the received chunk now contains), ``matches`` (ring == ``dist.all_reduce`` on every rank),
    ``size_bytes`` (S) and ``sent_per_rank`` (bytes each rank sent, summed from the log). Chapter 11."""

    nprocs: int
    size_bytes: int
    log: pd.DataFrame
    matches: bool
    max_abs_diff: float

    @property
    def sent_per_rank(self) -> pd.Series:
        return self.log.groupby("rank")["bytes_sent"].sum()


def run_ring(nprocs: int = 4, numel: int | None = None, *, timeout_s: float = 120) -> RingDemo:
    """Run :func:`ring_all_reduce` on ``nprocs`` fresh gloo ranks (``labkit.launch``) and compare it with
    ``dist.all_reduce``. ``numel`` defaults to 16·nprocs float64 elements; nprocs ≤ 52 (2**r must stay
    exact in float64). Taught in chapter 11 (communication diagnostics, §1)."""
    nprocs = checks.count("nprocs", nprocs, at_least=2)
    if nprocs > 52:
        raise ValueError(f"nprocs={nprocs}: the demo's 2**rank inputs are exact in float64 only up to 52 ranks")
    numel = checks.count("numel", 16 * nprocs if numel is None else numel, at_least=nprocs)
    from labkit.launcher.parent import launch

    res = launch(ring_demo_rank, nprocs, backend="gloo", args=(numel,), timeout_s=timeout_s, stream=False)
    outs = sorted(res.values, key=lambda o: o["rank"])
    diff = max(abs(a - b) for o in outs for a, b in zip(o["ring"], o["all_reduce"], strict=True))
    log = pd.DataFrame([row for o in outs for row in o["log"]]).sort_values(["step", "rank"]).reset_index(drop=True)
    log["holds"] = [contributors(v, nprocs) for v in log["recv_value"]]
    return RingDemo(nprocs=nprocs, size_bytes=outs[0]["bytes"], log=log, matches=diff == 0.0, max_abs_diff=diff)
