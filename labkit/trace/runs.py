"""Read every rank of a run: a folder of per-rank traces, read in parallel, checked to be one run.

Each rank's file is read and decoded by :func:`read_rank` (the parse dominates the
analysis); with several files they are read in a process pool of up to ``workers`` processes (default:
the cores this process may use, at most one per file; ``LABKIT_TRACE_WORKERS`` overrides), so a 16-rank
job costs about 16 ÷ cores files' time. Files are handed to the workers largest first; the result is in
rank order whatever the order they finish in.

Taught in chapter 9 (profiler traces).
"""
from __future__ import annotations

import gc
import importlib
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from labkit.checks import flag
from labkit.trace import fastload
from labkit.trace.load import NotATraceError, RankEvents, trace_files

L = importlib.import_module("labkit.trace.load")   # the module (``labkit.trace.load`` the attribute is a function)

POOL_MIN_BYTES = 4 * 2**20     # below this much trace on disk a pool's start-up costs more than it saves


def default_workers() -> int:
    """Processes for reading ranks: ``LABKIT_TRACE_WORKERS``, else the cores this process may run on.

    Taught in chapter 9.
    """
    env = os.environ.get("LABKIT_TRACE_WORKERS")
    if env:
        if not env.isdecimal() or int(env) < 1:
            raise ValueError(f"environment variable LABKIT_TRACE_WORKERS={env!r} is not valid: use an int >= 1")
        return int(env)
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not Linux
        return max(os.cpu_count() or 1, 1)


def read_rank(path, *, default_rank: int = 0, max_mb=None, max_events=None) -> RankEvents:
    """:func:`load` + :func:`extract` for one file, within the limits of :mod:`labkit.trace.fastload`
    (typed decoding of the fields used; the generic parser decides any file the typed decoder refuses).

    Taught in chapter 9.
    """
    max_bytes, max_ev = fastload.limits(max_mb, max_events)
    p = Path(path)
    # The cyclic garbage collector would rescan the parse's ~10^5 fresh objects again and again while
    # they are built and walked (none of them can form a cycle): off for the read, 25-40 % faster.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        raw = L._read(p, max_bytes)
        fastload.check_events(p, raw, max_ev)
        typed = fastload.decode_typed(raw)
        if typed is not None:
            del raw            # the typed document is all the rest reads: free the file's bytes (peak memory)
            ev = extract_typed(typed, p, default_rank)
            if ev is not None:
                return ev
            del typed
            raw = L._read(p, max_bytes)       # the generic parser decides, naming the event and field
        return L.extract(L._parse(p, raw), p, default_rank=default_rank)
    finally:
        if was_enabled:
            gc.enable()


