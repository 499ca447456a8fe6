"""The grading rule (labkit.teaching.grading.evidence's docstring), on lab10's q3: the point rests on the learner's own
recorded A/B runs, re-derived and bound to the execution that recorded them — a typed-in verdict, runs pasted
from another kernel, or an inconclusive A/B are each graded as the rule says.

The A/B is ``labkit.measure.ab.ab_train(same_ranks=True)`` itself with its launch replaced by records whose step times
this test chooses (no training: the checks never time anything, they read the evidence).
"""
from __future__ import annotations

import json
import math
import os
import time

import pytest

from labkit.measure.ab import NO_DIFFERENCE, ab_train
from labkit.record import RunRecord, Stat
from labkit.teaching.grading import EvidenceBook, load_lab
from labkit.teaching.grading.checker import run_checks
from labkit.teaching.grading.evidence import CheckFailed, Evidence
from labkit.train import TrainConfig

LAB = "lab10_planner"
CFG_A = TrainConfig(parallel="ddp", micro_batch=4, label="DP2", model="tiny", steps=4, warmup_steps=1, seed=0)
CFG_B = CFG_A.replace(parallel="single", tp=2, micro_batch=8, label="TP2")
STEP = {"DP2": 0.010, "TP2": 0.022}     # seconds per step: TP2 2.2x slower


def _live(monkeypatch, step=STEP, jitter=0.02, rounds=4):
    """ab_train's real A/B of CFG_A and CFG_B, its one launch replaced by records of ``step`` seconds (± a
    deterministic jitter), the launch lasting as long as their timed steps."""
    import labkit.train.launch as launch

    def fake_run_many(cfgs, nprocs, timeout_s=600):
        recs = []
        for i, c in enumerate(cfgs):
            med = step[c.label] * (1 + jitter * math.sin(2.3 * i))
            recs.append(RunRecord(label=c.label, step_time=Stat(median=med, p10=0.9 * med, p90=1.1 * med, n=3),
                                  tokens_per_step=2 * 8 * 64, config=c.to_dict(),
                                  device={"kind": "cpu", "backend": "gloo", "count": nprocs}))
        time.sleep(sum(3 * r.step_time.p10 for r in recs) * 1.05)
        return recs

    monkeypatch.setattr(launch, "run_many", fake_run_many)
    return ab_train(CFG_A, CFG_B, nprocs=2, rounds=rounds, warmup=1, metric="throughput", same_ranks=True)


def _submit(root, live, answer=None, runs=None):
    book = EvidenceBook(LAB, root=root)
    if answer is None:
        answer = {"tp_all_reduces": 4 * 2 * 1, "slowdown": 1 / live.ratio, "verdict": live.verdict}
    book.submit("q3", answer=answer, runs=list(live.runs) if runs is None else runs, a=list(live.a),
                b=list(live.b), a2=list(live.a2), rounds=live.rounds, warmup=live.warmup,
                cfg_a=CFG_A.to_dict(), cfg_b=CFG_B.to_dict())
    return book


def _grade_q3(root):
    checks = [{"id": c.id, "question": c.question, "weight": c.weight, "source": c.source}
              for c in load_lab(LAB).checks if c.question == "q3"]
    res = run_checks({"lab": LAB, "work_root": str(root), "checks": checks, "params": {}})
    return {r["id"]: r["passed"] for r in res}, {r["id"]: r["message"] for r in res}


def test_honest_runs_pass_both_q3_checks(tmp_path, monkeypatch):
    live = _live(monkeypatch)
    assert live.verdict == "slower" and all(r["launch"]["pid"] == os.getpid() for r in live.runs)
    _submit(tmp_path, live)
    ok, why = _grade_q3(tmp_path)
    assert ok == {"q3-hidden": True, "q3-hidden-claim": True}, why
    assert why["q3-hidden-claim"] == "passed"


def test_typed_in_verdict_without_runs_scores_nothing(tmp_path):
    """issue 33: {"slowdown": 2.0, "verdict": "slower"} with no runs earned q3-hidden-claim's point."""
    EvidenceBook(LAB, root=tmp_path).submit("q3", answer={"tp_all_reduces": 8, "slowdown": 2.0, "verdict": "slower"},
                                            runs=None, a=None, b=None, a2=None, rounds=None, warmup=None,
                                            cfg_a=None, cfg_b=None)
    ok, why = _grade_q3(tmp_path)
    assert ok == {"q3-hidden": False, "q3-hidden-claim": False}, why
    assert "no A/B runs" in why["q3-hidden-claim"]


