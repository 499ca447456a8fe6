"""Read torch.profiler (Kineto) Chrome traces into numpy arrays, one rank per file.

A trace is ``{"traceEvents": [...], "distributedInfo": {...}, ...}``; the events that carry time
are complete events (``"ph": "X"``) with ``ts``/``dur`` in microseconds and a category ``cat``:
``cpu_op`` (an aten/c10d operator on a host thread), ``user_annotation`` (``record_function``
ranges such as ``ProfilerStep#7``, ``enumerate(DataLoader)#...`` or gloo's ``gloo:all_reduce``),
``cuda_runtime`` (``cudaLaunchKernel`` …), and on the device ``kernel``, ``gpu_memcpy``,
``gpu_memset`` (with ``args.stream`` and ``args.correlation`` linking each to its launch).
Format: https://pytorch.org/docs/stable/profiler.html and the Trace Event Format
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU).

Only what the analysis needs is kept: a few passes over the events fill flat arrays (ts, dur, category
code, interned name, thread, stream, correlation); arguments are kept only for collectives.

Taught in chapter 9 (profiler traces).
"""
from __future__ import annotations

import gc
import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

try:  # optional accelerator for large traces (a dependency of labkit; the stdlib path stays tested)
    import orjson
except ImportError:  # pragma: no cover - exercised when orjson is absent
    orjson = None

# category codes
KERNEL, MEMCPY, MEMSET, CPU_OP, USER_ANNOTATION, RUNTIME, GPU_ANNOTATION, PYTHON, OTHER = range(9)
CATEGORIES = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET, "cpu_op": CPU_OP,
              "user_annotation": USER_ANNOTATION, "cuda_runtime": RUNTIME, "cuda_driver": RUNTIME,
              "gpu_user_annotation": GPU_ANNOTATION, "python_function": PYTHON}
DEVICE_CATS = (KERNEL, MEMCPY, MEMSET)
# NCCL/RCCL kernels under current and older names: ncclKernel_AllReduce_RING_LL_Sum_float,
# ncclDevKernel_AllGather_RING_LL, ncclAllReduceRingLLKernel_sum_f32 (NCCL 2.4-era), rccl…
COMM_KERNEL_RE = re.compile(r"^(nccl|rccl)\w*kernel", re.IGNORECASE)
TRACE_SUFFIXES = (".json", ".json.gz")


class NotATraceError(ValueError):
    """Valid JSON that is not a Chrome trace (no ``traceEvents``): skipped inside a folder.

    Taught in chapter 9.
    """


@dataclass
class RankEvents:
    """The timed events of one rank's trace as flat arrays (times in microseconds).

    Taught in chapter 9.
    """

    path: Path
    rank: int
    world_size: int | None
    backend: str | None
    names: list[str]
    ts: np.ndarray
    dur: np.ndarray
    cat: np.ndarray
    name_id: np.ndarray
    thread: np.ndarray            # index into `threads`
    stream: np.ndarray            # -1 when the event has none
    corr: np.ndarray              # correlation id, -1 when none
    threads: list[tuple] = field(default_factory=list)
    thread_names: dict[tuple, str] = field(default_factory=dict)
    comm_args: dict[int, dict] = field(default_factory=dict)   # event index -> args of a collective
    ts_is_float: bool = True

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    @property
    def has_device(self) -> bool:
        return bool(np.isin(self.cat, DEVICE_CATS).any())

    def name_mask(self, pred) -> np.ndarray:
        """Boolean mask of events whose name satisfies ``pred`` (evaluated once per distinct name)."""
        ok = np.fromiter((bool(pred(n)) for n in self.names), dtype=bool, count=len(self.names))
        return ok[self.name_id] if ok.size else np.zeros(self.ts.size, dtype=bool)


def trace_files(path) -> list[Path]:
    """The trace files under ``path``: the file itself, or every ``*.json``/``*.json.gz`` in a folder.

    Taught in chapter 9.
    """
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
        if not files:
            raise FileNotFoundError(f"no trace files (*.json, *.json.gz) in folder {p}")
        return files
    raise FileNotFoundError(f"trace path {p} does not exist")


