"""lab07_memory_precision graded through ``labkit grade`` with the CI parameters: the instructor source gets full
marks, the released learner version zero on every unanswered question, and a submission whose scaler log was
doctored (every skipped step marked applied, to claim a run that never skipped) loses exactly q3's log check.
This is the suite's one execution of lab07's instructor source (tests/_executed.py), so it also asserts what
tests/test_notebooks.py would: the CI parameters, every code cell ran without error."""
from __future__ import annotations

import copy
import csv
import json
import shutil

import nbformat
import pytest
from _executed import EXECUTED_BY_GRADING, assert_every_code_cell_ran, ci_params  # tests/_executed.py

from labkit.teaching.grading import Limits, load_lab, release
from labkit.teaching.grading.batch import GradeConfig, grade

LAB = "lab07_memory_precision"


def _forged_log(lab) -> nbformat.NotebookNode:
    nb = copy.deepcopy(lab.notebook())
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    [q3] = [c for c in nb.cells if c.metadata.get("labkit", {}).get("id") == "q3"]
    assert 'slog = stable.extra["loss_scale_log"]' in q3.source
    q3.source = q3.source.replace('slog = stable.extra["loss_scale_log"]',
                                  'slog = stable.extra["loss_scale_log"]\nfor r in slog:  # "it never skipped"\n'
                                  '    r["applied"] = True')
    return nb


@pytest.mark.slow
@pytest.mark.notebook
def test_lab07_full_marks_zero_and_a_forged_log_caught(tmp_path, calibrated_peaks):
    assert EXECUTED_BY_GRADING[LAB] == "tests/test_lab07.py"
    lab = load_lab(LAB)
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copy(lab.source, subs / "instructor.ipynb")
    shutil.copy(release(LAB, tmp_path / "rel"), subs / "learner.ipynb")
    (subs / "forged_log.ipynb").write_text(nbformat.writes(_forged_log(lab)) + "\n")
    cfg = GradeConfig(limits=Limits(notebook_s=400, cell_s=300), workers=2, params=ci_params(LAB), progress=False)
    assert cfg.params == {"FAST": True}
    res = grade(LAB, [subs], tmp_path / "out", cfg)
    assert not res.failed
    with open(res.gradebook) as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    fb = {s: json.loads((tmp_path / "out" / "feedback" / f"{s}.json").read_text()) for s in rows}
    why = {s: {q: v["feedback"] for q, v in f["questions"].items()} for s, f in fb.items()}
    ran = fb["instructor"]["execution"]
    assert ran["error"] is None and ran["cells_failed"] == 0 and not ran["deadline_hit"], ran
    assert_every_code_cell_ran(tmp_path / "out" / "executed" / "instructor.ipynb", what=f"{LAB} (instructor)")
    assert float(rows["instructor"]["score"]) == lab.max_score == 7, why["instructor"]
    assert float(rows["learner"]["score"]) == 0.0, why["learner"]
    for q in lab.questions:
        msg = fb["learner"]["questions"][q.id]["feedback"]
        assert any(s in msg for s in ("not answered yet", "no evidence", "no run record")), why["learner"]
    forged = fb["forged_log"]
    assert {q: v["score"] for q, v in forged["questions"].items()} == {"q1": 2, "q2": 2, "q3": 1}, why["forged_log"]
    failed = [c["id"] for q in forged["questions"].values() for c in q["checks"] if not c["passed"]]
    assert failed == ["q3-hidden-log"], why["forged_log"]


def test_lab07_release_hides_solutions_and_checks():
    import ast

    from labkit.teaching.grading.labfmt import PROMPT, learner_notebook

    lab = load_lab(LAB)
    assert [q.id for q in lab.questions] == ["q1", "q2", "q3"] and lab.max_score == 7
    assert {c.id: c.weight for c in lab.checks if c.question == "q3"} == {"q3-hidden": 1, "q3-hidden-log": 2}
    nb = learner_notebook(lab)
    text = "\n".join(c.source for c in nb.cells)
    assert "BEGIN SOLUTION" not in text and "evidence(" not in text and text.count(PROMPT) == 3
    assert "scale_growth_interval=3" not in text          # the fix is the learner's to write
    for c in nb.cells:
        if c.cell_type == "code":
            ast.parse(c.source)


def test_the_forged_log_breaks_the_rule_the_grader_replays():
    """The doctored log of the slow test, checked directly: marking skipped steps applied is caught."""
    from labkit.train import precision

    log = [{"scale": 2.0 ** 24 / 2 ** min(i, 3), "overflow": i < 3, "applied": i >= 3,
            "next_scale": 2.0 ** 24 / 2 ** min(i + 1, 3)} for i in range(5)]
    assert precision.scaler_violations(log, init=2.0 ** 24, growth_interval=3) == []
    forged = [{**r, "applied": True} for r in log]
    bad = precision.scaler_violations(forged, init=2.0 ** 24, growth_interval=3)
    assert len(bad) == 3 and all("applied=True" in b for b in bad)
