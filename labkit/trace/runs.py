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
    The file is first read streamed, a slice of events at a time (:func:`labkit.trace.stream.read_streamed`:
    never its bytes and all its events at once); what that reader declines is read whole, as before.

    Taught in chapter 9.
    """
    from labkit.trace.stream import read_streamed

    max_bytes, max_ev = fastload.limits(max_mb, max_events)
    p = Path(path)
    # The cyclic garbage collector would rescan the parse's ~10^5 fresh objects again and again while
    # they are built and walked (none of them can form a cycle): off for the read, 25-40 % faster.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        ev = read_streamed(p, default_rank=default_rank, max_mb=max_mb, max_events=max_events)
        if ev is not None:          # a slice of events at a time: never the file's bytes and all its events
            return ev
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
    and field). On a valid trace the result equals the generic one's (tests/test_trace_scale.py); the
    columns are :class:`labkit.trace.stream.Columns`, as the streamed reader fills them a slice at a time.

    Taught in chapter 9.
    """
    from labkit.trace.stream import Columns

    L.header(p, doc.distributedInfo, doc.baseTimeNanoseconds, default_rank)    # its errors first, as before
    cols = Columns()
    if not cols.add(doc.traceEvents):
        return None
    return cols.finish(p, default_rank, doc.distributedInfo, doc.baseTimeNanoseconds, doc.labkit_synthetic)


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
