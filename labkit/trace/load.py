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

import gzip
import json
import math
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from labkit.checks import ArgumentTypeError, refuse_special

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
    start_us: float | None = None  # first event, absolute (baseTimeNanoseconds + ts) when the trace has a base
    window_us: float = 0.0         # first event start to last event end
    has_base_time: bool = False
    synthetic: dict | None = None  # the generator's spec of a SYNTHETIC trace

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
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"path must be a trace file or folder (str or os.PathLike), got "
                                f"{type(path).__name__} {str(path)[:60]!r}")
    if os.fspath(path) == "":
        raise ValueError("path='' is not valid: name a trace file or a folder of traces (an empty path "
                         "would analyse the current folder)")
    p = Path(path)
    refuse_special("trace path", p)
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


def load(path, *, max_mb=None, max_events=None) -> dict:
    """Parse one Chrome trace (``.json`` or ``.json.gz``) and check its shape.

    Raises ValueError naming the file and what is wrong (truncated gzip, invalid JSON, no
    ``traceEvents`` list, more bytes or events than the limits of :mod:`labkit.trace.fastload`).

    Taught in chapter 9.
    """
    from labkit.trace import fastload

    max_bytes, max_ev = fastload.limits(max_mb, max_events)
    p = Path(path)
    raw = _read(p, max_bytes)
    fastload.check_events(p, raw, max_ev)
    return _parse(p, raw)


def _read(p: Path, max_bytes: int) -> bytes:
    from labkit.trace.fastload import read_bounded

    refuse_special("trace file", p)
    if not p.is_file():
        raise FileNotFoundError(f"trace file {p} does not exist")
    try:
        raw = read_bounded(p, max_bytes)
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise ValueError(f"trace file {p} is corrupt or truncated (gzip: {e})") from e
    if not raw or (len(raw) < 64 and not raw.strip()):
        raise ValueError(f"trace file {p} is empty")
    return raw


def _parse(p: Path, raw: bytes) -> dict:
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


def header(p: Path, info, base, default_rank: int):
    """(rank, world_size, backend, baseTimeNanoseconds) of a trace, checked (see :func:`extract`).

    Taught in chapter 9.
    """
    if info is None:
        info = {}
    if not isinstance(info, dict):
        raise ValueError(f"trace file {p}: 'distributedInfo' must be an object, got {type(info).__name__}")
    rank, world, backend = info.get("rank"), info.get("world_size"), info.get("backend")
    for key, v, low in (("rank", rank, 0), ("world_size", world, 1)):
        if v is not None and (type(v) is not int or v < low):
            raise ValueError(f"trace file {p}: distributedInfo.{key}={_short(v)} is not valid: use an int >= {low}")
    if rank is not None and world is not None and rank >= world:
        raise ValueError(f"trace file {p}: distributedInfo.rank={rank} is not valid for world_size={world} "
                         f"(use 0 <= rank < world_size)")
    if backend is not None and not isinstance(backend, str):
        raise ValueError(f"trace file {p}: distributedInfo.backend={_short(backend)} must be a string")
    if base is not None and not (type(base) is int and 0 <= base < 2**63 or type(base) is float and
                                 math.isfinite(base) and base >= 0):
        raise ValueError(f"trace file {p}: baseTimeNanoseconds={_short(base)} is not valid: use a finite "
                         "number >= 0")
    if rank is None:
        rank = _rank_from_name(p)
    if rank is None:
        rank = default_rank
    return rank, world, backend, base


