"""labkit.teaching.cases: the two seed cases derive their figures, carry complete ⚠ records, and every chapter that
quotes them agrees with them (a scan of the stored notebooks' sources fails when a chapter drifts again)."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from labkit.comm.models import ring_time
from labkit.teaching import cases

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
    assert BERT.split_ms() == pytest.approx((30, 60))
    assert BERT.parts.exposed_comm(True) == pytest.approx(0.030)  # 120 − 90 ms still exposed


def test_bert_large_named_overheads_give_2_23_not_1_8():
    """The source's overheads: data 20 ms/step, a 150 ms checkpoint every 100 steps, logging 5 ms/step."""
    assert BERT.overhead_parts == pytest.approx({"data loading": 20, "checkpointing": 1.5, "logging": 5})
    assert BERT.named_overhead_ms == pytest.approx(26.5)
    assert BERT.named_step_ms == pytest.approx(161.5)
    assert round(BERT.named_speedup, 2) == 2.23 and BERT.named_speedup > BERT.measured_speedup
    assert BERT.unexplained_ms == pytest.approx(38.5)           # of the 65 ms the 1.8× needs
    md = cases.warnings_markdown(BERT, "a")
    assert "20 + 150/100 + 5 = 20 + 1.5 + 5 = 26.5 ms" in md and "360/161.5 = 2.23×" in md
    assert "65 − 26.5 = 38.5 ms" in md


def test_bert_large_8_gpu_figure_is_a_speedup_over_one_gpu():
    assert BERT.large_step_ms == pytest.approx(225)             # max(360/8, 210) + 15
    assert BERT.large_speedup == pytest.approx(BERT.speedup_large) == pytest.approx(360 / 225)
    assert BERT.large_step_ms > BERT.step_ms(True)              # 8 GPUs slower than 4 at a fixed batch
    assert BERT.weak_t1_ms == pytest.approx(720) and BERT.weak_large_speedup == pytest.approx(3.2)
    assert BERT.ring_comm_ms(BERT.n) == pytest.approx(BERT.comm_ms)          # the model reproduces 4 ranks
    assert BERT.ring_comm_ms(8) == pytest.approx(140, abs=0.5)               # 120 × 1.75 / 1.5
    assert BERT.comm_large_ms / BERT.ring_comm_ms(8) == pytest.approx(1.5, abs=0.01)
    md = cases.warnings_markdown(BERT, "b")
    assert "360/225 = 1.60× over one GPU" in md and "720/225 = 3.20×" in md and "210/140 = 1.50×" in md
    assert "tree depth" in md and "2.88" not in md and "125 ms" not in md   # the invented reading is gone


def test_bert_large_link_needs_17_gb_s_against_pcie3s_15_75():
    bw = BERT.implied_link_bw()
    t = ring_time("all_reduce", BERT.grad_bytes, BERT.n, alpha=5e-6, beta=1 / bw)
    assert t == pytest.approx(BERT.comm_ms / 1e3)
    assert BERT.ring_bytes_per_rank / 1e9 == pytest.approx(2.04)            # 1.5 × 1.36 GB
    assert round(bw / 1e9, 1) == 17.0
    rows = {r["link"]: r for r in BERT.link_table()}
    p3, p4 = rows["PCIe 3.0 x16"], rows["PCIe 4.0 x16"]
    assert round(p3["line rate GB/s"], 2) == 15.75 and round(p3["needed / line rate"], 2) == 1.08
    assert p3["at 80% of it (ms)"] == pytest.approx(162, abs=1)             # ≈ 160 ms at a realistic share
    assert round(p4["needed / line rate"], 2) == 0.54
    assert BERT.consistent_link() == "PCIe 4.0 x16"                         # the "4×A100" label
    assert rows["NVLink V100-SXM2"]["all-reduce at line rate (ms)"] < BERT.comm_ms / 5
    md = cases.warnings_markdown(BERT, "d")
    assert "17.0 GB/s, 108% of PCIe 3.0 x16's 15.75 GB/s line rate" in md and "54% of PCIe 4.0" in md
    assert "p3.8xlarge (V100 16GB x4, PCIe)" in md and "https://aws.amazon.com/ec2/instance-types/p3/" in md
    assert "NVLink-connected" in md and "65%" in md


