"""Streamed reading of one rank's Chrome trace: the events decoded a slice at a time, never the whole file.

Reading a trace whole holds its bytes and every decoded event at once: about three times the file at the
peak, which for a job of 100 MB ranks read in a pool of workers is what bounds the job's memory. Here the
file (plain or ``.json.gz``) is read in chunks of :data:`CHUNK` bytes; the ``traceEvents`` array is cut
between two events (a ``}`` then ``,`` then ``{``, with any white space between), each slice is decoded
by the typed decoder of :mod:`labkit.trace.fastload` as a list of events and folded at once into flat
columns (:class:`Columns`), and the slice and its events are dropped before the next is read. The
document's other fields (``distributedInfo``, ``baseTimeNanoseconds``, the SYNTHETIC spec) are decoded from
the text before the array and the last slice, which holds the array's end and whatever follows it.

A cut is only ever made where one event ends and the next begins: the text from a true event start up to a
``}, {`` inside a string, or inside a nested array, does not decode as a list of events (the string or the
array is left open), so such a slice is kept and read on with the next chunk. Anything the streamed reader
cannot read this way — no ``traceEvents`` key near the start, a slice that will not decode, more events or
bytes than the limits, a corrupt gzip, an event the typed columns refuse — makes it return None, and the
whole-file reader of :func:`labkit.trace.runs.read_rank` decides (with its errors naming file, event and
field). On a valid trace the columns equal the whole-file reader's bit for bit (tests/test_trace_jobscale.py).

The same idea, in other tools: HTA reads a whole rank with ``json.load``/``orjson`` (its ``parser_backend``
option can use ijson's event stream instead); Perfetto's trace processor tokenizes JSON traces in chunks.

Taught in chapter 9 (profiler traces: reading a real job's files).
"""
from __future__ import annotations

import gzip
import importlib
import os
import re
import zlib
from pathlib import Path

import numpy as np

from labkit.trace import fastload

L = importlib.import_module("labkit.trace.load")

__all__ = ["CHUNK", "Columns", "read_streamed"]

CHUNK = 4 * 2**20                 # bytes read (inflated) at a time; a slice's events are decoded together
_CARRY_MAX = 16 * CHUNK           # a slice that keeps failing to decode past this: the whole-file reader decides
_HEAD_MAX = 64 * 2**20            # the ``traceEvents`` key must start within this many bytes
_KEY = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_WS = b" \t\r\n"


