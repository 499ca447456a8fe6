"""Sweeps, recommendations and the largest-micro-batch search (labkit.tuning.sweep)."""
from __future__ import annotations

import pandas as pd
import pytest

from labkit.record import RunRecord, Stat
from labkit.train import TrainConfig
from labkit.tuning import sweep as tune


def test_search_doubles_then_bisects():
    best, probes = tune.search_largest(lambda n: n <= 37, limit=1000)
    assert best == 37
    assert [n for n, _ in probes[:7]] == [1, 2, 4, 8, 16, 32, 64]
    assert len(probes) <= 7 + 6          # doubling, then log2(32) bisection steps
    assert tune.search_largest(lambda n: False)[0] == 0
    assert tune.search_largest(lambda n: True, limit=50)[0] == 50
    with pytest.raises(ValueError, match="start"):
        tune.search_largest(lambda n: True, start=0)


def test_largest_micro_batch_model_and_measured_on_cpu():
    from labkit.train import TrainConfig

    cfg = TrainConfig(model="tiny", parallel="single", device="cpu")
    budget = 64 * 2**20
    mb = tune.largest_micro_batch(cfg, memory_budget_bytes=budget)
    assert mb >= 1
    assert tune.predicted_bytes(cfg, mb) <= budget < tune.predicted_bytes(cfg, mb + 1)
    # checkpointing frees activations -> a larger micro-batch fits the same budget
    from dataclasses import replace

    assert tune.largest_micro_batch(replace(cfg, checkpoint=True), memory_budget_bytes=budget) > mb
    measured = tune.largest_micro_batch(cfg, memory_budget_bytes=budget / 2, method="measure", max_micro_batch=64)
    assert measured >= 1
    with pytest.raises(ValueError, match="memory_budget_bytes is needed on CPU"):
        tune.largest_micro_batch(cfg)
    with pytest.raises(ValueError, match="method='guess'"):
        tune.largest_micro_batch(cfg, memory_budget_bytes=1, method="guess")


def _rec(ms, spread=0.02, tps=None, loss=1.0):
    return RunRecord(step_time=Stat(median=ms / 1e3, p10=ms * (1 - spread) / 1e3, p90=ms * (1 + spread) / 1e3, n=5),
                     tokens_per_s=tps or 1e6 / ms, mfu=0.1, peak_memory_bytes=2**28, loss=[loss])


def test_sweep_with_injected_runner_recommends_with_reasons():
    from labkit.comm import AlphaBeta
    from labkit.train import TrainConfig

    times = {1.0: 30.0, 25.0: 20.0, 100.0: 20.2}
    runner = lambda cfg, n: _rec(times[cfg.bucket_cap_mb])
    ab = AlphaBeta(alpha_s=2e-4, beta_s_per_byte=1e-9, op="all_reduce", nranks=2)
    res = tune.sweep(TrainConfig(parallel="ddp"), {"bucket_cap_mb": [1.0, 25.0, 100.0]}, nprocs=2,
                     progress=False, runner=runner, alpha_beta=ab)
    assert list(res.table["bucket_cap_mb"]) == [1.0, 25.0, 100.0]
    assert res.best["bucket_cap_mb"] == 25.0
    assert "tokens/s +50.0% vs the baseline (bucket_cap_mb=1.0) — outside the p10–p90 spread" in res.recommendation
    assert "spreads overlap: treat as noise" in res.recommendation   # 25 vs 100 MB: 1% apart, within noise
    assert (res.table["comm_share_est"] > 0).all()
    # fewer buckets -> fewer latency terms -> a smaller estimated communication time
    assert res.table["comm_share_est"].iloc[0] * 30 > res.table["comm_share_est"].iloc[1] * 20


def test_recommend_prefers_less_memory_when_within_noise():
    t = pd.DataFrame([
        {"config": "a", "tokens_per_s": 100.0, "p10_ms": 9.0, "p90_ms": 11.0, "step_ms": 10.0,
         "model_state_MiB": 10.0, "fits": True},
        {"config": "b", "tokens_per_s": 101.0, "p10_ms": 8.9, "p90_ms": 10.9, "step_ms": 9.9,
         "model_state_MiB": 5.0, "fits": True},
        {"config": "c", "tokens_per_s": 150.0, "p10_ms": 6.0, "p90_ms": 7.0, "step_ms": 6.5,
         "model_state_MiB": 50.0, "fits": False}])
    text, best = tune.recommend(t)
    assert best["config"] == "b"
    assert "exceed the memory budget" in text


def test_grid_points_and_bad_knobs():
    from labkit.train import TrainConfig

    pts = tune._points({("micro_batch", "accum"): tune.fixed_batch_pairs(8, [8, 4, 2]), "checkpoint": [False, True]})
    assert len(pts) == 6 and pts[0] == {"micro_batch": 8, "accum": 1, "checkpoint": False}
    with pytest.raises(ValueError, match="not fields of TrainConfig"):
        tune.sweep(TrainConfig(), {"bucket_size": [1]}, runner=lambda c, n: None)
    with pytest.raises(ValueError, match="do not divide"):
        tune.fixed_batch_pairs(8, [3])
    with pytest.raises(ValueError, match="sharding_strategy='HALF'"):
        TrainConfig(parallel="fsdp1", sharding_strategy="HALF")


