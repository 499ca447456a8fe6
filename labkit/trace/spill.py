"""Rank summaries kept on disk while a job's tables are built, read back one rank at a time.

:func:`labkit.trace.analyze` and :func:`labkit.trace.critical_path` reduce each rank's trace to a
:class:`labkit.trace.summary.RankSummary` in a worker. The summary's per-step and per-collective arrays (step
windows, breakdown rows, the collectives' types, times and bytes, the compute before each) grow with the steps,
and the parent would hold them for every rank at once. Instead the worker writes them to a private temporary
folder (one uncompressed ``.npz`` per rank, :meth:`labkit.trace.summary.RankSummary.spill`) and sends back only the rank's identity and counts
(``RankSummary.spilled``: the file, how many windows and collectives, the collectives per type). The parent
sizes the job's arrays from the counts, then fills them rank by rank (:func:`rank`: one rank's arrays read back,
its rows copied in, dropped), in as many passes as the job's tables need — the files are small beside the traces.

A summary made in memory (:func:`labkit.trace.summary.summarize`) has ``spilled`` None: :func:`rank` returns it
as it is, so :func:`labkit.trace.analysis_of` and :func:`labkit.trace.critical_path_from` run the same code on
both, and their results are the same to the bit.

What the parent then holds per rank and step is what the results are made of (see
:func:`labkit.trace.analysis.analysis_of` and :func:`labkit.trace.critical_path.critical_path_from`).

Taught in chapter 9 (profiler traces: reading a real job's files).
"""
from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["rank"]


def rank(sm, keys=None):
    """``sm`` itself when its arrays are in memory; else a copy with them read back from its file (only
    ``keys`` among the summary's field names when given). Chapter 9."""
    from labkit.trace.summary import _ARRAYS, Windows

    _check("rank", sm)
    if sm.spilled is None:
        return sm
    want = (lambda k: True) if keys is None else (lambda k: k in keys)
    with np.load(sm.spilled["file"]) as z:
        got = {k: z[k] for k in _ARRAYS if want(k) and k in z.files}
        if want("wins"):
            got["wins"] = Windows.of_arrays(z["wins_ids"], z["wins_bounds"])
        if want("step_ids"):
            got["step_ids"] = z["step_ids"].tolist()
        if want("coll_type") and "type_codes" in z.files:
            got["coll_type"] = z["type_names"][z["type_codes"]].tolist()
    return dataclasses.replace(sm, **got)


def _check(fn: str, sm) -> None:
    from labkit.trace.summary import RankSummary

    if not isinstance(sm, RankSummary):
        raise TypeError(f"{fn}: sm={str(sm)[:60]!r} must be a labkit.trace.summary.RankSummary, "
                        f"got {type(sm).__name__}")


def _n_wins(sm) -> int:
    """How many step windows a summary has (in memory or spilled)."""
    return sm.spilled["n_wins"] if sm.spilled is not None else len(sm.wins)


def _n_colls(sm) -> int:
    """How many collectives a summary has (in memory or spilled)."""
    return sm.spilled["n_colls"] if sm.spilled is not None else len(sm.coll_start)


def _type_counts(sm) -> dict[str, int]:
    """Collectives per type of a summary (in memory or spilled)."""
    if sm.spilled is not None:
        return sm.spilled["types"]
    out: dict[str, int] = {}
    for t in sm.coll_type:
        out[t] = out.get(t, 0) + 1
    return out


def _of_type(summaries, counts, t: str):
    """Every rank's durations and bytes of the collectives of type ``t``, in rank order then time order, in
    two preallocated float arrays (``counts``: :func:`type_counts` of each summary)."""
    n = sum(c.get(t, 0) for c in counts)
    dur, nb = np.empty(n), np.empty(n)
    at = 0
    for sm, c in zip(summaries, counts, strict=True):
        m = c.get(t, 0)
        if not m:
            continue
        if sm.spilled is None:
            mask = np.fromiter((x == t for x in sm.coll_type), dtype=bool, count=len(sm.coll_type))
            d, b = sm.coll_dur, sm.coll_bytes
        else:
            with np.load(sm.spilled["file"]) as z:
                mask = z["type_codes"] == int(np.flatnonzero(z["type_names"] == t)[0])
                d, b = z["coll_dur"], z["coll_bytes"]
        dur[at:at + m], nb[at:at + m] = d[mask], b[mask]
        at += m
        del mask, d, b
    return dur, nb


