"""labkit.trace.critical_path (chapter 9): each step's cross-rank critical path — the pace-setting rank, its
cause and the others' wait — on SYNTHETIC traces with known answers (GPU-shaped, and gloo-shaped ones for a
slow link against the same delay in compute), the shipped real GPU trace (agreeing with the stragglers
table), and live gloo jobs on 4 ranks with one rank slowed by host code, compute, its data loader or its
link. Asserts ranks and causes, never timings."""
from __future__ import annotations

import json

import pytest

from labkit.trace import analyze
from labkit.trace.critical_path import CAUSES, critical_path
from labkit.trace.synthetic import SyntheticSpec, expected, synthesize_traces


def _synth(tmp_path, **kw):
    spec = SyntheticSpec(**kw)
    synthesize_traces(spec, tmp_path)
    return spec, critical_path(tmp_path)


def test_a_compute_straggler_sets_every_steps_pace_and_the_others_wait_exactly_its_delay(tmp_path):
    spec, cp = _synth(tmp_path, world_size=4, steps=4, straggler_rank=2, straggler_us=3000.0)
    assert cp.verdict() == (2, "compute")
    for p in cp.steps:
        assert (p.pacer, p.cause, p.stands_out) == (2, "compute", True)
        assert p.waited_s == pytest.approx({0: 3e-3, 1: 3e-3, 3: 3e-3})
        assert p.excess_s["compute"] == pytest.approx(3e-3)
        # the path is contiguous: its pieces add up to the step the straggler's rank lays out
        assert sum(b - a for _, a, b, _ in p.segments) == pytest.approx(p.duration_s)
    mid = expected(spec, 2)["steps"]
    assert cp.steps[0].duration_s == pytest.approx(mid["total"])
    assert set(cp.steps[0].by_rank[2]) == set(CAUSES)
    assert cp.lost_to_slowest()["compute"] == pytest.approx(4 * 3e-3)
    assert "rank 2 set the pace" in cp.steps[0].sentence() and "compute" in cp.summary()


def test_ranks_in_step_are_not_called_slow(tmp_path):
    _, cp = _synth(tmp_path, world_size=4, steps=3)
    assert cp.verdict() == (None, None)
    assert not any(p.stands_out for p in cp.steps)
    assert sum(cp.lost_to_slowest().values()) == 0
    assert "no rank held the others back" in cp.summary()


def test_the_data_loader_and_the_host_gaps_are_on_the_path(tmp_path):
    _, cp = _synth(tmp_path, world_size=2, steps=3, data_wait=True)
    p = cp.steps[0]
    parts = p.by_rank[p.pacer]
    assert parts["data"] > 0 and parts["compute"] > 0 and parts["comm"] > 0


def test_on_hta_s_real_two_of_128_trace_the_slow_rank_agrees_with_the_stragglers_table():
    from labkit.paths import dataset

    d = dataset("traces", "hta", "trace_filter")
    flagged = analyze(d).stragglers.query("straggler")["rank"].tolist()
    rank, _ = critical_path(d).verdict()
    assert flagged == [rank] == [1]


def test_the_shipped_cpu_trace_has_no_slow_rank_as_the_stragglers_table_says():
    from labkit.paths import dataset

    d = dataset("traces", "cpu_gloo_ddp_tiny")
    assert analyze(d).stragglers["straggler"].sum() == 0
    cp = critical_path(d)
    assert cp.kind == "cpu" and cp.verdict() == (None, None)


def _cpu_job(out, *, slow=None, by=None, delay_us=30_000.0, transfer_us=5_000.0, steps=4, ranks=4, late_ms=None):
    """SYNTHETIC gloo-style traces (one file per rank): per step the main thread computes 20 ms (an op), the
    ``gloo:all_reduce`` span on the gloo thread runs from the rank's arrival to the last arrival + the
    transfer, then the optimizer (1 ms). ``by="compute"``: the slow rank computes ``delay_us`` longer;
    ``by="link"``: its all-reduce ends ``delay_us`` after the others' (its own part of the transfer on a slow
    link), so it also starts its next step that much later. ``late_ms``: per step, each rank's extra compute
    in ms (steps and ranks from its shape; overrides ``slow``/``by``)."""
    out.mkdir(parents=True, exist_ok=True)
    if late_ms is not None:
        steps, ranks = len(late_ms), len(late_ms[0])
    t, events = [0.0] * ranks, {r: [] for r in range(ranks)}
    for s in range(2, 2 + steps):
        arrive = [t[r] + 20_000.0 + (delay_us if by == "compute" and r == slow else 0.0)
                  + (1e3 * late_ms[s - 2][r] if late_ms is not None else 0.0) for r in range(ranks)]
        last = max(arrive)
        for r in range(ranks):
            end = last + transfer_us + (delay_us if by == "link" and r == slow else 0.0)
            x = lambda name, cat, tid, a, b: {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid,  # noqa: E731
                                              "ts": a, "dur": b - a}
            events[r] += [x(f"ProfilerStep#{s}", "user_annotation", 1, t[r], end + 1000.0),
                          x("aten::mm", "cpu_op", 1, t[r], arrive[r]),
                          x("gloo:all_reduce", "user_annotation", 2, arrive[r], end),
                          x("Optimizer.step#AdamW.step", "user_annotation", 1, end, end + 1000.0),
                          x("aten::add_", "cpu_op", 1, end, end + 1000.0)]
            t[r] = end + 1000.0
    for r in range(ranks):
        doc = {"schemaVersion": 1, "deviceProperties": [], "traceEvents": events[r],
               "distributedInfo": {"backend": "gloo", "rank": r, "world_size": ranks}}
        (out / f"rank{r}.json").write_text(json.dumps(doc))
    return critical_path(out)


