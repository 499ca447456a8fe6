"""The grader against submissions that misbehave (tests/adversarial/, built from the mini lab).

Every submission must be graded for what it really did, the batch must never stop, no process may
outlive it, and a batch killed midway must resume into a complete gradebook without duplicates.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from labkit.teaching.grading import Limits
from labkit.teaching.grading.batch import GradeConfig, grade

HERE = Path(__file__).resolve().parent / "adversarial"
LAB = HERE / "mini_lab"
EXPECTED = {k: v for k, v in json.loads((HERE / "expected.json").read_text()).items() if not k.startswith("_")}
# cell_s: long enough for mini_lab's q3 (2 gloo ranks) on a loaded machine — at cell_s=12 a fresh clone's suite
# beside eight busy helpers (load ≈ 30) timed q3 out after hung_rank's hang and graded it 0
LIMITS = Limits(notebook_s=120, cell_s=25, cpu_s=300, fsize_mb=64, output_mb=1)


def _leftovers(root: Path) -> list[str]:
    """Processes still running inside the grading folder (a hung rank or kernel that escaped)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if str(root) in (p.cwd() or "") and p.pid != os.getpid():
                found.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}")
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
def test_corpus_is_graded_as_expected(tmp_path, calibrated_peaks):
    subs = sorted(HERE / f"{name}.ipynb" for name in EXPECTED)
    res = grade(LAB, subs, tmp_path / "out", GradeConfig(limits=LIMITS, workers=2, progress=False))
    assert not res.failed, res.failed
    got = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "out" / "feedback").glob("*.json")}
    assert set(got) == set(EXPECTED)
    for name, want in EXPECTED.items():
        fb = got[name]
        assert fb["status"] == want["status"], (name, fb["status"], fb["notes"])
        assert fb["score"] == want["score"], (name, fb["score"], {q: v["feedback"] for q, v in fb["questions"].items()})
        assert {q: v["score"] for q, v in fb["questions"].items()} == want["questions"], name
        if "note" in want:
            assert any(want["note"] in n for n in fb["notes"]), (name, fb["notes"])
        if "timed_out" in want:
            assert fb["execution"]["cells_timed_out"] >= want["timed_out"], (name, fb["execution"])
    # forged "passed" lines are in the executed notebook, and changed nothing
    assert "all checks passed: 5/5" in (tmp_path / "out" / "executed" / "forged_output.ipynb").read_text()
    # the flood was cut: the executed notebook stays near the output limit
    assert (tmp_path / "out" / "executed" / "huge_output.ipynb").stat().st_size < 3 * 2**20
    with open(res.gradebook) as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["student"] for r in rows) == sorted(EXPECTED)
    assert list(rows[0])[:5] == ["student", "lab", "timestamp", "score", "max_score"]
    assert _leftovers(tmp_path) == []


def test_corpus_files_match_their_builder(tmp_path):
    sys.path.insert(0, str(HERE))
    try:
        import build_corpus
    finally:
        sys.path.remove(str(HERE))
    import nbformat

    for name, nb in {**build_corpus.corpus(), **build_corpus.real_lab_corpus()}.items():
        assert (HERE / f"{name}.ipynb").read_text() == nbformat.writes(nb) + "\n", \
            f"{name}.ipynb is stale: run .venv/bin/python tests/adversarial/build_corpus.py"


