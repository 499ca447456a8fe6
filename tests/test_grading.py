"""Unit tests of labkit.teaching.grading: the lab format, release, evidence, hidden checks, gradebook, CLI."""
from __future__ import annotations

import ast
import csv
import json
import os
from pathlib import Path

import nbformat
import pytest
from _labs import write_lab  # tests/_labs.py: shared with tests/test_grading_sandbox.py

from labkit.cli import main as cli
from labkit.teaching.grading import (
    CheckFailed,
    Evidence,
    EvidenceBook,
    Limits,
    learner_notebook,
    load_lab,
    release,
)
from labkit.teaching.grading.batch import GradeConfig, _complete, collect, grade, student_of, write_gradebook
from labkit.teaching.grading.checker import run_checks
from labkit.teaching.grading.labfmt import PROMPT, strip_solutions

MINI = Path(__file__).resolve().parent / "adversarial" / "mini_lab"


def _lab(tmp_path, cells, name="toy") -> Path:
    d = tmp_path / name
    d.mkdir()
    return write_lab(d, cells)


ANS = ("x = None\n### BEGIN SOLUTION\nx = 1\n### END SOLUTION", {"id": "q1", "kind": "answer", "points": 1})
HID = ("### BEGIN HIDDEN CHECKS\nexpect(True, 'ok')\n### END HIDDEN CHECKS", {"id": "h1", "kind": "hidden",
                                                                             "question": "q1"})


# ---------------------------------------------------------------- lab format
def test_mini_lab_parses():
    lab = load_lab(MINI)
    assert lab.id == "mini_lab"
    assert [(q.id, q.points) for q in lab.questions] == [("q1", 2.0), ("q2", 2.0), ("q3", 1.0)]
    assert {c.question for c in lab.checks} == {"q1", "q2", "q3"}
    assert lab.max_score == 5.0
    assert [p.name for p in lab.support_files()] == ["minilab_ranks.py"]


@pytest.mark.parametrize("cells, message", [
    ([("### BEGIN SOLUTION\nx=1\n### END SOLUTION", None)], "no metadata.labkit id"),
    ([ANS, (ANS[0], ANS[1]), HID], "used by two cells"),
    ([("x = 1", {"id": "q1", "kind": "answer", "points": 1}), HID], "needs a ### BEGIN SOLUTION"),
    ([("### BEGIN SOLUTION\nx = 1", {"id": "q1", "kind": "answer", "points": 1}), HID], "never closed"),
    ([(ANS[0], {"id": "q1", "kind": "answer", "points": 0}), HID], "points > 0"),
    ([(ANS[0], {"id": "q1", "kind": "essay", "points": 1}), HID], "valid kinds"),
    ([ANS], "no hidden check"),
    ([ANS, ("print(1)\n" + HID[0], HID[1])], "must start with ### BEGIN HIDDEN CHECKS"),
    ([ANS, (HID[0], {"id": "h1", "kind": "hidden", "question": "q9"})], "refers to question 'q9'"),
])
def test_bad_labs_are_refused_with_the_cell_named(tmp_path, cells, message):
    with pytest.raises(ValueError, match=message):
        load_lab(_lab(tmp_path, cells))


def test_unknown_lab_id_lists_the_labs():
    with pytest.raises(ValueError, match="lab01_baseline"):
        load_lab("no_such_lab")


def test_strip_solutions_keeps_indentation_and_parses():
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n\ny = 2"
    out = strip_solutions(src)
    assert out == f"def f(x):\n    {PROMPT}\n\ny = 2"
    ast.parse(out)


def test_release_is_deterministic_and_hides_solutions(tmp_path):
    p1 = release(MINI, tmp_path / "a")
    p2 = release(MINI, tmp_path / "b")
    assert p1.read_bytes() == p2.read_bytes()
    assert (tmp_path / "a" / "mini_lab" / "minilab_ranks.py").is_file()
    text = p1.read_text()
    for secret in ("BEGIN SOLUTION", "HIDDEN CHECKS", "np.mean(x ** 2)", "evidence(\"q1\")"):
        assert secret not in text
    nb = nbformat.read(p1, as_version=4)
    ids = [c.metadata["labkit"]["id"] for c in nb.cells if "labkit" in c.metadata]
    assert ids == ["q1", "q1-check", "q2", "q2-check", "q3", "q3-check"]
    assert all(c.outputs == [] and c.execution_count is None for c in nb.cells if c.cell_type == "code")
    assert all("raises-exception" in c.metadata.get("tags", []) for c in nb.cells
               if c.metadata.get("labkit", {}).get("kind") == "check")
    for c in nb.cells:
        if c.cell_type == "code":
            ast.parse("\n".join(ln for ln in c.source.splitlines() if not ln.startswith("%")))


def test_released_real_labs_parse_and_hide_solutions(tmp_path):
    for lab in ("lab01_baseline", "lab02_profiler", "lab05_ddp", "lab09_collectives"):
        nb = learner_notebook(load_lab(lab))
        text = "\n".join(c.source for c in nb.cells)
        assert "BEGIN SOLUTION" not in text and "evidence(" not in text and PROMPT in text


