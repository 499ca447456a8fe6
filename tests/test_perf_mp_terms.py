"""The TP and PP terms of the gloo cells (labkit.perf.validate.model_parallel, chapter 24): counts and arithmetic,
no timing. The counts are the ones tests/test_perf_layouts_live.py finds in real gloo traces."""
from __future__ import annotations

import pytest

from labkit import flops
from labkit.comm import AlphaBeta
from labkit.comm.models import ring_time
from labkit.perf.validate import model_parallel as mp
from labkit.perf.validate.layouts import predicted_collectives
from labkit.train import TrainConfig

BASE = TrainConfig(model="small", micro_batch=2, accum=4, steps=3, warmup_steps=1, label="small")
AR2 = AlphaBeta(alpha_s=2e-4, beta_s_per_byte=1e-9, op="all_reduce", nranks=2)
AR4 = AlphaBeta(alpha_s=9e-4, beta_s_per_byte=6e-9, op="all_reduce", nranks=4)
SR = AlphaBeta(alpha_s=3e-4, beta_s_per_byte=2e-9, op="send_recv", nranks=2)
RATE = 1e10


def _head(cfg):
    return 6.0 * cfg.model_config.vocab_size * cfg.model_config.d_model


def test_tp_splits_the_blocks_not_the_head_and_issues_four_all_reduces_per_block():
    cfg = mp.mp_config(BASE, "tp", 2)
    assert (cfg.tp, cfg.pp, cfg.parallel) == (2, 1, "single")
    total = flops.hardware_flops_per_token(cfg.model_config.shape())
    (whole,) = mp.rank_flops_per_token(cfg.replace(vocab_parallel=False))     # the older plan: head on every rank
    assert whole == pytest.approx((total - _head(cfg)) / 2 + _head(cfg))
    (f,) = mp.rank_flops_per_token(cfg)                        # the vocabulary-parallel head: split too
    assert f == pytest.approx(total / 2)
    pr = mp.predict_mp_step(cfg, 2, flops_per_s=RATE, tp_all_reduce=AR2)
    act = 2 * 128 * 256 * 4                                   # b·s·h fp32 bytes
    assert pr.n_tp_all_reduce == predicted_collectives(cfg)["tp_all_reduce"] == 4 * 4 * 4
    assert pr.act_bytes == act and pr.pp_s == pr.bubble_s == 0 and pr.n_pp_sends == 0
    ar = ring_time("all_reduce", act, 2, alpha=2e-4, beta=1e-9)
    ends = 4 * (2 * ar + 3 * ring_time("all_reduce", act // 256, 2, alpha=2e-4, beta=1e-9))   # 5 per micro-batch
    assert pr.tp_s == pytest.approx(64 * ar + ends)
    old = mp.predict_mp_step(cfg.replace(vocab_parallel=False), 2, flops_per_s=RATE, tp_all_reduce=AR2)
    assert old.tp_s == pytest.approx(64 * ar) and old.compute_s > pr.compute_s
    assert pr.compute_s == pytest.approx(4 * f * 2 * 128 / RATE)
    assert pr.step_s == pytest.approx(pr.compute_s + pr.tp_s)
    four = mp.predict_mp_step(mp.mp_config(BASE, "tp", 4), 4, flops_per_s=RATE, tp_all_reduce=AR4)
    assert four.compute_s < pr.compute_s and four.tp_s > pr.tp_s       # less compute per rank, dearer collectives


def test_pp_sends_two_per_micro_batch_and_stage_and_its_bubble():
    cfg = mp.mp_config(BASE, "pp", 2)
    f = mp.rank_flops_per_token(cfg)
    assert f[1] - f[0] == pytest.approx(_head(cfg))             # 2 blocks each; the last stage runs the head
    pr = mp.predict_mp_step(cfg, 2, flops_per_s=RATE, pp_all_reduce=AR2, send_recv=SR)
    want = predicted_collectives(cfg)
    assert pr.n_pp_sends == want["pp_send"] + want["pp_recv"] == 2 * 1 * 4 and pr.n_tp_all_reduce == 0
    t = [x * 2 * 128 / RATE for x in f]
    assert pr.compute_s == pytest.approx(4 * t[1]) and pr.bubble_s == pytest.approx(t[0])
    tied = ring_time("all_reduce", 4096 * 256 * 4, 2, alpha=2e-4, beta=1e-9)
    assert pr.pp_s == pytest.approx(8 * ring_time("send_recv", pr.act_bytes, 2, alpha=3e-4, beta=2e-9) + tied)


@pytest.mark.parametrize("p, v, m", [(4, 1, 4), (2, 1, 8), (2, 2, 4)])
def test_equal_stages_give_the_papers_bubble(monkeypatch, p, v, m):
    """(p−1)/(v·m) of compute (Narayanan et al. 2021 §2.2) when every rank does the same work."""
    monkeypatch.setattr(mp, "rank_flops_per_token", lambda cfg: [1e6] * cfg.pp)
    cfg = BASE.replace(pp=p, accum=m, virtual_stages=v, pp_schedule="interleaved1f1b" if v > 1 else "1f1b")
    pr = mp.predict_mp_step(cfg, p, flops_per_s=RATE, pp_all_reduce=AR2, send_recv=SR)
    assert pr.bubble_fraction == pytest.approx((p - 1) / (v * m))
    assert pr.n_pp_sends == 2 * v * m


def test_tp_by_pp_counts_the_blocks_of_one_stage():
    cfg = mp.mp_config(BASE, "tpxpp", 4)
    pr = mp.predict_mp_step(cfg, 4, flops_per_s=RATE, tp_all_reduce=AR2, pp_all_reduce=AR2, send_recv=SR)
    assert pr.kind == "tpxpp" and pr.n_tp_all_reduce == predicted_collectives(cfg)["tp_all_reduce"] == 4 * 2 * 4
    assert pr.n_pp_sends == 8 and pr.tp_s > 0 and pr.pp_s > 0 and pr.bubble_s > 0
    assert set(pr.as_dict()) >= {"compute_s", "bubble_s", "tp_s", "pp_s", "step_s"}


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="tpxpp.*nranks must be 4"):
        mp.mp_config(BASE, "tpxpp", 2)
    with pytest.raises(ValueError, match="kind"):
        mp.mp_config(BASE, "ep", 2)
    with pytest.raises(ValueError, match="nranks"):
        mp.mp_config(BASE, "tp", 1)
    with pytest.raises(ValueError, match="must equal nranks=4"):
        mp.predict_mp_step(mp.mp_config(BASE, "tp", 2), 4, flops_per_s=RATE, tp_all_reduce=AR2)
    with pytest.raises(ValueError, match="sequence_parallel"):
        mp.predict_mp_step(mp.mp_config(BASE, "tp", 2).replace(sequence_parallel=True), 2, flops_per_s=RATE,
                           tp_all_reduce=AR2)
    with pytest.raises(ValueError, match="all_reduce link"):
        mp.predict_mp_step(mp.mp_config(BASE, "tp", 2), 2, flops_per_s=RATE)
    with pytest.raises(ValueError, match="flops_per_s"):
        mp.predict_mp_step(mp.mp_config(BASE, "tp", 2), 2, flops_per_s=-1.0, tp_all_reduce=AR2)
    with pytest.raises(TypeError, match="TrainConfig"):
        mp.predict_mp_step({"tp": 2}, 2, flops_per_s=RATE)
    with pytest.raises(ValueError, match="no cell"):
        mp.validate_mp("small", ["tpxpp"], [2])


# ------------------------------------------------------------------ TP's own DTensor work (labkit.perf.validate.tp_cycle)
def test_tp_cycle_fit_recovers_a_line_from_constructed_costs():
    from labkit.perf.validate.tp_cycle import fit_tp_cycle

    sizes = [65536, 262144, 1048576]
    c = fit_tp_cycle(sizes, [3e-4 + 2e-10 * b for b in sizes], 2)
    assert (c.alpha_s, c.beta_s_per_byte) == (pytest.approx(3e-4), pytest.approx(2e-10))
    assert c.cost(1e5) == pytest.approx(3e-4 + 2e-5)
    assert "300 us + 0.200 ns/B per pair and micro-batch" in c.format() and "66 kB" in c.format()
    noisy = fit_tp_cycle(sizes, [3e-4 + 2e-10 * b + e for b, e in zip(sizes, (2e-5, -3e-5, 1e-5), strict=True)], 2)
    assert noisy.alpha_s == pytest.approx(3e-4, abs=4e-5) and noisy.beta_s_per_byte == pytest.approx(2e-10, rel=0.2)
    assert fit_tp_cycle(sizes, [-1e-3, -1e-3, -1e-3], 2).cost(1e5) == 0.0          # a negative fit is clamped


def test_tp_cycle_prices_pairs_times_micro_batches():
    from labkit.perf.validate.tp_cycle import TPCycle

    c = TPCycle(nranks=2, alpha_s=1e-4, beta_s_per_byte=1e-9, act_bytes=(1.0, 2.0), cost_s=(0.0, 0.0))
    assert c.overhead_s(8, 4, 1e5) == pytest.approx(8 * 4 * (1e-4 + 1e-4))
    assert c.overhead_s(0, 4, 1e5) == 0.0
    with pytest.raises(ValueError, match="micro_batches"):
        c.overhead_s(8, 0, 1e5)


def test_the_tp_dtensor_term_is_pairs_times_the_cycle_beside_the_all_reduces():
    from labkit.perf.validate.tp_cycle import TPCycle

    cyc = TPCycle(nranks=2, alpha_s=1e-4, beta_s_per_byte=1e-9, act_bytes=(1.0, 2.0), cost_s=(0.0, 0.0))
    cfg = mp.mp_config(BASE, "tp", 2)
    bare = mp.predict_mp_step(cfg, 2, flops_per_s=RATE, tp_all_reduce=AR2)
    pr = mp.predict_mp_step(cfg, 2, flops_per_s=RATE, tp_all_reduce=AR2, tp_cycle=cyc)
    assert bare.tp_overhead_s == 0 and pr.n_tp_pairs == 2 * 4 and pr.n_tp_all_reduce == 2 * pr.n_tp_pairs * 4
    assert pr.tp_overhead_s == pytest.approx(8 * 4 * (1e-4 + 1e-9 * pr.act_bytes))
    assert pr.tp_s == bare.tp_s and pr.step_s == pytest.approx(bare.step_s + pr.tp_overhead_s)
    assert pr.as_dict()["tp_overhead_s"] == pr.tp_overhead_s
    held = TPCycle(nranks=2, alpha_s=1e-4, beta_s_per_byte=1e-9, act_bytes=(1.0, 2.0), cost_s=(0.0, 0.0),
                   includes_all_reduces=True)                               # measured on the GPT's blocks
    inside = mp.predict_mp_step(cfg, 2, flops_per_s=RATE, tp_all_reduce=AR2, tp_cycle=held)
    assert inside.tp_in_cycle and inside.tp_s == bare.tp_s                   # shown ...
    assert inside.step_s == pytest.approx(bare.compute_s + inside.tp_overhead_s)   # ... not added
    txp = mp.predict_mp_step(mp.mp_config(BASE, "tpxpp", 4), 4, flops_per_s=RATE, tp_all_reduce=AR2, pp_all_reduce=AR2,
                             send_recv=SR, tp_cycle=cyc)
    assert txp.n_tp_pairs == 2 * 2                                          # one stage's 2 blocks
    pp = mp.predict_mp_step(mp.mp_config(BASE, "pp", 2), 2, flops_per_s=RATE, pp_all_reduce=AR2, send_recv=SR,
                            tp_cycle=cyc)
    assert pp.tp_overhead_s == 0 and pp.n_tp_pairs == 0                     # no TP, no DTensor work
    with pytest.raises(TypeError, match="TPCycle"):
        mp.predict_mp_step(cfg, 2, flops_per_s=RATE, tp_all_reduce=AR2, tp_cycle=AR2)


def test_tp_cycle_refuses_bad_input_by_name():
    from labkit.perf.validate.tp_cycle import fit_tp_cycle, tp_block_cycle

    with pytest.raises(ValueError, match="two distinct sizes"):
        fit_tp_cycle([1e5, 1e5], [1e-4, 2e-4], 2)
    with pytest.raises(ValueError, match="act_bytes"):
        fit_tp_cycle([-1, 1e5], [1e-4, 2e-4], 2)
    with pytest.raises(ValueError, match="nranks"):
        fit_tp_cycle([1e4, 1e5], [1e-4, 2e-4], 1)
    with pytest.raises(ValueError, match="two distinct sizes"):
        tp_block_cycle(2, micro_batches=(64, 64))
    with pytest.raises(ValueError, match="tp=3 must divide n_heads"):
        tp_block_cycle(3, "tiny")                                         # refused before any rank starts