def extract_typed(doc, p, default_rank: int = 0):
    """A typed document into a :class:`labkit.trace.load.RankEvents`, or None when any event is not
    plainly valid (the generic :func:`labkit.trace.load.extract` then reads the file and names the event
    and field). On a valid trace the result equals the generic one's (tests/test_trace_scale.py).

    Taught in chapter 9.
    """
    import numpy as np

    rank, world, backend, base = L.header(p, doc.distributedInfo, doc.baseTimeNanoseconds, default_rank)
    evs = doc.traceEvents
    unset = fastload.UNSET
    # one pass over the events (each comprehension over ~10^5 events costs as much as the decode)
    xs: list = []
    code: list = []
    nid: list = []
    th: list = []
    ts: list = []
    dur: list = []
    thread_names: dict = {}
    names: dict[str, int] = {}
    threads: dict[tuple, int] = {}
    cat_of, other, name_id, thread_of = L.CATEGORIES.get, L.OTHER, names.setdefault, threads.get
    try:
        for e in evs:
            ph = e.ph
            if ph != "X":
                if ph == "M" and e.name == "thread_name":
                    a = e.args
                    thread_names[(e.pid, e.tid)] = "" if a is None or a.name is unset else str(a.name)
                continue
            c, d = e.cat, e.dur
            if d is None or c is None or c == "Trace":
                continue
            xs.append(e)
            code.append(cat_of(c, other))               # a non-string cat is caught just below
            nid.append(name_id(e.name, len(names)))
            k = (e.pid, e.tid)
            t = thread_of(k)
            if t is None:
                t = threads[k] = len(threads)
            th.append(t)
            ts.append(e.ts)
            dur.append(d)
        n = len(xs)
        ts_arr = np.array(ts) if n else np.zeros(0)
        dur_arr = np.array(dur) if n else np.zeros(0)
    except (TypeError, ValueError, OverflowError):
        return None
    # a null name is a None key among the names; a non-string cat can only have the code OTHER
    if ts_arr.dtype.kind not in "if" or dur_arr.dtype.kind not in "if" or not all(type(k) is str for k in names) \
            or not all(type(xs[i].cat) is str for i, c in enumerate(code) if c == other):
        return None
    ts_is_float = ts_arr.dtype.kind == "f"
    ts_arr, dur_arr = ts_arr.astype(float), dur_arr.astype(float)
    if (~np.isfinite(ts_arr) | ~np.isfinite(dur_arr) | (dur_arr < 0) | (np.abs(ts_arr) > L.MAX_TS_US)
            | (dur_arr > L.MAX_DUR_US)).any():
        return None
    cat = np.asarray(code, dtype=np.int8) if n else np.zeros(0, dtype=np.int8)
    stream = np.full(n, -1, dtype=np.int64)
    corr = np.full(n, -1, dtype=np.int64)
    comm_args: dict[int, dict] = {}
    comm_re = L.COMM_KERNEL_RE.match
    name_list = list(names)
    cat_list = cat.tolist()
    lo, hi = L._I64_MIN, L._I64_MAX
    for i in np.flatnonzero((cat <= L.MEMSET) | (cat == L.RUNTIME)).tolist():
        a = xs[i].args
        if a is None:
            continue
        c = -1 if a.correlation is unset else a.correlation
        if type(c) is not int or not lo <= c <= hi:
            return None
        corr[i] = c
        if cat_list[i] <= L.MEMSET:
            s = -1 if a.stream is unset else a.stream
            if type(s) is not int or not lo <= s <= hi:
                return None
            stream[i] = s
            if cat_list[i] == L.KERNEL and (a.collective is not unset or comm_re(name_list[nid[i]])):
                comm_args[i] = fastload.args_dict(a)
    rpc = names.get("record_param_comms")
    if rpc is not None:
        for i in np.flatnonzero((cat == L.CPU_OP) & (np.asarray(nid) == rpc)).tolist():
            a = xs[i].args
            comm_args[i] = {} if a is None else fastload.args_dict(a)
    for a in comm_args.values():
        for key in ("In msg nelems", "Out msg nelems"):
            v = a.get(key)
            if v is not None and (type(v) is not int or not 0 <= v <= hi):
                return None
    return L.rank_events(p, rank, world, backend, name_list, ts_arr, dur_arr, cat, nid, th, stream, corr, threads,
                         thread_names, comm_args, ts_is_float, base, doc.labkit_synthetic)


def _read_one(args):
    f, i, max_mb, max_events = args
    try:
        return read_rank(f, default_rank=i, max_mb=max_mb, max_events=max_events)
    except NotATraceError:
        return None


def read_ranks(path, *, allow_mixed: bool = False, max_mb=None, max_events=None,
               workers=None) -> list[RankEvents]:
    """All ranks under ``path`` (a file or a folder of per-rank files), sorted by rank. In a folder,
    JSON files that are not traces (no ``traceEvents``, e.g. a saved run record) are skipped;
    corrupt or truncated files raise. ``max_mb``/``max_events``: per-file limits
    (:func:`labkit.trace.fastload.limits`); ``workers``: processes reading files (:func:`default_workers`).

    Two files claiming the same rank is an error (traces of two different runs mixed up), and so are
    files that look like different runs (:func:`check_one_run`) unless ``allow_mixed=True``.

    Taught in chapter 9.
    """
    from labkit import checks
    from labkit.trace.fastload import limits

    allow_mixed = flag("allow_mixed", allow_mixed)
    limits(max_mb, max_events)                      # bad limits fail here, once, not in a worker
    workers = default_workers() if workers is None else checks.count("workers", workers)
    files = trace_files(path)
    if len(files) == 1:
        ranks = [read_rank(files[0], default_rank=0, max_mb=max_mb, max_events=max_events)]
        skipped = []
    else:
        jobs = [(f, i, max_mb, max_events) for i, f in enumerate(files)]
        got = _pool_map(_read_one, jobs, [f.stat().st_size for f in files], workers)
        ranks = [r for r in got if r is not None]
        skipped = [f.name for f, r in zip(files, got, strict=True) if r is None]   # e.g. a saved run record
    return _one_per_rank(ranks, skipped, path, allow_mixed)


