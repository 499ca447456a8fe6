"""One rank's trace reduced to what the job-level analyses need: a compact summary, and its interval index.

A job's cross-rank analyses — who is late at each collective (:mod:`labkit.trace.stragglers`), the critical
path of each step (:mod:`labkit.trace.critical_path`), the per-job breakdown (:func:`labkit.trace.analyze`) —
never need a rank's events themselves, only what each rank's own analysis makes of them:

- per selected step its window (device and host bounds) and its breakdown row (compute, exposed and hidden
  communication, memcpy, idle, data wait), and the op and kernel tables (name, count, seconds);
- per collective, in time order, its type, arrival (start) and duration, bytes, and the compute the rank ran
  since its previous collective (what :func:`labkit.trace.stragglers.stragglers` reports);
- the run's identity (rank, world size, backend, start time, SYNTHETIC spec) for
  :func:`labkit.trace.runs.check_one_run`;
- a :class:`ClassIndex`: the merged interval sets a stretch of the critical path is classified by (compute
  with memory copies, data loader, communication; on GPU traces the device events' starts and launch times
  for the host wait). Merged sets are far smaller than the events, and :func:`summarize_ranks` keeps them
  on disk, one ``.npz`` per rank, loaded one rank at a time.

:func:`summarize_ranks` is the streamed reader: each file is read, classified and summarised by one worker
of a process pool (ranks in parallel, one file per worker at a time), and only the summary comes back, so
the parent's memory grows with the summaries (a few numbers per step and per collective), not with the
events; with ``arrays_dir`` not even with those: the worker writes the summary's arrays there
(:meth:`RankSummary.spill`) and the parent reads them back one rank at a time (:mod:`labkit.trace.spill`). HolisticTraceAnalysis parses every rank in a ``fork`` pool and sends each rank's whole event frame
back to the parent, sizing the pool by the free memory over one rank's measured parse (its
``parse_multiple_ranks``): its peak grows with the rank count. Here it does not.

Taught in chapter 9 (profiler traces: reading a real job's files).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import labkit.intervals as iv
from labkit.trace.breakdown import COLUMNS, RankView, host_wait
from labkit.trace.load import CPU_OP, KERNEL
from labkit.units import US

__all__ = ["RankSummary", "Windows", "ClassIndex", "summarize", "summarize_ranks", "check_summaries"]

_SETS = ("comp", "mem", "dataloader", "comm")
#: a summary's per-step and per-collective arrays (what :meth:`RankSummary.spill` writes to disk)
_ARRAYS = ("steps_table", "coll_start", "coll_dur", "coll_bytes", "comp_before", "coll_end")


@dataclass
class ClassIndex:
    """The merged interval sets (µs) a stretch of one rank's time is classified by (chapter 9).

    ``comp``, ``mem``, ``dataloader``, ``comm``: (starts, ends) of merged sets as :class:`RankView` builds them;
    ``dev_starts``/``dev_launch``: on a GPU trace, the device events' starts in time order and their host
    launch times (NaN when unlinked), for the host wait of an idle gap.
    """

    kind: str
    comp: tuple
    mem: tuple
    dataloader: tuple
    comm: tuple
    dev_starts: np.ndarray
    dev_launch: np.ndarray

    @classmethod
    def of(cls, v: RankView) -> ClassIndex:
        """The index of a classified rank."""
        starts = launch = np.zeros(0)
        if v.kind == "gpu":
            order = v.dev_idx[np.argsort(v.ev.ts[v.dev_idx], kind="stable")]
            starts, launch = v.ev.ts[order], v.launch_ts[order]
        return cls(v.kind, v._comp_u, v._mem_u, v.dataloader, v._comm_u, starts, launch)

    def save(self, path) -> None:
        """Write the index to ``path`` (an uncompressed ``.npz``)."""
        arrays = {f"{k}_{j}": getattr(self, k)[j] for k in _SETS for j in (0, 1)}
        np.savez(path, kind=np.array(self.kind), dev_starts=self.dev_starts, dev_launch=self.dev_launch, **arrays)

    @classmethod
    def load(cls, path) -> ClassIndex:
        """Read an index written by :meth:`save`."""
        with np.load(path) as z:
            sets = {k: (z[f"{k}_0"], z[f"{k}_1"]) for k in _SETS}
            return cls(str(z["kind"]), dev_starts=z["dev_starts"], dev_launch=z["dev_launch"], **sets)

    def classify(self, a: float, b: float) -> list:
        """Split [a, b) µs into (cause, (start, end)) pieces, causes in the priority of
        :mod:`labkit.trace.critical_path`: compute, data, comm, then host and idle."""
        if b <= a:
            return []
        out = []
        comp = iv.clip(self.comp, a, b)
        if self.mem[0].size:                       # memory copies keep the device busy: counted with compute
            mem = iv.clip(self.mem, a, b)
            comp = iv.union(np.concatenate([comp[0], mem[0]]), np.concatenate([comp[1], mem[1]]))
        rest = iv.subtract((np.array([a]), np.array([b])), comp)
        data = iv.intersect(rest, iv.clip(self.dataloader, a, b))
        rest = iv.subtract(rest, data)
        comm = iv.intersect(rest, iv.clip(self.comm, a, b))
        rest = iv.subtract(rest, comm)
        for cause, (s, e) in (("compute", comp), ("data", data), ("comm", comm)):
            out += [(cause, (float(x), float(y))) for x, y in zip(s.tolist(), e.tolist(), strict=True)]
        if self.kind == "gpu":          # a gap is host-bound until the host launched the device's next event
            for x, y in zip(rest[0].tolist(), rest[1].tolist(), strict=True):
                h = host_wait(self.dev_starts, self.dev_launch, (np.array([x]), np.array([y])))   # µs
                h = min(max(h, 0.0), y - x)
                if h > 0:
                    out.append(("host", (x, x + h)))
                if y - x - h > 0:
                    out.append(("idle", (x + h, y)))
        else:
            out += [("host", (float(x), float(y))) for x, y in zip(rest[0].tolist(), rest[1].tolist(), strict=True)]
        return sorted(out, key=lambda p: p[1][0])


class Windows(Sequence):
    """A rank's step windows, (step id, device start, device end, host start, host end), kept as two arrays
    (12 bytes a number's worth per step instead of a tuple of five objects, ~200 bytes: the parent holds one
    per step per rank). Reads as the list :meth:`labkit.trace.breakdown.RankView.windows` returns: the same
    tuples, of the same types (an int, then numpy floats). Chapter 9."""

    def __init__(self, wins):
        self.ids = np.array([w[0] for w in wins], dtype=np.int64)
        self.bounds = np.array([w[1:] for w in wins], dtype=float).reshape(len(wins), 4)

    @classmethod
    def of_arrays(cls, ids: np.ndarray, bounds: np.ndarray) -> Windows:
        """The windows of step ``ids`` (int64) and ``bounds`` (rows of four floats), kept as given."""
        w = cls.__new__(cls)
        w.ids, w.bounds = ids, bounds
        return w

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return (int(self.ids[i]), *self.bounds[i])

    def __iter__(self):
        for k, b in zip(self.ids.tolist(), self.bounds, strict=True):
            yield (k, *b)

    def __eq__(self, other):
        return isinstance(other, (Windows, list, tuple)) and list(self) == list(other)

    __hash__ = None


@dataclass
class RankSummary:
    """What the job-level analyses need of one rank (times in µs unless named ``_s``). Chapter 9.

    ``wins``: (step, device start, device end, host start, host end) per selected step, a :class:`Windows`;
    ``steps_table``: one row per window, the :data:`labkit.trace.breakdown.COLUMNS` in seconds; ``coll_*``: the collectives inside
    the windows in time order (type, start, duration, bytes — NaN when unknown — and the compute seconds
    since the previous one); ``ops_kernel``/``ops_cpu``: (name, count, total_s) tables; ``index`` or
    ``index_file``: its :class:`ClassIndex`, in memory or on disk. ``spilled``: None, or where its arrays wait on
    disk (:meth:`spill`: the file, its counts; the array fields are then None).
    """

    path: Path
    rank: int
    world_size: int | None
    backend: str | None
    synthetic: dict | None
    start_us: float | None
    window_us: float
    has_base_time: bool
    kind: str
    step_ids: list
    wins: Windows
    steps_table: np.ndarray
    coll_type: list
    coll_start: np.ndarray
    coll_dur: np.ndarray
    coll_bytes: np.ndarray
    comp_before: np.ndarray
    coll_end: np.ndarray                 # when the rank is known to have left each collective (CPU: the cut span)
    ops_kernel: object = None
    ops_cpu: object = None
    index: ClassIndex | None = field(default=None, repr=False)
    index_file: Path | None = None
    spilled: dict | None = None

    def spill(self, path) -> None:
        """Write the per-step and per-collective arrays to ``path`` (an uncompressed ``.npz``) and drop them,
        keeping the file, the counts and the collectives per type in ``spilled`` (read back with
        :func:`labkit.trace.spill.rank`). Chapter 9."""
        if self.spilled is not None:
            raise ValueError(f"spill: the summary of rank {self.rank} is already spilled to {self.spilled['file']}")
        arrays = {k: getattr(self, k) for k in _ARRAYS if getattr(self, k) is not None}
        arrays["wins_ids"], arrays["wins_bounds"] = self.wins.ids, self.wins.bounds
        arrays["step_ids"] = np.asarray(self.step_ids, dtype=np.int64)
        types: dict[str, int] = {}
        if self.coll_type is not None:
            names, codes = np.unique(np.asarray(self.coll_type, dtype=str), return_inverse=True)
            arrays["type_names"], arrays["type_codes"] = names, codes.astype(np.int32)
            types = dict(zip(names.tolist(), np.bincount(codes, minlength=len(names)).tolist(), strict=True))
        np.savez(path, **arrays)
        self.spilled = {"file": Path(path), "n_wins": len(self.wins), "n_colls": len(self.coll_start),
                        "types": types}
        self.wins = self.step_ids = self.coll_type = None
        for k in _ARRAYS:
            setattr(self, k, None)

    def class_index(self) -> ClassIndex:
        """The rank's :class:`ClassIndex` (read from disk when it was kept there)."""
        return self.index if self.index is not None else ClassIndex.load(self.index_file)

    def collectives(self) -> list[dict]:
        """The collectives as :meth:`labkit.trace.breakdown.RankView.collectives` lists them (no names)."""
        return [{"type": t, "start_us": float(s), "dur_us": float(d), "bytes": None if b != b else int(b),
                 "end_us": float(x)}
                for t, s, d, b, x in zip(self.coll_type, self.coll_start, self.coll_dur, self.coll_bytes,
                                         self.coll_end, strict=True)]