class Columns:
    """The flat columns of a rank's complete events, filled one decoded slice of events at a time.

    :meth:`add` folds a list of typed events (:mod:`labkit.trace.fastload`) into the columns and returns
    False when an event is not plainly valid (the generic reader then names it); :meth:`finish` makes the
    :class:`labkit.trace.load.RankEvents`. The columns are those of the whole-file reader, in the same
    order, so one slice or many give the same result. Taught in chapter 9.
    """

    def __init__(self):
        self.n = 0
        self.parts: dict[str, list] = {k: [] for k in ("ts", "dur", "cat", "nid", "th", "stream", "corr")}
        self.names: dict[str, int] = {}
        self.threads: dict[tuple, int] = {}
        self.thread_names: dict = {}
        self.kernel_args: dict[int, dict] = {}
        self.rpc_args: dict[int, dict] = {}
        self.ts_is_float = False        # as the whole-file reader's: any float time, or no events at all

    def add(self, evs) -> bool:
        """Fold one slice of typed events into the columns; False when one is not plainly valid."""
        unset = fastload.UNSET
        xs: list = []
        code: list = []
        nid: list = []
        th: list = []
        ts: list = []
        dur: list = []
        names, threads, thread_names = self.names, self.threads, self.thread_names
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
            if n == 0:
                return True
            ts_arr, dur_arr = np.array(ts), np.array(dur)
        except (TypeError, ValueError, OverflowError):
            return False
        # a null name is a None key among the names; a non-string cat can only have the code OTHER
        if ts_arr.dtype.kind not in "if" or dur_arr.dtype.kind not in "if" or \
                not all(type(k) is str for k in names) or \
                not all(type(xs[i].cat) is str for i, c in enumerate(code) if c == other):
            return False
        self.ts_is_float |= ts_arr.dtype.kind == "f"
        cat = np.asarray(code, dtype=np.int8)
        stream = np.full(n, -1, dtype=np.int64)
        corr = np.full(n, -1, dtype=np.int64)
        comm_re = L.COMM_KERNEL_RE.match
        name_list = list(names)
        cat_list = cat.tolist()
        lo, hi, base = L._I64_MIN, L._I64_MAX, self.n
        for i in np.flatnonzero((cat <= L.MEMSET) | (cat == L.RUNTIME)).tolist():
            a = xs[i].args
            if a is None:
                continue
            c = -1 if a.correlation is unset else a.correlation
            if type(c) is not int or not lo <= c <= hi:
                return False
            corr[i] = c
            if cat_list[i] <= L.MEMSET:
                s = -1 if a.stream is unset else a.stream
                if type(s) is not int or not lo <= s <= hi:
                    return False
                stream[i] = s
                if cat_list[i] == L.KERNEL and (a.collective is not unset or comm_re(name_list[nid[i]])):
                    self.kernel_args[base + i] = fastload.args_dict(a)
        nid_arr = np.asarray(nid, dtype=np.int64)
        rpc = names.get("record_param_comms")
        if rpc is not None:
            for i in np.flatnonzero((cat == L.CPU_OP) & (nid_arr == rpc)).tolist():
                a = xs[i].args
                self.rpc_args[base + i] = {} if a is None else fastload.args_dict(a)
        for key, col in (("ts", ts_arr), ("dur", dur_arr), ("cat", cat), ("nid", nid_arr),
                         ("th", np.asarray(th, dtype=np.int64)), ("stream", stream), ("corr", corr)):
            self.parts[key].append(col)
        self.n += n
        return True

    def finish(self, p, default_rank, info, base, synth):
        """The :class:`labkit.trace.load.RankEvents` of the columns, or None when a field is out of range;
        ``info``, ``base``, ``synth``: the document's ``distributedInfo``, ``baseTimeNanoseconds`` and
        ``labkit_synthetic``."""
        rank, world, backend, base = L.header(p, info, base, default_rank)
        cols = {k: np.concatenate(v) if v else None for k, v in self.parts.items()}
        self.parts = {}
        if self.n == 0:
            self.ts_is_float = True
            ts_arr = dur_arr = np.zeros(0)
            cat = np.zeros(0, dtype=np.int8)
            nid = th = []
            stream = corr = np.full(0, -1, dtype=np.int64)
        else:
            ts_arr, dur_arr = cols["ts"].astype(float), cols["dur"].astype(float)
            cat, nid, th, stream, corr = cols["cat"], cols["nid"], cols["th"], cols["stream"], cols["corr"]
        if (~np.isfinite(ts_arr) | ~np.isfinite(dur_arr) | (dur_arr < 0) | (np.abs(ts_arr) > L.MAX_TS_US)
                | (dur_arr > L.MAX_DUR_US)).any():
            return None
        comm_args = {**self.kernel_args, **self.rpc_args}
        for a in comm_args.values():
            for key in ("In msg nelems", "Out msg nelems"):
                v = a.get(key)
                if v is not None and (type(v) is not int or not 0 <= v <= L._I64_MAX):
                    return None
        return L.rank_events(p, rank, world, backend, list(self.names), ts_arr, dur_arr, cat, nid, th, stream,
                             corr, self.threads, self.thread_names, comm_args, self.ts_is_float, base, synth)


def _decode(text):
    try:
        return fastload._DECODER.decode(text)
    except (fastload.msgspec.DecodeError, fastload.msgspec.ValidationError, RecursionError, ValueError):
        return None


def _decode_events(text):
    try:
        return _EVENTS.decode(text)
    except (fastload.msgspec.DecodeError, fastload.msgspec.ValidationError, RecursionError, ValueError):
        return None


_EVENTS = fastload.msgspec.json.Decoder(list[fastload._Event]) if fastload.msgspec is not None else None