def test_a_slow_link_is_named_by_its_collectives_ending_after_the_others_and_compute_is_not(tmp_path):
    """The link's signature in the spans: the rank arrives in step but leaves its all-reduces 30 ms after the
    others (all-reduce ranks end together once the last one arrived), then reaches the next one 30 ms late
    with no more compute than they had — cause 'comm'. The same delay spent in compute is 'compute'."""
    link = _cpu_job(tmp_path / "link", slow=2, by="link")
    assert link.kind == "cpu" and link.verdict() == (2, "comm")
    for p in link.steps:
        assert (p.pacer, p.cause, p.stands_out) == (2, "comm", True)
        assert p.excess_s["comm"] == pytest.approx(0.03)
        assert p.excess_s.get("compute", 0.0) == pytest.approx(0.0, abs=1e-9)   # it computed what they did
    assert "ended 30 ms later than the other ranks' median" in link.steps[-1].sentence()
    assert "slow link" in link.summary()
    comp = _cpu_job(tmp_path / "compute", slow=1, by="compute")
    assert comp.verdict() == (1, "compute")
    assert all(p.excess_s["comm"] == 0.0 and p.excess_s["compute"] == pytest.approx(0.03) for p in comp.steps)


def test_a_slow_ring_that_stretches_every_ranks_transfer_alike_names_no_rank(tmp_path):
    """What the spans cannot say: a slow link inside a ring makes every rank's all-reduce long and end together
    — communication on the path, nobody held back, so no rank is named (that takes per-link tests)."""
    cp = _cpu_job(tmp_path, transfer_us=60_000.0)
    assert cp.verdict() == (None, None)
    assert all(max(p.by_rank[p.pacer], key=p.by_rank[p.pacer].get) == "comm" for p in cp.steps)


# Arrival times (ms after the first rank) at the profiled steps' all-reduces of live 4-rank gloo jobs kept by
# benchmarks/bench_critical_path.py --keep on the shared 2-core machine (load 4-12), 3 profiled steps each:
_COMPUTE_SEED2 = [[54.8, 33.1, 34.7, 0.0], [42.2, 0.0, 0.0, 42.9], [50.1, 0.0, 3.0, 1.8]]   # rank 0 slowed
_DATA_SEED9 = [[7.6, 0.0, 160.8, 56.5], [2.1, 72.0, 108.0, 0.0], [27.5, 191.9, 179.6, 0.0]]  # rank 2 slowed
_CLEAN_SEED8 = [[29.6, 0.0, 58.0, 40.1], [0.0, 20.5, 56.1, 30.8], [0.0, 12.2, 39.2, 9.3]]    # no rank slowed
_CLEAN_SEED5 = [[0.0, 7.0, 38.3, 22.0], [13.0, 0.0, 15.9, 28.3], [4.0, 0.0, 24.0, 25.8]]
_CLEAN_SEED4 = [[13.1, 41.8, 0.0, 15.0], [44.7, 44.2, 0.0, 33.7], [28.0, 23.9, 0.0, 37.5]]


def test_three_collectives_need_a_perfect_record_so_one_unlucky_step_hides_a_straggler(tmp_path):
    """SYNTHETIC traces replaying recorded arrivals (issue #35's compute misses). With 3 profiled steps the
    verdict's chance test (last at more than half the collectives, binomial tail below 1/8) passes only at 3 of 3:
    the compute straggler (rank 0, 22-50 ms late) lost one step to a descheduled peer arriving 0.7 ms after
    it, and the data straggler (rank 2) one to a peer 12 ms after it — no rank named. The same steps over 8
    collectives (the recorded ones repeated: the same share of bad luck) name both."""
    assert _cpu_job(tmp_path / "c3", late_ms=_COMPUTE_SEED2).verdict() == (None, None)
    assert _cpu_job(tmp_path / "d3", late_ms=_DATA_SEED9).verdict() == (None, None)
    eight = lambda rows: (rows * 3)[:8]   # noqa: E731
    assert _cpu_job(tmp_path / "c8", late_ms=eight(_COMPUTE_SEED2)).verdict() == (0, "compute")
    d8 = _cpu_job(tmp_path / "d8", late_ms=eight(_DATA_SEED9))
    assert d8.verdict() == (2, "compute") and d8.n_collectives == 8   # replayed as compute