@pytest.mark.slow
def test_killed_batch_resumes_without_duplicates(tmp_path, calibrated_peaks):
    subs = tmp_path / "subs"
    subs.mkdir()
    names = ["exception", "sys_exit", "deleted_cells", "forged_output", "kernel_death"]
    for n in names:
        shutil.copy(HERE / f"{n}.ipynb", subs / f"{n}.ipynb")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "labkit", "grade", str(LAB), str(subs), "--out", str(out), "--workers", "2",
           "--cell-timeout", "12", "--timeout", "90", "--no-progress"]
    from labkit.teaching.grading.isolation import isolation

    caged = isolation()[0] is not None
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def its_cages():
        """This grader's cages' upper layers (made by its process: the batch's workers are its threads), not the
        cages of a test grading beside it."""
        return [p for p in Path(tempfile.gettempdir()).glob("labkit-cage-*")
                if (p / ".labkit-scratch-owner").is_file()
                and (p / ".labkit-scratch-owner").read_text().split()[0] == str(proc.pid)]

    deadline = time.monotonic() + 120
    # kill once a submission is graded and (where submissions are caged) another is inside its cage: the batch is
    # frozen (SIGSTOP) while its cages are looked at, so none goes between the look and the kill
    while time.monotonic() < deadline:
        if list((out / "feedback").glob("*.json")):
            os.killpg(proc.pid, signal.SIGSTOP)
            if its_cages() or not caged:
                break
            os.killpg(proc.pid, signal.SIGCONT)
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)   # the grader dies mid-batch (its executors notice and stop)
    proc.wait()
    scratch = its_cages()                  # left behind by the killed grader
    assert scratch or not caged, "no cage of the killed grader was left: the sweep below would check nothing"
    done_before = {p.stem for p in (out / "feedback").glob("*.json")}
    assert 1 <= len(done_before) < len(names)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"skipped (already graded) {len(done_before)}" in r.stdout
    assert not [p for p in scratch if p.exists()]      # the resumed batch removed what the killed grader left
    with open(out / "gradebook.csv") as f:
        rows = list(csv.DictReader(f))
    students = [row["student"] for row in rows]
    assert sorted(students) == sorted(names) and len(set(students)) == len(students)
    assert all(float(row["score"]) <= float(row["max_score"]) for row in rows)
    # a third run changes nothing and duplicates nothing
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert f"skipped (already graded) {len(names)}" in r.stdout
    with open(out / "gradebook.csv") as f:
        assert len(list(csv.DictReader(f))) == len(names)
    time.sleep(1.0)  # executors orphaned by the kill poll their parent every 0.5 s
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
def test_notebook_deadline_stops_a_sleeping_submission(tmp_path):
    from labkit.teaching.grading import learner_notebook, load_lab

    lab = load_lab(LAB)
    nb = learner_notebook(lab)
    inst = {c.get("id"): c for c in lab.notebook().cells}
    import nbformat
    from nbformat.v4 import new_code_cell

    i = next(k for k, c in enumerate(nb.cells) if c.get("id") == "q1")
    nb.cells[i] = inst["q1"]
    nb.cells.insert(i + 1, new_code_cell("import time\ntime.sleep(600)"))
    sub = tmp_path / "sleeper.ipynb"
    nbformat.write(nb, sub)
    # notebook_s: room for the kernel to start and q1 to run on a loaded machine (at 8 s, load ≈ 30 cut q1 too),
    # far below the 600 s sleep the deadline must stop
    lim = Limits(notebook_s=30, cell_s=300, cpu_s=120, fsize_mb=64)
    t0 = time.monotonic()
    res = grade(LAB, [sub], tmp_path / "out", GradeConfig(limits=lim, progress=False))
    assert time.monotonic() - t0 < 150
    fb = json.loads((tmp_path / "out" / "feedback" / "sleeper.json").read_text())
    assert fb["execution"]["deadline_hit"] is True
    assert fb["questions"]["q1"]["score"] == 2 and fb["score"] == 2
    assert res.rows[0]["score"] == 2


@pytest.mark.slow
def test_on_disk_tampering_is_flagged_not_graded(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell

    from labkit.teaching.grading import learner_notebook, load_lab

    protected = tmp_path / "protected"
    protected.mkdir()
    (protected / "checks.py").write_text("OK = True\n")
    nb = learner_notebook(load_lab(LAB))
    nb.cells.append(new_code_cell(f"open({str(protected / 'checks.py')!r}, 'w').write('OK = False  # tampered')"))
    sub = tmp_path / "tamper.ipynb"
    nbformat.write(nb, sub)
    cfg = GradeConfig(limits=LIMITS, protect=(str(protected),), progress=False)
    res = grade(LAB, [sub], tmp_path / "out", cfg)
    fb = json.loads((tmp_path / "out" / "feedback" / "tamper.json").read_text())
    from labkit.teaching.grading.isolation import isolation

    if isolation()[0] is None:     # not caged: the file really changed, nothing is graded until it is restored
        assert res.failed == ["tamper"] and res.rows == []
        assert fb["status"] == "labkit-modified" and fb["complete"] is False
    else:                          # caged: the write landed in the overlay; this submission alone is tampered
        assert (protected / "checks.py").read_text() == "OK = True\n"
        assert res.failed == [] and fb["status"] == "tampered" and fb["score"] == 0
        assert fb["tampered"] == [f"changed {protected / 'checks.py'}"]
