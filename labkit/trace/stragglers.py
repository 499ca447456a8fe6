"""Who is late at each collective: align the n-th collective across ranks, find the last arrival.

A rank that arrives late at every collective makes all the others wait for it (a *straggler*: a slow
node, a noisy neighbour, an unbalanced shard); a rank that is last only now and then is jitter. The
test below tells the two apart (one-sided binomial test), and the time each rank spends in a collective
before the last peer arrives is reported as ``peer_wait_s`` — waiting, not moving bytes.

Being last most often is not enough: the rank must also be late by a margin of the step
(``late_of_step`` = mean lateness / median step time, at least :data:`LATE_MARGIN` of the trace's kind).
On a CPU trace the ranks are processes time-sliced on a few shared cores: a healthy 2-rank run on a
loaded 2-core machine has put one rank last at 5 or 6 of 6 collectives, but by at most 8 % of a step
(four runs of chapter 8's DDP job, and the shipped ``cpu_gloo_ddp_tiny`` trace: 7 %), while an
injected straggler (``TrainConfig(inject="straggler")``, the default ``inject_share``) is late by 36–57 %
of its step — so CPU traces need 15 %. On a GPU trace each rank owns its device and 2 % will do: the
real 2-of-128 HTA trace's slow rank is late by 6 % of its step.

Used by :func:`labkit.trace.analysis.analyze`. Taught in chapter 9 (stragglers) and chapter 14.
"""
from __future__ import annotations

import numpy as np

from labkit.units import US

__all__ = ["stragglers", "stragglers_of", "binom_tail", "last_beyond_chance", "LATE_MARGIN", "CHANCE_LEVEL"]

#: the least mean lateness, as a share of the median step time, that makes a straggler (see above)
LATE_MARGIN = {"cpu": 0.15, "gpu": 0.02}
#: "last more often than chance": the one-sided binomial tail must be below 1/8. With 2 ranks, 4 of 4 (1/16) and
#: 5 of 6 (7/64 ≈ 0.109) pass and 3 of 3 (exactly 1/8) does not. At 10 %, the level first used, 5 of 6 failed
#: although chapter 9 said it passed: a straggler whose 6-step trace had one collective where a time slice put
#: the other rank last went unnamed (lab 2's mystery runs profile 6 steps).
CHANCE_LEVEL = 0.125


