"""The instructor's workflow around `labkit grade`: LMS export names and rosters, late uploads, learner
feedback with or without the correct values, the instructor-copy column, interrupted --force runs,
sharding and merging, and a `kill -9` of the grader that must leave no process behind."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main as cli
from labkit.teaching.grading import EvidenceBook, learner_notebook, load_lab
from labkit.teaching.grading import batch as batch_mod
from labkit.teaching.grading.batch import GradeConfig, grade, read_pending
from labkit.teaching.grading.checker import run_checks
from labkit.teaching.grading.evidence import sha256_file
from labkit.teaching.grading.feedback import render, withhold
from labkit.teaching.grading.gradebook import merge
from labkit.teaching.grading.labfmt import source_copy
from labkit.teaching.grading.students import Roster, origin_of, parse_shard, resolve, shard_of

MINI = Path(__file__).resolve().parent / "adversarial" / "mini_lab"
LAB = "lab01_baseline"
CANVAS = "bergana_12345_678901_lab01_baseline.ipynb"
CANVAS_LATE = "bergana_LATE_12345_678955_lab01_baseline-1.ipynb"
MOODLE = "Ben Okafor_1235_assignsubmission_file_lab01_baseline.ipynb"
MOODLE_DIR = "Cai_Lin_1236_assignsubmission_file/lab01_baseline.ipynb"
ROSTER = """student_id,name,login,canvas_id,moodle_id
s001,Ana Berg,aberg,12345,1234
s002,Ben Okafor,bokafor,,1235
s003,Cai Lin,clin,,1236
s004,Dee Ray,dray,,
"""


def _touch(root: Path, rel: str, mtime: float | None = None) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("{}")
    if mtime is not None:
        os.utime(p, (mtime, mtime))
    return p


# ---------------------------------------------------------------- students
def test_lms_export_names_are_parsed():
    o = origin_of(Path(CANVAS), LAB)
    assert (o.source, o.key, o.name, o.attempt, o.late) == ("canvas", "12345", "bergana", 0, False)
    o = origin_of(Path(CANVAS_LATE), LAB)
    assert (o.source, o.key, o.attempt, o.late) == ("canvas", "12345", 1, True)
    o = origin_of(Path(MOODLE), LAB)
    assert (o.source, o.key, o.name) == ("moodle", "1235", "Ben Okafor")
    o = origin_of(Path("/x") / MOODLE_DIR, LAB)
    assert (o.source, o.key, o.name) == ("moodle", "1236", "Cai_Lin")
    assert origin_of(Path(f"/sub/bob/{LAB}/{LAB}.ipynb"), LAB).key == "bob"      # nbgrader
    assert origin_of(Path("/x/alice.ipynb"), LAB).key == "alice"


def test_without_a_roster_ids_are_the_lms_names(tmp_path):
    paths = [_touch(tmp_path, n) for n in (CANVAS, MOODLE, MOODLE_DIR)]
    assert list(resolve(paths, LAB)) == ["Ben_Okafor", "Cai_Lin", "bergana"]


def test_roster_maps_canvas_and_moodle_names_and_lists_strangers(tmp_path):
    (tmp_path / "roster.csv").write_text(ROSTER)
    roster = Roster.load(tmp_path / "roster.csv")
    paths = [_touch(tmp_path, n) for n in (CANVAS, MOODLE, MOODLE_DIR, "zed_99999_1_lab01_baseline.ipynb")]
    got = resolve(paths, LAB, roster)
    assert {k: v.path.name for k, v in got.items()} == {
        "s001": CANVAS, "s002": MOODLE, "s003": "lab01_baseline.ipynb", "zed": "zed_99999_1_lab01_baseline.ipynb"}
    assert [k for k, v in got.items() if v.in_roster is False] == ["zed"]
    assert got["zed"].info()["roster"] == "not in roster" and got["s001"].info()["roster"] == "matched"


def test_late_upload_replaces_the_earlier_one_and_is_noted(tmp_path):
    now = time.time()
    late = _touch(tmp_path, CANVAS_LATE, mtime=now - 100)       # an older mtime: the -1 suffix still wins
    first = _touch(tmp_path, CANVAS, mtime=now)
    got = resolve([first, late], LAB)
    st = got["bergana"]
    assert st.path == late and st.replaced == [first]
    assert st.info() == {"file": CANVAS_LATE, "source": "canvas", "lms_id": "12345", "late": True,
                         "replaced": [CANVAS], "roster": ""}
    # without a suffix the newer file wins (two Moodle uploads of one participant)
    a = _touch(tmp_path / "m", "Ana Berg_1234_assignsubmission_file_old.ipynb", mtime=now - 50)
    b = _touch(tmp_path / "m", "Ana Berg_1234_assignsubmission_file_new.ipynb", mtime=now)
    assert resolve([b, a], LAB)["Ana_Berg"].path == b


def test_two_accounts_on_one_student_is_an_error_naming_both(tmp_path):
    (tmp_path / "roster.csv").write_text(ROSTER)
    canvas = _touch(tmp_path, CANVAS)
    moodle = _touch(tmp_path, "Ana Berg_1234_assignsubmission_file_lab01_baseline.ipynb")
    with pytest.raises(ValueError, match="two submissions map to student 's001'") as e:
        resolve([canvas, moodle], LAB, Roster.load(tmp_path / "roster.csv"))
    assert str(canvas) in str(e.value) and str(moodle) in str(e.value)


@pytest.mark.parametrize("text, message", [
    ("id,name\nx,y\n", "column='id' is not valid"),
    ("name\nAna\n", "no student_id column"),
    ("student_id,name\ns1,A\ns1,B\n", "'s1' appears twice"),
    ("student_id,canvas_id\ns1,5\ns2,5\n", "canvas '5' belongs to two students"),
    ("student_id\nno way\n", "student_id='no way'"),
    ("student_id\n", "lists no students"),
])
def test_bad_rosters_are_refused_with_the_value_named(tmp_path, text, message):
    (tmp_path / "r.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        Roster.load(tmp_path / "r.csv")
    with pytest.raises(FileNotFoundError, match="roster .* does not exist"):
        Roster.load(tmp_path / "nope.csv")


def test_shards_partition_the_sorted_students():
    ids = [f"s{i:02d}" for i in range(11)][::-1]
    parts = [shard_of(ids, (i, 3)) for i in (1, 2, 3)]
    assert sorted(sum(parts, [])) == sorted(ids) and all(len(p) in (3, 4) for p in parts)
    assert parts[0][:2] == ["s00", "s03"] and shard_of(ids, None) == sorted(ids)
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/2", "3/2", "1", "a/b", "1/0"):
        with pytest.raises(ValueError, match=f"shard='{bad}' is not valid: use i/N"):
            parse_shard(bad)
    with pytest.raises(ValueError, match="feedback_values='maybe'"):
        GradeConfig(feedback_values="maybe")


# ---------------------------------------------------------------- feedback
def test_withheld_values_keep_the_learners_own_numbers():
    msg = "q2: 123 is not 0.5 / MFU = 3.374 for the saved run"
    assert withhold(msg, [123.0]) == "q2: 123 is not [hidden] / MFU = [hidden] for the saved run"
    assert withhold("q3: share 0.412 vs (0.380); x**2", [0.41234]) == "q3: share 0.412 vs ([hidden]); x**2"
    assert withhold(msg, [123, 0.5, 3.3741]) == msg


def test_checker_records_the_message_and_its_learner_version(tmp_path):
    EvidenceBook("toy", root=tmp_path).submit("q2", answer=123.0, steps=16)
    chk = {"id": "h", "question": "q2", "weight": 1,
           "source": "a = evidence('q2').number()\nexpect(False, f'q2: {a:.4g} is not 0.5 / MFU = {0.5/0.1482:.4g}')"}
    (res,) = run_checks({"lab": "toy", "work_root": str(tmp_path), "checks": [chk], "check_s": 5})
    assert res["message"] == "q2: 123 is not 0.5 / MFU = 3.374"
    assert res["learner_message"] == "q2: 123 is not [hidden] / MFU = [hidden]"


def test_markdown_feedback_shows_or_hides_values():
    check = {"id": "h", "passed": False, "message": "q2: 123 is not 0.5 / MFU = 3.374",
             "learner_message": "q2: 123 is not [hidden] / MFU = [hidden]"}
    fb = {"student": "s001", "lab": "mini_lab", "score": 2.0, "max_score": 4.0, "status": "graded",
          "questions": {"q1": {"score": 2.0, "max_score": 2.0, "checks": [{"id": "o", "passed": True}]},
                        "q2": {"score": 0.0, "max_score": 2.0, "checks": [check]}},
          "notes": ["cells deleted (by id): q3"],
          "submitted_as": {"file": CANVAS_LATE, "late": True, "replaced": [CANVAS]}}
    hidden, shown = render(fb, "hide"), render(fb, "show")
    assert "**Score: 2 / 4**" in hidden and "| q1 | 2 / 2 | all checks passed |" in hidden
    assert "3.374" not in hidden and "q2: 123 is not [hidden] / MFU = [hidden]" in hidden
    assert "q2: 123 is not 0.5 / MFU = 3.374" in shown and "[hidden]" not in shown
    assert f"`{CANVAS_LATE}` (late)" in hidden and f"`{CANVAS}`" in hidden and "cells deleted" in hidden
    with pytest.raises(ValueError, match="feedback_values='all'"):
        render(fb, "all")


def test_instructor_copies_are_recognised():
    lab = load_lab(MINI)
    assert source_copy(lab, lab.notebook()) == "identical"
    learner = learner_notebook(lab)
    assert source_copy(lab, learner) == ""
    learner.cells.append(nbformat.v4.new_code_cell("### BEGIN HIDDEN CHECKS\npass\n### END HIDDEN CHECKS"))
    assert source_copy(lab, learner) == "solutions"


# ---------------------------------------------------------------- the batch, with a stand-in grader
def _fake_grade_one(calls):
    def grade_one(lab, sub, student, out, cfg):
        calls.append(student)
        pending = read_pending(Path(out), lab)
        return {"student": student, "lab": lab.id, "timestamp": "t", "score": 1.0, "max_score": lab.max_score,
                "submission_sha256": sha256_file(sub), "lab_sha256": lab.sha256,
                "grader_version": batch_mod.GRADER_VERSION, "status": "graded", "complete": True, "notes": [],
                "source_copy": "", "pending_seen": sorted(pending),
                "questions": {q.id: {"score": 1.0 if q.id == "q1" else 0.0, "max_score": q.points,
                                     "checks": [{"id": "h", "passed": q.id == "q1", "message": "q2: 7 is not 0.25",
                                                 "learner_message": "q2: 7 is not [hidden]"}]}
                              for q in lab.questions}}
    return grade_one


def test_batch_with_roster_late_upload_feedback_and_pending(tmp_path, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(batch_mod, "grade_one", _fake_grade_one(calls))
    subs = tmp_path / "subs"
    now = time.time()
    for name, t in ((CANVAS, now - 10), (CANVAS_LATE, now), (MOODLE, now), ("zed_99999_1_mini_lab.ipynb", now)):
        _touch(subs, name, mtime=t)
    (tmp_path / "roster.csv").write_text(ROSTER)
    out = tmp_path / "out"
    cfg = GradeConfig(progress=False, roster=str(tmp_path / "roster.csv"))
    res = grade(MINI, [subs], out, cfg)
    assert res.graded == ["s001", "s002", "zed"] and res.unmatched == ["zed"] and res.missing == ["s003", "s004"]
    assert res.replaced == {"s001": [CANVAS]}
    with open(res.gradebook) as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert rows["s001"]["file"] == CANVAS_LATE and rows["s001"]["late"] == "yes" and rows["s001"]["replaced"] == CANVAS
    assert rows["zed"]["roster"] == "not in roster" and rows["s002"]["roster"] == "matched"
    md = (out / "feedback" / "s001.md").read_text()
    assert "q2: 7 is not [hidden]" in md and "0.25" not in md
    # a --force run lists everyone as pending before grading the first, and strikes each off when done
    calls.clear()
    res = grade(MINI, [subs], out, GradeConfig(progress=False, roster=cfg.roster, force=True))
    assert calls == ["s001", "s002", "zed"] and not (out / ".pending-mini_lab.json").exists()
    assert json.loads((out / "feedback" / "s001.json").read_text())["pending_seen"] == ["s001", "s002", "zed"]
    # as if that run had been killed after s001: s002 is still pending, so a plain re-run regrades it
    (out / ".pending-mini_lab.json").write_text(json.dumps({"lab": "mini_lab", "students": ["s002"]}))
    calls.clear()
    res = grade(MINI, [subs], out, GradeConfig(progress=False, roster=cfg.roster, feedback_values="show"))
    assert calls == ["s002"] and res.skipped == ["s001", "zed"] and not (out / ".pending-mini_lab.json").exists()
    assert "q2: 7 is not 0.25" in (out / "feedback" / "s001.md").read_text()   # skipped, but re-rendered


def test_shards_merged_equal_one_unsharded_run_fast(tmp_path, monkeypatch):
    monkeypatch.setattr(batch_mod, "grade_one", _fake_grade_one([]))
    subs = tmp_path / "subs"
    for n in ("ann", "ben", "cat", "dan", "eve"):
        _touch(subs, f"{n}.ipynb", mtime=1_700_000_000)
    whole = grade(MINI, [subs], tmp_path / "all", GradeConfig(progress=False)).gradebook
    for i in (1, 2):
        grade(MINI, [subs], tmp_path / f"s{i}", GradeConfig(progress=False, shard=f"{i}/2"))
    assert cli(["grade-merge", str(tmp_path / "merged.csv"), str(tmp_path / "s1"), str(tmp_path / "s2")]) == 0
    assert _rows(tmp_path / "merged.csv") == _rows(whole)
    # the merge never overwrites a gradebook unless told, and refuses a student graded twice
    with pytest.raises(FileExistsError, match="merged.csv exists"):
        merge(tmp_path / "merged.csv", [tmp_path / "s1"])
    with pytest.raises(ValueError, match="student 'ann' is in two gradebooks"):
        merge(tmp_path / "m2.csv", [tmp_path / "s1", tmp_path / "all"])
    (tmp_path / "other.csv").write_text("student,lab,timestamp,score,max_score,qX\n")
    with pytest.raises(ValueError, match="columns .* differ"):
        merge(tmp_path / "m3.csv", [tmp_path / "s1", tmp_path / "other.csv"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        merge(tmp_path / "m4.csv", [tmp_path / "nowhere"])


# ---------------------------------------------------------------- real runs of the mini lab
def _rows(path: Path) -> list[dict]:
    """The gradebook's rows without ``timestamp``: each row's own grading time differs from run to run."""
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if k != "timestamp"} for r in csv.DictReader(f)]


@pytest.mark.slow
def test_shards_merged_equal_one_unsharded_run(tmp_path):
    """Real grading of the mini lab: the instructor's copy and the learner version, 1/2 + 2/2 + merge."""
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "teacher.ipynb").write_bytes((MINI / "mini_lab.ipynb").read_bytes())
    nbformat.write(learner_notebook(load_lab(MINI)), subs / "learner.ipynb")
    common = ["--cell-timeout", "60", "--timeout", "120", "--no-progress"]
    assert cli(["grade", str(MINI), str(subs), "--out", str(tmp_path / "all"), *common]) == 0
    for i in (1, 2):
        assert cli(["grade", str(MINI), str(subs), "--out", str(tmp_path / f"s{i}"), "--shard", f"{i}/2", *common]) == 0
    assert cli(["grade-merge", str(tmp_path / "merged.csv"), str(tmp_path / "s1"), str(tmp_path / "s2")]) == 0
    assert _rows(tmp_path / "merged.csv") == _rows(tmp_path / "all" / "gradebook.csv")
    with open(tmp_path / "merged.csv") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    assert rows["teacher"]["source_copy"] == "identical" and float(rows["teacher"]["score"]) == 5.0
    assert rows["learner"]["source_copy"] == "" and float(rows["learner"]["score"]) == 0.0
    assert "not answered yet" in (tmp_path / "s1" / "feedback" / "learner.md").read_text()


