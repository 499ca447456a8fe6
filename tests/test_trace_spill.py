"""labkit.trace.spill (chapter 9): the summaries' arrays wait on disk while the job's tables are filled.

``analyze``/``critical_path`` write each rank's summary arrays to a private temporary folder and read them back
one rank at a time: the folder must be gone after a success and after an error mid-way, a spilled summary must
read back as the one made in memory, and the spilled path must give the in-memory path's results (the full
table-by-table comparison on shipped and SYNTHETIC jobs is tests/test_trace_jobscale.py).
"""
from __future__ import annotations

import gc
import importlib
import tempfile

import numpy as np
import pandas as pd
import pytest

from labkit.trace import jobtables, runs, spill
from labkit.trace.analysis import analysis_of, analyze
from labkit.trace.breakdown import RankView
from labkit.trace.critical_path import critical_path, critical_path_from
from labkit.trace.runs import read_ranks
from labkit.trace.summary import Windows, summarize, summarize_ranks
from labkit.trace.synthetic import SyntheticSpec, synthesize_traces

cp_mod = importlib.import_module("labkit.trace.critical_path")   # the package's name is the function


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("spill") / "strag"
    synthesize_traces(SyntheticSpec(world_size=4, steps=6, straggler_rank=2, straggler_us=3000.0, seed=1), d)
    return d


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """tempfile's folder for this test only, so what analyze/critical_path leave behind can be seen."""
    t = tmp_path / "tempdir"
    t.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(t))
    monkeypatch.setattr(runs, "POOL_MIN_BYTES", 0)          # the worker pool even for small traces
    return t


def _spilled_files(t):
    return sorted(p.name for p in t.rglob("*-arrays.npz"))


def _ours(t):
    """labkit's folders left in ``t`` (multiprocessing keeps its own pymp-* folder for the process's life)."""
    return [p.name for p in t.iterdir() if p.name.startswith("labkit-")]


def test_analyze_and_critical_path_leave_no_folder(job, private_tmp):
    a = analyze(job, workers=2)
    c = critical_path(job, workers=2)
    assert a.ranks == [0, 1, 2, 3] and c.steps
    # the results' own files (labkit.trace.ondisk.results_dir) live as long as the results; the spills are gone
    assert all(n.startswith("labkit-results-") for n in _ours(private_tmp))
    assert len(a.step_breakdown) == 4 * 6 and len(a.collectives)
    del a, c
    gc.collect()
    assert _ours(private_tmp) == []


@pytest.mark.parametrize("where", ["analyze", "critical_path"])
def test_folder_deleted_after_an_error_mid_way(job, private_tmp, monkeypatch, where):
    seen = []

    def boom(*args, **kwargs):
        seen.append(_spilled_files(private_tmp))            # the workers have spilled every rank by now
        raise RuntimeError("mid-way")

    if where == "analyze":
        monkeypatch.setattr(jobtables, "job_tables", boom)
        with pytest.raises(RuntimeError, match="mid-way"):
            analyze(job, workers=2)
    else:
        monkeypatch.setattr(cp_mod, "_job_path", boom)
        with pytest.raises(RuntimeError, match="mid-way"):
            critical_path(job, workers=2)
    assert seen == [[f"rank-file-{i}-arrays.npz" for i in range(4)]]
    assert _ours(private_tmp) == []


def test_spilled_summary_reads_back_as_in_memory(job, tmp_path):
    view = RankView(read_ranks(job, workers=1)[1])
    mem, sm = summarize(view, index=False), summarize(view, index=False)
    sm.spill(tmp_path / "r.npz")
    assert sm.wins is None and sm.coll_start is None and sm.coll_type is None
    assert sm.spilled["n_wins"] == len(mem.wins) and sm.spilled["n_colls"] == len(mem.coll_start)
    assert sum(sm.spilled["types"].values()) == len(mem.coll_type)
    back = spill.rank(sm)
    assert isinstance(back.wins, Windows) and back.wins == mem.wins
    assert back.step_ids == mem.step_ids and back.coll_type == mem.coll_type
    for k in ("steps_table", "coll_start", "coll_dur", "coll_bytes", "comp_before", "coll_end"):
        np.testing.assert_array_equal(getattr(back, k), getattr(mem, k))
    part = spill.rank(sm, ("coll_start",))
    assert part.wins is None and part.coll_dur is None and part.coll_start is not None
    assert spill.rank(mem) is mem                           # in memory: itself


def test_spilled_and_in_memory_paths_agree(job, tmp_path):
    """summarize_ranks(arrays_dir=...) then analysis_of/critical_path_from = the same on summaries in memory."""
    (tmp_path / "a").mkdir()
    sp = summarize_ranks(job, workers=1, index_dir=tmp_path, arrays_dir=tmp_path / "a")
    mem = summarize_ranks(job, workers=1, index_dir=tmp_path)
    assert all(s.spilled is not None and s.steps_table is None for s in sp)
    assert all(s.spilled is None for s in mem)
    x, y = analysis_of(sp), analysis_of(mem)
    for t in ("breakdown", "step_breakdown", "comm_by_type", "stragglers", "collectives"):
        pd.testing.assert_frame_equal(getattr(x, t), getattr(y, t), check_exact=True)
    assert x.summary() == y.summary()
    p, q = critical_path_from(sp), critical_path_from(mem)
    assert p.steps == q.steps and p.summary() == q.summary() and p.verdict() == q.verdict()


def test_bad_input(job, tmp_path):
    with pytest.raises(TypeError, match="RankSummary"):
        spill.rank("rank0.json")
    sm = summarize(RankView(read_ranks(job, workers=1)[0]), index=False)
    sm.spill(tmp_path / "x.npz")
    with pytest.raises(ValueError, match="already spilled"):
        sm.spill(tmp_path / "y.npz")
    with pytest.raises(ValueError, match="arrays_dir"):
        summarize_ranks(job, arrays_dir=tmp_path / "nope")


def test_own_time_in_chunks_of_steps_is_the_same(job, monkeypatch):
    """critical_path's own-time pass over a few steps at a time (each rank's index read once a chunk) gives the
    path of one pass over every step."""
    views = [RankView(ev) for ev in read_ranks(job, workers=1)]
    sums = [summarize(v) for v in views]
    whole = critical_path_from(sums)
    monkeypatch.setattr(cp_mod, "_OWN_STEPS", 2)                # 6 steps: three chunks
    chunked = critical_path_from(sums)
    assert len(whole.steps) == 6 and chunked.steps == whole.steps and chunked.summary() == whole.summary()
    assert any(p.excess_s and p.cause != "comm" for p in whole.steps)   # the own time decided a cause
