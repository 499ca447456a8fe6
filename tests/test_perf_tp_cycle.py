"""labkit.perf.validate.tp_cycle (chapter 24, issue #24): TP's own DTensor work calibrated on a synthetic stack of
column/row-parallel Linear pairs — what the calibration launches and how it subtracts; one real 2-rank run of the
synthetic stack (behaviour, no measured figure asserted); validate_mp's use of it with the launches faked."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from labkit import flops
from labkit.comm import AlphaBeta
from labkit.perf.validate import model_parallel as mp
from labkit.perf.validate import tp_cycle


def test_the_calibration_launches_the_gpts_blocks_once_and_takes_the_local_shard_out(monkeypatch):
    """One launch of n ranks; per pair cost = (TP block − local shard block, both run by all ranks) / 2 pairs."""
    from labkit.launcher import parent

    launches = []

    def fake_launch(target, n, *, args=(), **kw):
        launches.append((target, n, args))
        return SimpleNamespace(value=[(3e-3 + 2 * (5e-4 + 3e-9 * b * 128 * 256 * 4), 3e-3) for b in args[1]])

    monkeypatch.setattr(parent, "launch", fake_launch)
    c = tp_cycle.tp_block_cycle(2, "small", (1, 2, 4), iters=4, warmup=1)
    assert [(t, n) for t, n, _ in launches] == [(tp_cycle._block_cells, 2)]
    assert launches[0][2] == ("small", [1, 2, 4], 2, 4, 1, 2)
    assert c.alpha_s == pytest.approx(5e-4) and c.beta_s_per_byte == pytest.approx(3e-9) and c.includes_all_reduces
    assert c.act_bytes == tuple(b * 128 * 256 * 4 for b in (1, 2, 4))
    c4 = tp_cycle.tp_block_cycle(4, "small", (1, 2), tp=2, iters=4, warmup=1)
    assert launches[1][1] == 4 and launches[1][2][-1] == 2 and (c4.nranks, c4.tp) == (4, 2)
    assert "groups of tp=2" in c4.format() and "GPT blocks: all-reduces, DTensor and waits" in c4.format()
    with pytest.raises(ValueError, match="nranks"):
        tp_cycle.tp_block_cycle(1)
    with pytest.raises(ValueError, match="tp=3 must divide nranks=4"):
        tp_cycle.tp_block_cycle(4, tp=3)
    with pytest.raises(ValueError, match="two distinct sizes"):
        tp_cycle.tp_block_cycle(2, micro_batches=(2, 2))
    with pytest.raises(ValueError, match="model"):
        tp_cycle.tp_block_cycle(2, "huge")
    assert len(launches) == 2                                                  # bad requests launch nothing


def test_a_real_calibration_on_the_gpts_blocks_runs_and_fits_a_line():
    """On real gloo ranks (two TP groups of 2 in a world of 4, as TP2×PP2): the trainer's plan on the tiny GPT's
    blocks and their local shards all run, and the fit is finite (no measured value asserted: a loaded machine
    moves it)."""
    c = tp_cycle.tp_block_cycle(4, "tiny", (1, 2), tp=2, iters=2, warmup=1, timeout_s=240)
    assert (c.nranks, c.tp) == (4, 2) and len(c.cost_s) == 2 and c.includes_all_reduces
    assert all(math.isfinite(x) for x in (c.alpha_s, c.beta_s_per_byte, *c.cost_s))
    assert c.overhead_s(4, 2, 4096) >= 0


def _fake_record(cfg, step):
    mc = cfg.model_config
    return SimpleNamespace(step_time=SimpleNamespace(median=step), tokens_per_step=cfg.micro_batch * mc.seq_len * cfg.accum,
                           hardware_flops_per_token=flops.hardware_flops_per_token(mc.shape()), n_devices=1)


def test_validate_mp_calibrates_a_cycle_on_tp_ranks_each_round_and_prices_it(monkeypatch):
    from labkit.perf.validate import fit, runs

    calls = []

    def links(n, ops, **kw):
        calls.append(("links", n))
        return {op: AlphaBeta(alpha_s=1e-4, beta_s_per_byte=1e-9, op=op, nranks=n) for op in ops}

    def cycle(n, model, mbs, tp=None, **kw):
        calls.append(("cycle", tp, n))
        assert (model, mbs) == ("small", [1, 2, 4])                       # bracketing the cells' micro-batch of 2
        return tp_cycle.fit_tp_cycle((1e5, 4e5), (2e-4, 5e-4 * n / 2), n, tp=tp, includes_all_reduces=True)

    def steps_then_rates(cfgs, plain, n, **kw):
        calls.append(("measure", n, tuple(c.label for c in cfgs)))
        return [_fake_record(c, 0.5) for c in cfgs], [2e10]

    monkeypatch.setattr(fit, "fit_gloo_links", links)
    monkeypatch.setattr(tp_cycle, "tp_block_cycle", cycle)
    monkeypatch.setattr(runs, "measure_steps_then_rates", steps_then_rates)
    from labkit.perf.validate import stage_times

    monkeypatch.setattr(stage_times, "measure_part_times", lambda *a, **k: (calls.append(("parts",)),
                        stage_times.PartTimes(0.002, 0.03, 0.04, 4))[1])
    v = mp.validate_mp("small", nranks=(2, 4), micro_batch=2, accum=4, rounds=2)
    assert [c for c in calls if c[0] == "cycle"] == [("cycle", 2, 2), ("cycle", 2, 4), ("cycle", 4, 4)] * 2
    assert calls.count(("parts",)) == 2 and calls[0] == ("parts",)                       # the GPT's parts, every round
    assert calls.index(("cycle", 2, 2)) < calls.index(next(c for c in calls if c[0] == "measure"))
    t = v.table.set_index(["kind", "ranks"])
    want = tp_cycle.fit_tp_cycle((1e5, 4e5), (2e-4, 5e-4), 2).overhead_s(8, 4, 2 * 128 * 256 * 4)
    assert t.loc[("tp", 2), "pred_tpo_ms"] == pytest.approx(want * 1e3) and t.loc[("pp", 2), "pred_tpo_ms"] == 0
    four = tp_cycle.fit_tp_cycle((1e5, 4e5), (2e-4, 1e-3), 4, tp=2).overhead_s(4, 4, 2 * 128 * 256 * 4)
    assert t.loc[("tpxpp", 4), "n_pairs"] == 4 and t.loc[("tpxpp", 4), "pred_tpo_ms"] == pytest.approx(four * 1e3)
    parts = ["pred_compute_ms", "pred_bubble_ms", "pred_tpo_ms", "pred_pp_ms"]          # the α–β is inside the cycle
    assert (t[parts].sum(axis=1) - t["pred_step_ms"]).abs().max() < 1e-9 and (t["pred_tp_ms"] > 0).any()
    text = v.format()
    assert "TP cycle" in text and "TP cycle on 2 ranks" in text and "TP cycle on 4 ranks (groups" in text
    assert "which holds them (not added)" in text
    assert "GPT parts" in text and v.parts.tail_s == 0.04
    assert isinstance(v.table, pd.DataFrame) and set(v.cycles) == {(2, 2), (2, 4), (4, 4)}
