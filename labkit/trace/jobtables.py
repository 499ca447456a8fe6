"""The job's tables of :func:`labkit.trace.analyze`, built rank by rank into files, read back when asked for.

A job's ``step_breakdown`` is 80 bytes per rank and step and its ``collectives`` 8 per rank and collective: at
128 ranks × 6,326 steps they alone made the analysing process grow 0.7 MB a rank (issue #35). Here each rank's
rows go straight from its summary (:mod:`labkit.trace.spill`) to :class:`labkit.trace.ondisk.Matrix` files; the
two tables are :class:`labkit.trace.ondisk.Lazy`, read the first time they are asked for. What ``analyze`` needs
from them is made on the way, in memory bounded whatever the rank count:

- ``breakdown`` (a row per rank): each rank's rows summed by pandas' groupby as one group — the sum the whole
  table's groupby makes of that rank's rows (same rows, same order, same kernel).
- the median step span (the stragglers' yardstick): :func:`labkit.trace.ondisk.median` over the spans on disk.
- the stragglers table: the ranks × collectives arrival and end matrices on disk; one pass over column slabs for
  each collective's earliest and latest arrival and who was last, :func:`~labkit.trace.ondisk.median` for the
  median duration, then one pass over the ranks, a row (one rank's collectives) at a time, for each rank's
  lateness (written to the ``collectives`` file as it goes), mean and waits.
- ``comm_by_type``: each type's durations and bytes, every rank's in rank order, to a file, summed with
  :func:`~labkit.trace.ondisk.pairwise_sum`.

Every figure equals, to the bit, the one the whole tables in memory give (:func:`labkit.trace.stragglers.
stragglers_of`, pandas' groupby, numpy's median and sum): the arithmetic is the same, only where the operands
wait differs (``tests/test_trace_jobscale.py``). Taught in chapter 9 (reading a real job's files).
"""
from __future__ import annotations

import numpy as np

from labkit.trace import ondisk
from labkit.trace.breakdown import COLUMNS
from labkit.units import GB, US

__all__ = ["job_tables", "comm_by_type"]


class _Files:
    """Owner of a result object's files: the folder goes when the last table that reads it is gone."""

    def __init__(self):
        self.folder = ondisk.results_dir(self)