@pytest.mark.slow   # 2 launches: ~10 s on an idle 2-core machine, > 20 s under parallel load
def test_fsdp1_sweep_on_two_gloo_ranks():
    """A real sweep: FSDP1 FULL_SHARD vs SHARD_GRAD_OP on 2 gloo ranks (device_id=cpu), table + advice."""
    base = TrainConfig(parallel="fsdp1", steps=3, warmup_steps=1, micro_batch=2, peak_flops=1e11)
    res = tune.sweep(base, {"sharding_strategy": ["FULL_SHARD", "SHARD_GRAD_OP"]}, nprocs=2, progress=False)
    t = res.table
    assert list(t["sharding_strategy"]) == ["FULL_SHARD", "SHARD_GRAD_OP"]
    assert (t["tokens_per_s"] > 0).all() and (t["step_ms"] > 0).all()
    # SHARD_GRAD_OP keeps full parameters: more model state per rank than FULL_SHARD
    assert t["model_state_MiB"].iloc[1] > t["model_state_MiB"].iloc[0]
    assert t["final_loss"].notna().all()
    assert res.recommendation.startswith("Recommendation: sharding_strategy=")
    assert "sharding_strategy" in res.format()


def test_tune_cli(capsys):
    from labkit.cli import main
    from labkit.cli.tune import parse_grid

    assert parse_grid(["bucket_cap_mb=1,25", "micro_batch:accum=8:1,4:2", "mp_policy=none,bf16"]) == {
        "bucket_cap_mb": [1, 25], ("micro_batch", "accum"): [(8, 1), (4, 2)], "mp_policy": [None, "bf16"]}
    assert main(["tune", "--largest-micro-batch", "--model", "tiny", "--parallel", "single",
                 "--budget-gib", "0.05"]) == 0
    assert "largest micro-batch" in capsys.readouterr().out
    assert main(["tune"]) == 2


def test_find_micro_batch_reports_every_probe():
    """The search's probes carry their bytes: the model's are predicted_bytes; the measured ones are model states
    + saved activations and grow with the micro-batch; the answer is the largest probe that fits (chapter 15)."""
    cfg = TrainConfig(model="tiny", parallel="single", device="cpu", seq_len=32)
    budget = 40 * 2**20
    model = tune.find_micro_batch(cfg, memory_budget_bytes=budget, max_micro_batch=256)
    assert model.best == tune.largest_micro_batch(cfg, memory_budget_bytes=budget, max_micro_batch=256)
    assert [m for m, _, _ in model.probes[:3]] == [1, 2, 4]
    assert all(b == tune.predicted_bytes(cfg, m) and ok == (b <= budget) for m, b, ok in model.probes)
    assert model.best == max(m for m, _, ok in model.probes if ok)
    meas = tune.find_micro_batch(cfg, memory_budget_bytes=budget, method="measure", max_micro_batch=256)
    by = dict((m, b) for m, b, _ in meas.probes)
    assert meas.best >= 1 and by[meas.best] <= budget < by[meas.best + 1]
    assert by[4] > by[2] > by[1]
    assert list(meas.table().columns) == ["micro_batch", "MiB", "fits"]
    # the run's seq_len counts: twice the tokens per sequence, more bytes per micro-batch
    assert tune.predicted_bytes(cfg.replace(seq_len=64), 4) > tune.predicted_bytes(cfg, 4)


def test_ab_micro_batch_runs_the_loop_interleaved():
    res = tune.ab_micro_batch(TrainConfig(model="tiny", seq_len=8), a=(4, 1), b=(1, 4), rounds=3)
    assert res.clock == "cpu" and len(res.a) == len(res.b) == len(res.a2) == 3
    assert res.ratio > 0 and res.labels == ("A: 4 × accum 1", "B: 1 × accum 4")
    with pytest.raises(ValueError, match="same sequences per step"):
        tune.ab_micro_batch(TrainConfig(model="tiny"), a=(4, 1), b=(2, 1))


def test_step_gemm_shapes_are_the_6N_matmuls_of_the_linear_layers():
    import torch

    from labkit.tuning.sweep import step_gemm_shapes
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    shapes = step_gemm_shapes(model, 10)
    assert len(shapes) == 6
    weights = 8 * 32 + 32 * 4
    assert sum(2 * m * n * k for m, n, k in shapes) == 6 * 10 * weights      # 3 GEMMs of 2·T·k·n per layer
    with pytest.raises(ValueError, match="no nn.Linear"):
        step_gemm_shapes(torch.nn.ReLU(), 10)
    with pytest.raises(ValueError, match="tokens"):
        step_gemm_shapes(model, 0)


def test_ab_gemms_refuses_splits_of_different_batches():
    from labkit.train import TrainConfig
    from labkit.tuning.sweep import ab_gemms
    with pytest.raises(ValueError, match="same sequences"):
        ab_gemms(TrainConfig(model="tiny", seq_len=16, device="cpu"), a=(16, 1), b=(4, 2))
