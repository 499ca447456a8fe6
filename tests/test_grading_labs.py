"""Each graded lab: the instructor source gets full marks, the released learner version scores zero on
every unanswered question, and a forged lab01 submission loses exactly the points its forgery touches.

Graded with the CI parameters (FAST=True) through ``labkit grade``, 2 workers.
"""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from labkit.grading import Limits, load_lab, release
from labkit.grading.batch import GradeConfig, grade

HERE = Path(__file__).resolve().parent / "adversarial"
REAL = json.loads((HERE / "expected.json").read_text())["_real_labs"]


@pytest.mark.slow
@pytest.mark.parametrize("lab_id", ["lab01_baseline", "lab02_profiler", "lab05_ddp"])
def test_instructor_full_marks_learner_zero(lab_id, tmp_path, calibrated_peaks):
    """Graded against a calibrated peak: lab01 checks MFU <= 100 %, which a live peak measured on a
    loaded machine once broke (MFU 1.75)."""
    lab = load_lab(lab_id)
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(lab.source, subs / "instructor.ipynb")
    shutil.copy(release(lab_id, tmp_path / "rel"), subs / "learner.ipynb")
    extra = {n: v for n, v in REAL.items() if v["lab"] == lab_id}
    for name in extra:
        shutil.copy(HERE / f"{name}.ipynb", subs / f"{name}.ipynb")
    cfg = GradeConfig(limits=Limits(notebook_s=400, cell_s=300), workers=2, params={"FAST": True}, progress=False)
    res = grade(lab_id, [subs], tmp_path / "out", cfg)
    assert not res.failed
    with open(res.gradebook) as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    fb = {s: json.loads((tmp_path / "out" / "feedback" / f"{s}.json").read_text()) for s in rows}
    why = {s: {q: v["feedback"] for q, v in f["questions"].items()} for s, f in fb.items()}
    assert float(rows["instructor"]["score"]) == lab.max_score, why["instructor"]
    assert float(rows["learner"]["score"]) == 0.0, why["learner"]
    for q in lab.questions:  # the first failing check says the work is missing, not something obscure
        msg = fb["learner"]["questions"][q.id]["feedback"]
        assert any(s in msg for s in ("not answered yet", "no evidence", "no run record")), why["learner"]
    for name, want in extra.items():
        got = fb[name]
        assert {q: v["score"] for q, v in got["questions"].items()} == want["questions"], why[name]
        failed = [c["id"] for q in got["questions"].values() for c in q["checks"] if not c["passed"]]
        assert failed == [want["failed_check"]], why[name]