def _job_tables(summaries, steps=None):
    """The job's step table and stragglers tables (:func:`labkit.trace.stragglers.stragglers_of`'s), built
    into preallocated arrays rank by rank: (step_df, stragglers, aligned). Chapter 9."""
    import pandas as pd

    from labkit.trace.breakdown import COLUMNS
    from labkit.trace.stragglers import _table

    nw = [_n_wins(s) for s in summaries]
    for s, m in zip(summaries, nw, strict=True):
        if not m:
            ids = rank(s, ("step_ids",)).step_ids
            raise ValueError(f"trace file {s.path}: no events in the selected steps {sorted(steps or [])}; "
                             f"steps in this trace: {ids or 'none (no ProfilerStep)'}")
    total, R = sum(nw), len(summaries)
    table = np.empty((len(COLUMNS), total))           # column-major: it becomes the frame's block, uncopied
    rank_col, step_col, host = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.int64), np.empty(total)
    order = sorted(range(R), key=lambda i: summaries[i].rank)          # the stragglers' rows: by rank
    row = {i: k for k, i in enumerate(order)}
    nc = min(_n_colls(s) for s in summaries)
    strag = R >= 2 and nc > 0
    starts, ends = (np.empty((R, nc)), np.empty((R, nc))) if strag else (None, None)
    comp_med: list = [None] * R
    at = 0
    for i, s in enumerate(summaries):
        f = rank(s, ("wins", "steps_table", "coll_start", "coll_dur", "comp_before"))
        m = nw[i]
        table[:, at:at + m] = f.steps_table.T
        rank_col[at:at + m] = s.rank
        step_col[at:at + m], b = _windows(f)
        np.subtract(b[:, 3], b[:, 2], out=host[at:at + m])
        if strag:
            k = row[i]
            starts[k] = f.coll_start[:nc]
            np.add(f.coll_start[:nc], f.coll_dur[:nc], out=ends[k])
            comp_med[k] = np.median(f.comp_before[:nc])
        at += m
        del f, b
    step_df = pd.DataFrame(table.T, columns=list(COLUMNS), copy=False)
    step_df.insert(0, "step", step_col)
    step_df.insert(0, "rank", rank_col)
    del table, rank_col, step_col
    if not strag:
        return (step_df, *_table([], "cpu", [], None, None, None, 0.0))
    kind = "gpu" if any(s.kind == "gpu" for s in summaries) else "cpu"
    step_us = float(np.median(host))
    del host
    types = rank(summaries[order[0]], ("coll_type",)).coll_type[:nc]
    return (step_df, *_table([summaries[i].rank for i in order], kind, types, starts, ends, comp_med, step_us))


# a rank's windows and collectives by step (the critical path's alignment: labkit.trace.critical_path)
def _windows(sm):
    """(step ids, bounds: device start, device end, host start, host end per window) of a summary's windows."""
    from labkit.trace.summary import Windows

    w = sm.wins if isinstance(sm.wins, Windows) else Windows(list(sm.wins))
    return w.ids, w.bounds


def _steps_of(sm):
    """A rank's distinct step ids (sorted), the index of the last window of each, and its windows' bounds."""
    ids, b = _windows(sm)
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    uniq = np.unique(s)
    return uniq, order[np.searchsorted(s, uniq, side="right") - 1], b


def _colls_by_step(sm, shared_arr):
    """A rank's collectives grouped by step (indices, in time order within a step), where each shared step's
    group starts, and how many it has."""
    ids, b = _windows(sm)
    k = np.searchsorted(b[:, 0], sm.coll_start, side="right") - 1
    c = np.flatnonzero(k >= 0)
    sid = ids[k[c]]
    o = np.argsort(sid, kind="stable")
    sid, c = sid[o], c[o]
    lo = np.searchsorted(sid, shared_arr, side="left")
    return c, lo, np.searchsorted(sid, shared_arr, side="right") - lo
