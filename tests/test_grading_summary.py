"""The class report (grades/summary.md + summary.png) and feedback a learner can read (issue #33, items 5-6).

Unit tests build feedback records as the grader writes them and read the report back; the end-to-end test
grades a small class of real mini-lab submissions (the instructor's, an untouched one and its copy, a
wrong answer, one whose q3 cell never finishes) and checks the report and the timed-out notebook's partial
credit.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import nbformat
import pytest

from labkit.teaching.grading import Limits, learner_notebook, load_lab
from labkit.teaching.grading import batch as batch_mod
from labkit.teaching.grading.batch import GradeConfig, grade
from labkit.teaching.grading.feedback import HIDDEN, render, row_messages
from labkit.teaching.grading.gradebook import write_gradebook
from labkit.teaching.grading.summary import main as summary_main
from labkit.teaching.grading.summary import summarize, write_summary

MINI = Path(__file__).resolve().parent / "adversarial" / "mini_lab"


def _chk(cid, q, passed, msg="passed"):
    return {"id": cid, "question": q, "weight": 1.0, "passed": passed, "message": msg, "learner_message": msg}


def _fb(student, scores, checks, *, answers=None, execution=None, sha=None, ts="2026-12-06T04:00:00+00:00",
        cells=None):
    maxes = {"q1": 2.0, "q2": 2.0, "q3": 1.0}
    qs = {q: {"score": scores[q], "max_score": maxes[q], "checks": checks.get(q, []),
              "answer_cells": (cells or {}).get(q, [{"id": q, "executed": True, "error": None, "timed_out": False}])}
          for q in maxes}
    return {"student": student, "lab": "mini_lab", "timestamp": ts, "graded_at": ts, "score": sum(scores.values()),
            "max_score": 5.0, "status": "graded", "complete": True, "questions": qs, "answers": answers or {},
            "execution": execution or {"deadline_hit": False, "cells_timed_out": 0, "stopped": None},
            "submission_sha256": sha or f"sha-{student}", "notes": []}


def _class(out: Path, records) -> None:
    (out / "feedback").mkdir(parents=True)
    for fb in records:
        (out / "feedback" / f"{fb['student']}.json").write_text(json.dumps(fb))
    write_gradebook(load_lab(MINI), out)


def _records():
    ok = {q: [_chk(f"{q}-hidden", q, True)] for q in ("q1", "q2", "q3")}
    fam = "q3: 'memory' is not the family of mystery run 4"
    return [
        _fb("ann", {"q1": 2, "q2": 2, "q3": 1}, ok, answers={"q3": {"family": "data"}}, sha="same"),
        _fb("ben", {"q1": 2, "q2": 2, "q3": 1}, ok, sha="same"),
        _fb("cat", {"q1": 2, "q2": 1, "q3": 0},
            {"q1": ok["q1"], "q2": [_chk("q2-hidden", "q2", True), _chk("q2-ratio", "q2", False, "q2: 3.1 is not 2.2")],
             "q3": [_chk("q3-hidden", "q3", False, fam)]}, answers={"q3": {"family": "memory"}}),
        _fb("dan", {"q1": 0, "q2": 0, "q3": 0},
            {"q1": [_chk("q1-hidden", "q1", False, "q1: 0.5 is not the mean")],
             "q2": [_chk("q2-hidden", "q2", False, "q1: no run record in the evidence"),
                    _chk("q2-ratio", "q2", False, "q2: 1.7 is not 2.05")],
             "q3": [_chk("q3-hidden", "q3", False, "q3: 'memory' is not the family of mystery run 9")]},
            answers={"q3": {"family": "memory"}}),
        # stopped in q3 by the notebook's time limit: q1 and q2 finished and keep their points
        _fb("eve", {"q1": 2, "q2": 2, "q3": 0},
            {**{q: ok[q] for q in ("q1", "q2")}, "q3": [_chk("q3-hidden", "q3", False, "q3: no evidence recorded")]},
            execution={"deadline_hit": True, "cells_timed_out": 1, "stopped": "notebook time limit (60 s) reached"},
            cells={"q3": [{"id": "q3", "executed": True, "error": None, "timed_out": True}]}),
    ]


def test_summary_pass_rates_ranking_families_timeouts_and_copies(tmp_path):
    stopped = dict(_fb("fay", {"q1": 0, "q2": 0, "q3": 0}, {}), complete=False, status="labkit-modified")
    _class(tmp_path, _records() + [stopped])
    s = summarize(tmp_path)
    q = {x["id"]: x for x in s["questions"]}
    assert (s["n"], s["lab"]) == (5, "mini_lab")
    assert (q["q1"]["full"], q["q1"]["none"], q["q1"]["pass_rate"]) == (4, 1, 0.8)
    assert (q["q2"]["full"], q["q2"]["some"], q["q2"]["none"]) == (3, 1, 1) and q["q2"]["mean"] == pytest.approx(1.4)
    assert q["q3"]["mean"] == pytest.approx(0.4)
    ranked = [(c["id"], c["failed"]) for c in s["failed_checks"]]
    assert ranked[0] == ("q3-hidden", 3)                 # cat, dan, eve
    assert ranked[1:] == [("q2-ratio", 2), ("q1-hidden", 1), ("q2-hidden", 1)]
    assert s["failed_checks"][0]["messages"] == [("q3: '…' is not the family of mystery run #", 2),
                                                 ("q3: no evidence recorded", 1)]
    assert s["failed_checks"][1]["messages"] == [("q2: # is not #", 2)]
    assert s["failed_checks"][3]["messages"] == [("q2: needs q1's evidence — q1: no run record in the evidence", 1)]
    assert s["families"] == [{"family": "memory", "count": 2, "students": ["cat", "dan"], "questions": ["q3"]}]
    (t,) = s["timed_out"]
    assert t["student"] == "eve" and t["finished_points"] == 4.0
    assert t["questions"]["q3"] == {"finished": False, "score": 0.0, "max": 1.0}
    assert s["identical"] == [["ann", "ben"]]
    assert s["incomplete"] == ["fay (labkit-modified)"]            # not in the gradebook, not counted
    md = (write_summary(tmp_path)).read_text()
    assert "| q1 | 2 | 4 (80%) | 0 | 1 | 1.60 |" in md
    assert "| memory | 2 | q3 | cat, dan |" in md
    assert "| eve | 4 / 5 | q1 (2/2), q2 (2/2) | q3 | notebook time limit (60 s) reached |" in md
    assert "| q3-hidden | q3 | 3 of 5 | q3: '…' is not the family of mystery run # (2×); q3: no evidence " in md
    assert "identical notebooks: ann, ben" in md
    assert "the next run regrades them): fay (labkit-modified)" in md
    png = tmp_path / "summary.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_summary_is_rebuilt_from_the_records_and_refuses_what_is_not_a_grade_folder(tmp_path, capsys):
    _class(tmp_path, _records())
    first = write_summary(tmp_path).read_text()
    (tmp_path / "summary.md").unlink()
    assert summary_main([str(tmp_path)]) == 0 and (tmp_path / "summary.md").read_text() == first
    assert summary_main([str(tmp_path / "nowhere")]) == 2
    assert "gradebook.csv does not exist" in capsys.readouterr().err
    with pytest.raises(ValueError, match="grades mini_lab, not lab02_profiler"):
        write_summary(tmp_path, "lab02_profiler")
    (tmp_path / "gradebook.csv").write_text("name,score\nx,1\n")
    with pytest.raises(ValueError, match="not a labkit gradebook"):
        write_summary(tmp_path)


def test_a_question_row_starts_with_its_own_check():
    checks = [_chk("a", "q2", False, "q1: no run record in the evidence"), _chk("b", "q2", False, "q2: 7 is not 3"),
              _chk("c", "q2", True)]
    assert row_messages("q2", checks, questions=["q1", "q2"]) == [
        "q2: 7 is not 3", "q2: needs q1's evidence — q1: no run record in the evidence"]
    only_other = row_messages("q2", checks[:1], questions=["q1", "q2"])
    assert only_other == ["q2: needs q1's evidence — q1: no run record in the evidence"]
    fb = _records()[3]
    md = render(fb)
    row = next(ln for ln in md.splitlines() if ln.startswith("| q2 |"))
    assert row.startswith("| q2 | 0 / 2 | q2: 1.7 is not 2.05 (and 1 more below) |")


def test_the_hidden_footer_only_when_something_was_hidden():
    fb = _records()[2]
    assert HIDDEN not in render(fb)                       # nothing withheld: no footer
    fb["questions"]["q2"]["checks"][1]["learner_message"] = f"q2: 3.1 is not {HIDDEN}"
    md = render(fb)
    assert md.count(HIDDEN) == 2 and md.rstrip().endswith(f"shown as {HIDDEN}._")
    assert HIDDEN not in render(fb, "show")


def test_each_gradebook_row_has_its_own_grading_time(tmp_path, monkeypatch):
    """The timestamp column is when that row was graded, not the files' mtime nor one time for all."""
    clock = iter(f"2026-12-06T04:0{i}:00+00:00" for i in range(10))
    monkeypatch.setattr(batch_mod, "_now", lambda: next(clock))

    def fake(lab, sub, student, out, cfg):
        return {"student": student, "lab": lab.id, "timestamp": "start", "score": 1.0, "max_score": lab.max_score,
                "submission_sha256": batch_mod.sha256_file(sub), "lab_sha256": lab.sha256, "status": "graded",
                "grader_version": batch_mod.GRADER_VERSION, "complete": True, "notes": [], "questions": {}}
    monkeypatch.setattr(batch_mod, "grade_one", fake)
    subs = tmp_path / "subs"
    subs.mkdir()
    for n in ("ann", "ben", "cat"):
        (subs / f"{n}.ipynb").write_text("{}")
    grade(MINI, [subs], tmp_path / "out", GradeConfig(progress=False))
    with open(tmp_path / "out" / "gradebook.csv") as f:
        stamps = {r["student"]: r["timestamp"] for r in csv.DictReader(f)}
    assert stamps == {"ann": "2026-12-06T04:00:00+00:00", "ben": "2026-12-06T04:01:00+00:00",
                      "cat": "2026-12-06T04:02:00+00:00"}
    (subs / "ben.ipynb").write_text('{"changed": 1}')      # only ben is regraded; the others keep their time
    grade(MINI, [subs], tmp_path / "out", GradeConfig(progress=False))
    with open(tmp_path / "out" / "gradebook.csv") as f:
        again = {r["student"]: r["timestamp"] for r in csv.DictReader(f)}
    assert again == dict(stamps, ben="2026-12-06T04:03:00+00:00")
    assert "3 submissions" in (tmp_path / "out" / "summary.md").read_text()


