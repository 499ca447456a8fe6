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

The job's tables go from these straight to files of their own (:mod:`labkit.trace.jobtables`,
:mod:`labkit.trace.ondisk`): the parent holds one rank's arrays at a time and slabs of the job's matrices.

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


def _of_rank_type(sm, t: str):
    """One rank's durations and bytes of its collectives of type ``t``, in time order (in memory or spilled)."""
    if sm.spilled is None:
        mask = np.fromiter((x == t for x in sm.coll_type), dtype=bool, count=len(sm.coll_type))
        return sm.coll_dur[mask], sm.coll_bytes[mask]
    with np.load(sm.spilled["file"]) as z:
        mask = z["type_codes"] == int(np.flatnonzero(z["type_names"] == t)[0])
        return z["coll_dur"][mask], z["coll_bytes"][mask]


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
