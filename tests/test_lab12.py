"""lab12_capstone and labkit.capstone: the seed draws every family and hides its knobs; a fix may change trainer
options only; a memory budget fits more sequences under recomputation; and the hidden checks, run by the grader's
checker on evidence made here, pass a real fix and fail one that names the right family but does not speed the
job up, one that "speeds it up" by changing the global batch or the sequence length, and a speed-up typed in.

Full marks for the instructor source, zero for the released copy and the forged speed-up (lab12_forged) are
graded through ``labkit grade`` in tests/test_grading_labs.py."""
from __future__ import annotations

import pytest

from labkit import capstone
from labkit.grading import EvidenceBook, load_lab
from labkit.grading.checker import run_checks
from labkit.record import RunRecord, Stat

LAB = "lab12_capstone"


def test_the_seed_draws_every_mystery_and_the_record_hides_its_environment():
    drawn = {capstone.mystery_of(s).name for s in range(30)}
    assert drawn == set(capstone.MYSTERIES)
    assert {m.family for m in capstone.MYSTERIES.values()} == {"data", "compute", "memory"}
    for name in capstone.MYSTERIES:
        seed = capstone.seed_for(name)
        assert capstone.mystery_of(seed).name == name and capstone.mystery_of(seed) == capstone.mystery_of(seed)
        assert "seed=" in repr(capstone.Workload(seed)) and name not in repr(capstone.Workload(seed))
    w = capstone.Workload(capstone.seed_for("tiny_micro"))
    full = w.config().to_dict()
    assert full["micro_batch"] == 1 and full["accum"] == capstone.GLOBAL_BATCH
    assert not set(capstone.HIDDEN) & set(w.options())
    with pytest.raises(ValueError, match="seed"):
        capstone.mystery_of(-1)
    with pytest.raises(ValueError, match="name"):
        capstone.seed_for("straggler")


@pytest.mark.parametrize("options, match", [
    ({"seq_len": 4}, "define the workload"), ({"data_slowdown_s": 0.0}, "define the workload"),
    ({"memory_budget_mb": 100.0}, "define the workload"), ({"model": "tiny"}, "define the workload"),
    ({"not_a_field": 1}, "not TrainConfig fields")])
def test_a_fix_may_change_trainer_options_only(options, match):
    with pytest.raises(ValueError, match=match):
        capstone.Workload(capstone.seed_for("tiny_micro")).config(**options)


def test_global_batch_counts_micro_batch_times_accum():
    assert capstone.global_batch({"micro_batch": 2, "accum": 4}) == 8
    assert capstone.global_batch({"micro_batch": 1, "accum": 8, "micro_batch_requested": 8}) == 8   # a budget's run
    with pytest.raises(ValueError, match="adaptive"):
        capstone.global_batch({"micro_batch": 2, "accum": "adaptive"})


def test_the_activation_budget_fits_more_sequences_under_recomputation():
    """inject.plan fits the micro-batch with what a sequence saves under the run's own recomputation policy: the
    memory mystery runs one sequence per micro-batch, with full recomputation 4 fit (a sequence of the small GPT
    saves 3.7x fewer bytes); the global batch stays."""
    import torch

    from labkit.train.inject import plan

    w = capstone.Workload(capstone.seed_for("act_budget"))
    dev = torch.device("cpu")
    given, facts = plan(w.config(), dev)
    fixed, facts_fix = plan(w.config(checkpoint=True), dev)
    assert (given.micro_batch, given.accum, given.checkpoint) == (1, capstone.GLOBAL_BATCH, False)
    assert fixed.micro_batch == 4 and fixed.micro_batch * fixed.accum == capstone.GLOBAL_BATCH and fixed.checkpoint
    assert facts_fix["activation_bytes_per_sample_recomputed"] * 3 < facts["activation_bytes_per_sample"]


def test_release_hides_solutions_and_checks():
    import ast

    from labkit.grading.labfmt import PROMPT, learner_notebook

    lab = load_lab(LAB)
    assert [q.id for q in lab.questions] == ["q1", "q2"] and lab.max_score == 7
    assert {c.id: c.weight for c in lab.checks if c.question == "q2"} == {
        "q2-hidden": 1, "q2-hidden-ab": 2, "q2-hidden-remeasure": 1}
    text = "\n".join(c.source for c in learner_notebook(lab).cells)
    assert "BEGIN SOLUTION" not in text and "evidence(" not in text and "mystery_of" not in text
    assert text.count(PROMPT) == 2
    for c in learner_notebook(lab).cells:
        if c.cell_type == "code":
            ast.parse(c.source)


