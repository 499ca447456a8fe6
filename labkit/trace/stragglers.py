"""Who is late at each collective: align the n-th collective across ranks, find the last arrival.

A rank that arrives late at every collective makes all the others wait for it (a *straggler*: a slow
node, a noisy neighbour, an unbalanced shard); a rank that is last only now and then is jitter. The
test below tells the two apart (one-sided binomial test), and the time each rank spends in a collective
before the last peer arrives is reported as ``peer_wait_s`` — waiting, not moving bytes.

Used by :func:`labkit.trace.analysis.analyze`. Taught in chapter 9 (stragglers) and chapter 14.
"""
from __future__ import annotations

import numpy as np

from labkit.units import US

__all__ = ["stragglers", "binom_tail"]


def binom_tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p). Taught in chapter 9 (is a rank last more often than chance?)."""
    from math import comb

    return sum(comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(k, n + 1))


def stragglers(colls):
    """Align the n-th collective across ranks: the last to arrive (latest start) is late; report how
    often each rank was last, by how much, and how much compute it ran since its previous collective.

    ``colls`` maps rank -> (RankView, step windows, collectives in time order). Returns the per-rank
    table and the aligned collectives (empty with fewer than 2 ranks). Taught in chapter 9.
    """
    import pandas as pd

    cols = ["rank", "n_collectives", "times_last", "mean_late_s", "median_compute_before_s", "straggler",
            "peer_wait_s"]
    if len(colls) < 2:
        return pd.DataFrame(columns=cols), pd.DataFrame()
    ranks = sorted(colls)
    n = min(len(colls[r][2]) for r in ranks)
    if n == 0:
        return pd.DataFrame(columns=cols), pd.DataFrame()
    starts = np.array([[colls[r][2][k]["start_us"] for k in range(n)] for r in ranks])
    ends = np.array([[colls[r][2][k]["start_us"] + colls[r][2][k]["dur_us"] for k in range(n)] for r in ranks])
    late = starts - starts.min(axis=0)
    last = late.argmax(axis=0)
    comp_before = np.zeros_like(starts)
    for i, r in enumerate(ranks):
        v, wins, _ = colls[r]
        prev = np.concatenate([[min(w[1] for w in wins)], ends[i, :-1]])
        for k in range(n):
            comp_before[i, k] = v.compute_between(prev[k], starts[i, k])
    dur = (ends - starts)
    # time each rank sits in a collective before the last peer arrives (at most the collective's own
    # duration): waiting for a late peer, not moving bytes
    peer_wait = np.minimum(late.max(axis=0) - late, dur)
    rows = []
    for i, r in enumerate(ranks):
        times_last = int(((last == i) & (late.max(axis=0) > 0)).sum())
        mean_late = float(late[i].mean()) * US
        # a straggler: last at most collectives — more often than chance would make it (one-sided
        # binomial test at 10 %, each of `world` ranks last with probability 1/world: with 2 ranks,
        # 4 of 4 or 5 of 6) — and late by more than 10 % of a typical collective. With 2 ranks and 3
        # collectives one of them is always "last at most": that alone is noise, not a straggler.
        strag = (times_last > n / 2 and binom_tail(n, times_last, 1 / len(ranks)) < 0.10
                 and mean_late > 0.1 * float(np.median(dur)) * US)
        rows.append({"rank": r, "n_collectives": n, "times_last": times_last, "mean_late_s": mean_late,
                     "median_compute_before_s": float(np.median(comp_before[i])), "straggler": bool(strag),
                     "peer_wait_s": float(peer_wait[i].sum()) * US})
    aligned = pd.DataFrame({"n": np.arange(n), "type": [colls[ranks[0]][2][k]["type"] for k in range(n)],
                            "last_rank": [ranks[j] for j in last], "skew_s": late.max(axis=0) * US,
                            **{f"late_s_rank{r}": late[i] * US for i, r in enumerate(ranks)}})
    return pd.DataFrame(rows, columns=cols), aligned
