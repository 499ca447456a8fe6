"""Live collective benchmark on gloo ranks (labkit.comm.bench) and the α–β fit on it."""
from __future__ import annotations

import numpy as np
import pytest

from labkit import comm
from labkit.comm import bench as cb


def test_benchmark_table_and_fit_on_two_gloo_ranks():
    sizes = [4096, 65536, 262144, 1048576, 2097152]
    res = comm.benchmark(["all_reduce", "reduce_scatter"], sizes, nprocs=2, iters=40, warmup=2)
    assert res.backend == "gloo" and res.nranks == 2
    ar = res.for_op("all_reduce")
    assert list(ar["size"]) == sizes and (ar["time_us"] > 0).all()
    # busbw = algbw * 2(n-1)/n = algbw on 2 ranks; reduce_scatter's factor is (n-1)/n
    assert np.allclose(ar["busbw"], ar["algbw"])
    rs = res.for_op("reduce_scatter")
    assert np.allclose(rs["busbw"], rs["algbw"] / 2)
    assert any("no native reduce-scatter" in n for n in res.notes)
    text = res.format()
    assert "# all_reduce" in text and "busbw" in text and "no native reduce-scatter" in text
    # fit on all but one size, predict the held-out one. Honest tolerance on a shared 2-core machine
    # (other tests run in parallel): the prediction must fall inside the held-out size's own measured
    # p10-p90 band, widened by half. The fit is on each size's p10 (load only lengthens a call; chapter 11
    # fits the same way) over 40 calls: a size's 9 calls last ~7 ms, one scheduler slice, so a burst of load
    # moved whole medians several-fold (beside two busy loops the 4 KiB median read 3.0 ms, its p10 0.3-0.6) and the
    # median fit once left the band. benchmarks/bench_alpha_beta.py reports the plain relative error (goal: 25%).
    held = 3
    keep = [i for i in range(len(sizes)) if i != held]
    fit = comm.fit_alpha_beta(ar["size"].iloc[keep], ar["p10_us"].iloc[keep] * 1e-6, "all_reduce", 2)
    pred_us = fit.predict(sizes[held]) * 1e6
    lo, hi = ar["p10_us"].iloc[held], ar["p90_us"].iloc[held]
    assert fit.beta_s_per_byte > 0
    assert 0.5 * lo <= pred_us <= 1.5 * hi, (pred_us, lo, hi, fit.summary())


class _FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 0.001          # every clock read advances 1 ms: each timed op "takes" 1 ms
        return self.t


def test_timing_loop_with_fake_clock_and_sync(tmp_path):
    """bench_rank in-process on a 1-rank gloo group: the injected clock and device sync are used
    around every timed iteration (the CUDA path differs only by the sync function)."""
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        syncs = []
        raw = cb.bench_rank(["all_reduce", "all_gather"], [1024, 4096], iters=4, warmup=1,
                            clock=_FakeClock(), sync=lambda: syncs.append(1))
    finally:
        dist.destroy_process_group()
    assert [(r["op"], r["size"]) for r in raw] == [("all_reduce", 1024), ("all_reduce", 4096),
                                                   ("all_gather", 1024), ("all_gather", 4096)]
    assert all(r["times_s"] == pytest.approx([0.001] * 4) for r in raw)
    assert len(syncs) == 2 * (1 + 2 * 2 * 4)     # per op: after warm-up, then before+after each timed op
    table = comm.results_to_table(raw)
    assert table["time_us"].tolist() == pytest.approx([1000.0] * 4)


def test_sync_calls_cuda_only_for_cuda_devices(monkeypatch):
    calls = []
    monkeypatch.setattr("torch.cuda.synchronize", lambda dev=None: calls.append(dev))
    cb._sync(type("D", (), {"type": "cuda"})())
    assert len(calls) == 1
    cb._sync(type("D", (), {"type": "cpu"})())
    assert len(calls) == 1


def test_results_table_from_raw_records():
    raw = [{"op": "all_gather", "size": 8 * 2**20, "count": 2 * 2**20, "type": "float", "redop": "none", "root": -1,
            "times_s": [0.010, 0.011, 0.012, 0.009, 0.010], "nranks": 4, "backend": "gloo"}]
    t = comm.results_to_table(raw).iloc[0]
    assert t["time_us"] == pytest.approx(10000)
    assert t["algbw"] == pytest.approx(8 * 2**20 / 0.010 / 1e9)
    assert t["busbw"] == pytest.approx(t["algbw"] * 3 / 4)


def test_benchmark_bad_input():
    with pytest.raises(ValueError, match="nprocs=0"):
        comm.benchmark(nprocs=0)
    with pytest.raises(ValueError, match="sizes="):
        comm.benchmark(sizes=[0])
    with pytest.raises(ValueError, match="not a known collective"):
        comm.benchmark(["gather_all"])
    with pytest.raises(ValueError, match="min_bytes"):
        comm.default_sizes(0, 10)