def check_summaries(fn: str, summaries) -> None:
    """Refuse anything but a non-empty list of :class:`RankSummary` (``fn`` names the caller). Chapter 9."""
    if not isinstance(summaries, (list, tuple)) or not summaries:
        raise ValueError(f"{fn}: summaries={str(summaries)[:60]!r} must be a non-empty list of RankSummary "
                         "(labkit.trace.summary.summarize or summarize_ranks)")
    bad = [type(s).__name__ for s in summaries if not isinstance(s, RankSummary)]
    if bad:
        raise TypeError(f"{fn}: summaries must be RankSummary objects, got {bad[:3]}")


def summarize(v: RankView, steps=None, *, index=True) -> RankSummary:
    """The :class:`RankSummary` of a classified rank over the selected steps (None: all). ``index``: True
    keeps its :class:`ClassIndex` in the summary, False builds none (the breakdown and stragglers need none),
    a path writes it there (an ``.npz``) and keeps only the path. Taught in chapter 9."""
    if not isinstance(v, RankView):
        raise TypeError(f"summarize: v must be a labkit.trace.breakdown.RankView, got {type(v).__name__}")
    if not (index is True or index is False or isinstance(index, (str, os.PathLike))):
        raise ValueError(f"summarize: index={index!r} is not valid: use True, False or a file path")
    ev = v.ev
    wins = v.windows(steps)
    parts = [v.breakdown(w) for w in wins]
    rows = np.array([[b[c] for c in COLUMNS] for b in parts], dtype=float).reshape(len(wins), len(COLUMNS))
    cs = v.collectives(wins) if wins else []
    start = np.array([c["start_us"] for c in cs], dtype=float)
    dur = np.array([c["dur_us"] for c in cs], dtype=float)
    cend = np.array([c["end_us"] for c in cs], dtype=float)
    nbytes = np.array([np.nan if c["bytes"] is None else c["bytes"] for c in cs], dtype=float)
    comp_before = np.zeros(len(cs))
    if cs:
        prev = np.concatenate([[min(w[1] for w in wins)], (start + dur)[:-1]])
        comp_before = np.array([v.compute_between(p, s) for p, s in zip(prev, start, strict=True)])
    index_file = None
    if index is True:
        index = ClassIndex.of(v)
    elif index is False:
        index = None
    else:
        index_file = Path(index)
        ClassIndex.of(v).save(index_file)
        index = None
    return RankSummary(
        path=ev.path, rank=ev.rank, world_size=ev.world_size, backend=ev.backend, synthetic=ev.synthetic,
        start_us=ev.start_us, window_us=ev.window_us, has_base_time=ev.has_base_time, kind=v.kind,
        step_ids=sorted(int(s) for s in v.step_ids), wins=Windows(wins), steps_table=rows, coll_type=[c["type"] for c in cs],
        coll_start=start, coll_dur=dur, coll_bytes=nbytes, comp_before=comp_before, coll_end=cend,
        ops_kernel=_op_table(v, wins, KERNEL, device=True) if wins else None,
        ops_cpu=_op_table(v, wins, CPU_OP, device=False) if wins else None,
        index=index, index_file=index_file)