def binom_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p). Taught in chapter 9 (is a rank last more often than chance?)."""
    from math import comb

    return sum(comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))


def last_beyond_chance(n: int, k: int, world: int) -> bool:
    """Whether a rank last at ``k`` of ``n`` aligned collectives of ``world`` ranks is last more often than chance:
    at more than half of them, with a one-sided binomial tail (each rank last with probability 1/world) below
    :data:`CHANCE_LEVEL`. The stragglers table's test and the critical path's verdict. Taught in chapter 9."""
    return bool(k > n / 2 and binom_tail(n, k, 1 / world) < CHANCE_LEVEL)


def stragglers(colls):
    """Align the n-th collective across ranks: the last to arrive (latest start) is late; report how
    often each rank was last, by how much, and how much compute it ran since its previous collective.

    ``colls`` maps rank -> (RankView, step windows, collectives in time order). Returns the per-rank
    table and the aligned collectives (empty with fewer than 2 ranks). Taught in chapter 9.
    """
    ranks = sorted(colls)
    n = min((len(colls[r][2]) for r in ranks), default=0)
    if len(colls) < 2 or n == 0:
        return _table([], "cpu", [], None, None, None, 0.0)
    starts = np.array([[colls[r][2][k]["start_us"] for k in range(n)] for r in ranks])
    ends = np.array([[colls[r][2][k]["start_us"] + colls[r][2][k]["dur_us"] for k in range(n)] for r in ranks])
    comp_before = np.zeros_like(starts)
    for i, r in enumerate(ranks):
        v, wins, _ = colls[r]
        prev = np.concatenate([[min(w[1] for w in wins)], ends[i, :-1]])
        for k in range(n):
            comp_before[i, k] = v.compute_between(prev[k], starts[i, k])
    kind = "gpu" if any(getattr(colls[r][0], "kind", "cpu") == "gpu" for r in ranks) else "cpu"
    step_us = float(np.median([w[4] - w[3] for r in ranks for w in colls[r][1]]))
    types = [colls[ranks[0]][2][k]["type"] for k in range(n)]
    return _table(ranks, kind, types, starts, ends, [np.median(c) for c in comp_before], step_us)


def stragglers_of(summaries):
    """:func:`stragglers` from per-rank summaries (:class:`labkit.trace.summary.RankSummary`, each with its
    collectives' starts, durations and the compute before each): the same tables, without the events.

    Taught in chapter 9.
    """
    sums = sorted(summaries, key=lambda s: s.rank)
    n = min((len(s.coll_start) for s in sums), default=0)
    if len(sums) < 2 or n == 0:
        return _table([], "cpu", [], None, None, None, 0.0)
    # the job's matrices filled in place, one rank at a time (the parent holds them for every rank at once)
    starts, ends = np.empty((len(sums), n)), np.empty((len(sums), n))
    for i, s in enumerate(sums):
        starts[i] = s.coll_start[:n]
        np.add(s.coll_start[:n], s.coll_dur[:n], out=ends[i])
    comp_med = [np.median(s.comp_before[:n]) for s in sums]
    kind = "gpu" if any(s.kind == "gpu" for s in sums) else "cpu"
    host = [np.asarray([w[3:5] for w in s.wins], dtype=float).reshape(-1, 2) if not hasattr(s.wins, "bounds")
            else s.wins.bounds[:, 2:4] for s in sums]
    step_us = float(np.median(np.concatenate([h[:, 1] - h[:, 0] for h in host])))
    return _table([s.rank for s in sums], kind, sums[0].coll_type[:n], starts, ends, comp_med, step_us)


def _table(ranks, kind, types, starts, ends, comp_med, step_us):
    """The per-rank table and the aligned collectives from the ranks' (rank × n) arrival and end times (µs;
    both overwritten here, into the lateness and the durations: no copies of the job's matrices) and each
    rank's median compute before a collective."""
    import pandas as pd

    cols = ["rank", "n_collectives", "times_last", "mean_late_s", "late_of_step", "median_compute_before_s",
            "straggler", "peer_wait_s"]
    if not ranks:
        return pd.DataFrame(columns=cols), pd.DataFrame()
    n = starts.shape[1]
    dur = np.subtract(ends, starts, out=ends)
    starts -= starts.min(axis=0)
    late = starts
    last = late.argmax(axis=0)
    late_max = late.max(axis=0)
    med_dur = float(np.median(dur))
    # step_us, the step a lateness is measured against: the median host span of a step over ranks and steps
    rows = []
    for i, r in enumerate(ranks):
        times_last = int(((last == i) & (late_max > 0)).sum())
        mean_late = float(late[i].mean()) * US
        late_of_step = float(late[i].mean()) / step_us if step_us > 0 else 0.0
        # a straggler: last at most collectives — more often than chance would make it (last_beyond_chance:
        # a one-sided binomial tail below 1/8, each of `world` ranks last with probability 1/world: with 2
        # ranks, 4 of 4 or 5 of 6) — late by more than 10 % of a typical collective, and by LATE_MARGIN of a
        # step. With 2 ranks and 3 collectives one of them is always "last at most": that alone is
        # noise, not a straggler; so is a rank a time slice behind on a loaded CPU.
        strag = (last_beyond_chance(n, times_last, len(ranks))
                 and mean_late > 0.1 * med_dur * US and late_of_step >= LATE_MARGIN[kind])
        # time the rank sits in a collective before the last peer arrives (at most the collective's own
        # duration): waiting for a late peer, not moving bytes
        peer_wait = np.minimum(late_max - late[i], dur[i])
        rows.append({"rank": r, "n_collectives": n, "times_last": times_last, "mean_late_s": mean_late,
                     "late_of_step": late_of_step,
                     "median_compute_before_s": float(comp_med[i]), "straggler": bool(strag),
                     "peer_wait_s": float(peer_wait.sum()) * US})
    skew = late_max * US
    late *= US
    # the lateness matrix becomes the frame's block as it is (no copy of the job's rank x collective matrix)
    aligned = pd.DataFrame(late.T, columns=[f"late_s_rank{r}" for r in ranks], copy=False)
    for k, v in reversed({"n": np.arange(n), "type": list(types), "last_rank": [ranks[j] for j in last],
                          "skew_s": skew}.items()):
        aligned.insert(0, k, v)
    return pd.DataFrame(rows, columns=cols), aligned