# ---------------------------------------------------------------- hidden checks on evidence made here
SEED = capstone.seed_for("tiny_micro")
FIX = {"micro_batch": capstone.GLOBAL_BATCH, "accum": 1}


def _record(step_s: float, **options) -> dict:
    cfg = capstone.public_config(capstone.Workload(SEED).config(**options).to_dict())
    cfg["capstone_seed"] = SEED
    return RunRecord(label="capstone", step_time=Stat.of([step_s * f for f in (0.98, 1.0, 1.03)]), config=cfg)


def _submit(tmp_path, options, b, *, speedup=None, family="compute"):
    """q1 and q2 evidence: the job at ≈ 1 s per step, the fix's runs at ``b`` s (one trace file stands in)."""
    import statistics

    trace = tmp_path / "fixed.json"
    trace.write_text("{}")
    book = EvidenceBook(LAB, root=tmp_path)
    book.submit("q1", answer={"family": family, "diagnose_primary": "compute", "justification": "MFU 1.3%"},
                record=_record(1.0), seed=SEED)
    a, a2 = [1.0, 1.05, 0.97], [1.02, 0.99, 1.01]
    bs = [b * f for f in (1.0, 1.04, 0.98)]
    ratio = statistics.median(bs) / statistics.median(a)
    verdict = "faster" if ratio < 0.9 else "no difference at this resolution"
    book.submit("q2", answer={"options": options, "speedup": speedup or 1 / ratio}, record=_record(b, **options),
                files=[trace], options=options, a=a, b=bs, a2=a2, ratio=ratio, verdict=verdict)
    return book


def _grade(root, ids):
    checks = [{"id": c.id, "question": c.question, "weight": c.weight, "source": c.source}
              for c in load_lab(LAB).checks if c.id in ids]
    res = run_checks({"lab": LAB, "work_root": str(root), "checks": checks, "params": {}})
    return {r["id"]: r["passed"] for r in res}, [r["message"] for r in res]


IDS = ("q1-hidden-family", "q2-hidden", "q2-hidden-ab")


def test_hidden_checks_pass_a_real_fix(tmp_path):
    _submit(tmp_path, FIX, 0.25)
    ok, why = _grade(tmp_path, IDS)
    assert ok == dict.fromkeys(IDS, True), why


def test_the_right_family_without_a_speed_up_fails(tmp_path):
    _submit(tmp_path, {"num_workers": 2}, 0.98)
    ok, why = _grade(tmp_path, IDS)
    assert ok == {"q1-hidden-family": True, "q2-hidden": True, "q2-hidden-ab": False}, why
    assert "at least 20 % faster" in why[2]


def test_a_wrong_family_fails_q1(tmp_path):
    _submit(tmp_path, FIX, 0.25, family="data")
    ok, why = _grade(tmp_path, ("q1-hidden-family",))
    assert ok == {"q1-hidden-family": False} and f"workload {SEED}" in why[0], why


def test_a_larger_global_batch_or_a_shorter_sequence_is_not_a_fix(tmp_path):
    """Twice the sequences per micro-batch, or half the tokens per sequence: each step is cheaper per sequence or
    shorter — the A/B shows a speed-up, the option check fails."""
    _submit(tmp_path, {"micro_batch": 2 * capstone.GLOBAL_BATCH, "accum": 1}, 0.3)
    ok, why = _grade(tmp_path, IDS)
    assert ok == {"q1-hidden-family": True, "q2-hidden": False, "q2-hidden-ab": True}, why
    assert "global batch" in why[1]
    _submit(tmp_path, {**FIX}, 0.25)
    book = EvidenceBook(LAB, root=tmp_path)
    ev = book.load("q2")
    book.submit("q2", answer={"options": {"seq_len": 4}, "speedup": ev.answered()["speedup"]}, record=ev.record,
                files=ev.files("*.json"), options={"seq_len": 4}, a=ev.value("a"), b=ev.value("b"),
                a2=ev.value("a2"), ratio=ev.value("ratio"), verdict=ev.value("verdict"))
    ok, why = _grade(tmp_path, ("q2-hidden",))
    assert ok == {"q2-hidden": False} and "define the workload" in why[0], why


def test_a_typed_in_speed_up_fails(tmp_path):
    _submit(tmp_path, FIX, 0.25, speedup=6.0)
    ok, why = _grade(tmp_path, IDS)
    assert ok == {"q1-hidden-family": True, "q2-hidden": True, "q2-hidden-ab": False}, why
    assert "the samples give" in why[2]
