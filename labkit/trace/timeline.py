"""One DDP step of one rank on a timeline: backward compute on one lane, each bucket's all-reduce on another.

DDP (Li et al. 2020, *PyTorch Distributed: Experiences on Accelerating Data Parallel Training*, §3.2.3)
groups gradients into buckets in reverse parameter order and launches a bucket's all-reduce as soon as
autograd has produced all of its gradients — while backward goes on computing the next bucket's. A
torch.profiler trace shows both: the launch (``c10d::allreduce_`` on the main thread, inside backward)
and the run (``gloo:all_reduce`` on gloo's thread on CPU, an ``nccl…AllReduce`` kernel on GPU).

:func:`ddp_timeline` reads them from a trace and pairs the k-th launch with the k-th run. The compute
lane is the host's autograd work (``autograd::engine::evaluate_function: …`` on the main thread): on a
CPU rank that *is* the compute; on a GPU it is when the host issued backward's kernels, which run a
little later on their stream (chapter 9's breakdown reads the kernels themselves).
``labkit.teaching.viz.ddp_timeline`` draws it. Taught in chapter 9 (trace analytics, §2).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit import intervals as iv
from labkit.trace.breakdown import RankView
from labkit.trace.load import CPU_OP, USER_ANNOTATION
from labkit.trace.runs import read_ranks

__all__ = ["DDPTimeline", "ddp_timeline"]

_BACKWARD = "autograd::engine::evaluate_function:"


@dataclass
class DDPTimeline:
    """One rank's step: ``backward`` (start_ms, end_ms of each merged stretch of autograd work),
    ``forward`` and ``optimizer`` spans (or None), and ``buckets`` (bucket, launch_ms, start_ms,
    end_ms, hidden_ms: how much of its all-reduce ran while backward computed). Times are ms from the
    step's start. Taught in chapter 9."""

    rank: int
    step: int
    backward: object                  # pandas.DataFrame (pandas is imported when a timeline is built)
    buckets: object
    forward: tuple[float, float] | None
    optimizer: tuple[float, float] | None
    kind: str

    @property
    def backward_span(self) -> tuple[float, float]:
        return float(self.backward["start_ms"].min()), float(self.backward["end_ms"].max())

    def compute_between(self, t0: float, t1: float) -> float:
        """Milliseconds of backward compute between ``t0`` and ``t1`` (ms from the step's start)."""
        b = (self.backward["start_ms"].to_numpy(), self.backward["end_ms"].to_numpy())
        return float(iv.total(iv.clip(b, t0, t1)))


def ddp_timeline(path, *, rank: int = 0, step: int | None = None) -> DDPTimeline:
    """The backward compute and the bucketed all-reduces of one step of one rank of a DDP trace
    (a folder of per-rank traces or one file). ``step``: a ``ProfilerStep`` number (default: the last
    step whose all-reduces all lie inside it). Taught in chapter 9 (trace analytics, §2)."""
    ranks = {r.rank: r for r in read_ranks(path)}
    if rank not in ranks:
        raise ValueError(f"rank={rank!r}: the trace has ranks {sorted(ranks)}")
    ev = ranks[rank]
    v = RankView(ev)
    if v.step_ids.size == 0:
        raise ValueError(f"{ev.path}: no ProfilerStep ranges; record with torch.profiler's schedule (chapter 8)")
    main = ev.thread == v.main_thread
    is_bw = (ev.cat == CPU_OP) & main & ev.name_mask(lambda n: n.startswith(_BACKWARD))
    is_launch = (ev.cat == CPU_OP) & main & ev.name_mask(lambda n: n in ("c10d::allreduce_", "c10d::allreduce"))
    runs = v.comm_idx                       # gloo spans (CPU) or NCCL kernels (GPU), in time order
    choices = []
    for sid, (h0, h1) in zip(v.step_ids, v.step_host, strict=True):
        if step is not None and sid != step:
            continue
        inside = (ev.ts >= h0) & (ev.ts < h1)
        n_launch = int((is_launch & inside).sum())
        run_in = runs[(ev.ts[runs] >= h0) & (ev.ts[runs] < h1)]
        if n_launch and (is_bw & inside).any() and run_in.size == n_launch:
            choices.append((int(sid), h0, h1, inside, run_in))
    if not choices:
        have = [int(s) for s in v.step_ids]
        raise ValueError(f"step={step!r}: no step of rank {rank} with a backward and matching all-reduce launches "
                         f"and runs (steps in the trace: {have})")
    sid, h0, h1, inside, run_in = choices[-1]
    import pandas as pd  # on use: `import labkit.trace` stays free of pandas

    ms = lambda t: (np.asarray(t, dtype=float) - h0) / 1e3   # noqa: E731 - µs since the step began -> ms
    bw = np.flatnonzero(is_bw & inside)
    bs, be = iv.union(ms(ev.ts[bw]), ms(ev.end[bw]))
    launches = np.flatnonzero(is_launch & inside)
    launches = launches[np.argsort(ev.ts[launches], kind="stable")]
    start, end = ms(ev.ts[run_in]), ms(ev.end[run_in])
    hidden = [iv.intersect_total((np.array([a]), np.array([b])), (bs, be)) for a, b in zip(start, end, strict=True)]
    buckets = pd.DataFrame({"bucket": range(len(launches)), "launch_ms": ms(ev.ts[launches]), "start_ms": start,
                            "end_ms": end, "hidden_ms": hidden})

    def span(pred):
        m = np.flatnonzero((ev.cat == USER_ANNOTATION) & main & inside & ev.name_mask(pred))
        return (float(ms(ev.ts[m]).min()), float(ms(ev.end[m]).max())) if m.size else None

    return DDPTimeline(rank=rank, step=sid, backward=pd.DataFrame({"start_ms": bs, "end_ms": be}), buckets=buckets,
                       forward=span(lambda n: n == "DistributedDataParallel.forward"),
                       optimizer=span(lambda n: n.startswith("Optimizer.step#")), kind=v.kind)
