"""Interval arithmetic on numpy arrays: the whole of trace analysis is unions and intersections.

A set of time intervals is two float arrays ``(starts, ends)``. :func:`union` merges overlapping
intervals (sorted, disjoint result — the same rule as HTA's ``merge_kernel_intervals``: an interval
joins the previous group when it starts no later than the running maximum end). Once sets are
merged, lengths of intersections and differences follow from a sweep over the boundaries.

Every reader that needs interval maths uses this module: the profiler-trace breakdown
(:mod:`labkit.trace.breakdown`, :mod:`labkit.trace.hta`) and the Nsight Systems timeline analysis
(:mod:`labkit.nsys.analysis`).

Taught in chapter 9 (reading a profiler trace: exposed vs hidden communication).
"""
from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.zeros(0), np.zeros(0))


def union(starts, ends) -> Intervals:
    """Merge possibly overlapping intervals into a sorted, disjoint set.

    Taught in chapter 9.
    """
    s = np.asarray(starts, dtype=float)
    e = np.asarray(ends, dtype=float)
    if s.shape != e.shape:
        raise ValueError(f"starts and ends differ in length ({s.size} vs {e.size})")
    if s.size == 0:
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_max = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_max[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def total(iv: Intervals) -> float:
    """Summed length of a merged set.

    Taught in chapter 9.
    """
    return float(np.sum(iv[1] - iv[0])) if iv[0].size else 0.0


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    """Restrict a merged set to the window [lo, hi).

    Taught in chapter 9.
    """
    s = np.maximum(iv[0], lo)
    e = np.minimum(iv[1], hi)
    keep = e > s
    return s[keep], e[keep]


def intersect_total(a: Intervals, b: Intervals) -> float:
    """Length of the intersection of two merged sets (sweep: +1/-1 for a, +2/-2 for b, count 3).

    Taught in chapter 9.
    """
    if a[0].size == 0 or b[0].size == 0:
        return 0.0
    s, e = _where(a, b, 3)
    return float(np.sum(e - s))


def _where(a: Intervals, b: Intervals, level: int) -> Intervals:
    """Spans where the sweep count (a counts 1, b counts 2) equals ``level``: 3 = a∩b, 1 = a∖b."""
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate([np.full(a[0].size, 1), np.full(a[0].size, -1),
                            np.full(b[0].size, 2), np.full(b[0].size, -2)])
    order = np.lexsort((delta, times))          # at equal times, ends (-) before starts (+)
    t = times[order]
    running = np.cumsum(delta[order])
    inside = np.flatnonzero(running[:-1] == level)
    s, e = t[inside], t[inside + 1]
    keep = e > s
    return s[keep], e[keep]


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """The intersection of two merged sets, as a merged set.

    Taught in chapter 9.
    """
    if a[0].size == 0 or b[0].size == 0:
        return EMPTY
    return _where(a, b, 3)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """``a`` minus ``b`` for merged sets.

    Taught in chapter 9.
    """
    if a[0].size == 0 or b[0].size == 0:
        return a
    return _where(a, b, 1)