def test_cases_follow_their_inputs():
    c = replace(BERT, comm_ms=60.0)                  # compute-bound now: the step is 90 + 15
    assert c.step_ms(True) == pytest.approx(105) and c.overhead_ms == pytest.approx(95)
    assert replace(BERT, checkpoint_every=10).named_overhead_ms == pytest.approx(40)     # 20 + 15 + 5
    assert replace(T13, base_k=2.1).efficiency(2.1) == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------------- 13B
def test_thirteen_b_carries_1_8k_per_gpu_on_64_with_its_citation():
    assert (T13.base_k, T13.gpus_before, T13.gpus_after) == (1.8, 64, 128)
    assert any("source" in s for s in T13.sources) and "labkit/cases" in T13.sources[0]
    assert round(T13.mfu(T13.base_k), 2) == 0.45 and T13.peak_flops == pytest.approx(312e12)


def test_thirteen_b_reading_table_reproduces_58_and_92_only_under_the_coherent_reading():
    as_labelled, aggregate, coherent = T13.readings()
    for r in (as_labelled, aggregate):
        assert not r["reproduces 58% / 92%"] and not r["expected = linear (1.8k kept)"]
    assert as_labelled["measured per GPU (k)"] > T13.base_k                 # 2.1k/GPU would beat 1.8k
    assert as_labelled["expected per GPU (k)"] == pytest.approx(2 * T13.base_k)   # a doubled per-GPU rate
    assert coherent["reproduces 58% / 92%"] and coherent["expected = linear (1.8k kept)"]
    assert (coherent["measured per GPU (k)"], coherent["fixed per GPU (k)"]) == pytest.approx((1.05, 1.65))
    assert (round(coherent["efficiency measured"], 2), round(coherent["efficiency fixed"], 2)) == (0.58, 0.92)
    assert T13.coherent_reading() == coherent
    assert [round(T13.mfu(k), 2) for k in T13.source_per_gpu_k] == [0.45, 0.26, 0.41]
    assert "2.1k × 64/128 = 1,050" in coherent["arithmetic"] and "1,050/1,800 = 58%" in coherent["arithmetic"]
    # the other readings do not reproduce the source's % by construction: change the source's % and none does
    with pytest.raises(ValueError, match="0 readings"):
        replace(T13, stated_efficiency=(0.5, 0.9)).coherent_reading()


def test_thirteen_b_nodes_and_links():
    assert T13.nodes_needed == 16 and T13.line_rate_gb_s == pytest.approx(3.125)
    assert T13.busbw_across_gb_s > T13.line_rate_gb_s


def test_thirteen_b_warning_a_is_the_issues_reading_and_e_is_gone():
    keys = [w.key for w in T13.warnings]
    assert "e" not in keys and "a" in keys
    md = cases.warnings_markdown(T13, "a")
    for s in ("1.8k tokens/s per GPU on 64 GPUs", "2 × 1.8k, a doubled per-GPU rate", "faster per GPU than 1.8k",
              "2.1k × 64/128 = 1.05k", "3.3k × 64/128 = 1.65k", "58% and 92% of 1.8k", "45% → 26% → 41% of 312 TF"):
        assert s in md, s
    assert "per-GPU rate of 64 GPUs" not in md                               # the old ⚠ a's misreading


