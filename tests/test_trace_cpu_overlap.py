"""CPU-trace overlap (chapter 9): gloo communication that runs while the main thread computes is hidden.

A hand-built 2-rank CPU trace in torch.profiler's layout (``ProfilerStep#N`` and ops on the main thread,
``gloo:all_reduce`` on ``pt_gloo_runloop`` threads, ``distributedInfo``) with every bucket known to the
µs — including a gloo span that outlives the main thread's resumption and is cut at the sync point —,
the recorded traces shipped in ``datasets/traces``, and one live 2-rank DDP run whose small buckets fire
during backward.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from labkit.trace import analyze
from labkit.trace.breakdown import is_collective_op

PID, MAIN, GLOO1, GLOO2 = 4242, 4242, 4301, 4302
BASE = 5_196_815_000_000          # µs, the epoch-like magnitude of real Kineto timestamps
STEP_US = 1000
DL = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
EVAL = "autograd::engine::evaluate_function: "

# One step per rank, times in µs from the step start. Main-thread cpu_ops (name, start, end);
# the c10d::allreduce_ launches sit inside the AccumulateGrad / AddmmBackward0 ops as in real traces.
RANK_OPS = {
    0: [("aten::linear", 20, 300), ("aten::addmm", 30, 290),                       # forward
        (EVAL + "MmBackward0", 320, 500),                                          # backward ...
        (EVAL + "torch::autograd::AccumulateGrad", 500, 520), ("c10d::allreduce_", 510, 515),
        (EVAL + "AddmmBackward0", 520, 700), ("c10d::allreduce_", 598, 600),
        # ... then the main thread blocks on the collective: a wait op inside a wrapping op
        ("PythonSubclass", 700, 770), ("_c10d_functional::wait_tensor", 705, 765),
        ("torch.distributed.ddp.reducer::copy_bucket_to_grad", 770, 780),
        ("aten::add_", 800, 990)],                                                  # optimizer
    1: [("aten::linear", 10, 290),
        (EVAL + "MmBackward0", 300, 480),
        (EVAL + "torch::autograd::AccumulateGrad", 480, 500), ("c10d::allreduce_", 490, 492),
        (EVAL + "AddmmBackward0", 500, 650), ("c10d::allreduce_", 580, 582),
        # DDP's wait for the last bucket records no op: a gap in the main thread [650, 770)
        ("torch.distributed.ddp.reducer::copy_bucket_to_grad", 770, 780),
        ("aten::add_", 800, 990)],
}
# gloo:all_reduce spans (thread, start, end): the first runs from the middle of backward to just after
# it, the second (the other runloop thread) lies inside the first. Both all-reduces complete at 760, but
# rank 1's gloo thread closes its first span only at 810, after the main thread resumed (at 770, its DDP
# copy of the reduced bucket): the span is cut at that sync point, its tail is no communication.
RANK_GLOO = {0: [(GLOO1, 515, 760), (GLOO2, 600, 690)], 1: [(GLOO1, 492, 810), (GLOO2, 582, 700)]}
RANK_DL = {0: (0, 20), 1: (0, 10)}
RANK_ANN = [("Optimizer.step#AdamW.step", 800, 990)]

# The answer, per step, worked out by hand (µs):
# rank 0: compute [20,300) [320,510) [515,598) [600,705) [765,780) [800,990) = 280+190+83+105+15+190 = 863;
#         comm [515,760) = 245; hidden = [515,598)+[600,705) = 188; exposed = [598,600)+[705,760) = 57;
#         idle host wait [0,20) = 20; idle other [300,320) [510,515) [760,765) [780,800) [990,1000) = 60.
# rank 1: compute [10,290) [300,490) [492,580) [582,650) [770,780) [800,990) = 280+190+88+68+10+190 = 826;
#         comm [492,770) = 278 (cut at the copy); hidden = [492,580)+[582,650) = 156;
#         exposed = [580,582)+[650,770) = 122; idle host wait [0,10) = 10;
#         idle other [290,300) [490,492) [780,800) [990,1000) = 42.
EXPECTED_US = {
    0: {"compute": 863, "comm_hidden": 188, "comm_exposed": 57, "idle_host_wait": 20, "idle_other": 60},
    1: {"compute": 826, "comm_hidden": 156, "comm_exposed": 122, "idle_host_wait": 10, "idle_other": 42},
}
STEPS = (7, 8)


def _x(name, cat, tid, t0, t1):
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": BASE + t0, "dur": t1 - t0}


def cpu_trace(rank: int) -> dict:
    """One rank's CPU-only Chrome trace (gloo backend), two identical steps."""
    evs = [{"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "args": {"name": f"thread {tid} ({n})"}}
           for tid, n in ((MAIN, "python"), (GLOO1, "pt_gloo_runloop"), (GLOO2, "pt_gloo_runloop"))]
    for k, step in enumerate(STEPS):
        o = k * STEP_US
        evs.append(_x(f"ProfilerStep#{step}", "user_annotation", MAIN, o, o + STEP_US))
        evs.append(_x(DL, "user_annotation", MAIN, o + RANK_DL[rank][0], o + RANK_DL[rank][1]))
        evs += [_x(n, "user_annotation", MAIN, o + a, o + b) for n, a, b in RANK_ANN]
        evs += [_x(n, "cpu_op", MAIN, o + a, o + b) for n, a, b in RANK_OPS[rank]]
        evs += [_x("gloo:all_reduce", "user_annotation", tid, o + a, o + b) for tid, a, b in RANK_GLOO[rank]]
    evs.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                "tid": "PyTorch Profiler",
                "ts": BASE - 10, "dur": 2 * STEP_US + 20})
    return {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2},
            "traceEvents": evs}