def extract(doc: dict, path, *, default_rank: int = 0) -> RankEvents:
    """``doc["traceEvents"]`` into a :class:`RankEvents` (see the module docstring): a few list
    comprehensions over the events (fast in CPython), then numpy arrays.

    Refuses what would silently distort the analysis, naming the file, the event (index in
    ``traceEvents`` and name) and the field: non-finite or non-numeric ``ts``/``dur``, a negative
    ``dur``, a non-string ``name``/``cat``, ``args`` that is not an object, a ``stream`` or
    ``correlation`` that is not an int (a string or null would unlink kernels from their launches and
    drop the step windows), message sizes that are not ints >= 0, and a ``distributedInfo`` whose
    ``rank``/``world_size`` are not ints (0 <= rank < world_size).

    Taught in chapter 9.
    """
    p = Path(path)
    rank, world, backend, base = header(p, doc.get("distributedInfo"), doc.get("baseTimeNanoseconds"),
                                        default_rank)
    evs = doc["traceEvents"]
    try:
        # a few tight comprehensions instead of one branchy loop: each runs at C-ish speed
        xs = [e for e in evs if e.get("ph") == "X" and e.get("dur") is not None
              and e.get("cat") not in (None, "Trace")]
        thread_names = {(e.get("pid"), e.get("tid")): str((e.get("args") or {}).get("name", ""))
                        for e in evs if e.get("ph") == "M" and e.get("name") == "thread_name"}
        cats = CATEGORIES
        code = [cats.get(e["cat"], OTHER) for e in xs]
        names: dict[str, int] = {}
        nid = [names.setdefault(n, len(names)) for n in [e.get("name", "") for e in xs]]
        threads: dict[tuple, int] = {}
        th = []
        for e in xs:                 # one pass, no intermediate list of keys (18 -> 14 ms on 45k events)
            k = (e.get("pid"), e.get("tid"))
            t = threads.get(k)
            if t is None:
                t = threads[k] = len(threads)
            th.append(t)
        n = len(xs)
        ts_arr = np.array([e.get("ts") for e in xs]) if n else np.zeros(0)
        dur_arr = np.array([e["dur"] for e in xs]) if n else np.zeros(0)
        # numbers only: a string, null or nested value makes a str/object array (no silent conversion)
        if ts_arr.dtype.kind not in "if" or dur_arr.dtype.kind not in "if" or \
                not all(type(k) is str for k in names) or not all(type(e["cat"]) is str for e in xs):
            raise TypeError("an event field has the wrong type")
        ts_is_float = ts_arr.dtype.kind == "f"
        ts_arr, dur_arr = ts_arr.astype(float), dur_arr.astype(float)
    except (TypeError, AttributeError, ValueError, OverflowError) as ex:
        raise ValueError(f"trace file {p}: {_bad_event(evs) or ex}") from None
    bad = ~np.isfinite(ts_arr) | ~np.isfinite(dur_arr) | (dur_arr < 0) | (np.abs(ts_arr) > MAX_TS_US) | \
        (dur_arr > MAX_DUR_US)
    if bad.any():
        raise ValueError(f"trace file {p}: {_bad_event(evs, xs[int(np.flatnonzero(bad)[0])])}")
    cat = np.asarray(code, dtype=np.int8) if n else np.zeros(0, dtype=np.int8)
    stream = np.full(n, -1, dtype=np.int64)
    corr = np.full(n, -1, dtype=np.int64)
    comm_args: dict[int, dict] = {}
    comm_re = COMM_KERNEL_RE.match
    name_list = list(names)
    cat_list = cat.tolist()          # Python ints: indexing a numpy array per event is slow
    for i in np.flatnonzero((cat <= MEMSET) | (cat == RUNTIME)).tolist():
        a = xs[i].get("args")
        if a is None:
            continue
        c = a.get("correlation", -1) if type(a) is dict else None
        if type(c) is not int or not _I64_MIN <= c <= _I64_MAX:
            raise ValueError(f"trace file {p}: {_bad_event(evs, xs[i])}")
        corr[i] = c
        if cat_list[i] <= MEMSET:
            s = a.get("stream", -1)
            if type(s) is not int or not _I64_MIN <= s <= _I64_MAX:
                raise ValueError(f"trace file {p}: {_bad_event(evs, xs[i])}")
            stream[i] = s
            if cat_list[i] == KERNEL and ("Collective name" in a or comm_re(name_list[nid[i]])):
                comm_args[i] = _comm_args(p, evs, xs[i])
    rpc = names.get("record_param_comms")
    if rpc is not None:
        for i in np.flatnonzero((cat == CPU_OP) & (np.asarray(nid) == rpc)).tolist():
            comm_args[i] = _comm_args(p, evs, xs[i])
    return rank_events(p, rank, world, backend, name_list, ts_arr, dur_arr, cat, nid, th, stream, corr, threads,
                       thread_names, comm_args, ts_is_float, base, doc.get("labkit_synthetic"))


def rank_events(p, rank, world, backend, name_list, ts_arr, dur_arr, cat, nid, th, stream, corr, threads,
                thread_names, comm_args, ts_is_float, base, synth) -> RankEvents:
    """A :class:`RankEvents` from the decoded columns of one rank's trace (the dict reader here and the typed
    one of :mod:`labkit.trace.runs` share it): the window and the start on the profiler's base time."""
    n = len(ts_arr)
    start = float(ts_arr.min()) + (base or 0) / 1e3 if n else None
    window = float((ts_arr + dur_arr).max() - ts_arr.min()) if n else 0.0
    return RankEvents(path=p, rank=int(rank), world_size=world, backend=backend,
                      names=name_list, ts=ts_arr, dur=dur_arr, cat=cat,
                      name_id=np.asarray(nid, dtype=np.int32), thread=np.asarray(th, dtype=np.int32),
                      stream=stream, corr=corr, threads=list(threads),
                      thread_names=thread_names, comm_args=comm_args, ts_is_float=ts_is_float,
                      start_us=start, window_us=window, has_base_time=base is not None,
                      synthetic=synth.get("spec") if isinstance(synth, dict) else None)