def test_thirteen_b_modelled_view_is_labelled_and_compared_with_the_source():
    m = T13.modelled()
    d64, d128, fix = m.values()
    assert d128.tokens_per_s > d64.tokens_per_s                                  # aggregate grows
    assert d128.tokens_per_s_per_gpu < 0.85 * d64.tokens_per_s_per_gpu           # per GPU it falls
    assert fix.tokens_per_s_per_gpu > 1.2 * d128.tokens_per_s_per_gpu            # the fix recovers
    assert "MODELLED" in cases.ThirteenBCase.modelled.__doc__
    g = T13.modelled_gap()
    assert g["vs_source"] == pytest.approx([p.tokens_per_s_per_gpu / (k * 1e3) for p, k in
                                            zip((d64, d128, fix), (1.8, 1.05, 1.65), strict=True)])
    assert "1,800 → 1,050 → 1,650" in cases.warnings_markdown(T13, "f")


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
    assert md.count(f"> **⚠ {case.label} (") == len(case.warnings) and "*What is right:*" in md
    assert cases.warnings_markdown(case, keys="ba").index("(b)") < cases.warnings_markdown(case, keys="ba").index("(a)")
    assert case.sources and all(isinstance(s, str) and s for s in case.sources)


@pytest.mark.parametrize("case", [BERT, T13], ids=["bert", "13b"])
def test_cases_cite_nothing_outside_the_repository(case):
    """Issue #27: shared/course/SYLLABUS.md is not in the repository; no source or ⚠ may point there."""
    text = " ".join(case.sources) + cases.warnings_markdown(case)
    assert "SYLLABUS" not in text and "shared/" not in text and "issue #14" not in text


def test_two_cases_boxes_never_share_a_label():
    md = cases.warnings_markdown(BERT, "d") + cases.warnings_markdown(T13, "d")
    heads = re.findall(r"> \*\*⚠ (.+?\(\w\))", md)
    assert heads == ["BERT-large (d)", "13B (d)"]


def test_warning_text_is_derived_not_restated():
    md = cases.warnings_markdown(BERT)
    assert "200 − 135 = 65 ms" in md and "max(90, 120) + 15 = 135 ms → 2.67×" in md
    assert "3.2 / 3.125 = 1.024" in cases.warnings_markdown(T13)
    # change an input and the boxes follow (nothing in them is typed by hand)
    md2 = cases.warnings_markdown(cases.bert_large(logging_ms=15.0), "a")
    assert "36.5 ms per step" in md2 and "26.5" not in md2
    assert "1.8k tokens/s per GPU on 64" not in cases.warnings_markdown(cases.thirteen_b(base_k=1.7), "a")