def test_runs_copied_from_another_kernel_are_not_evidence(tmp_path, monkeypatch):
    live = _live(monkeypatch)
    pasted = json.loads(json.dumps(list(live.runs)))
    for r in pasted:   # the same runs as another kernel recorded them (a classmate's, or an earlier session's)
        r["launch"] = {**r["launch"], "pid": os.getpid() + 1}
    _submit(tmp_path, live, runs=pasted)
    ok, why = _grade_q3(tmp_path)
    assert ok == {"q3-hidden": False, "q3-hidden-claim": False}, why
    assert "not by the kernel that recorded this evidence" in why["q3-hidden-claim"]
    unstamped = [{k: v for k, v in r.items() if k != "launch"} for r in live.runs]
    _submit(tmp_path, live, runs=unstamped)
    ok, why = _grade_q3(tmp_path)
    assert ok == {"q3-hidden": False, "q3-hidden-claim": False} and "no launch stamp" in why["q3-hidden"], why


def test_a_launch_shorter_than_its_runs_steps_is_refused(tmp_path, monkeypatch):
    live = _live(monkeypatch)
    runs = json.loads(json.dumps(list(live.runs)))
    for r in runs:     # fresh stamps typed around runs measured elsewhere: the launch is too short to hold them
        r["launch"] = {**r["launch"], "started_at": r["launch"]["ended_at"]}
    _submit(tmp_path, live, runs=runs)
    ok, why = _grade_q3(tmp_path)
    assert ok["q3-hidden-claim"] is False and "were not measured in that launch" in why["q3-hidden-claim"], why


def test_an_inconclusive_ab_is_noted_not_penalised(tmp_path, monkeypatch):
    live = _live(monkeypatch, step={"DP2": 0.010, "TP2": 0.010}, jitter=0.3, rounds=4)
    assert live.verdict == NO_DIFFERENCE
    _submit(tmp_path, live)
    ok, why = _grade_q3(tmp_path)
    assert ok == {"q3-hidden": True, "q3-hidden-claim": True}, why
    assert "inconclusive" in why["q3-hidden-claim"] and "not penalised" in why["q3-hidden-claim"]


def test_conclusive_evidence_against_the_claim_fails_it(tmp_path, monkeypatch):
    live = _live(monkeypatch, step={"DP2": 0.022, "TP2": 0.010})
    assert live.verdict == "faster"
    _submit(tmp_path, live)
    ok, why = _grade_q3(tmp_path)
    assert ok == {"q3-hidden": True, "q3-hidden-claim": False}, why
    assert "contradict the claim" in why["q3-hidden-claim"]


def test_a_forged_sample_or_answer_is_caught(tmp_path, monkeypatch):
    live = _live(monkeypatch)
    book = _submit(tmp_path, live, answer={"tp_all_reduces": 8, "slowdown": 2.0, "verdict": "slower"})
    ok, why = _grade_q3(tmp_path)   # copied numbers: a slowdown that is not this A/B's
    assert ok == {"q3-hidden": False, "q3-hidden-claim": True} and "slowdown" in why["q3-hidden"], why
    doc = json.loads((book.dir / "q3.json").read_text())
    doc["values"]["b"][0] *= 0.5
    (book.dir / "q3.json").write_text(json.dumps(doc))
    with pytest.raises(CheckFailed, match="samples"):
        Evidence.load(LAB, "q3", root=tmp_path).ab_from_runs(metric="throughput")


def test_note_needs_a_sentence():
    from labkit.teaching.grading import note

    with pytest.raises(ValueError, match="non-empty sentence"):
        note("  ")


