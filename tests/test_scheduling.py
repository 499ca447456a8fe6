"""Chapter 27: the seeded shared-cluster queue (labkit.perf.scheduling) accounts every GPU-hour."""
import pytest

from labkit.perf.scheduling import jobs, simulate


def test_every_gpu_hour_is_accounted_once():
    r = simulate(hours=24, seed=3)
    assert sum(v for _, v, _ in r.table()) == pytest.approx(r.capacity_gpu_h, abs=0.5)
    assert r.capacity_gpu_h == 16 * 8 * 24 and 0 < r.utilisation < 1
    assert 0 <= r.fragmented_gpu_h <= r.idle_waiting_gpu_h


def test_the_stream_is_seeded():
    a, b, c = jobs(1, 24, 5, 32, 2.0), jobs(1, 24, 5, 32, 2.0), jobs(2, 24, 5, 32, 2.0)
    assert [(j.arrival, j.gpus, j.work) for j in a] == [(j.arrival, j.gpus, j.work) for j in b] != \
        [(j.arrival, j.gpus, j.work) for j in c]
    assert {j.gpus for j in a} <= {1, 2, 4, 8, 16, 32}
    assert simulate(hours=12, seed=1) == simulate(hours=12, seed=1)


def test_backfill_fills_what_fifo_leaves_idle():
    """A blocked head of the queue leaves GPUs idle under FIFO; backfill starts smaller jobs on them."""
    fifo, back = simulate(policy="fifo", seed=0), simulate(policy="backfill", seed=0)
    assert back.idle_waiting_gpu_h < 0.7 * fifo.idle_waiting_gpu_h
    assert back.median_wait_h(1) < fifo.median_wait_h(1)


def test_rarer_checkpoints_lose_more_work_to_failures():
    lost = [simulate(policy="backfill", failures_per_job_h=0.1, checkpoint_every_min=c, seed=0).lost_gpu_h
            for c in (10, 240)]
    assert lost[1] > 2 * lost[0]
    assert simulate(failures_per_job_h=0.0, hours=12).lost_gpu_h == 0


@pytest.mark.parametrize("kw, name", [({"policy": "lifo"}, "policy"), ({"max_gpus": 24}, "max_gpus"),
                                      ({"max_gpus": 4096}, "max_gpus"), ({"nodes": 0}, "nodes"),
                                      ({"failures_per_job_h": -1}, "failures_per_job_h"),
                                      ({"checkpoint_every_min": 0}, "checkpoint_every_min")])
def test_bad_input_names_the_value(kw, name):
    with pytest.raises((ValueError, TypeError), match=name):
        simulate(**kw)
