"""labkit.perf.validate.layouts (chapter 24): what a rank of each layout holds and which collectives one step
issues, on real gloo ranks, against the model's counts and the parameter-split rule."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from labkit.perf.validate.layouts import (
    held_params,
    predicted_collectives,
    probe_layout_state,
    trace_collectives,
)
from labkit.train import TrainConfig, run_many

BASE = TrainConfig(model="tiny", steps=2, warmup_steps=1, peak_flops=1e12, accum=2, micro_batch=2, profile_steps=1)


def test_two_rank_layouts_hold_and_send_what_the_model_counts(tmp_path):
    cfgs = {"tp": BASE.replace(tp=2, profile_dir=str(tmp_path / "tp")),
            "pp": BASE.replace(pp=2, profile_dir=str(tmp_path / "pp"))}
    recs = dict(zip(cfgs, run_many(list(cfgs.values()), 2, timeout_s=240, all_ranks=True, probe=probe_layout_state),
                    strict=True))
    for name, cfg in cfgs.items():
        probes = [r.extra["probe"] for r in recs[name]]
        rule = held_params(cfg)
        assert [p["rank"] for p in probes] == [0, 1]
        assert max(p["n_params"] for p in probes) == rule["blocks split"] < rule["total"]
        for p in probes:       # fp32 AdamW: params, grads, exp_avg, exp_avg_sq (+ one 4-byte step per tensor)
            assert p["params"] == p["grads"] == 4 * p["n_params"]
            assert 2 * p["params"] < p["optimizer"] < 2 * p["params"] + 4 * 64
            assert p["model_states"] == p["params"] + p["grads"] + p["optimizer"]
        counts = trace_collectives(cfg.profile_dir)
        assert sorted(counts) == [0, 1]
        pred = predicted_collectives(cfg)
        for c in counts.values():
            if name == "tp":     # TP only: no DP replicas, so every all-reduce is TP's (blocks' + the vocab ends')
                assert pred["tp_all_reduce"] == 4 * 2 * 2 and pred["tp_vocab_all_reduce"] == 5 * 2
                assert c["all_reduce"] == pred["tp_all_reduce"] + pred["tp_vocab_all_reduce"]
            else:
                assert c["send"] == pred["pp_send"] == 2 and c["recv"] == pred["pp_recv"] == 2
    assert [p["n_params"] for p in (r.extra["probe"] for r in recs["pp"])] == held_params(cfgs["pp"])["stages"]


def test_held_params_rule():
    tiny = held_params(BASE)
    assert tiny["model"] == tiny["blocks split"] == tiny["total"] == 929_280 and tiny["stages"] == [929_280]
    tp = held_params(BASE.replace(tp=2))
    emb, ln_f = 4096 * 128 // 2 + 64 * 128, 2 * 128                  # the tied table split on the vocabulary
    per_block = (3 * 128 * 128 + 3 * 128 + 128 * 128 + 512 * 128 + 512 + 512 * 128) // 2 + 128 + 128 + 4 * 128
    assert tp["blocks split"] == emb + ln_f + 2 * per_block and tp["model"] == 929_280 / 2
    whole = held_params(BASE.replace(tp=2, vocab_parallel=False))   # the older plan: the table on every rank
    assert whole["blocks split"] - tp["blocks split"] == 4096 * 128 // 2
    pp = held_params(BASE.replace(pp=2))
    assert pp["stages"][0] - pp["stages"][1] == 64 * 128 - ln_f       # the first has pos_emb, the last ln_f
    assert sum(pp["stages"]) == 929_280 + 4096 * 128                 # the tied table is held twice


def test_predicted_collectives_and_bad_input(tmp_path):
    assert predicted_collectives(BASE) == {}
    small = TrainConfig(model="small", tp=2, pp=2, accum=4, micro_batch=2)
    assert predicted_collectives(small) == {"tp_all_reduce": 32, "pp_send": 4, "pp_recv": 4,
                                            "tp_vocab_all_reduce_first": 4, "tp_vocab_all_reduce_last": 16}
    assert predicted_collectives(small.replace(vocab_parallel=False)) == {"tp_all_reduce": 32, "pp_send": 4,
                                                                          "pp_recv": 4}
    inter = TrainConfig(model="small", pp=2, accum=4, pp_schedule="interleaved1f1b", virtual_stages=2)
    assert predicted_collectives(inter)["pp_send"] == 8
    with pytest.raises(ValueError, match="sequence_parallel=True"):
        predicted_collectives(BASE.replace(tp=2, sequence_parallel=True))
    with pytest.raises(TypeError, match="TrainConfig"):
        predicted_collectives({"tp": 2})
    with pytest.raises(ValueError, match="no rank"):
        trace_collectives(tmp_path)
    ev = [{"ph": "X", "name": n, "ts": 0, "dur": 1} for n in ("gloo:all_reduce", "nccl:send", "aten::mm",
                                                                "gloo:all_reduce")]
    (tmp_path / "rank1.json").write_text(json.dumps({"traceEvents": ev}))
    assert trace_collectives(tmp_path) == {1: Counter({"all_reduce": 2, "send": 1})}