def _lab09_q2_tolerance(root, spread: float, error: float):
    """lab09's q2-hidden-tolerance on a SYNTHETIC all-reduce table: an α-β line (α 50 µs, 1 GB/s) fitted exactly,
    the held-out size's timings spread by ``spread`` ((p50 - p10) / p10), the answer off by ``error``."""
    sizes, held = [2**k for k in range(10, 24, 2)], 2**17
    rows, raw = [], []
    for s in sorted(sizes + [held]):
        t = 50e-6 + s / 1e9
        times = [t * (1 + spread * i / 4) for i in range(9)] if s == held else [t] * 9
        rows.append({"op": "all_reduce", "size": s, "p10_us": t * 1e6})
        raw.append({"op": "all_reduce", "size": s, "times_s": times})
    book = EvidenceBook("lab09_collectives", root=root)
    book.submit("q1", answer={}, table=rows, raw=raw, held_out=held, nranks=2)
    book.submit("q2", answer={"error": error})
    checks = [{"id": c.id, "question": c.question, "weight": c.weight, "source": c.source}
              for c in load_lab("lab09_collectives").checks if c.id == "q2-hidden-tolerance"]
    (res,) = run_checks({"lab": "lab09_collectives", "work_root": str(root), "checks": checks, "params": {}})
    return res["passed"], res["message"]


def test_lab09_a_miss_beyond_the_cap_on_a_too_noisy_run_is_noted_not_penalised(tmp_path):
    ok, why = _lab09_q2_tolerance(tmp_path / "noisy", spread=0.8, error=1.5)   # noise ×3 = 240 %: above the cap
    assert ok and "too noisy to test the model here; not penalised" in why, why
    ok, why = _lab09_q2_tolerance(tmp_path / "quiet", spread=0.1, error=1.5)   # noise ×3 = 30 %: a real miss
    assert not ok and "off by" in why, why
    ok, why = _lab09_q2_tolerance(tmp_path / "within", spread=0.1, error=0.2)
    assert ok and why == "passed", why


def _lab01_q2(root, peak_source: str):
    """lab01's q2 on a record whose MFU against its peak is 1.5 (a peak measured at a third of the real one)."""
    from labkit import flops
    from labkit.model.gpt import gpt_config

    fpt = flops.model_flops_per_token(gpt_config("tiny", seq_len=64).shape())
    rec = RunRecord(label="baseline", step_time=Stat.of([0.1] * 4), tokens_per_step=256, tokens_per_s=2560.0,
                    peak_flops=2560.0 * fpt / 1.5, peak_source=peak_source, config={"model": "tiny", "seq_len": 64})
    book = EvidenceBook("lab01_baseline", root=root)
    book.submit("q1", answer=None, record=rec)
    book.submit("q2", answer=0.5 / 1.5)
    checks = [{"id": c.id, "question": c.question, "weight": c.weight, "source": c.source}
              for c in load_lab("lab01_baseline").checks if c.id == "q2-hidden"]
    (res,) = run_checks({"lab": "lab01_baseline", "work_root": str(root), "checks": checks, "params": {}})
    return res["passed"], res["message"]


def test_lab01_mfu_above_one_against_a_measured_peak_is_noted_against_a_catalogue_peak_fails(tmp_path):
    ok, why = _lab01_q2(tmp_path / "measured", "measured:matmul fp32 1 s")
    assert ok and "not penalised" in why, why
    ok, why = _lab01_q2(tmp_path / "catalogue", "catalogue:cpu")
    assert not ok and "above 1" in why, why


@pytest.mark.parametrize("lab_id, question", [("lab04_attention", "q1"), ("lab07_memory_precision", "q3"),
                                              ("lab10_planner", "q3"), ("lab09_collectives", "q5")])
def test_the_prompt_says_what_to_do_not_the_code(lab_id, question):
    """issue 33: these prompts carried their solution's code. The question's prompt (the markdown cell before its
    answer cell) shares no 24-character stretch of code with the solution (whitespace and backticks ignored)."""
    from labkit.teaching.grading.labfmt import BEGIN_SOLUTION, END_SOLUTION

    cells = load_lab(lab_id).notebook().cells
    at = next(i for i, c in enumerate(cells) if (c.metadata.get("labkit") or {}).get("id") == question)
    prompt = next(c for c in reversed(cells[:at]) if c.cell_type == "markdown")
    text = " ".join(prompt.source.replace("`", " ").split())
    inside, shared = False, set()
    for line in cells[at].source.splitlines():
        if BEGIN_SOLUTION.match(line) or END_SOLUTION.match(line):
            inside = bool(BEGIN_SOLUTION.match(line))
            continue
        code = " ".join(line.split("#")[0].split())
        if inside:
            shared |= {code[i:i + 24] for i in range(len(code) - 23) if code[i:i + 24] in text}
    assert not shared, f"{lab_id} {question}'s prompt carries its solution's code: {sorted(shared)[:5]}"