def _op_table(v: RankView, wins, cat, device):
    """(name, count, total_s) of the rank's kernels (``device``) or main-thread CPU ops inside the windows."""
    import pandas as pd

    ev = v.ev
    mask = ev.cat == cat
    if not device:
        mask &= ev.thread == v.main_thread
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return pd.DataFrame(columns=["name", "count", "total_s"])
    t = ev.ts[idx]
    lo, hi = iv.union([w[1] if device else w[3] for w in wins], [w[2] if device else w[4] for w in wins])
    j = np.searchsorted(lo, t, side="right") - 1           # the merged window that may hold each event
    inside = (j >= 0) & (t < hi[np.clip(j, 0, hi.size - 1)])
    idx = idx[inside]
    nid = ev.name_id[idx]
    cnt = np.bincount(nid, minlength=len(ev.names))
    tot = np.bincount(nid, weights=ev.dur[idx], minlength=len(ev.names))
    keep = np.flatnonzero(cnt)
    return pd.DataFrame({"name": [ev.names[k] for k in keep], "count": cnt[keep], "total_s": tot[keep] * US})


def _summarize_one(args):
    from labkit.trace.load import NotATraceError
    from labkit.trace.runs import read_rank
    f, i, steps, max_mb, max_events, index_dir, skip, fields, arrays_dir = args
    try:
        ev = read_rank(f, default_rank=i, max_mb=max_mb, max_events=max_events)
    except NotATraceError:
        if not skip:            # one file given: say it is not a trace (read_ranks does the same)
            raise
        return None
    view = RankView(ev)
    del ev
    sm = summarize(view, steps, index=False if index_dir is None else Path(index_dir) / f"rank-file-{i}.npz")
    if fields == "path":        # only what the critical path reads comes back (the parent holds every rank's)
        sm.steps_table = sm.coll_type = sm.coll_bytes = sm.comp_before = sm.ops_kernel = sm.ops_cpu = None
    elif fields == "analysis":  # the breakdown and stragglers never read when a rank left a collective
        sm.coll_end = None
    if arrays_dir is not None:  # only the identity and counts go back; the arrays wait on disk
        sm.spill(Path(arrays_dir) / f"rank-file-{i}-arrays.npz")
    return sm