def _last_cut(buf: bytes) -> tuple[int, int] | None:
    """(end of an event, start of the next) for the last ``}`` ``,`` ``{`` in ``buf``, or None."""
    j = len(buf)
    while True:
        j = buf.rfind(b"{", 0, j)
        if j <= 0:
            return None
        k = j - 1
        while k >= 0 and buf[k] in _WS:
            k -= 1
        if k >= 1 and buf[k] == 0x2C:              # ","
            k -= 1
            while k >= 0 and buf[k] in _WS:
                k -= 1
            if k >= 0 and buf[k] == 0x7D:          # "}"
                return k + 1, j


def _chunks(p: Path, max_bytes: int):
    """The file's (inflated) bytes, :data:`CHUNK` at a time; :class:`_Decline` once past ``max_bytes`` (or
    before inflating, when the gzip trailer says so: the whole-file reader then raises its error)."""
    name = os.fspath(p)
    if name.endswith(".gz"):
        isize = fastload._gzip_isize(p)
        if isize is not None and max_bytes < isize <= 1032 * os.stat(p).st_size:
            raise _Decline
        f = gzip.open(p, "rb")
    else:
        if os.stat(p).st_size > max_bytes:
            raise _Decline
        f = open(p, "rb")
    with f:
        n = 0
        while True:
            b = f.read(CHUNK)
            if not b:
                return
            n += len(b)
            if n > max_bytes:
                raise _Decline
            yield b


class _Decline(Exception):
    """The streamed reader cannot read this file: the whole-file reader decides."""


def read_streamed(path, *, default_rank: int = 0, max_mb=None, max_events=None):
    """One rank's :class:`labkit.trace.load.RankEvents`, the file decoded a slice of events at a time (see
    the module docstring), or None when the whole-file reader must decide (:func:`labkit.trace.runs.read_rank`
    falls back to it). ``max_mb``/``max_events``: the limits of :func:`labkit.trace.fastload.limits`.

    Taught in chapter 9.
    """
    from labkit.checks import refuse_special

    max_bytes, max_ev = fastload.limits(max_mb, max_events)
    p = Path(path)
    refuse_special("trace file", p)
    if not p.is_file():
        raise FileNotFoundError(f"trace file {p} does not exist")
    if fastload.msgspec is None:
        return None
    try:
        return _stream(p, default_rank, max_bytes, max_ev)
    except (_Decline, EOFError, gzip.BadGzipFile, zlib.error, OSError):
        return None


def _stream(p: Path, default_rank: int, max_bytes: int, max_ev: int):
    cols, head, buf, tail3, n_ph = Columns(), None, b"", b"", 0
    for chunk in _chunks(p, max_bytes):
        n_ph += (tail3 + chunk).count(b'"ph"')     # as fastload.check_events counts, across chunk edges
        tail3 = chunk[-3:]
        if n_ph > max_ev:
            raise _Decline
        buf = buf + chunk if buf else chunk
        del chunk
        if head is None:
            m = _KEY.search(buf)
            if m is None:
                if len(buf) > _HEAD_MAX:
                    raise _Decline
                continue
            head = buf[:m.end() - 1]            # the text before the array's "["
            try:                                # the key is the document's own, not nested nor in a string
                ok = isinstance(fastload.msgspec.json.decode(head + b"[]}"), dict)
            except (fastload.msgspec.DecodeError, RecursionError, ValueError):
                ok = False
            if not ok:
                raise _Decline
            buf = buf[m.end():]
        cut = _last_cut(buf)
        if cut is None:
            continue
        evs = _decode_events(b"[" + buf[:cut[0]] + b"]")
        if evs is None:                         # a "}, {" inside a string or a nested array: read on
            if len(buf) > _CARRY_MAX:
                raise _Decline
            continue
        if not cols.add(evs):
            raise _Decline
        del evs
        buf = buf[cut[1]:]
    if head is None or b'"traceEvents"' in buf:     # no array, or a second one after it
        raise _Decline
    doc = _decode(head + b"[" + buf)
    del buf
    if doc is None or not cols.add(doc.traceEvents):
        raise _Decline
    return cols.finish(p, default_rank, doc.distributedInfo, doc.baseTimeNanoseconds, doc.labkit_synthetic)
