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
    assert cases.warnings_markdown(case, keys="ba").index("⚠ (b)") < cases.warnings_markdown(case, keys="ba").index("⚠ (a)")
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
    (lambda: cases.warnings_markdown(BERT, keys="az"), r"keys='az'.*abcde"),
    (lambda: cases.CaseWarning("a", "t", "", "1", "r", "w", "s"), r"CaseWarning.claim"),
])
def test_bad_input_names_the_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ------------------------------------------------- the chapters quote the cases as labkit.cases has them
NOTEBOOKS = sorted((ROOT / "chapters").rglob("*.ipynb"))


def _cells(path: Path):
    """(cell id, cell type, source) of every markdown and code cell of a stored notebook."""
    for c in json.loads(path.read_text())["cells"]:
        if c["cell_type"] in ("markdown", "code"):
            yield c.get("id"), c["cell_type"], "".join(c["source"])


def _num(s: str) -> float:
    return float(s)


def _allowed():
    b, t = BERT, T13
    speedups = {float(b.n), b.measured_speedup, b.speedup_large, 2.0,           # 2.0: backward ≈ 2× forward
                round(b.speedup(True), 2), round(b.speedup(True), 1), round(b.speedup(False), 2),
                round(b.t1_ms / b.large_step_ms, 2)}
    gbs = {t.busbw_across_gb_s, t.busbw_inside_gb_s, round(t.line_rate_gb_s, 3), round(b.implied_link_bw() / 1e9, 1),
           *(round(v / 1e9, 2) for v in cases.LINKS.values()), *(round(v / 1e9, 1) for v in cases.LINKS.values())}
    return speedups, gbs, {t.expected_k, t.measured_k, t.fixed_k}, {round(100 * e) for e in t.stated_efficiency}


# a cell is about BERT-large when it names it or quotes its one-GPU step or 4-GPU compute
BERT_CELL = r"BERT|\b360 ?ms|\bcompute 90 ms"


def case_violations(cells) -> list[str]:
    """Numbers attached to the seed cases in ``cells`` ((where, source) pairs) that labkit.cases does not give."""
    speedups, gbs, ks, pcts = _allowed()
    b = BERT
    bad = []
    for where, text in cells:
        if re.search(BERT_CELL, text):
            for label, pat, want in (("all-reduce", r"(?:all-reduce|comm)\D{0,12}?(\d+(?:\.\d+)?) ?ms", {b.comm_ms}),
                                     ("sync", r"sync\D{0,12}?(\d+(?:\.\d+)?) ?ms", {b.sync_ms}),
                                     ("compute", r"compute\D{0,12}?(\d+(?:\.\d+)?) ?ms", {b.compute_ms})):
                bad += [f"{where}: BERT {label} {v} ms (labkit.cases: {sorted(want)})"
                        for v in re.findall(pat, text) if _num(v) not in want]
            bad += [f"{where}: BERT speedup {v}× (labkit.cases gives {sorted(speedups)})"
                    for v in re.findall(r"(\d+(?:\.\d+)?)×", text) if _num(v) not in speedups]
            bad += [f"{where}: BERT sync/all-reduce of the old rebuild ({m})"
                    for m in re.findall(r"\b(?:65|45) ms\b(?! of serial)", text)]
        if re.search(r"13B", text):
            bad += [f"{where}: 13B rate {v}k (labkit.cases: {sorted(ks)})"
                    for v in re.findall(r"(\d+(?:\.\d+)?)k\b", text) if _num(v) not in ks]
            bad += [f"{where}: 13B efficiency {v}% (the source's: {sorted(pcts)})"
                    for v in re.findall(r"(\d+) ?%", text) if int(v) not in pcts]
        if re.search(BERT_CELL + "|13B", text):
            bad += [f"{where}: {v} GB/s is neither case's figure nor a catalogued link ({sorted(gbs)})"
                    for v in re.findall(r"(\d+(?:\.\d+)?) ?GB/s", text) if _num(v) not in gbs]
    return bad


def test_the_scanner_catches_the_old_rebuild():
    old = [("ch05", "BERT-large: compute 90 ms, comm 65 ms, sync 45 ms → 135 ms = 2.7×"),
           ("ch05", "BERT-large rebuilt: 4 GPUs 2.71× possible"),
           ("ch14", "A 13B model fell from an expected 3.6k to 2.0k tokens/s per GPU (55% efficiency)"),
           ("ch11", "BERT-large over a 16 GB/s link"),
           ("ch05 quiz", "compute 90 ms, comm 65 ms, sync 45 ms. Step time in ms with full overlap?")]
    found = case_violations(old)
    assert any("all-reduce 65" in f for f in found) and any("sync 45" in f for f in found)
    assert any("2.71×" in f for f in found) and any("2.0k" in f for f in found) and any("55%" in f for f in found)
    assert any("16 GB/s" in f for f in found) and any(f.startswith("ch05 quiz") for f in found)
    assert not case_violations([("ok", "BERT-large: all-reduce 120 ms, sync 15 ms → 2.67×; 13B 3.6k → 2.1k, 58%")])


def test_chapters_quote_the_seed_cases_as_labkit_cases_has_them():
    assert NOTEBOOKS, "no stored notebooks found under chapters/"
    cells = [(f"{p.relative_to(ROOT)}#{cid}", src) for p in NOTEBOOKS for cid, _, src in _cells(p)]
    assert case_violations(cells) == []


def test_chapters_that_rebuild_a_case_use_labkit_cases():
    """A chapter that prints a case's numbers or quotes the 13B per-GPU figures builds them from labkit.cases
    and shows the ⚠ records (no private copy of the case)."""
    for p in NOTEBOOKS:
        code = "\n".join(src for _, kind, src in _cells(p) if kind == "code")
        text = "\n".join(src for _, _, src in _cells(p))
        assert "scaling.decompose(t1" not in code and "BERT_LARGE_PARAMS" not in code, p.name
        if re.search(r"BERT", code):
            assert "bert_large()" in code and "warnings_markdown(" in code, p.name
        if "3.6k" in text or re.search(r"13B", code):
            assert "thirteen_b()" in code and "warnings_markdown(" in code, p.name
