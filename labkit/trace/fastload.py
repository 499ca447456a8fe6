"""Bounded, typed reading of Chrome traces: size and event limits, and a decoder of only the fields used.

A real job's traces are tens to hundreds of MB per rank. Two things keep reading them linear and
bounded:

- **Limits checked while reading.** :func:`read_bounded` inflates a ``.json.gz`` in chunks and stops at
  ``max_bytes`` (a 3 MB gzip that would inflate to 2.9 GB ends in one clear error, not a MemoryError);
  the gzip trailer's recorded size is checked first, before any byte is inflated; :func:`check_events`
  counts the events (occurrences of ``"ph"``, a C-speed byte scan) before any is
  decoded. Both limits default to :data:`MAX_TRACE_BYTES` and :data:`MAX_EVENTS`, and can be raised per
  call (``max_mb=``, ``max_events=``, CLI ``--max-mb``/``--max-events``) or by the environment
  (``LABKIT_TRACE_MAX_MB``, ``LABKIT_TRACE_MAX_EVENTS``).
- **Typed decoding of the fields used** (msgspec, https://jcristharif.com/msgspec/structs.html): each
  event becomes a small struct of ``ph, cat, name, pid, tid, ts, dur`` and the four ``args`` the
  analysis reads, instead of a dict of every key a profiler wrote (a kernel's grid, block, occupancy …
  are skipped unread). About 3× faster than a generic JSON parse and a fraction of its memory. Any
  document the typed decoder refuses (wrong types, a missing ``traceEvents``) goes to the generic
  parser, whose errors name the file, event and field (:func:`labkit.trace.load.load`).

Taught in chapter 9 (profiler traces: reading a real job's files).
"""
from __future__ import annotations

import gzip
import os
from typing import Any

from labkit.checks import refuse_special

try:
    import msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; the generic path stays tested
    msgspec = None

MAX_TRACE_BYTES = 2 * 2**30      # 2 GiB uncompressed per file: several times a large real rank's trace
MAX_EVENTS = 20_000_000          # events per file (~5 GB of Kineto JSON)
_CHUNK = 16 * 2**20


def limits(max_mb=None, max_events=None) -> tuple[int, int]:
    """The byte and event limits in force: the arguments, else the environment, else the defaults.

    Taught in chapter 9.
    """
    from labkit import checks

    if max_mb is None:
        env = os.environ.get("LABKIT_TRACE_MAX_MB")
        max_mb = _env_number("LABKIT_TRACE_MAX_MB", env) if env else MAX_TRACE_BYTES / 2**20
    else:
        max_mb = checks.positive("max_mb", max_mb)
    if max_events is None:
        env = os.environ.get("LABKIT_TRACE_MAX_EVENTS")
        max_events = _env_number("LABKIT_TRACE_MAX_EVENTS", env) if env else MAX_EVENTS
    else:
        max_events = checks.count("max_events", max_events)
    return int(max_mb * 2**20), int(max_events)


def _env_number(name, text) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (v > 0 and v < 1e15):
        raise ValueError(f"environment variable {name}={text!r} is not valid: use a number > 0")
    return v


def _too_big(p, limit: int, what: str) -> ValueError:
    return ValueError(f"trace file {p} {what} more than the limit of {limit / 2**20:,.0f} MB uncompressed; "
                      "if it really is one rank's trace, raise the limit (max_mb=…, --max-mb, or "
                      "LABKIT_TRACE_MAX_MB)")