def _pool_map(fn, jobs, sizes, workers) -> list:
    """``fn`` over ``jobs``, results in the jobs' order: in a pool of up to ``workers`` processes, largest
    ``sizes`` first, when there are several jobs and their sizes add up to :data:`POOL_MIN_BYTES`; else here."""
    n = min(workers, len(jobs))
    if n <= 1 or sum(sizes) < POOL_MIN_BYTES:
        return [fn(j) for j in jobs]
    import multiprocessing as mp

    order = sorted(range(len(jobs)), key=lambda k: -sizes[k])
    # forkserver: a fresh interpreter per worker (no fork of a parent holding torch threads)
    ctx = mp.get_context("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        done = dict(zip(order, pool.map(fn, [jobs[k] for k in order]), strict=True))
    return [done[k] for k in range(len(jobs))]


def _one_per_rank(ranks, skipped, path, allow_mixed) -> list:
    """The ranks read from ``path``, sorted, each rank once and (unless ``allow_mixed``) from one run."""
    if not ranks:
        raise ValueError(f"no Chrome traces in {path}: {skipped} are JSON without 'traceEvents'")
    if not allow_mixed:
        check_one_run(ranks)
    seen: dict[int, Path] = {}
    for r in ranks:
        if r.rank in seen:
            raise ValueError(f"trace files {seen[r.rank]} and {r.path} both claim rank {r.rank}; "
                             f"put one run's traces per folder (the analysis is per rank, even with allow_mixed)")
        seen[r.rank] = r.path
    return sorted(ranks, key=lambda r: r.rank)


MIXED_START_S = 5.0   # ranks of one run start profiling within a few steps of each other


def check_one_run(ranks: list[RankEvents]) -> None:
    """Raise ValueError naming the files when traces in one folder come from different runs: their
    ``distributedInfo`` world sizes or backends differ, their SYNTHETIC generator specs differ, or their
    absolute start times (``baseTimeNanoseconds`` + first ``ts``) lie further apart than
    max(``MIXED_START_S``, twice the longer trace's window) — ranks of one run profile the same steps.

    Taught in chapter 9.
    """
    def differ(what, key):
        vals = {}
        for r in ranks:
            v = key(r)
            if v is not None:
                vals.setdefault(json.dumps(v, sort_keys=True, default=str), []).append(r.path.name)
        if len(vals) > 1:
            shown = "; ".join(f"{v}: {', '.join(fs)}" for v, fs in vals.items())
            raise ValueError(f"trace files from different runs in one folder ({what} differ — {shown}); put one "
                             "run's traces per folder, or pass allow_mixed=True (--allow-mixed)")

    differ("distributedInfo.world_size", lambda r: r.world_size)
    differ("distributedInfo.backend", lambda r: r.backend)
    differ("SYNTHETIC specs", lambda r: r.synthetic)
    for based in (True, False):          # absolute times compare only within one kind of time base
        timed = [r for r in ranks if r.start_us is not None and r.has_base_time == based]
        if len(timed) < 2:
            continue
        a, b = min(timed, key=lambda r: r.start_us), max(timed, key=lambda r: r.start_us)
        gap_s = (b.start_us - a.start_us) / 1e6
        limit_s = max(MIXED_START_S, 2 * max(r.window_us for r in timed) / 1e6)
        if gap_s > limit_s:
            raise ValueError(f"trace files from different runs in one folder: {b.path.name} starts {gap_s:,.1f} s "
                             f"after {a.path.name} (ranks of one run start within {limit_s:,.1f} s); put one "
                             "run's traces per folder, or pass allow_mixed=True (--allow-mixed)")