def job_tables(summaries, steps=None):
    """(step_breakdown, breakdown, steps, stragglers, collectives) of the ranks' summaries (in memory or spilled):
    ``step_breakdown`` and ``collectives`` as :class:`~labkit.trace.ondisk.Lazy` tables, the rest as frames and the
    sorted step ids. Chapter 9."""
    import pandas as pd

    from labkit.trace.spill import _n_colls, _n_wins, _windows, rank
    from labkit.trace.stragglers import _table

    nw = [_n_wins(s) for s in summaries]
    for s, m in zip(summaries, nw, strict=True):
        if not m:
            ids = rank(s, ("step_ids",)).step_ids
            raise ValueError(f"trace file {s.path}: no events in the selected steps {sorted(steps or [])}; "
                             f"steps in this trace: {ids or 'none (no ProfilerStep)'}")
    files = _Files()
    total, R = sum(nw), len(summaries)
    table = ondisk.Matrix(files.folder / "steps.f8", len(COLUMNS), total)       # a row per column
    keys = ondisk.Matrix(files.folder / "keys.i8", 2, total, dtype=np.int64)   # rank, step
    host = ondisk.Matrix(files.folder / "host.f8", 1, total)
    order = sorted(range(R), key=lambda i: summaries[i].rank)          # the stragglers' rows: by rank
    row = {i: k for k, i in enumerate(order)}
    nc = min(_n_colls(s) for s in summaries)
    strag = R >= 2 and nc > 0
    if strag:
        starts = ondisk.Matrix(files.folder / "starts.f8", R, nc)
        ends = ondisk.Matrix(files.folder / "ends.f8", R, nc)
    comp_med: list = [None] * R
    aggs, step_ids = [], set()
    at = 0
    for i, s in enumerate(summaries):
        f = rank(s, ("wins", "steps_table", "coll_start", "coll_dur", "comp_before"))
        m = nw[i]
        for c in range(len(COLUMNS)):
            table.write(c, f.steps_table[:, c], at)
        ids, b = _windows(f)
        keys.write(0, np.full(m, s.rank, dtype=np.int64), at)
        keys.write(1, ids, at)
        host.write(0, b[:, 3] - b[:, 2], at)
        step_ids.update(int(x) for x in np.unique(ids))
        one = pd.DataFrame(f.steps_table, columns=list(COLUMNS))
        one.insert(0, "rank", s.rank)
        aggs.append(one.groupby("rank", as_index=False)[list(COLUMNS)].sum())
        if strag:
            k = row[i]
            starts.write(k, f.coll_start[:nc])
            ends.write(k, f.coll_start[:nc] + f.coll_dur[:nc])
            comp_med[k] = np.median(f.comp_before[:nc])
        at += m
        del f, b, one
    agg = pd.concat(aggs, ignore_index=True).groupby("rank", as_index=False)[list(COLUMNS)].sum()
    step_lazy = ondisk.Lazy(lambda: _step_frame(files, table, keys), nbytes=total * (len(COLUMNS) + 2) * 8)
    if not strag:
        host.delete()
        strag_df, aligned = _table([], "cpu", [], None, None, None, 0.0)
        return step_lazy, agg, sorted(step_ids), strag_df, aligned
    kind = "gpu" if any(s.kind == "gpu" for s in summaries) else "cpu"
    step_us = ondisk.median(lambda: (b[0][0] for _, _, b in ondisk.column_slabs(host, rows=1)), total)
    host.delete()
    types = rank(summaries[order[0]], ("coll_type",)).coll_type[:nc]
    strag_df, aligned = _stragglers(files, [summaries[i].rank for i in order], kind, types, starts, ends,
                                    comp_med, step_us)
    starts.delete()
    ends.delete()
    return step_lazy, agg, sorted(step_ids), strag_df, aligned


def _step_frame(files, table, keys):
    import pandas as pd

    step_df = pd.DataFrame(table.read().T, columns=list(COLUMNS), copy=False)
    k = keys.read()
    step_df.insert(0, "step", k[1])
    step_df.insert(0, "rank", k[0])
    return step_df