# ---------------------------------------------------------------- evidence
def test_evidence_round_trip_and_file_verification(tmp_path):
    f = tmp_path / "trace.json"
    f.write_text('{"a": 1}')
    book = EvidenceBook("toy", root=tmp_path)
    saved = book.submit("q1", answer=0.5, files=[f], steps=3)
    assert repr(saved) == "q1: evidence saved (answered) as toy/q1.json" and str(tmp_path) not in repr(saved)
    assert os.fspath(saved) == str(saved.path) and saved.path.is_file()
    ev = Evidence.load("toy", "q1", root=tmp_path)
    assert ev.number() == 0.5 and ev.value("steps") == 3
    assert ev.files("*.json") == [f]
    f.write_text('{"a": 2}')  # changed after it was recorded
    with pytest.raises(CheckFailed, match="changed after the evidence was recorded"):
        ev.files()
    with pytest.raises(CheckFailed, match="lacks 'device'"):
        ev.value("device")


def test_a_failed_check_shows_one_message_in_jupyter_not_a_traceback():
    e = CheckFailed("q2: 123 is not 0.5 / MFU")
    shown = e._render_traceback_()      # IPython prints these lines instead of a traceback into labkit
    assert "q2: 123 is not 0.5 / MFU" in shown[0] and "labkit/grading" not in "".join(shown)


def test_evidence_refusals(tmp_path):
    book = EvidenceBook("toy", root=tmp_path)
    with pytest.raises(CheckFailed, match="no evidence recorded"):
        Evidence.load("toy", "q1", root=tmp_path)
    with pytest.raises(ValueError, match="question='q 1'"):
        book.submit("q 1", answer=1)
    with pytest.raises(FileNotFoundError, match="no such file"):
        book.submit("q1", files=[tmp_path / "missing"])
    with pytest.raises(ValueError, match="limit"):
        book.submit("q1", answer="x" * (5 * 2**20))
    book.submit("q1", answer=None)
    with pytest.raises(CheckFailed, match="not answered yet"):
        Evidence.load("toy", "q1", root=tmp_path).number()
    book.submit("q2", answer=float("nan"))
    with pytest.raises(CheckFailed, match="finite number"):
        Evidence.load("toy", "q2", root=tmp_path).number()


def test_checker_reports_pass_fail_error_and_timeout(tmp_path):
    EvidenceBook("toy", root=tmp_path).submit("q1", answer=3.0)
    checks = [
        {"id": "ok", "question": "q1", "weight": 1, "source": "expect(evidence('q1').number() == 3, 'bad')"},
        {"id": "fail", "question": "q1", "weight": 1, "source": "expect(close(evidence('q1').number(), 4), 'not 4')"},
        {"id": "err", "question": "q1", "weight": 1, "source": "evidence('q1').answer['key']"},
        {"id": "slow", "question": "q1", "weight": 1, "source": "while True:\n    pass"},
        {"id": "none", "question": "q2", "weight": 1, "source": "evidence('q2')"},
    ]
    res = {r["id"]: r for r in run_checks({"lab": "toy", "work_root": str(tmp_path), "checks": checks,
                                            "check_s": 1})}
    assert res["ok"]["passed"] and not res["fail"]["passed"] and res["fail"]["message"] == "not 4"
    assert "could not run" in res["err"]["message"] and "TypeError" in res["err"]["message"]
    assert "timed out" in res["slow"]["message"]
    assert "no evidence recorded" in res["none"]["message"]


# ---------------------------------------------------------------- batch pieces
def test_student_names_and_collection(tmp_path):
    assert student_of(Path("/x/alice.ipynb"), "lab01") == "alice"
    assert student_of(Path("/sub/bob/lab01/lab01.ipynb"), "lab01") == "bob"
    assert student_of(Path("/x/ca rol!.ipynb"), "lab01") == "ca_rol"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.ipynb").write_text("{}")
    (tmp_path / "a" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "a" / ".ipynb_checkpoints" / "x.ipynb").write_text("{}")
    assert [p.name for p in collect([tmp_path / "a"])] == ["x.ipynb"]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        collect([tmp_path / "nope"])
    with pytest.raises(ValueError, match="not a .ipynb"):
        (tmp_path / "n.txt").write_text("")
        collect([tmp_path / "n.txt"])