def read_bounded(p, max_bytes: int) -> bytes:
    """The (inflated) bytes of a trace file, refusing past ``max_bytes`` while reading.

    Taught in chapter 9.
    """
    name = os.fspath(p)
    refuse_special("trace file", p)
    if name.endswith(".gz"):
        isize = _gzip_isize(p)
        # the trailer says so, and deflate could (at most ~1032:1): refuse before inflating. A truncated
        # file's last bytes are not a trailer and mostly fail the second test; its read then says truncated
        if isize is not None and max_bytes < isize <= 1032 * os.stat(p).st_size:
            raise _too_big(p, max_bytes, f"says (gzip trailer) it inflates to {isize / 2**20:,.0f} MB,")
        with gzip.open(p, "rb") as f:
            return _read_chunks(f, p, max_bytes, "inflates to", _CHUNK)
    size = os.stat(p).st_size
    if size > max_bytes:
        raise _too_big(p, max_bytes, f"is {size / 2**20:,.0f} MB,")
    with open(p, "rb") as f:
        # read(n) allocates n bytes up front: ask for what the file holds (+1 to see it grow), never the
        # limit itself, so a 90-byte trace reads under a small ``ulimit -v`` (the limit is 2 GiB)
        return _read_chunks(f, p, max_bytes, "holds", max(size, 1) + 1)


def _read_chunks(f, p, max_bytes: int, what: str, first: int) -> bytes:
    """All of ``f`` (plain or gzip), ``first`` bytes asked for first and then :data:`_CHUNK` at a time,
    refused (:func:`_too_big`, saying the file ``what``) as soon as it passes ``max_bytes``."""
    chunks, n = [], 0
    while True:
        b = f.read(min(first if n == 0 else _CHUNK, max_bytes + 1 - n))
        if not b:
            break
        chunks.append(b)
        n += len(b)
        if n > max_bytes:
            raise _too_big(p, max_bytes, what)
    return b"".join(chunks)


def _gzip_isize(p) -> int | None:
    """The uncompressed size a gzip file's trailer records (RFC 1952 ISIZE: size mod 2**32 of the last
    member), None when unreadable. A cheap first check only: a file past 4 GiB or of several members can
    record less than it holds, so the inflating read still counts every byte."""
    try:
        with open(p, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() < 18:
                return None
            f.seek(-4, os.SEEK_END)
            return int.from_bytes(f.read(4), "little")
    except OSError:
        return None


def check_events(p, raw: bytes, max_events: int) -> None:
    """Refuse a file with more than ``max_events`` events before decoding any (each has a ``"ph"``).

    Taught in chapter 9.
    """
    if len(raw) < 12 * max_events:     # the smallest event, {"ph":"X"}, takes 12 bytes with its comma
        return
    n = raw.count(b'"ph"')
    if n > max_events:
        raise ValueError(f"trace file {p} has about {n:,} events, more than the limit of {max_events:,}; if it "
                         "really is one rank's trace, raise the limit (max_events=…, --max-events, or "
                         "LABKIT_TRACE_MAX_EVENTS)")


if msgspec is not None:
    UNSET = _UNSET = msgspec.UNSET

    class _Args(msgspec.Struct, gc=False, rename={"collective": "Collective name", "in_n": "In msg nelems",
                                                   "out_n": "Out msg nelems"}):
        correlation: Any = _UNSET
        stream: Any = _UNSET
        collective: Any = _UNSET
        in_n: Any = _UNSET
        out_n: Any = _UNSET
        dtype: Any = _UNSET
        name: Any = _UNSET

    class _Event(msgspec.Struct, gc=False):
        ph: Any = None
        cat: Any = None
        name: Any = ""
        pid: Any = None
        tid: Any = None
        ts: Any = None
        dur: Any = None
        args: _Args | None = None

    class _Doc(msgspec.Struct, gc=False):
        traceEvents: list[_Event]
        distributedInfo: Any = None
        baseTimeNanoseconds: Any = None
        labkit_synthetic: Any = None

    _DECODER = msgspec.json.Decoder(_Doc)


def decode_typed(raw: bytes):
    """The typed document, or None when the typed decoder refuses it (the generic parser then decides).

    Taught in chapter 9.
    """
    if msgspec is None:
        return None
    try:
        return _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError):
        return None


def args_dict(a) -> dict:
    """The fields of a typed ``args`` that were present, as the dict the analysis reads.

    Taught in chapter 9.
    """
    out = {}
    for key, v in (("correlation", a.correlation), ("stream", a.stream), ("Collective name", a.collective),
                   ("In msg nelems", a.in_n), ("Out msg nelems", a.out_n), ("dtype", a.dtype)):
        if v is not _UNSET:
            out[key] = v
    return out

