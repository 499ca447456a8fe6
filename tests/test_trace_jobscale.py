"""labkit.trace.summary (chapter 9): the streamed job-level analysis equals the in-memory one, exactly.

``analyze``/``critical_path`` on a folder reduce each rank to a summary in a worker pool and never hold a
rank's events in the parent; ``analysis_of``/``critical_path_of`` on ranks read into memory are the same
analyses. Every table and every step of the critical path must be equal, bit for bit, on the shipped traces
(CPU gloo, real GPU traces from HTA's test data, SYNTHETIC GPU jobs) and on synthetic jobs with a straggler,
a data-loader wait and no message sizes. Memory at job size is a benchmark figure
(benchmarks/bench_trace_jobscale.py), not asserted here.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labkit.trace import ondisk, runs
from labkit.trace.analysis import analysis_of, analyze
from labkit.trace.breakdown import RankView, host_wait
from labkit.trace.critical_path import critical_path, critical_path_from, critical_path_of
from labkit.trace.pacing import RankSeconds, RankStore
from labkit.trace.runs import read_ranks
from labkit.trace.stragglers import stragglers, stragglers_of
from labkit.trace.summary import ClassIndex, Windows, check_summaries, summarize, summarize_ranks
from labkit.trace.synthetic import SyntheticSpec, synthesize_traces

SHIPPED = Path(__file__).resolve().parents[1] / "datasets" / "traces"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    d = tmp_path_factory.mktemp("jobs")
    synthesize_traces(SyntheticSpec(world_size=4, steps=6, straggler_rank=2, straggler_us=3000.0, seed=1), d / "strag")
    synthesize_traces(SyntheticSpec(world_size=3, steps=5, data_wait=True, seed=2), d / "data")
    synthesize_traces(SyntheticSpec(world_size=6, steps=12, straggler_rank=5, straggler_us=900.0, nccl_names="legacy",
                                    comm_args=False, seed=3), d / "legacy")
    return {"cpu_gloo_ddp_tiny": SHIPPED / "cpu_gloo_ddp_tiny",
            "synthetic_gpu_ddp_straggler": SHIPPED / "synthetic_gpu_ddp_straggler",
            "hta_trace_filter": SHIPPED / "hta" / "trace_filter",
            "hta_one_rank": SHIPPED / "hta" / "ns_resolution_trace",
            "strag": d / "strag", "data": d / "data", "legacy": d / "legacy"}


def _frames_equal(a, b):
    assert list(a.columns) == list(b.columns)
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=True,
                                  check_dtype=False)


@pytest.mark.parametrize("name", ["cpu_gloo_ddp_tiny", "synthetic_gpu_ddp_straggler", "hta_trace_filter",
                                  "hta_one_rank", "strag", "data", "legacy"])
def test_streamed_equals_in_memory(jobs, name, monkeypatch):
    pool = name in ("cpu_gloo_ddp_tiny", "strag", "legacy")
    if pool:
        monkeypatch.setattr(runs, "POOL_MIN_BYTES", 0)      # the worker pool even for small traces
    workers = 2 if pool else 1                              # 1: streamed in this process, indexes on disk
    path = jobs[name]
    views = [RankView(ev) for ev in read_ranks(path, workers=1)]
    pick = set(views[0].step_ids[1:3].tolist()) if name in ("strag", "cpu_gloo_ddp_tiny") else None
    for steps in (None, pick) if pick else (None,):
        mem = analysis_of([summarize(v, steps, index=False) for v in views], steps=steps)
        got = analyze(path, steps=steps, workers=workers)
        assert (got.kind, got.ranks, got.steps, got.paths) == (mem.kind, mem.ranks, mem.steps, mem.paths)
        for table in ("breakdown", "step_breakdown", "comm_by_type", "stragglers", "collectives"):
            _frames_equal(getattr(got, table), getattr(mem, table))
        for kind in ("kernel", "cpu_op"):
            _frames_equal(got._ops[kind], mem._ops[kind])
        assert got.overlap.keys() == mem.overlap.keys()
        assert all(got.overlap[r] == mem.overlap[r] or got.overlap[r] != got.overlap[r] for r in got.overlap)
        assert got.summary() == mem.summary() and got.data_wait_s == mem.data_wait_s
        if len(views) > 1:
            cp, cp_mem = critical_path(path, steps=steps, workers=workers), critical_path_of(views, steps=steps)
            assert cp.steps == cp_mem.steps and cp.steps
            assert (cp.kind, cp.ranks, cp.n_collectives, cp.times_last) == \
                (cp_mem.kind, cp_mem.ranks, cp_mem.n_collectives, cp_mem.times_last)
            assert cp.summary() == cp_mem.summary()


def test_stragglers_of_summaries_equals_stragglers_of_views(jobs):
    views = [RankView(ev) for ev in read_ranks(jobs["strag"])]
    colls = {}
    for v in views:
        w = v.windows()
        colls[v.ev.rank] = (v, w, v.collectives(w))
    a, b = stragglers(colls), stragglers_of([summarize(v, index=False) for v in views])
    _frames_equal(a[0], b[0])
    _frames_equal(a[1], b[1])
    assert a[0]["straggler"].tolist() == [False, False, True, False]


def test_windows_read_as_the_list_they_keep(jobs):
    import pickle
    import sys

    for name in ("strag", "cpu_gloo_ddp_tiny"):
        v = RankView(read_ranks(jobs[name])[0])
        wins = v.windows()
        w = summarize(v, index=False).wins
        assert isinstance(w, Windows) and len(w) == len(wins) > 2 and w == wins and bool(w)
        assert [tuple(map(type, x)) for x in w] == [tuple(map(type, x)) for x in wins]    # int, numpy floats
        assert w[1] == wins[1] and w[-1] == wins[-1] and w[1:3] == wins[1:3]
        assert pickle.loads(pickle.dumps(w)) == wins
    big = [(i, *(np.float64(x + i) for x in wins[0][1:])) for i in range(2000)]     # a long job's steps
    listed = sys.getsizeof(big) + sum(sys.getsizeof(t) + sum(map(sys.getsizeof, t)) for t in big)
    kept = Windows(big)
    assert kept == big and sys.getsizeof(kept.ids) + sys.getsizeof(kept.bounds) < listed / 4     # in memory
    assert not Windows([])


def test_index_round_trip_and_host_wait(jobs, tmp_path):
    v = next(v for v in map(RankView, read_ranks(jobs["data"])) if v.kind == "gpu")
    mem = ClassIndex.of(v)
    s = summarize(v, index=tmp_path / "r.npz")
    assert s.index is None and s.index_file.exists()
    disk = s.class_index()
    w = v.windows()
    a, b = w[0][1], w[-1][2]
    cuts = np.linspace(a, b, 9)
    for x, y in zip(cuts[:-1], cuts[1:], strict=True):
        assert disk.classify(x, y) == mem.classify(x, y) and mem.classify(x, y)
    gaps = (np.array([a, (a + b) / 2]), np.array([a + 50.0, (a + b) / 2 + 700.0]))
    assert host_wait(disk.dev_starts, disk.dev_launch, gaps) == v._host_wait(gaps)


def test_streamed_reader_keeps_no_events_and_indexes_on_disk(jobs, tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "POOL_MIN_BYTES", 0)
    sums = summarize_ranks(jobs["legacy"], workers=2, index_dir=tmp_path)
    assert [s.rank for s in sums] == list(range(6))
    assert all(s.index is None and s.index_file.parent == tmp_path and s.index_file.exists() for s in sums)
    assert not any(hasattr(s, "ev") for s in sums)
    assert all(np.isnan(s.coll_bytes).all() for s in sums)      # no message sizes in the legacy job
    assert summarize_ranks(jobs["legacy"], workers=1)[0].index_file is None


def test_path_fields_walk_the_same_path_and_rank_seconds_read_as_dicts(jobs, tmp_path):
    """``fields="path"`` drops what the walk does not read, in the worker; the walk is the same. Each step's
    ``held_s``/``waited_s`` is a RankSeconds over one array: the same items, in the same order, as the dicts."""
    full = summarize_ranks(jobs["strag"], workers=1, index_dir=tmp_path)
    slim = summarize_ranks(jobs["strag"], workers=1, index_dir=tmp_path, fields="path")
    assert all(s.steps_table is None and s.coll_type is None and s.comp_before is None for s in slim)
    a, b = critical_path_from(full), critical_path_from(slim)
    assert a.steps == b.steps and a.summary() == b.summary() and a.verdict() == (2, b.verdict()[1])
    p = next(p for p in a.steps if p.waited_s)
    assert isinstance(p.held_s, RankSeconds) and isinstance(p.waited_s, RankSeconds)
    assert list(p.held_s) == [0, 1, 2, 3] and p.pacer not in p.waited_s and len(p.waited_s) == 3
    assert p.waited_s == {r: p.waited_s[r] for r in (0, 1, 2, 3) if r != p.pacer} != dict(p.held_s)
    with pytest.raises(KeyError):
        p.waited_s[p.pacer]
    keys = ((0, 1, 2), {0: 0, 1: 1, 2: 2})
    assert RankSeconds.pack({0: 1.5, 2: 0.25}, *keys) == {0: 1.5, 2: 0.25}
    assert isinstance(RankSeconds.pack({2: 1.0, 0: 2.0}, *keys), dict)     # not in rank order: kept a dict
    assert repr(RankSeconds.pack({0: 1.0, 1: 2.0, 2: 3.0}, *keys)) == "{0: 1.0, 1: 2.0, 2: 3.0}"


def _fields(cp):
    return [{k: (dict(v) if k in ("held_s", "waited_s") else v) for k, v in vars(p).items()} for p in cp.steps]


@pytest.mark.parametrize("slab_bytes", [8, 96])            # 6 ranks: slabs of 1 and of 2 collectives
def test_column_slabs_of_any_width_give_the_same_path(jobs, tmp_path, monkeypatch, slab_bytes):
    """critical_path reads its ranks × collectives matrices a column slab at a time (labkit.trace.ondisk): slabs
    of one or two collectives, own-time chunks of one step (so a step's collective and the one before it
    fall in different slabs) give every field of every step to the bit, and the same verdict."""
    sums = summarize_ranks(jobs["legacy"], workers=1, index_dir=tmp_path)
    reads = []
    real = ondisk.Matrix.read
    monkeypatch.setattr(ondisk.Matrix, "read", lambda self, *a, **k: reads.append(k.get("j1")) or real(self, *a, **k))
    whole = critical_path_from(sums)
    n_whole = len(reads)
    monkeypatch.setattr(ondisk, "SLAB_BYTES", slab_bytes)
    sliced = critical_path_from(sums)
    assert len(reads) - n_whole > 3 * n_whole                 # many more, narrower reads: the patch took
    assert len(whole.steps) == 12 and _fields(sliced) == _fields(whole)
    assert (sliced.n_collectives, sliced.times_last, sliced.summary(), sliced.verdict()) == \
        (whole.n_collectives, whole.times_last, whole.summary(), whole.verdict())
    assert whole.verdict()[0] == 5


def test_rank_seconds_outlive_their_critical_path_and_pickle(jobs):
    """held_s/waited_s are rows of files in a folder tied to a store every step's RankSeconds holds, not to the
    CriticalPath: a step kept after its result is dropped still reads; pickled, it is the values."""
    import gc
    import pickle

    cp = critical_path(jobs["strag"], workers=1)
    p = next(p for p in cp.steps if p.waited_s)
    want_held, want_waited = dict(p.held_s), dict(p.waited_s)
    folder = p.held_s._src[0].folder
    assert p.held_s._v is None and folder.is_dir()           # on disk, not in the parent
    del cp
    gc.collect()
    assert folder.is_dir() and dict(p.held_s) == want_held and p.waited_s == want_waited
    assert repr(p.held_s) == repr(want_held) and p.held_s[p.pacer] == want_held[p.pacer]
    q = pickle.loads(pickle.dumps(p))
    assert q == p and dict(q.held_s) == want_held and dict(q.waited_s) == want_waited
    assert q.held_s._src is None and list(q.waited_s) == list(want_waited)
    del p
    gc.collect()
    assert not folder.exists() and dict(q.held_s) == want_held    # the folder went with its last step
    store = RankStore(2, 3)
    store.write("held_s", 1, [1.0, 2.0, 3.0])
    assert store.row("held_s", 1).tolist() == [1.0, 2.0, 3.0] and store.row("waited_s", 0).tolist() == [0.0] * 3
    with pytest.raises(ValueError, match="name='held' is not one of its files"):
        store.row("held", 0)
    with pytest.raises(IndexError, match="outside the matrix"):
        store.write("held_s", 2, [1.0, 2.0, 3.0])


def test_bad_inputs_are_named(jobs, tmp_path):
    with pytest.raises(TypeError, match="RankView"):
        summarize("rank0.json")
    v = RankView(read_ranks(jobs["data"])[0])
    with pytest.raises(ValueError, match="index=3"):
        summarize(v, index=3)
    with pytest.raises(ValueError, match="non-empty list"):
        check_summaries("analysis_of", [])
    with pytest.raises(TypeError, match="RankView"):
        analysis_of([v])
    with pytest.raises(ValueError, match="non-empty"):
        critical_path_from([])
    s = summarize(v)
    with pytest.raises(ValueError, match="repeat"):
        critical_path_from([s, s])
    with pytest.raises(ValueError, match="index_dir"):
        summarize_ranks(jobs["data"], index_dir=tmp_path / "nope")
    with pytest.raises(ValueError, match="workers"):
        summarize_ranks(jobs["data"], workers=0)
    with pytest.raises(ValueError, match="fields='steps'"):
        summarize_ranks(jobs["data"], fields="steps")
    with pytest.raises(ValueError, match="no events in the selected steps"):
        analyze(jobs["data"], steps=[99])


@pytest.mark.parametrize("slab", [None, 64])
def test_job_tables_on_disk_equal_the_whole_tables_in_memory(jobs, monkeypatch, slab):
    """labkit.trace.jobtables: the tables built rank by rank into files (in 1-column slabs with a 64-byte slab)
    equal, to the bit, what the whole tables in memory give: stragglers_of's frames, pandas' groupby of every
    rank's rows, numpy's sums of every rank's collectives of a type."""
    from labkit.trace import ondisk
    from labkit.trace.breakdown import COLUMNS

    if slab:
        monkeypatch.setattr(ondisk, "SLAB_BYTES", slab)
    for name in ("strag", "legacy", "data", "cpu_gloo_ddp_tiny", "hta_trace_filter"):
        sums = [summarize(RankView(ev), index=False) for ev in read_ranks(jobs[name], workers=1)]
        a = analysis_of(sums)
        s, al = stragglers_of(sums)
        _frames_equal(a.stragglers, s)
        _frames_equal(a.collectives, al)
        whole = pd.DataFrame(np.vstack([x.steps_table for x in sums]), columns=list(COLUMNS))
        whole.insert(0, "step", np.concatenate([x.wins.ids for x in sums]))
        whole.insert(0, "rank", np.concatenate([np.full(len(x.wins), x.rank) for x in sums]))
        _frames_equal(a.step_breakdown, whole)
        _frames_equal(a.breakdown[["rank", *COLUMNS]], whole.groupby("rank", as_index=False)[list(COLUMNS)].sum())
        for row in a.comm_by_type.itertuples():
            dur = np.concatenate([x.coll_dur[[t == row.type for t in x.coll_type]] for x in sums])
            assert row.count == len(dur) and row.total_s == dur.sum() * 1e-6


def test_job_tables_are_read_when_asked_and_pickle_with_them(jobs):
    import pickle

    from labkit.trace.ondisk import Lazy

    a = analyze(jobs["strag"], workers=1)
    a.summary()
    a.to_dict()
    assert all(isinstance(a.__dict__[k], Lazy) and not a.__dict__[k].loaded for k in ("_step_breakdown", "_collectives"))
    b = pickle.loads(pickle.dumps(a))
    assert all(isinstance(b.__dict__[k], pd.DataFrame) for k in ("_step_breakdown", "_collectives"))
    _frames_equal(b.step_breakdown, a.step_breakdown)
    _frames_equal(b.collectives, a.collectives)
    assert a.step_breakdown is a.step_breakdown and len(a.step_breakdown) == 4 * 6
    a.step_breakdown = a.step_breakdown.head(2)              # a frame may be set, as on any dataclass field
    assert len(a.step_breakdown) == 2 and "step_breakdown" not in repr(a)