_NUMBER_TYPES = {int, float}
MAX_TS_US = 1e17      # µs: ~3,000 years after 1970 (Kineto writes µs since the epoch, or since a base time)
MAX_DUR_US = 1e13     # µs: ~116 days, far past any profiled span (1e308 would make every sum inf)
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_DEVICE_NAMES = {k for k, v in CATEGORIES.items() if v in DEVICE_CATS or v == RUNTIME}


def _comm_args(p: Path, evs, e: dict) -> dict:
    """The args of a collective, with message sizes checked (ints >= 0 or absent)."""
    a = e.get("args") or {}
    if type(a) is not dict:
        raise ValueError(f"trace file {p}: {_bad_event(evs, e)}")
    for key in ("In msg nelems", "Out msg nelems"):
        v = a.get(key)
        if v is not None and (type(v) is not int or not 0 <= v <= _I64_MAX):
            raise ValueError(f"trace file {p}: {_where(evs, e)} has {key!r}={_short(v)}: use an int >= 0 "
                             "(elements in the message)")
    return a


def _where(evs, e) -> str:
    i = next((k for k, x in enumerate(evs) if x is e), "?")
    name = e.get("name") if isinstance(e, dict) else None
    return f"event {i}" + (f" ({str(name)[:60]!r})" if name is not None else "")


def _bad_event(evs, only=None) -> str | None:
    """What is wrong with the first invalid event (or with ``only``): where it is, the field, the value."""
    for e in ([only] if only is not None else evs):
        if not isinstance(e, dict):
            return f"{_where(evs, e)} is {type(e).__name__}, not an object"
        problem = _event_problem(e)
        if problem:
            return f"{_where(evs, e)}: {problem}"
    return None


def _short(v) -> str:
    if type(v) is int and abs(v) > 10**30:
        return f"<int of {v.bit_length()} bits>"
    return repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."


def _event_problem(e: dict) -> str | None:
    ph = e.get("ph")
    try:
        hash((e.get("pid"), e.get("tid"), e.get("ph"), e.get("name")))
    except TypeError:
        return f"pid/tid/ph/name must be numbers or strings, got {e.get('pid')!r}/{e.get('tid')!r}/{ph!r}"
    args = e.get("args")
    if args is not None and not isinstance(args, dict):
        return f"'args' must be an object, got {type(args).__name__} {str(args)[:40]!r}"
    if ph != "X" or e.get("dur") is None or e.get("cat") in (None, "Trace"):
        return None
    if not isinstance(e["cat"], str):
        return f"'cat'={_short(e['cat'])} must be a string"
    if not isinstance(e.get("name", ""), str):
        return f"'name'={_short(e['name'])} must be a string"
    for key in ("ts", "dur"):
        v = e.get(key)
        if type(v) not in _NUMBER_TYPES:
            return f"{key!r}={_short(v)} is non-numeric ({type(v).__name__}): use a finite number (µs)"
        if not (math.isfinite(v) if type(v) is float else abs(v) < 2**1023):
            return f"{key!r}={_short(v)} is not valid: use a finite number (µs)"
        if key == "dur" and v < 0:
            return f"'dur'={v!r} is not valid: use a finite number >= 0 (µs)"
        if key == "ts" and abs(v) > MAX_TS_US or key == "dur" and v > MAX_DUR_US:
            top = MAX_TS_US if key == "ts" else MAX_DUR_US
            return (f"{key!r}={_short(v)} is out of range: a profiler time in µs is at most {top:.0e} "
                    f"({'about 3,000 years since 1970' if key == 'ts' else 'about 116 days'})")
    if e["cat"] in _DEVICE_NAMES and args is not None:
        for key in ("correlation", "stream") if CATEGORIES[e["cat"]] in DEVICE_CATS else ("correlation",):
            v = args.get(key, -1)
            if type(v) is not int or not _I64_MIN <= v <= _I64_MAX:
                return (f"args.{key}={_short(v)} is not valid: use a 64-bit int (it links kernels to their "
                        "launches; a wrong type would silently drop the step windows)")
    return None


def __getattr__(name: str):
    """The readers of files and folders moved to :mod:`labkit.trace.runs`; their old names here still
    import, with a DeprecationWarning, through :mod:`labkit._compat` (this file never imports runs)."""
    from labkit import _compat

    return _compat.moved_attribute(__name__, name)