@pytest.fixture()
def cpu_dir(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank{r}.json").write_text(json.dumps(cpu_trace(r)))
    return tmp_path


def test_collective_ops_are_not_compute():
    for n in ("c10d::allreduce_", "c10d::barrier", "_c10d_functional::wait_tensor",
              "_c10d_functional::all_reduce", "record_param_comms", "aten::wait"):
        assert is_collective_op(n), n
    for n in ("aten::mm", EVAL + "AddmmBackward0", "torch.distributed.ddp.reducer::copy_bucket_to_grad",
              "PythonSubclass", "aten::waitress"):
        assert not is_collective_op(n), n


def test_synthetic_cpu_trace_reports_overlap_to_the_microsecond(cpu_dir):
    a = analyze(cpu_dir)
    assert a.kind == "cpu" and a.ranks == [0, 1] and a.steps == list(STEPS)
    for r in (0, 1):
        want = EXPECTED_US[r]
        rows = a.step_breakdown[a.step_breakdown["rank"] == r]
        assert len(rows) == len(STEPS)
        for _, row in rows.iterrows():
            for k, v in want.items():
                assert row[k] == pytest.approx(v * 1e-6, abs=1e-12), (r, k, row[k] * 1e6)
            assert row["total"] == pytest.approx(STEP_US * 1e-6, abs=1e-12)
            assert row["memcpy"] == 0
            assert row["data_wait"] == pytest.approx(want["idle_host_wait"] * 1e-6, abs=1e-12)
        hidden, exposed = want["comm_hidden"], want["comm_exposed"]
        assert a.overlap[r] == pytest.approx(hidden / (hidden + exposed), abs=1e-12)


def test_cpu_partition_counts_overlapped_time_once(cpu_dir):
    """Compute + exposed comm + idle is the step; hidden comm is inside compute, not a share of its own."""
    a = analyze(cpu_dir)
    b = a.breakdown
    parts = b["compute"] + b["comm_exposed"] + b["memcpy"] + b["idle_host_wait"] + b["idle_other"]
    assert np.allclose(parts, b["total"], rtol=0, atol=1e-12)
    s = a.shares()
    assert s["compute"] + s["comm_exposed"] + s["memcpy"] + s["idle_host_wait"] + s["idle_other"] == \
        pytest.approx(1.0, abs=1e-12)
    assert a.comm_wait_share == pytest.approx((57 + 122) / 2000, abs=1e-12)
    assert a.utilisation == pytest.approx(1 - (20 + 60 + 10 + 42) / 2000, abs=1e-12)
    text = a.summary()                               # overlap 188/245 = 76.7% and 156/278 = 56.1%
    assert "76.7%" in text and "56.1%" in text


def test_collectives_and_stragglers_on_the_cpu_trace(cpu_dir):
    a = analyze(cpu_dir)
    ar = a.comm_by_type.set_index("type").loc["all_reduce"]
    assert ar["count"] == 2 * 2 * len(STEPS)                      # 2 buckets x 2 ranks x 2 steps
    assert ar["total_s"] == pytest.approx(2 * (245 + 90 + 318 + 118) * 1e-6, abs=1e-12)   # spans as recorded
    assert set(a.stragglers["rank"]) == {0, 1}


def test_sync_points_cut_gloo_tails(cpu_dir):
    """The last DDP copy of each backward and every Optimizer.step start are sync points; without the
    copies (``gradient_as_bucket_view``) the optimizer step cuts the tail."""
    from labkit.trace.breakdown import RankView, sync_points
    from labkit.trace.runs import read_rank

    ev = read_rank(cpu_dir / "rank1.json")
    marks = sync_points(ev, RankView(ev).main_thread)
    assert (marks - BASE).tolist() == [770, 800, 1770, 1800]
    doc = cpu_trace(1)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if "copy_bucket_to_grad" not in e.get("name", "")]
    (cpu_dir / "rank1.json").write_text(json.dumps(doc))
    row = analyze(cpu_dir).step_breakdown.set_index(["rank", "step"]).loc[(1, STEPS[0])]
    # compute loses the copy [770,780); comm [492,800) is cut at the optimizer step
    want = {"compute": 816, "comm_hidden": 156, "comm_exposed": 2 + 150, "idle_host_wait": 10,
            "idle_other": 22}
    for k, v in want.items():
        assert row[k] == pytest.approx(v * 1e-6, abs=1e-12), (k, row[k] * 1e6)