@pytest.mark.parametrize("make, match", [
    (lambda: cases.BertLargeCase(comm_ms=-1), r"comm_ms=-1"),
    (lambda: cases.BertLargeCase(n=1), r"n=1"),
    (lambda: cases.BertLargeCase(measured_speedup=10), r"measured_speedup=10 is not valid: use a speed-up in \(0, 2\.67\]"),
    (lambda: cases.BertLargeCase(measured_speedup=2.7), r"measured_speedup=2.7"),
    (lambda: cases.BertLargeCase(speedup_large=2.88), r"speedup_large=2.88 .* 360/225 = 1.6×"),
    (lambda: cases.BertLargeCase(forward_ms=60), r"forward_ms \+ backward_ms = 100.* compute_ms=90"),
    (lambda: cases.BertLargeCase(compute_ms=400, forward_ms=200, backward_ms=200), r"compute_ms=400"),
    (lambda: cases.BertLargeCase(n_large=4), r"n_large=4"),
    (lambda: cases.BertLargeCase(checkpoint_every=0), r"checkpoint_every=0"),
    (lambda: cases.BertLargeCase(pcie_share=65), r"pcie_share=65"),
    (lambda: cases.ThirteenBCase(expected_k="3.6k"), r"expected_k must be a number"),
    (lambda: cases.ThirteenBCase(base_k=0), r"base_k=0"),
    (lambda: cases.ThirteenBCase(gpus_after=32), r"gpus_after=32 is not valid"),
    (lambda: cases.ThirteenBCase(stated_efficiency=(0.58, 92)), r"stated_efficiency\[1\]=92"),
    (lambda: cases.ThirteenBCase(stated_efficiency=(0.58,)), r"stated_efficiency=\(0.58,\) is not valid"),
    (lambda: BERT.split_ms(0), r"backward_over_forward=0"),
    (lambda: BERT.implied_link_bw(alpha_s=0.1), r"alpha_s=0.1"),
    (lambda: BERT.ring_comm_ms(1), r"n=1"),
    (lambda: T13.per_gpu_k(-1), r"figure_k=-1"),
    (lambda: cases.bert_large(measured_speedup=10), r"measured_speedup=10"),
    (lambda: cases.thirteen_b(nope=1), r"nope"),
    (lambda: cases.warnings_markdown({"warnings": 1}), r"labkit.teaching.cases case"),
    (lambda: cases.warnings_markdown(BERT, keys="az"), r"keys='az'.*abcde"),
    (lambda: cases.CaseWarning("a", "t", "", "1", "r", "w", "s"), r"CaseWarning.claim"),
])
def test_bad_input_names_the_value(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# ------------------------------------------------- the chapters quote the cases as labkit.teaching.cases has them
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
                round(b.named_speedup, 2), round(b.large_speedup, 2), round(b.weak_large_speedup, 1)}
    gbs = {t.busbw_across_gb_s, t.busbw_inside_gb_s, round(t.line_rate_gb_s, 3), round(b.implied_link_bw() / 1e9, 1),
           *(round(v / 1e9, 2) for v in cases.LINKS.values()), *(round(v / 1e9, 1) for v in cases.LINKS.values())}
    ks = {t.base_k, t.expected_k, t.measured_k, t.fixed_k, *(round(k, 2) for k in t.source_per_gpu_k)}
    return speedups, gbs, ks, {round(100 * e) for e in t.stated_efficiency}


# a cell is about BERT-large when it names it or quotes its one-GPU step or 4-GPU compute; "BERT-large
# (sequence 512)" names a published benchmark's model (chapter 16 quotes FlashAttention's), not the seed case
BERT_CELL = r"BERT(?!-large \(sequence)|\b360 ?ms|\bcompute 90 ms"


def case_violations(cells) -> list[str]:
    """Numbers attached to the seed cases in ``cells`` ((where, source) pairs) that labkit.teaching.cases does not give."""
    speedups, gbs, ks, pcts = _allowed()
    b = BERT
    bad = []
    for where, text in cells:
        if re.search(BERT_CELL, text):
            comms = {b.comm_ms, b.comm_large_ms, round(b.ring_comm_ms(b.n_large))}    # 4 GPUs, 8 GPUs, ring on 8
            for label, pat, want in (("all-reduce", r"(?:all-reduce|comm)\D{0,12}?(\d+(?:\.\d+)?) ?ms", comms),
                                     ("sync", r"sync\D{0,12}?(\d+(?:\.\d+)?) ?ms", {b.sync_ms}),
                                     ("compute", r"compute\D{0,12}?(\d+(?:\.\d+)?) ?ms", {b.compute_ms})):
                bad += [f"{where}: BERT {label} {v} ms (labkit.teaching.cases: {sorted(want)})"
                        for v in re.findall(pat, text) if _num(v) not in want]
            bad += [f"{where}: BERT speedup {v}× (labkit.teaching.cases gives {sorted(speedups)})"
                    for v in re.findall(r"(\d+(?:\.\d+)?)×", text) if _num(v) not in speedups]
            bad += [f"{where}: BERT sync/all-reduce of the old rebuild ({m})"
                    for m in re.findall(r"\b(?:65|45) ms\b(?! of serial)", text)]
        if re.search(r"13B", text):
            bad += [f"{where}: 13B rate {v}k (labkit.teaching.cases: {sorted(ks)})"
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
           ("ch05 quiz", "compute 90 ms, comm 65 ms, sync 45 ms. Step time in ms with full overlap?"),
           ("ch05", "BERT-large on 8 GPUs: 1.6× over the 4-GPU run, 125 ms → 2.88× over one GPU"),
           ("ch14", "13B: 1.8k per GPU on 64, 2.0k per GPU on 128")]
    found = case_violations(old)
    assert any("all-reduce 65" in f for f in found) and any("sync 45" in f for f in found)
    assert any("2.71×" in f for f in found) and any("2.0k" in f for f in found) and any("55%" in f for f in found)
    assert any("16 GB/s" in f for f in found) and any(f.startswith("ch05 quiz") for f in found)
    assert any("2.88×" in f for f in found) and sum("2.0k" in f for f in found) == 2
    assert not case_violations([("ok", "BERT-large: all-reduce 120 ms, sync 15 ms → 2.67×; 13B 3.6k → 2.1k, 58%"),
                                ("ok", "BERT-large: 2.23× from the named overheads, all-reduce 210 ms on 8 GPUs, 3.2×"),
                                ("ok", "13B: 1.8k per GPU on 64, 1.05k and 1.65k per GPU on 128 (58%, 92%)")])


