"""labkit.trace.stream (chapter 9): a rank's trace decoded a slice of events at a time equals the whole-file read.

The streamed reader cuts the ``traceEvents`` array between events and folds each decoded slice into flat
columns; every column, name, thread, argument and header field must equal the whole-file typed reader's, on
every shipped trace (CPU gloo, real GPU traces, SYNTHETIC jobs, plain and gzip'd) whatever the slice size,
including slices of a few hundred bytes that end inside strings holding ``}, {`` and inside nested arrays.
What it cannot read (bad events, no ``traceEvents``, past the limits) it declines, and the whole-file reader's
errors are unchanged. Its memory at 100 MB per rank is a benchmark figure (benchmarks/bench_trace_jobscale.py).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import labkit.trace.stream as S
from labkit.trace import fastload
from labkit.trace.load import NotATraceError
from labkit.trace.runs import extract_typed, read_rank
from labkit.trace.synthetic import SyntheticSpec, synthesize_trace

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "datasets" / "traces").rglob("*.json.gz"))


def _whole(p):
    return extract_typed(fastload.decode_typed(fastload.read_bounded(p, 2**31)), p)


def _same(a, b):
    for k in ("ts", "dur", "cat", "name_id", "thread", "stream", "corr"):
        x, y = getattr(a, k), getattr(b, k)
        assert x.dtype == y.dtype and np.array_equal(x, y), k
    for k in ("names", "threads", "thread_names", "ts_is_float", "rank", "world_size", "backend", "start_us",
              "window_us", "has_base_time", "synthetic", "path"):
        assert getattr(a, k) == getattr(b, k), k
    assert list(a.comm_args.items()) == list(b.comm_args.items())    # same keys, values and order


@pytest.mark.parametrize("chunk", [S.CHUNK, 4096, 257])
@pytest.mark.parametrize("path", SHIPPED, ids=[p.parent.name + "/" + p.name for p in SHIPPED])
def test_streamed_equals_whole_file(path, chunk, monkeypatch):
    monkeypatch.setattr(S, "CHUNK", chunk)
    a, b = _whole(path), S.read_streamed(path)
    assert a is not None and b is not None
    _same(a, b)


def _tricky(tmp_path, indent=None, gz=False):
    """A SYNTHETIC GPU trace whose names hold ``}, {`` and whose args hold arrays of objects, with the
    document's other fields both before and after the events."""
    doc = synthesize_trace(SyntheticSpec(world_size=2, steps=4, seed=5), 1)
    for i, e in enumerate(doc["traceEvents"]):
        if e.get("ph") == "X" and i % 3 == 0 and not e["name"].startswith(("ProfilerStep", "nccl")):
            e["name"] = 'aten::weird"}, {"ph": "X"}, {' + str(i % 3)
            e.setdefault("args", {})["Input Dims"] = [{"a": [1, 2]}, {"b": {}}, {"c": "}, {"}]
    events = doc.pop("traceEvents")
    doc = {"schemaVersion": 1, **doc, "traceEvents": events, "traceName": "}, {", "displayTimeUnit": "ms",
           "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    text = json.dumps(doc, indent=indent).encode()
    p = tmp_path / ("rank1.json.gz" if gz else "rank1.json")
    p.write_bytes(gzip.compress(text) if gz else text)
    return p


@pytest.mark.parametrize("indent,gz", [(None, False), (2, False), (None, True)])
@pytest.mark.parametrize("chunk", [64, 300, 1 << 20])
def test_cuts_inside_strings_and_nested_arrays_are_not_taken(tmp_path, indent, gz, chunk, monkeypatch):
    monkeypatch.setattr(S, "CHUNK", chunk)
    p = _tricky(tmp_path, indent, gz)
    a = _whole(p)
    assert a is not None and any('}, {"ph"' in n for n in a.names) and a.has_base_time
    _same(a, S.read_streamed(p))
    _same(a, read_rank(p))


def test_what_it_declines_the_whole_file_reader_decides(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "CHUNK", 512)
    doc = synthesize_trace(SyntheticSpec(world_size=1, steps=3), 0)
    k = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel")
    doc["traceEvents"][k]["dur"] = -1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert S.read_streamed(bad) is None
    with pytest.raises(ValueError, match=rf"{bad.name}: event {k}"):
        read_rank(bad)
    nested = tmp_path / "nested.json"                   # the key, but not the document's own
    nested.write_text(json.dumps({"run": {"traceEvents": doc["traceEvents"][:3]}}))
    assert S.read_streamed(nested) is None
    with pytest.raises(NotATraceError, match="traceEvents"):
        read_rank(nested)
    cut = tmp_path / "cut.json"
    cut.write_bytes(json.dumps(synthesize_trace(SyntheticSpec(world_size=1, steps=3), 0)).encode()[:-40])
    assert S.read_streamed(cut) is None
    with pytest.raises(ValueError, match="truncated|not valid JSON"):
        read_rank(cut)
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(synthesize_trace(SyntheticSpec(world_size=1, steps=3), 0)))
    assert S.read_streamed(ok, max_events=5) is None       # past a limit: declined, and refused whole
    with pytest.raises(ValueError, match="more than the limit"):
        read_rank(ok, max_events=5)
    assert S.read_streamed(ok, max_mb=0.001) is None
    with pytest.raises(ValueError, match="more than the limit"):
        read_rank(ok, max_mb=0.001)
    empty = tmp_path / "empty.json"
    empty.write_text('{"traceEvents": []}')
    _same(_whole(empty), S.read_streamed(empty))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        S.read_streamed(tmp_path / "nope.json")
