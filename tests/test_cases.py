"""labkit.cases: the two seed cases derive their figures, carry complete ⚠ records, and every chapter that
quotes them agrees with them (a scan of the stored notebooks' sources fails when a chapter drifts again)."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from labkit import cases
from labkit.comm.models import ring_time

ROOT = Path(__file__).resolve().parents[1]
BERT, T13 = cases.bert_large(), cases.thirteen_b()


# ------------------------------------------------------------------------------------------ BERT-large
def test_bert_large_step_and_speedups_come_from_the_parts():
    assert BERT.step_ms(True) == pytest.approx(135)             # max(90, 120) + 15
    assert BERT.step_ms(False) == pytest.approx(225)            # 90 + 120 + 15
    assert round(BERT.speedup(True), 2) == 2.67
    assert BERT.ideal_ms == pytest.approx(90)
    assert BERT.measured_step_ms == pytest.approx(200)          # 360 / 1.8
    assert BERT.overhead_ms == pytest.approx(65)                # 200 − 135
    assert BERT.large_step_ms == pytest.approx(125)             # 200 / 1.6: the 4-GPU baseline
    assert BERT.split_ms() == pytest.approx((30, 60))
    assert BERT.parts.exposed_comm(True) == pytest.approx(0.030)  # 120 − 90 ms still exposed


def test_bert_large_implied_link_round_trips_through_the_ring_model():
    bw = BERT.implied_link_bw()
    t = ring_time("all_reduce", BERT.grad_bytes, BERT.n, alpha=5e-6, beta=1 / bw)
    assert t == pytest.approx(BERT.comm_ms / 1e3)
    assert bw / 1e9 == pytest.approx(17.0, abs=0.1)
    assert BERT.consistent_link() == "PCIe 3.0 x16"
    rows = {r["link"]: r for r in BERT.link_table()}
    assert rows["NVLink V100-SXM2"]["modelled all-reduce ms"] < BERT.comm_ms / 5   # NVLink is far faster
    assert rows["PCIe 3.0 x16"]["line rate GB/s"] == pytest.approx(15.75, abs=0.01)


def test_cases_follow_their_inputs():
    c = replace(BERT, comm_ms=60.0)                  # compute-bound now: the step is 90 + 15
    assert c.step_ms(True) == pytest.approx(105) and c.overhead_ms == pytest.approx(95)
    assert replace(T13, measured_k=1.8).efficiency(1.8) == pytest.approx(0.5)


# ----------------------------------------------------------------------------------------------- 13B
def test_thirteen_b_efficiencies_and_the_coherent_reading():
    assert round(T13.efficiency(T13.measured_k), 2) == 0.58
    assert round(T13.efficiency(T13.fixed_k), 2) == 0.92
    assert T13.coherent_reading().startswith("per GPU")
    per_gpu, as_total, expected_total = T13.readings()
    assert per_gpu["aggregate 64 (k tok/s)"] == pytest.approx(230.4)
    assert per_gpu["aggregate 128 (k tok/s)"] == pytest.approx(268.8)           # the job still got faster
    assert not as_total["matches the source's %"] and expected_total["MFU of the per-GPU rate"] < 0.01
    assert T13.nodes_needed == 16 and T13.line_rate_gb_s == pytest.approx(3.125)
    assert T13.busbw_across_gb_s > T13.line_rate_gb_s
    assert T13.mfu(T13.expected_k) > 0.85                                        # 3.6k needs ≈ 90% MFU


def test_thirteen_b_modelled_view_is_labelled_and_shows_the_collapse():
    m = T13.modelled()
    d64, d128, fix = m.values()
    assert d128.tokens_per_s > d64.tokens_per_s                                  # aggregate grows
    assert d128.tokens_per_s_per_gpu < 0.85 * d64.tokens_per_s_per_gpu           # per GPU it falls
    assert fix.tokens_per_s_per_gpu > 1.2 * d128.tokens_per_s_per_gpu            # the fix recovers
    assert "MODELLED" in cases.ThirteenBCase.modelled.__doc__


# --------------------------------------------------------------------------------------- ⚠ records
@pytest.mark.parametrize("case", [BERT, T13], ids=["bert", "13b"])
def test_every_warning_record_is_complete(case):
    keys = [w.key for w in case.warnings]
    assert keys == sorted(keys) and len(set(keys)) == len(keys) >= 4
    for w in case.warnings:
        for part in ("title", "claim", "arithmetic", "right", "why", "source"):
            assert getattr(w, part).strip(), (w.key, part)
        assert re.search(r"\d", w.arithmetic), w          # arithmetic shows numbers
    md = cases.warnings_markdown(case)
    assert md.count("> **⚠ (") == len(case.warnings) and "*What is right:*" in md
    assert case.sources and all(isinstance(s, str) and s for s in case.sources)


def test_warning_text_is_derived_not_restated():
    md = cases.warnings_markdown(BERT)
    assert "200 − 135 = 65 ms" in md and "max(90, 120) + 15 = 135 ms → 2.67×" in md
    assert "2.1/3.6 = 58%" in cases.warnings_markdown(T13) and "3.2 / 3.125 = 1.024" in cases.warnings_markdown(T13)


@pytest.mark.parametrize("make, match", [
    (lambda: cases.BertLargeCase(comm_ms=-1), r"comm_ms=-1"),
    (lambda: cases.BertLargeCase(n=1), r"n=1"),
    (lambda: cases.ThirteenBCase(expected_k="3.6k"), r"expected_k must be a number"),
    (lambda: cases.ThirteenBCase(stated_efficiency=(0.58, 92)), r"stated_efficiency\[1\]=92"),
    (lambda: BERT.split_ms(0), r"backward_over_forward=0"),
    (lambda: BERT.implied_link_bw(alpha_s=0.1), r"alpha_s=0.1"),
    (lambda: cases.warnings_markdown({"warnings": 1}), r"labkit.cases case"),
    (lambda: cases.CaseWarning("a", "t", "", "1", "r", "w", "s"), r"CaseWarning.claim"),
])
def test_bad_input_names_the_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()