def _cmdline(p) -> list[str]:
    import psutil

    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _alive(pids) -> list[int]:
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("when", ["labkit.teaching.grading.executor", "ipykernel"])
def test_kill_9_of_a_forced_run_leaves_no_process_and_the_rerun_regrades(tmp_path, monkeypatch, when):
    """``kill -9`` of the grader as soon as its executor starts (while it still imports papermill) and
    once the kernel runs: neither the executor nor the kernel nor a rank may survive it."""
    import psutil

    subs = tmp_path / "subs"
    subs.mkdir()
    sub = subs / "teacher.ipynb"
    sub.write_bytes((MINI / "mini_lab.ipynb").read_bytes())
    lab = load_lab(MINI)
    out = tmp_path / "out"
    (out / "feedback").mkdir(parents=True)
    old = {"student": "teacher", "lab": lab.id, "complete": True, "submission_sha256": sha256_file(sub),
           "lab_sha256": lab.sha256, "grader_version": batch_mod.GRADER_VERSION, "score": 0.0, "status": "graded"}
    (out / "feedback" / "teacher.json").write_text(json.dumps(old))     # graded before, with the old grade
    cmd = [sys.executable, "-m", "labkit", "grade", str(MINI), str(subs), "--out", str(out), "--force",
           "--cell-timeout", "60", "--timeout", "120", "--no-progress"]
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: set[int] = set()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            kids = psutil.Process(proc.pid).children(recursive=True)
            seen |= {k.pid for k in kids}
            if any(when in " ".join(_cmdline(k)) for k in kids):
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"no {when} process started within 120 s")
        seen |= {k.pid for k in psutil.Process(proc.pid).children(recursive=True)}
    finally:
        os.kill(proc.pid, signal.SIGKILL)          # kill -9 of the grader only
        proc.wait()
    t0 = time.monotonic()
    while _alive(seen) and time.monotonic() - t0 < 10:
        time.sleep(0.2)
    assert _alive(seen) == [], [" ".join(psutil.Process(p).cmdline())[:120] for p in _alive(seen)]
    assert read_pending(out, lab) == {"teacher"}
    # the re-run, without --force, regrades what the killed run had been forced to regrade
    calls: list[str] = []
    monkeypatch.setattr(batch_mod, "grade_one", _fake_grade_one(calls))
    res = grade(MINI, [subs], out, GradeConfig(progress=False))
    assert calls == ["teacher"] and res.graded == ["teacher"] and read_pending(out, lab) == set()
