"""labkit.perf.validate.pipeline_sim (chapter 24, issue #24): a GPipe or 1F1B step played op by op on fewer cores
than ranks — the schedules' orders, the papers' bubble where every rank owns a core, and what sharing cores does —
and its use by predict_mp_step; the tp-way local shard of a block that prices a TP rank's compute. Arithmetic on
constructed times; one real 1-rank timing (behaviour only)."""
from __future__ import annotations

import pytest

from labkit import flops
from labkit.comm import AlphaBeta
from labkit.perf.validate import model_parallel as mp
from labkit.perf.validate.pipeline_sim import PipelinePlay, play_schedule, rank_ops
from labkit.perf.validate.stage_times import PartTimes, rank_time_shares, shard_block
from labkit.train import TrainConfig

BASE = TrainConfig(model="small", micro_batch=2, accum=4, steps=3, warmup_steps=1, label="small")
AR = AlphaBeta(alpha_s=2e-4, beta_s_per_byte=1e-9, op="all_reduce", nranks=2)
SR = AlphaBeta(alpha_s=3e-4, beta_s_per_byte=2e-9, op="send_recv", nranks=2)


def test_each_rank_runs_its_schedules_order():
    assert rank_ops("gpipe", 1, 2, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    # 1F1B (torch's Schedule1F1B): p − r warm-up forwards, then B/F in turn, then the last backwards
    assert rank_ops("1f1b", 0, 4, 4) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("B", 1), ("B", 2), ("B", 3)]
    assert rank_ops("1f1b", 3, 4, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert rank_ops("1f1b", 2, 4, 6)[:4] == [("F", 0), ("F", 1), ("B", 0), ("F", 2)]
    for r in range(4):
        ops = rank_ops("1f1b", r, 4, 6)
        assert sorted(ops) == sorted([("F", i) for i in range(6)] + [("B", i) for i in range(6)])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p, m", [(2, 1), (2, 4), (4, 4), (4, 8), (3, 5)])
def test_with_a_core_per_rank_the_play_is_the_papers_bubble(schedule, p, m):
    """Equal stages of t: (m + p − 1)·t, i.e. a bubble of (p − 1)/m of the compute (Narayanan et al. 2021 §2.2)."""
    play = play_schedule([0.01] * p, m, schedule=schedule)
    assert play.step_s == pytest.approx((m + p - 1) * 0.01)
    assert play.utilisation == pytest.approx(m / (m + p - 1))


def test_sharing_cores_costs_less_than_every_rank_at_the_time_shared_rate():
    """4 equal stages on 2 cores: the busy ranks' work ÷ the cores bounds it below; the formula at the rate of 4
    busy ranks (half a core each) — what the model priced before — overcounts the fill and drain."""
    p, m, t = 4, 4, 0.01
    play = play_schedule([t] * p, m, cores=2)
    work_bound, all_busy = p * m * t / 2, 2 * (m + p - 1) * t
    assert work_bound <= play.step_s < all_busy
    assert play.step_s == pytest.approx(9 * t)          # worked by hand: fill 1.67t, steady 6t at half speed, drain
    assert play_schedule([t] * 2, m, cores=2).step_s == pytest.approx((m + 1) * t)   # ranks ≤ cores: the formula
    # a stage of tp ranks counts tp times against the cores: TP2×PP2 on 2 cores is 4 busy ranks
    assert play_schedule([t] * 2, m, cores=2, ranks_per_stage=2).step_s > play_schedule([t] * 2, m, cores=4, ranks_per_stage=2).step_s
    heavy = play_schedule([t, t, t, 2 * t], m)                       # the head's stage sets the pace
    assert heavy.step_s == pytest.approx(m * 2 * t + 3 * t) and isinstance(heavy, PipelinePlay)


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="at least 2"):
        play_schedule([0.01], 4)
    with pytest.raises(ValueError, match=r"stage_s\[1\]"):
        play_schedule([0.01, -1.0], 4)
    with pytest.raises(ValueError, match="schedule"):
        play_schedule([0.01, 0.01], 4, schedule="interleaved1f1b")
    with pytest.raises(ValueError, match="cores"):
        play_schedule([0.01, 0.01], 4, cores=0)
    with pytest.raises(ValueError, match="rank=4"):
        rank_ops("1f1b", 4, 4, 2)


def test_predict_mp_step_plays_the_pipeline_on_the_cores_it_is_given():
    rate, parts = 1e10, PartTimes(embed_s=0.002, block_s=0.030, tail_s=0.030, n_layers=4)
    kw = dict(flops_per_s=rate, pp_all_reduce=AR, send_recv=SR, part_times=parts)
    cfg = mp.mp_config(BASE, "pp", 4)
    formula = mp.predict_mp_step(cfg, 4, **kw)
    own = mp.predict_mp_step(cfg, 4, cores=4, **kw)
    assert own.compute_s == pytest.approx(formula.compute_s) and own.pp_s == formula.pp_s
    assert own.step_s == pytest.approx(formula.step_s, rel=0.02)          # a core each: the played step ≈ the formula
    shared = mp.predict_mp_step(cfg, 4, cores=2, **kw)
    assert shared.compute_s == pytest.approx(formula.compute_s / 2)       # a core's speed: the 4-rank rate × 4/2
    assert shared.step_s < formula.step_s and shared.bubble_s > 0
    whole = flops.hardware_flops_per_token(cfg.model_config.shape()) * 2 * 128 / rate
    busy = 4 * sum(rank_time_shares(cfg, parts)) * whole * (2 / 4) / 2    # every rank's m micro-batches at a core's
    #                                                                     speed (the 4-rank rate × 4/2), ÷ 2 cores
    assert shared.compute_s + shared.bubble_s >= busy * (1 - 1e-9)
    measured = mp.predict_mp_step(cfg, 4, cores=2, core_flops_per_s=1.5 * rate, **kw)   # the rate at 2 ranks, measured
    assert measured.compute_s == pytest.approx(formula.compute_s / 1.5)
    assert mp.predict_mp_step(cfg, 4, cores=4, core_flops_per_s=9 * rate, **kw).step_s == own.step_s  # a core each
    tp = mp.predict_mp_step(mp.mp_config(BASE, "tp", 2), 2, flops_per_s=rate, tp_all_reduce=AR, cores=1)
    assert tp.bubble_s == 0                                               # no pipeline: nothing to play


def test_a_tp_rank_computes_its_local_shard_with_the_layernorms_whole():
    import torch

    mc = BASE.model_config
    blk = shard_block(mc, 2)
    assert blk.attn.qkv.out_features == 3 * mc.d_model // 2 and blk.mlp.fc.out_features == mc.ff // 2
    assert blk.ln1.normalized_shape == (mc.d_model,)
    x = torch.randn(1, 8, mc.d_model)
    assert blk(x).shape == x.shape                                        # n_heads/2 heads read from qkv's width
    parts = PartTimes(0.002, 0.030, 0.040, 4, block_tp_s=((2, 0.021),))
    (share,) = rank_time_shares(BASE.replace(tp=2), parts)
    assert share == pytest.approx((4 * 0.021 + 0.002 + 0.040 / 2) / parts.model_s)  # measured shard, not block / 2;
    (four,) = rank_time_shares(BASE.replace(tp=4), parts)           # the vocab-parallel tail / tp. Not measured: block / tp
    assert four == pytest.approx((4 * 0.030 / 4 + 0.002 + 0.040 / 4) / parts.model_s)
    assert "tp=2 local shard 21.0 ms (70% of the block, not 50%)" in parts.format()
    with pytest.raises(ValueError, match="tp=3"):
        shard_block(mc, 3)