def _stragglers(files, ranks, kind, types, starts, ends, comp_med, step_us):
    """:func:`labkit.trace.stragglers._table` over the arrival and end matrices on disk (see the module
    docstring): the same rows and figures, the lateness matrix written to a file for the ``collectives`` table."""
    import pandas as pd

    from labkit.trace.stragglers import LATE_MARGIN, last_beyond_chance

    R, n = starts.shape
    first, late_max = np.empty(n), np.empty(n)
    last = np.empty(n, dtype=np.int64)
    for j, j1, (s,) in ondisk.column_slabs(starts):
        first[j:j1] = s.min(axis=0)
        s -= first[j:j1]
        last[j:j1] = s.argmax(axis=0)
        late_max[j:j1] = s.max(axis=0)
        del s

    def durations():
        for _, _, (e, s) in ondisk.column_slabs(ends, starts):
            yield (e - s).reshape(-1)

    med_dur = ondisk.median(durations, R * n)
    late_file = ondisk.Matrix(files.folder / "late.f8", R, n)
    cols = ["rank", "n_collectives", "times_last", "mean_late_s", "late_of_step", "median_compute_before_s",
            "straggler", "peer_wait_s"]
    rows = []
    for i, r in enumerate(ranks):
        s, e = starts.read(i, i + 1)[0], ends.read(i, i + 1)[0]
        dur = np.subtract(e, s, out=e)
        late = np.subtract(s, first, out=s)
        times_last = int(((last == i) & (late_max > 0)).sum())
        mean_late = float(late.mean()) * US
        late_of_step = float(late.mean()) / step_us if step_us > 0 else 0.0
        # the test of labkit.trace.stragglers._table (its comments say why): last more often than chance, late
        # by more than 10 % of a typical collective and by LATE_MARGIN of a step
        strag = (last_beyond_chance(n, times_last, R)
                 and mean_late > 0.1 * med_dur * US and late_of_step >= LATE_MARGIN[kind])
        peer_wait = np.minimum(late_max - late, dur)
        rows.append({"rank": r, "n_collectives": n, "times_last": times_last, "mean_late_s": mean_late,
                     "late_of_step": late_of_step, "median_compute_before_s": float(comp_med[i]),
                     "straggler": bool(strag), "peer_wait_s": float(peer_wait.sum()) * US})
        late *= US
        late_file.write(i, late)
        del s, e, dur, late, peer_wait
    skew = late_max * US
    names = [f"late_s_rank{r}" for r in ranks]
    last_rank = np.asarray(ranks)[last].tolist()

    def aligned():
        # the lateness matrix becomes the frame's block as it is read (no copy)
        df = pd.DataFrame(late_file.read().T, columns=names, copy=False)
        for k, v in reversed({"n": np.arange(n), "type": list(types), "last_rank": last_rank, "skew_s": skew}.items()):
            df.insert(0, k, v)
        return df

    return pd.DataFrame(rows, columns=cols), ondisk.Lazy(aligned, nbytes=R * n * 8)


def comm_by_type(summaries, folder=None):
    """Per collective type: count, seconds, bytes and algbw over every rank — each type's durations and bytes,
    every rank's in rank order then time order, written to a working file (:func:`~labkit.trace.ondisk.working_dir`
    in ``folder``, ``analyze``'s scratch folder) and summed as numpy sums them
    (:func:`labkit.trace.ondisk.pairwise_sum`). Chapter 9."""
    import pandas as pd

    from labkit.trace import spill

    cols = ["type", "count", "total_s", "mean_s", "bytes", "algbw_GBps"]
    counts = [spill._type_counts(s) for s in summaries]
    kinds = sorted({t for c in counts for t in c})
    if not kinds:
        return pd.DataFrame(columns=cols)
    with ondisk.working_dir(folder, "comm-by-type") as where:
        out = [_type_row(summaries, counts, t, where / "durations_bytes.f8") for t in kinds]
    return pd.DataFrame(out, columns=cols).sort_values("total_s", ascending=False).reset_index(drop=True)


def _type_row(summaries, counts, t, path):
    """comm_by_type's row of collective type ``t``, through the working file ``path`` (removed after)."""
    from labkit.trace import spill

    n = sum(c.get(t, 0) for c in counts)
    f = ondisk.Matrix(path, 3, n)      # durations; known bytes; durations of those
    at = known_at = 0
    for sm, c in zip(summaries, counts, strict=True):
        if not c.get(t, 0):
            continue
        d, b = spill._of_rank_type(sm, t)
        known = ~np.isnan(b)
        f.write(0, d, at)
        f.write(1, b[known], known_at)
        f.write(2, d[known], known_at)
        at, known_at = at + len(d), known_at + int(known.sum())
        del d, b, known

    def total(k, m, f=f):
        return ondisk.pairwise_sum(lambda lo, hi: f.read(k, k + 1, lo, hi)[0], m)

    dur_sum = total(0, n)
    k_dur = total(2, known_at) if known_at < n else dur_sum
    nbytes = total(1, known_at) if known_at else float("nan")
    bw = nbytes / (k_dur * US) / GB if known_at and k_dur > 0 else float("nan")
    f.delete()
    return {"type": t, "count": n, "total_s": dur_sum * US, "mean_s": dur_sum / n * US,
            "bytes": nbytes, "algbw_GBps": bw}