def summarize_ranks(path, *, steps=None, allow_mixed: bool = False, max_mb=None, max_events=None,
                    workers=None, index_dir=None, fields: str = "all", arrays_dir=None) -> list[RankSummary]:
    """Every rank under ``path`` (a file or a folder of per-rank files) as a :class:`RankSummary`, sorted by
    rank — the streamed counterpart of :func:`labkit.trace.runs.read_ranks`, with its checks (one run, no
    rank twice) and arguments. Each file is read and summarised in a worker (``workers`` processes, one
    file each at a time, largest first); only the summary comes back. ``index_dir``: a folder where each
    rank's :class:`ClassIndex` is written (what the critical path classifies by); None builds none.
    ``steps``: a set of step numbers, or None for all. ``fields``: ``"all"``; ``"analysis"`` for what
    :func:`labkit.trace.analysis_of` reads (all but ``coll_end``); ``"path"`` for only what
    :func:`labkit.trace.critical_path_from` reads (identity, windows, collectives' times, index): the breakdown
    rows, op tables, collective types, bytes and compute-before are None, dropped in the worker, so the
    parent holds about half as much per rank. ``arrays_dir``: a folder where each rank's per-step and
    per-collective arrays are written (:meth:`RankSummary.spill`; the summaries come back with only
    their identity and counts, read back with :func:`labkit.trace.spill.rank`); None keeps them in the
    summaries. Taught in chapter 9.
    """
    from labkit import checks
    from labkit.checks import flag
    from labkit.trace.fastload import limits
    from labkit.trace.load import trace_files
    from labkit.trace.runs import _one_per_rank, _pool_map, default_workers

    allow_mixed = flag("allow_mixed", allow_mixed)
    checks.one_of("fields", fields, ("all", "analysis", "path"))
    limits(max_mb, max_events)                      # bad limits fail here, once, not in a worker
    workers = default_workers() if workers is None else checks.count("workers", workers)
    for name, d in (("index_dir", index_dir), ("arrays_dir", arrays_dir)):
        if d is not None and not os.path.isdir(d):
            raise ValueError(f"{name}={d!r} is not a folder: give an existing folder or None")
    files = trace_files(path)
    jobs = [(f, i, steps, max_mb, max_events, index_dir, len(files) > 1, fields, arrays_dir) for i, f in enumerate(files)]
    got = _pool_map(_summarize_one, jobs, [f.stat().st_size for f in files], workers)
    ranks = [r for r in got if r is not None]
    return _one_per_rank(ranks, [f.name for f, r in zip(files, got, strict=True) if r is None], path, allow_mixed)


def _classify_all(queries, index_of) -> list:
    """Classify (rank, a, b) stretches (:meth:`ClassIndex.classify`), each rank's index fetched once (from disk
    when it is kept there): the cross-rank critical path's pieces (:mod:`labkit.trace.critical_path`)."""
    out: list = [None] * len(queries)
    by_rank: dict[int, list[int]] = {}
    for q, (r, _, _) in enumerate(queries):
        by_rank.setdefault(r, []).append(q)
    for r, qs in by_rank.items():
        index = index_of(r)
        for q in qs:
            out[q] = index.classify(queries[q][1], queries[q][2])
        del index
    return out