def test_gradebook_has_one_row_per_student_and_resume_rules(tmp_path):
    lab = load_lab(MINI)
    fbdir = tmp_path / "feedback"
    fbdir.mkdir()
    for s, score in (("ann", 5.0), ("ben", 2.0)):
        fb = {"student": s, "lab": "mini_lab", "timestamp": "t", "score": score, "max_score": 5.0,
              "status": "graded", "complete": True, "submission_sha256": "abc", "lab_sha256": lab.sha256,
              "grader_version": 1, "questions": {"q1": {"score": min(score, 2.0)}}}
        (fbdir / f"{s}.json").write_text(json.dumps(fb))
    (fbdir / "cat.json").write_text(json.dumps({"student": "cat", "lab": "mini_lab", "complete": False}))
    (fbdir / "bad.json").write_text("{truncated")
    path, rows = write_gradebook(lab, tmp_path)
    with open(path) as f:
        got = list(csv.DictReader(f))
    assert [r["student"] for r in got] == ["ann", "ben"]
    assert list(got[0]) == ["student", "lab", "timestamp", "score", "max_score", "q1", "q2", "q3", "status",
                            "source_copy", "file", "late", "replaced", "roster"]
    assert got[1]["q1"] == "2.0" and got[1]["q2"] == "0.0"
    assert _complete(fbdir / "ann.json", "abc", lab)
    assert not _complete(fbdir / "ann.json", "other-bytes", lab)
    assert not _complete(fbdir / "cat.json", "abc", lab) and not _complete(fbdir / "bad.json", "abc", lab)


def test_config_validation():
    from labkit.teaching.grading.sandbox import default_memory_mb

    assert Limits().memory_mb == default_memory_mb()
    assert Limits(memory_mb=None).memory_mb is None
    with pytest.raises(ValueError, match="cell_s"):
        Limits(cell_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=-1)
    with pytest.raises(ValueError, match="workers"):
        GradeConfig(workers=0)


def test_duplicate_student_names_are_refused(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "same.ipynb").write_text("{}")
    with pytest.raises(ValueError, match="two submissions map to student 'same'"):
        grade(MINI, [tmp_path / "a", tmp_path / "b"], tmp_path / "out", GradeConfig(progress=False))


# ---------------------------------------------------------------- CLI
def test_cli_release_and_bad_lab(tmp_path, capsys):
    assert cli(["release", str(MINI), "--out", str(tmp_path)]) == 0
    assert "3 questions, 5 points" in capsys.readouterr().out
    assert (tmp_path / "mini_lab" / "mini_lab.ipynb").is_file()
    assert cli(["release", "no_such_lab", "--out", str(tmp_path)]) == 2
    assert "not a lab id" in capsys.readouterr().err


@pytest.mark.slow
def test_mini_lab_instructor_full_marks_learner_zero(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)          # --out relative, as labs/README shows it (the executors run elsewhere)
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "teacher.ipynb").write_bytes((MINI / "mini_lab.ipynb").read_bytes())
    release(MINI, tmp_path / "rel")
    (subs / "learner.ipynb").write_bytes((tmp_path / "rel" / "mini_lab" / "mini_lab.ipynb").read_bytes())
    rc = cli(["grade", str(MINI), str(subs), "--out", "out", "--workers", "2",
              "--cell-timeout", "60", "--timeout", "120", "--no-progress"])
    assert rc == 0
    with open(tmp_path / "out" / "gradebook.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert float(rows["teacher"]["score"]) == 5.0
    assert float(rows["learner"]["score"]) == 0.0
    fb = json.loads((tmp_path / "out" / "feedback" / "learner.json").read_text())
    assert all("not answered yet" in q["feedback"] for q in fb["questions"].values())
    # the learner saw the visible checks fail with a specific message, and the run went on
    cells = {c["id"]: c for c in fb["execution"]["cells"] if c["id"]}
    assert cells["q1-check"]["error"]["ename"] == "CheckFailed"
    assert "not answered yet" in cells["q1-check"]["error"]["evalue"]
    assert os.path.exists(tmp_path / "out" / "executed" / "learner.ipynb")


def test_cpu_limit_is_watched_from_outside_so_cpu_clocks_stay_precise():
    """No RLIMIT_CPU in a submission (it makes time.process_time tick in 4 ms steps on HZ=250 kernels);
    the CPU budget is enforced by polling instead: a spinning process is stopped once it passes it."""
    import subprocess
    import sys
    import time

    from labkit.teaching.grading.sandbox import Limits, wait_within

    lim = Limits(cpu_s=1, fsize_mb=64, memory_mb=None)
    probe = subprocess.run([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_CPU))"],
                           preexec_fn=lim.preexec(), capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == str((resource_infinity := -1, resource_infinity))
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                            preexec_fn=lim.preexec())
    t0 = time.monotonic()
    rc, why = wait_within(spin, timeout=120, cpu_s=1)
    assert why == "cpu limit" and rc is not None and time.monotonic() - t0 < 60
    quick = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    assert wait_within(quick, timeout=60, cpu_s=1) == (0, None)


def test_every_labs_last_cell_says_what_is_left_to_do():
    """An untouched lab's Run All ends in one line that says what to do (issue #27), never a bare traceback
    from a None answer: the last code cell of every ready lab starts with a ``grading.expect`` guard."""
    from labkit import course
    for e in course.notebooks(ready_only=True):
        if e.kind != "lab":
            continue
        last = [c for c in nbformat.read(Path(__file__).resolve().parent.parent / e.path, as_version=4).cells
                if c.cell_type == "code"][-1]
        body = [ln for ln in last.source.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        assert body and body[0].startswith("grading.expect(") and "is not done" in last.source, e.id