def _looping(qid: str):
    """The instructor's mini lab with an endless loop at the top of ``qid``'s answer cell."""
    nb = nbformat.read(MINI / "mini_lab.ipynb", as_version=4)
    for cell in nb.cells:
        if (cell.metadata.get("labkit") or {}).get("id") == qid:
            cell.source = "while True:   # never finishes\n    pass\n" + cell.source
    return nb


@pytest.mark.slow
def test_a_small_class_graded_end_to_end(tmp_path):
    """Real mini-lab submissions: a notebook stopped by a cell's time limit, or by the notebook's, keeps the
    points of the questions whose cells finished; the class report says so."""
    lab = load_lab(MINI)
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "teacher.ipynb").write_bytes((MINI / "mini_lab.ipynb").read_bytes())
    nbformat.write(learner_notebook(lab), subs / "untouched.ipynb")
    (subs / "untouched_copy.ipynb").write_bytes((subs / "untouched.ipynb").read_bytes())
    nbformat.write(_looping("q3"), subs / "looper.ipynb")
    out = tmp_path / "out"
    res = grade(MINI, [subs], out, GradeConfig(limits=Limits(notebook_s=300, cell_s=25), workers=2, progress=False))
    scores = {r["student"]: float(r["score"]) for r in res.rows}
    assert scores == {"teacher": 5.0, "untouched": 0.0, "untouched_copy": 0.0, "looper": 4.0}
    # stuck in q2 until the notebook's own time limit kills the kernel: q1's evidence was recorded, its point stays.
    # notebook_s: the room tests/test_grading_adversarial.py's sleeper gets for the kernel to start and q1 to run on
    # a loaded machine (8 s was too little at load ≈ 30); every second past it is waited out
    nbformat.write(_looping("q2"), tmp_path / "stuck.ipynb")
    res = grade(MINI, [tmp_path / "stuck.ipynb"], out,
                GradeConfig(limits=Limits(notebook_s=30, cell_s=300), progress=False))
    stuck = json.loads((out / "feedback" / "stuck.json").read_text())
    assert stuck["execution"]["deadline_hit"] and stuck["score"] == 2.0
    s = summarize(out)
    t = {x["student"]: x for x in s["timed_out"]}
    assert sorted(t) == ["looper", "stuck"]
    assert t["looper"]["finished_points"] == 4.0 and t["stuck"]["finished_points"] == 2.0
    assert {q: v["finished"] for q, v in t["looper"]["questions"].items()} == {"q1": True, "q2": True, "q3": False}
    assert {q: v["finished"] for q, v in t["stuck"]["questions"].items()} == {"q1": True, "q2": False, "q3": False}
    assert t["stuck"]["stopped"] == "notebook time limit reached during cell q2" and t["looper"]["stopped"] == "cell q3 hit the cell time limit"
    assert s["identical"] == [["untouched", "untouched_copy"]] and s["source_copies"] == ["looper", "stuck", "teacher"]
    assert {x["id"]: x["full"] for x in s["questions"]} == {"q1": 3, "q2": 2, "q3": 1}
    assert res.summary == out / "summary.md"
    md = res.summary.read_text()
    assert "| looper | 4 / 5 | q1 (2/2), q2 (2/2) | q3 |" in md and "| stuck | 2 / 5 | q1 (2/2) | q2, q3 |" in md
    fb = json.loads((out / "feedback" / "untouched.json").read_text())
    assert next(r for r in res.rows if r["student"] == "untouched")["timestamp"] == fb["graded_at"]
    assert all(q["feedback"].startswith(f"{qid}:") for qid, q in fb["questions"].items())
    assert (out / "summary.png").is_file()