def _fast_loads(raw: bytes):
    """orjson when installed (≈2–3× faster on large traces), else the standard library.

    orjson refuses what the standard library accepts (NaN literals some exporters write), and its
    errors carry no line/column: on any orjson error the standard parser decides, so the result and
    the error messages are the same either way.
    """
    if orjson is not None:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def load(path) -> dict:
    """Parse one Chrome trace (``.json`` or ``.json.gz``) and check its shape.

    Raises ValueError naming the file and what is wrong (truncated gzip, invalid JSON, no
    ``traceEvents`` list).

    Taught in chapter 9.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file {p} does not exist")
    try:
        if p.name.endswith(".gz"):
            with gzip.open(p, "rb") as f:
                raw = f.read()
        else:
            raw = p.read_bytes()
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise ValueError(f"trace file {p} is corrupt or truncated (gzip: {e})") from e
    if not raw or (len(raw) < 64 and not raw.strip()):
        raise ValueError(f"trace file {p} is empty")
    try:
        doc = _fast_loads(raw)
    except json.JSONDecodeError as e:
        # cut inside a string, JSON reports where the string starts: an unterminated string runs to the end
        cut = e.pos >= len(raw.rstrip()) - 1 or e.msg.startswith("Unterminated string")
        hint = " — the file looks truncated" if cut else ""
        raise ValueError(f"trace file {p} is not valid JSON (line {e.lineno}, column {e.colno}: "
                         f"{e.msg}){hint}") from e
    except UnicodeDecodeError as e:
        raise ValueError(f"trace file {p} is not text JSON ({e})") from e
    except ValueError as e:           # e.g. an integer of more than 4300 digits (a run of digits)
        raise ValueError(f"trace file {p} is not a trace: {e}") from e
    except RecursionError as e:       # "[[[[..." deeper than the JSON parser recurses
        raise ValueError(f"trace file {p} is not a trace: JSON nested too deeply to read") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        got = type(doc).__name__ if not isinstance(doc, dict) else f"keys {sorted(doc)[:8]}"
        raise NotATraceError(f"trace file {p} has no 'traceEvents' list (got {got}); "
                         "is it a torch.profiler Chrome trace?")
    return doc


def _rank_from_name(p: Path) -> int | None:
    m = re.search(r"rank[-_]?(\d+)", p.name)
    return int(m.group(1)) if m else None


def extract(doc: dict, path, *, default_rank: int = 0) -> RankEvents:
    """``doc["traceEvents"]`` into a :class:`RankEvents` (see the module docstring): a few list
    comprehensions over the events (fast in CPython), then numpy arrays.

    Taught in chapter 9.
    """
    p = Path(path)
    info = doc.get("distributedInfo") or {}
    rank = info.get("rank")
    if not isinstance(rank, int):
        rank = _rank_from_name(p)
    if rank is None:
        rank = default_rank
    evs = doc["traceEvents"]
    try:
        # a few tight comprehensions instead of one branchy loop: each runs at C-ish speed
        xs = [e for e in evs if e.get("ph") == "X" and e.get("dur") is not None
              and e.get("cat") not in (None, "Trace")]
        thread_names = {(e.get("pid"), e.get("tid")): str((e.get("args") or {}).get("name", ""))
                        for e in evs if e.get("ph") == "M" and e.get("name") == "thread_name"}
    except AttributeError as ex:
        bad = next(i for i, e in enumerate(evs) if not isinstance(e, dict))
        raise ValueError(f"trace file {p}: event {bad} is {type(evs[bad]).__name__}, not an object") from ex
    cats = CATEGORIES
    code = [cats.get(e["cat"], OTHER) for e in xs]
    names: dict[str, int] = {}
    nid = [names.setdefault(n, len(names)) for n in [e.get("name", "") for e in xs]]
    threads: dict[tuple, int] = {}
    th = []
    for e in xs:                     # one pass, no intermediate list of keys (18 -> 14 ms on 45k events)
        k = (e.get("pid"), e.get("tid"))
        t = threads.get(k)
        if t is None:
            t = threads[k] = len(threads)
        th.append(t)
    n = len(xs)
    try:
        ts_arr = np.array([e.get("ts") for e in xs])
        ts_is_float = ts_arr.dtype.kind == "f"
        ts_arr = ts_arr.astype(float) if n else np.zeros(0)
        dur_arr = np.array([e["dur"] for e in xs], dtype=float) if n else np.zeros(0)
    except (TypeError, ValueError) as ex:
        raise ValueError(f"trace file {p}: an event has a non-numeric ts or dur ({ex})") from ex
    if n and not (np.isfinite(ts_arr).all() and np.isfinite(dur_arr).all() and (dur_arr >= 0).all()):
        bad = int(np.flatnonzero(~(np.isfinite(ts_arr) & np.isfinite(dur_arr) & (dur_arr >= 0)))[0])
        raise ValueError(f"trace file {p}: events with missing ts or negative dur, or a ts or dur that is not "
                         f"a finite number (first: {xs[bad].get('name')!r}, ts={xs[bad].get('ts')!r}, "
                         f"dur={xs[bad].get('dur')!r})")
    cat = np.asarray(code, dtype=np.int8) if n else np.zeros(0, dtype=np.int8)
    stream = np.full(n, -1, dtype=np.int64)
    corr = np.full(n, -1, dtype=np.int64)
    comm_args: dict[int, dict] = {}
    comm_re = COMM_KERNEL_RE.match
    name_list = list(names)
    cat_list = cat.tolist()          # Python ints: indexing a numpy array per event is slow
    for i in np.flatnonzero((cat <= MEMSET) | (cat == RUNTIME)).tolist():
        a = xs[i].get("args")
        if not a:
            continue
        corr[i] = _int_or(a.get("correlation", -1))
        if cat_list[i] <= MEMSET:
            stream[i] = _int_or(a.get("stream", -1))
            if cat[i] == KERNEL and ("Collective name" in a or comm_re(name_list[nid[i]])):
                comm_args[i] = a
    rpc = names.get("record_param_comms")
    if rpc is not None:
        for i in np.flatnonzero((cat == CPU_OP) & (np.asarray(nid) == rpc)).tolist():
            comm_args[i] = xs[i].get("args") or {}
    return RankEvents(path=p, rank=int(rank), world_size=info.get("world_size"), backend=info.get("backend"),
                      names=name_list, ts=ts_arr, dur=dur_arr, cat=cat,
                      name_id=np.asarray(nid, dtype=np.int32), thread=np.asarray(th, dtype=np.int32),
                      stream=stream, corr=corr, threads=list(threads),
                      thread_names=thread_names, comm_args=comm_args, ts_is_float=ts_is_float)


def _int_or(x, default=-1) -> int:
    if type(x) is int:
        return x
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def read_rank(path, *, default_rank: int = 0) -> RankEvents:
    """:func:`load` + :func:`extract` for one file.

    Taught in chapter 9.
    """
    # The cyclic garbage collector would rescan the parse's ~10^5 fresh dicts again and again while
    # they are built and walked (none of them can form a cycle): off for the read, 25-40 % faster.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return extract(load(path), path, default_rank=default_rank)
    finally:
        if was_enabled:
            gc.enable()


def read_ranks(path) -> list[RankEvents]:
    """All ranks under ``path`` (a file or a folder of per-rank files), sorted by rank. In a folder,
    JSON files that are not traces (no ``traceEvents``, e.g. a saved run record) are skipped;
    corrupt or truncated files raise.

    Two files claiming the same rank is an error (traces of two different runs mixed up).

    Taught in chapter 9.
    """
    files = trace_files(path)
    ranks, skipped = [], []
    for i, f in enumerate(files):
        try:
            ranks.append(read_rank(f, default_rank=i))
        except NotATraceError:
            if len(files) == 1:
                raise
            skipped.append(f.name)       # e.g. a run record saved beside the traces
    if not ranks:
        raise ValueError(f"no Chrome traces in {path}: {skipped} are JSON without 'traceEvents'")
    seen: dict[int, Path] = {}
    for r in ranks:
        if r.rank in seen:
            raise ValueError(f"trace files {seen[r.rank]} and {r.path} both claim rank {r.rank}; "
                             f"put one run's traces per folder")
        seen[r.rank] = r.path
    return sorted(ranks, key=lambda r: r.rank)

