"""labkit.perf.validate.stage_times (chapter 24, issue #24): each pipeline/TP rank's share of a GPT's forward +
backward by the measured times of its parts, not its FLOPs — arithmetic on constructed times, and one real 1-rank
measurement (behaviour only: no measured figure asserted)."""
from __future__ import annotations

import math

import pytest

from labkit import flops
from labkit.comm import AlphaBeta
from labkit.perf.validate import model_parallel as mp
from labkit.perf.validate.stage_times import PartTimes, measure_part_times, rank_time_shares
from labkit.train import TrainConfig

BASE = TrainConfig(model="small", micro_batch=2, accum=4, steps=3, warmup_steps=1, label="small")
PARTS = PartTimes(embed_s=0.002, block_s=0.030, tail_s=0.040, n_layers=4)      # t_model = 0.162 s
AR2 = AlphaBeta(alpha_s=2e-4, beta_s_per_byte=1e-9, op="all_reduce", nranks=2)
SR = AlphaBeta(alpha_s=3e-4, beta_s_per_byte=2e-9, op="send_recv", nranks=2)


def test_shares_follow_the_trainers_cut():
    assert PARTS.model_s == pytest.approx(0.162)
    pp2 = rank_time_shares(BASE.replace(pp=2), PARTS)
    assert pp2 == pytest.approx([(2 * 0.030 + 0.002) / 0.162, (2 * 0.030 + 0.040) / 0.162]) and sum(pp2) == pytest.approx(1)
    pp4 = rank_time_shares(BASE.replace(pp=4), PARTS)
    assert pp4 == pytest.approx([0.032 / 0.162, 0.030 / 0.162, 0.030 / 0.162, 0.070 / 0.162])
    (tp2,) = rank_time_shares(BASE.replace(tp=2), PARTS)          # blocks and the vocab-parallel tail halved
    assert tp2 == pytest.approx((4 * 0.030 / 2 + 0.002 + 0.040 / 2) / 0.162)
    (whole,) = rank_time_shares(BASE.replace(tp=2, vocab_parallel=False), PARTS)    # the head whole on each rank
    assert whole == pytest.approx((4 * 0.030 / 2 + 0.002 + 0.040) / 0.162)
    v2 = rank_time_shares(BASE.replace(pp=2, virtual_stages=2, pp_schedule="interleaved1f1b"), PARTS)
    assert v2 == pytest.approx([(0.060 + 0.002) / 0.162, (0.060 + 0.040) / 0.162])   # stages 0,2 and 1,3
    assert "tail (norm, head, loss) 40.0 ms" in PARTS.format() and "25% of the time" in PARTS.format()


def test_predict_mp_step_divides_the_rated_model_by_the_measured_shares():
    rate = 1e10
    cfg = mp.mp_config(BASE, "pp", 2)
    whole = flops.hardware_flops_per_token(cfg.model_config.shape()) * 2 * 128 / rate
    pr = mp.predict_mp_step(cfg, 2, flops_per_s=rate, pp_all_reduce=AR2, send_recv=SR, part_times=PARTS)
    s0, s1 = rank_time_shares(cfg, PARTS)
    assert pr.compute_s == pytest.approx(4 * s1 * whole) and pr.bubble_s == pytest.approx(s0 * whole)
    by_flops = mp.predict_mp_step(cfg, 2, flops_per_s=rate, pp_all_reduce=AR2, send_recv=SR)
    assert by_flops.compute_s + by_flops.bubble_s == pytest.approx(whole * 4 * max(mp.rank_flops_per_token(cfg))
                                                                 / sum(mp.rank_flops_per_token(cfg)) + by_flops.bubble_s)
    assert pr.pp_s == by_flops.pp_s                                        # only compute and bubble move
    with pytest.raises(ValueError, match="n_layers=4"):
        mp.predict_mp_step(cfg, 2, flops_per_s=rate, pp_all_reduce=AR2, send_recv=SR,
                           part_times=PartTimes(0.001, 0.01, 0.01, n_layers=2))
    with pytest.raises(TypeError, match="PartTimes"):
        rank_time_shares(cfg, {"embed_s": 1})


def test_a_real_part_timing_runs_on_one_rank():
    p = measure_part_times("tiny", 1, iters=2, warmup=1, timeout_s=240)
    assert p.n_layers == 2 and all(math.isfinite(x) and x > 0 for x in (p.embed_s, p.block_s, p.tail_s))
    assert sum(rank_time_shares(TrainConfig(model="tiny", pp=2, accum=2), p)) == pytest.approx(1)
    with pytest.raises(ValueError, match="model"):
        measure_part_times("huge")