def test_the_lab02_class_script_builds_its_mixed_class(tmp_path):
    """scripts/lab02_class.py (the ≥ 20-notebook class of issue #33) builds: 21 notebooks, the wrong families
    differ from each seed's drawn fault, the copies are byte-identical, and it refuses a non-empty folder."""
    import importlib.util

    from labkit.teaching.faults import _fault_of

    spec = importlib.util.spec_from_file_location("lab02_class", Path(__file__).resolve().parents[1] / "scripts" / "lab02_class.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    paths = mod.build(tmp_path / "class")
    names = sorted(p.stem for p in paths)
    assert len(names) == 21 and sum(n.startswith("honest_s") for n in names) == 9
    for s in range(9, 13):
        q3 = next(c for c in nbformat.read(tmp_path / "class" / f"wrongfam_s{s}.ipynb", 4).cells
                  if (c.get("metadata", {}).get("labkit") or {}).get("id") == "q3")
        wrong = q3.source.rsplit("family=", 1)[1].split(")")[0].strip("'\"")
        assert wrong != _fault_of(s)[0].family
    for s in (1, 2):
        assert (tmp_path / "class" / f"copy_of_honest_s{s}.ipynb").read_bytes() == \
            (tmp_path / "class" / f"honest_s{s}.ipynb").read_bytes()
    with pytest.raises(SystemExit, match="not empty"):
        mod.build(tmp_path / "class")