def test_shipped_recorded_gloo_trace_shows_overlap():
    """The recorded 2-rank trace (1 MB buckets): the gloo all-reduces run during backward on both ranks."""
    from labkit.paths import dataset

    a = analyze(dataset("traces", "cpu_gloo_ddp_tiny"))
    assert all(0 < v < 1 for v in a.overlap.values()), a.overlap
    b = a.breakdown
    assert (b["comm_hidden"] <= b["compute"]).all()
    parts = b["compute"] + b["comm_exposed"] + b["memcpy"] + b["idle_host_wait"] + b["idle_other"]
    assert np.allclose(parts, b["total"], rtol=0, atol=1e-9)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_live_ddp_gloo_all_reduce_overlaps_backward(tmp_path):
    """Small buckets all-reduce during backward on the gloo threads: some communication is hidden."""
    from labkit.train import TrainConfig, run

    run(TrainConfig(parallel="ddp", micro_batch=4, steps=5, warmup_steps=1, bucket_cap_mb=0.25,
                    profile_dir=str(tmp_path)), 2)
    a = analyze(tmp_path)
    assert a.kind == "cpu" and a.ranks == [0, 1]
    assert max(a.overlap.values()) > 0, a.summary()
    b = a.breakdown
    assert (b["comm_hidden"] <= b["compute"]).all()
    parts = b["compute"] + b["comm_exposed"] + b["memcpy"] + b["idle_host_wait"] + b["idle_other"]
    assert np.allclose(parts, b["total"])