def test_chapters_quote_the_seed_cases_as_labkit_cases_has_them():
    assert NOTEBOOKS, "no stored notebooks found under chapters/"
    cells = [(f"{p.relative_to(ROOT)}#{cid}", src) for p in NOTEBOOKS for cid, _, src in _cells(p)]
    assert case_violations(cells) == []


def test_chapters_that_rebuild_a_case_use_labkit_cases():
    """A chapter that prints a case's numbers or quotes the 13B per-GPU figures builds them from labkit.teaching.cases
    and shows the ⚠ records (no private copy of the case)."""
    for p in NOTEBOOKS:
        code = "\n".join(src for _, kind, src in _cells(p) if kind == "code")
        text = "\n".join(src for _, _, src in _cells(p))
        assert "scaling.decompose(t1" not in code and "BERT_LARGE_PARAMS" not in code, p.name
        if re.search(r"BERT", code):
            assert "bert_large()" in code and "warnings_markdown(" in code, p.name
        if "3.6k" in text or re.search(r"13B", code):
            assert "thirteen_b()" in code and "warnings_markdown(" in code, p.name


def _stored_markdown(path: Path) -> list[str]:
    """Every text/markdown output stored in a notebook."""
    out = []
    for c in json.loads(path.read_text())["cells"]:
        for o in c.get("outputs", []):
            md = o.get("data", {}).get("text/markdown")
            if md:
                out.append("".join(md))
    return out


def test_stored_warning_boxes_are_the_case_objects_boxes():
    """A ⚠ box a chapter shows is printed from labkit.teaching.cases: each stored box equals one the case object renders
    now (a stale stored output, or a box typed by hand, fails), and chapters 5, 11 and 14 show the boxes this
    issue is about."""
    boxes = {b for case in (BERT, T13) for b in cases.warnings_markdown(case).split("\n\n> **")}
    boxes = {b if b.startswith("> **") else "> **" + b for b in boxes}
    shown = {}
    for p in NOTEBOOKS:
        for md in _stored_markdown(p):
            for b in md.split("\n\n> **"):
                b = b if b.startswith("> **") else "> **" + b
                if re.match(r"> \*\*⚠ (BERT-large|13B) \(", b):
                    assert b in boxes, f"{p.name}: a ⚠ box not as labkit.teaching.cases renders it now:\n{b[:300]}"
                    shown.setdefault(p.stem[:4], set()).add(re.match(r"> \*\*⚠ (.+?\(\w\))", b).group(1))
    assert {"BERT-large (a)", "BERT-large (b)", "BERT-large (d)"} <= shown["ch05"]
    assert {"BERT-large (d)", "13B (c)", "13B (d)"} <= shown["ch11"]
    assert {"13B (a)", "13B (f)"} <= shown["ch14"]
