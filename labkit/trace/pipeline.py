"""The pipeline bubble measured from a run's traces, against (p−1)/(v·m).

A pipelined step of labkit's loop (:mod:`labkit.train.pipeline`) runs the schedule inside one
``record_function`` range, ``labkit:pipeline``, on every rank, and each stage's forward and backward of
each micro-batch inside ``labkit:stage{s}:forward`` / ``:backward`` ranges, which hold compute only (the
schedule waits for a micro-batch's activations or gradients before calling them). So per rank and step:

    busy  = |⋃ stage ranges ∩ pipeline range|,     wait = |pipeline range| − busy
    bubble = wait / busy          (idle time per unit of compute)

Megatron's bubble fraction compares the same two things: with p stages of equal time, m micro-batches and
v chunks per rank, each rank idles (p−1)/(v·m) of its compute time (Narayanan et al. 2021, §2.2).
The measured wait also holds the transfers themselves, the loss (computed by the schedule between the last
stage's forward and backward), the schedule's own Python, and any imbalance between stages (the first stage
embeds, the last computes the head), so on a real run it sits above the model; the model's trend — fewer
idle seconds per compute second with more micro-batches, and with interleaving — is what to compare.

The ranges are host (CPU) ranges: on a GPU they time the launches, not the kernels.

Taught in chapter 24 (choosing a parallel layout).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from labkit import intervals

WINDOW = "labkit:pipeline"
STAGE_PREFIX = "labkit:stage"


@dataclass(frozen=True)
class RankBubble:
    """One rank's pipeline ranges: their total, the time waiting on transfers, the rest (compute).
    Taught in chapter 24."""

    rank: int
    steps: int
    window_s: float
    wait_s: float
    busy_s: float
    bubble: float          # wait / busy
    idle_share: float      # wait / window


@dataclass(frozen=True)
class PipelineBubble:
    """Measured bubble per rank and their mean, with the model's (p−1)/(v·m) when the layout is given.
    Taught in chapter 24."""

    ranks: list
    mean_bubble: float
    predicted: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def rank_bubble(ev) -> RankBubble:
    """The bubble of one rank's events (:class:`labkit.trace.load.RankEvents`). Taught in chapter 24."""
    win = ev.name_mask(lambda n: n == WINDOW)
    if not win.any():
        raise ValueError(f"{ev.path}: no '{WINDOW}' range — not a trace of a pipelined labkit run "
                         "(TrainConfig(pp ≥ 2, profile_dir=...))")
    work = ev.name_mask(lambda n: n.startswith(STAGE_PREFIX))
    w_iv = intervals.union(ev.ts[win], ev.end[win])
    window = intervals.total(w_iv)
    busy = intervals.intersect_total(w_iv, intervals.union(ev.ts[work], ev.end[work]))
    wait = window - busy
    return RankBubble(rank=ev.rank, steps=int(win.sum()), window_s=window / 1e6, wait_s=wait / 1e6,
                      busy_s=busy / 1e6, bubble=wait / busy if busy > 0 else float("inf"),
                      idle_share=wait / window if window > 0 else 0.0)


def pipeline_bubble(path, *, pp: int | None = None, micro_batches: int | None = None,
                    virtual_stages: int = 1, workers: int | None = 1) -> PipelineBubble:
    """The measured bubble of every rank's trace under ``path`` (a folder of ``rank*.json``) and, given
    ``pp`` and ``micro_batches``, the model's (p−1)/(v·m) beside it; ``workers``: processes reading the
    files (:func:`labkit.trace.runs.read_ranks`; one by default). Taught in chapter 24."""
    from labkit.trace.runs import read_ranks

    ranks = [rank_bubble(ev) for ev in read_ranks(path, workers=workers)]
    predicted = None
    if pp is not None and micro_batches is not None:
        from labkit.train.pipeline import bubble_fraction

        predicted = bubble_fraction(pp, micro_batches, virtual_stages)
    finite = [r.bubble for r in ranks if np.isfinite(r.bubble)]
    return PipelineBubble(ranks=ranks, mean_bubble=float(np.mean(finite)) if finite else float("inf"),
                          predicted=predicted)