def test_a_rank_descheduled_three_steps_running_is_a_straggler_in_three_steps_but_not_in_eight(tmp_path):
    """SYNTHETIC traces replaying a recorded clean job (issue #35's false namings): rank 2 was last at all 3
    profiled all-reduces by 28-36 ms, 20-25 % of the step, and is named. Followed by 5 steps of two other
    recorded clean jobs, it is last at 4 of 8 (not more than half): no rank is named."""
    assert _cpu_job(tmp_path / "c3", late_ms=_CLEAN_SEED8).verdict()[0] == 2
    eight = _cpu_job(tmp_path / "c8", late_ms=_CLEAN_SEED8 + _CLEAN_SEED5 + _CLEAN_SEED4[:2])
    assert eight.times_last[2] == 4 and eight.verdict() == (None, None)


def test_straggler_by_link_is_checked():
    from labkit.train import TrainConfig

    with pytest.raises(ValueError, match="straggler_by='link'.*parallel='ddp'"):
        TrainConfig(inject="straggler", straggler_by="link", parallel="fsdp")
    with pytest.raises(ValueError, match="straggler_by='link'.*communication hook"):
        TrainConfig(inject="straggler", straggler_by="link", parallel="ddp", comm_hook="fp16")
    from labkit.train.slow_link import delay_s, slow_straggler_link

    g = slow_straggler_link(0.25, 4e6, 4)          # the link that makes one step's 4 MB take 0.25 s more
    assert delay_s(4e6, 4, g) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="extra_s"):
        slow_straggler_link(0.0, 4e6, 4)


def test_bad_input_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        critical_path(tmp_path / "nope")
    spec = SyntheticSpec(world_size=2, steps=2)
    synthesize_traces(spec, tmp_path / "t")
    with pytest.raises(ValueError, match="steps"):
        critical_path(tmp_path / "t", steps=[99])
    with pytest.raises(TypeError, match="steps="):
        critical_path(tmp_path / "t", steps="10")


def test_cli_prints_the_verdict_as_json_and_draws_the_heat_map(tmp_path, capsys):
    from labkit.cli import main

    png = tmp_path / "path.png"
    assert main(["trace", "critical-path", "--example", "synthetic-straggler", "--json", "--plot", str(png)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"] == {"rank": 1, "cause": "compute"}
    assert len(doc["steps"]) == 4 and png.stat().st_size > 1000
    assert main(["trace", "critical-path", "--example", "synthetic-straggler", "--plot", "x.pdf"]) == 2


def test_straggler_by_is_checked():
    from labkit.train import TrainConfig

    with pytest.raises(ValueError, match="straggler_by='disk'"):
        TrainConfig(inject="straggler", straggler_by="disk")
    with pytest.raises(ValueError, match="straggler_by='compute'.*inject='straggler'"):
        TrainConfig(straggler_by="compute")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_live_gloo_jobs_name_the_slow_rank_and_its_cause(tmp_path):
    """One launch of 4 gloo ranks, four jobs: a rank slowed by host code (a sleep outside any op), by
    compute (extra matrix multiplies), by its data loader and by a slow link (its gradient buckets held back
    in its collectives) — each named by the job's verdict."""
    from labkit.train import TrainConfig, run_many

    # 8 profiled steps (one all-reduce each): over the default 3 the verdict's chance test needs a perfect
    # record, and one step of a loaded machine's bad luck hides the slow rank (the tests above)
    fast = dict(model="tiny", seq_len=32, micro_batch=4, steps=10, profile_steps=8, warmup_steps=2, parallel="ddp")
    kinds = {"host": 1, "compute": 2, "data": 3, "link": 0}
    cfgs = [TrainConfig(**fast, inject="straggler", straggler_rank=r, straggler_by=k,
                        profile_dir=str(tmp_path / k)) for k, r in kinds.items()]
    run_many(cfgs, 4, timeout_s=360)
    got = {k: critical_path(tmp_path / k).verdict() for k in kinds}
    assert {k: v[0] for k, v in got.items()} == kinds, got          # the slow rank, every kind
    # the cause: host and data always; compute was once read as 'data' on an idle machine (4 ranks on 2 cores:
    # the compute straggler's extra matmuls delay its next loader call); the link was read as 'compute' once in
    # 60 bench trials (the delay fell outside its all-reduce's span: torch runs a Future.then callback inline,
    # on the training thread, when the future is already done) — benchmarks/bench_critical_path.py measures both
    assert got["host"][1] == "host" and got["data"][1] == "data", got
    assert got["compute"][1] in ("compute", "data") and got["link"][1] in ("comm", "compute"), got
