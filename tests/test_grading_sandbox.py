"""The instructor's material against the commands and the submissions that could destroy it (issue 37):
`release` never writes onto a source lab or a file it did not write, `--from` refuses a checkout, every
grading limit is finite and positive, a lab id names the course's lab first, an inherited `ulimit -v` is
respected, and a submission that writes to / deletes / renames an instructor file or signals the grader
is graded `tampered` while the rest of the batch is graded normally."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _labs import write_lab  # tests/_labs.py: the toy-lab builder of tests/test_grading.py

from labkit.cli import main as cli
from labkit.teaching.grading import Limits
from labkit.teaching.grading.batch import GradeConfig

MINI = Path(__file__).resolve().parent / "adversarial" / "mini_lab"


def _bytes_of(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _source(tmp_path) -> Path:
    """A copy of the mini lab's instructor source (the test may then try to destroy it)."""
    src = tmp_path / "src" / "mini_lab"
    shutil.copytree(MINI, src)
    return src


# ---------------------------------------------------------------- release never destroys a user's work
@pytest.mark.parametrize("out", ["parent", "lab", "inside"])
def test_release_onto_a_source_lab_folder_is_refused_and_changes_no_byte(tmp_path, capsys, out):
    src = _source(tmp_path)
    before = _bytes_of(tmp_path / "src")
    target = {"parent": src.parent, "lab": src, "inside": src / "sub"}[out]
    assert cli(["release", str(src), "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "instructor" in err and err.count("\n") == 1
    assert _bytes_of(tmp_path / "src") == before
    assert not (src / "sub").exists()


def test_release_onto_the_courses_labs_folder_is_refused(tmp_path, capsys):
    from labkit.paths import repo_root

    labs = repo_root() / "labs"
    before = _bytes_of(labs / "lab01_baseline")
    assert cli(["release", "lab01_baseline", "--out", str(labs)]) == 2
    assert "--out" in capsys.readouterr().err
    assert _bytes_of(labs / "lab01_baseline") == before


def test_release_overwrites_only_what_it_wrote(tmp_path, capsys):
    src = _source(tmp_path)
    out = tmp_path / "rel"
    import os

    old_mask = os.umask(0o077)
    try:
        assert cli(["release", str(src), "--out", str(out)]) == 0
    finally:
        os.umask(old_mask)
    assert all((p.stat().st_mode & 0o777) == (0o755 if p.is_dir() else 0o644) for p in out.rglob("*"))
    assert cli(["release", str(src), "--out", str(out)]) == 0          # a re-run: same bytes
    nb = out / "mini_lab" / "mini_lab.ipynb"
    # the source changed: the file release wrote is updated
    doc = json.loads((src / "mini_lab.ipynb").read_text())
    doc["cells"][0]["source"] = "# changed intro\n" + "".join(doc["cells"][0]["source"])
    (src / "mini_lab.ipynb").write_text(json.dumps(doc))
    assert cli(["release", str(src), "--out", str(out)]) == 0
    assert "# changed intro" in nb.read_text()
    capsys.readouterr()
    # a file the user wrote (or edited) is never overwritten
    nb.write_text("my own notes")
    helper = out / "mini_lab" / "minilab_ranks.py"
    assert cli(["release", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "did not write" in err and str(nb) in err
    assert nb.read_text() == "my own notes" and helper.is_file()
    other = tmp_path / "fresh"
    (other / "mini_lab").mkdir(parents=True)
    (other / "mini_lab" / "minilab_ranks.py").write_text("# mine")
    assert cli(["release", str(src), "--out", str(other)]) == 2
    assert (other / "mini_lab" / "minilab_ranks.py").read_text() == "# mine"
    assert not (other / "mini_lab" / "mini_lab.ipynb").exists()   # nothing written when one file is refused


def test_course_tree_onto_the_checkout_is_refused(capsys):
    from labkit.paths import repo_root

    before = _bytes_of(repo_root() / "labs" / "lab01_baseline")
    assert cli(["release", "--course-tree", str(repo_root())]) == 2
    assert "--course-tree" in capsys.readouterr().err
    assert _bytes_of(repo_root() / "labs" / "lab01_baseline") == before


@pytest.mark.parametrize("mark", [".git", "markers"])
def test_course_from_an_instructor_checkout_is_refused(tmp_path, capsys, mark):
    checkout = tmp_path / "checkout"
    shutil.copytree(MINI, checkout / "labs" / "mini_lab")   # solutions and hidden checks
    if mark == ".git":
        (checkout / ".git").mkdir()
    copy = tmp_path / "my-course"
    assert cli(["release", "--course", str(copy), "--from", str(checkout)]) == 2
    err = capsys.readouterr().err
    assert "--from" in err and ("checkout" in err if mark == ".git" else "solution" in err)
    assert not copy.exists()


# ---------------------------------------------------------------- limits
@pytest.mark.parametrize("option", ["--timeout", "--cell-timeout", "--check-timeout", "--output-mb"])
@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_every_grading_limit_is_finite_and_positive_by_name(tmp_path, capsys, option, value):
    sub = tmp_path / "s.ipynb"
    sub.write_bytes((MINI / "mini_lab.ipynb").read_bytes())
    assert cli(["grade", str(MINI), str(sub), "--out", str(tmp_path / "out"), option, value, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert option in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["notebook_s", "cell_s", "output_mb"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0, -1.0, True])
def test_limits_refuse_nan_inf_and_nonpositive(name, value):
    with pytest.raises(ValueError, match=name):
        Limits(**{name: value})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0, -1])
def test_check_timeout_refuses_nan_inf_and_nonpositive(value):
    with pytest.raises(ValueError, match="check_s"):
        GradeConfig(check_s=value)


# ---------------------------------------------------------------- lab ids
def test_a_lab_id_names_the_courses_lab_before_a_folder_of_that_name(tmp_path, monkeypatch, capsys):
    from labkit.paths import repo_root
    from labkit.teaching.grading import load_lab

    course_lab = load_lab(repo_root() / "labs" / "lab01_baseline" / "lab01_baseline.ipynb")
    decoy = tmp_path / "lab01_baseline"
    decoy.mkdir()
    shutil.copyfile(MINI / "mini_lab.ipynb", decoy / "lab01_baseline.ipynb")   # the mini lab: 5 points
    monkeypatch.chdir(tmp_path)
    assert cli(["release", "lab01_baseline", "--out", str(tmp_path / "rel")]) == 0
    assert f"{len(course_lab.questions)} questions, {course_lab.max_score:g} points" in capsys.readouterr().out
    released = (tmp_path / "rel" / "lab01_baseline" / "lab01_baseline.ipynb").read_text()
    assert "minilab" not in released and "BEGIN SOLUTION" not in released
    from labkit.cli.release import read_lab, resolve_lab

    assert read_lab(resolve_lab("lab01_baseline")).source == course_lab.source
    assert read_lab(resolve_lab("./lab01_baseline")).source == (decoy / "lab01_baseline.ipynb").resolve()


# ---------------------------------------------------------------- an inherited ulimit -v
def test_limits_are_clamped_to_an_inherited_hard_address_space_limit():
    code = """
import resource, signal, subprocess, sys
hard = 6 * 2**30
resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
from labkit.teaching.grading import Limits
lim, notes = Limits(memory_mb=8192).within_inherited()
print(lim.memory_mb, notes)
r = subprocess.run([sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[1])"],
                   preexec_fn=Limits(memory_mb=8192).preexec(None), capture_output=True, text=True)
print("child", r.returncode, r.stdout.strip(), r.stderr[-200:])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    first, child = r.stdout.strip().splitlines()
    assert first.startswith("6144 ") and "ulimit -v" in first
    assert child == f"child 0 {6 * 2**30}"


# ---------------------------------------------------------------- submissions against the instructor's files
def _toy_course(tmp_path) -> Path:
    """A fast lab (one question, evidence, a hidden check, a support file) in an instructor folder."""
    d = tmp_path / "course" / "toy"
    d.mkdir(parents=True)
    (d / "helper.py").write_text("VALUE = 1\n")
    return write_lab(d, [
        ("from labkit.teaching.grading import EvidenceBook\nfrom helper import VALUE", None),
        ("x = None\n### BEGIN SOLUTION\nx = VALUE\n### END SOLUTION\nEvidenceBook('toy').submit('q1', answer=x)",
         {"id": "q1", "kind": "answer", "points": 1}),
        ("### BEGIN HIDDEN CHECKS\nexpect(evidence('q1').number() == 1, 'not 1')\n### END HIDDEN CHECKS",
         {"id": "h1", "kind": "hidden", "question": "q1"})])


HOSTILE = {   # student -> a cell appended to the instructor's own (full-marks) notebook
    "writer": "open({lab!r} + '/toy.ipynb', 'a').write('tampered')",
    "deleter": "import os; os.remove({lab!r} + '/helper.py')",
    "renamer": "import os; os.rename({lab!r} + '/toy.ipynb', {lab!r} + '/toy.bak')",
    "forger": "open({out!r} + '/feedback/honest.json', 'w').write('{{}}'); open({out!r} + '/gradebook.csv', 'w')",
    "signaller": ("import os, signal, psutil\n"
                  "grader = [p for p in psutil.Process().parents() if 'grade' in p.cmdline()\n"
                  "          or any('labkit.teaching.grading' in t for t in p.cmdline())]\n"
                  "for sig in (signal.SIGTERM, signal.SIGKILL):\n"
                  "    for p in grader:\n"
                  "        try:\n"
                  "            os.kill(p.pid, sig)\n"
                  "        except OSError:\n"
                  "            pass"),
}


@pytest.mark.slow
def test_a_submission_that_tampers_changes_nothing_but_its_own_grade(tmp_path):
    import nbformat
    import psutil
    from nbformat.v4 import new_code_cell

    from labkit.teaching.grading.isolation import isolation

    if isolation()[0] is None:
        pytest.skip(isolation()[1])
    lab = _toy_course(tmp_path)
    out = tmp_path / "out"
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copyfile(lab / "toy.ipynb", subs / "honest.ipynb")
    for name, cell in HOSTILE.items():
        nb = nbformat.read(lab / "toy.ipynb", as_version=4)
        nb.cells.append(new_code_cell(cell.format(lab=str(lab), out=str(out))))
        nbformat.write(nb, subs / f"{name}.ipynb")
    shutil.copyfile(subs / "honest.ipynb", subs / "zeta.ipynb")   # graded last, after every hostile one
    before = _bytes_of(tmp_path / "course")
    # the grader is `labkit grade` in its own process, as on a hub: the signaller aims at it
    r = subprocess.run([sys.executable, "-m", "labkit", "grade", str(lab), str(subs), "--out", str(out),
                        "--workers", "2", "--no-progress", "--timeout", "120", "--cell-timeout", "60"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert _bytes_of(tmp_path / "course") == before
    fbs = {n: json.loads((out / "feedback" / f"{n}.json").read_text()) for n in ["honest", "zeta", *HOSTILE]}
    for n in ("honest", "zeta"):
        assert fbs[n]["status"] == "graded" and fbs[n]["score"] == 1, fbs[n]["notes"]
    for n in HOSTILE:
        assert fbs[n]["status"] == "tampered" and fbs[n]["score"] == 0, (n, fbs[n]["status"], fbs[n]["notes"])
        assert f"{n:<24}      0 / 1  tampered" in r.stdout
    assert any("toy.ipynb" in t for t in fbs["writer"]["tampered"])
    assert any("deleted or renamed" in t and "helper.py" in t for t in fbs["deleter"]["tampered"])
    assert any("deleted or renamed" in t and "toy.ipynb" in t for t in fbs["renamer"]["tampered"])
    assert any("gradebook.csv" in t for t in fbs["forger"]["tampered"])
    assert fbs["signaller"]["tampered"] == ["sent SIGTERM to the grader"]
    assert "signaller: tampered, graded 0: sent SIGTERM to the grader" in r.stdout
    with open(out / "gradebook.csv") as f:
        assert len(f.read().splitlines()) == 1 + 2 + len(HOSTILE)
    assert not [p for p in psutil.process_iter(["cwd"]) if str(tmp_path) in (p.info["cwd"] or "")]


@pytest.mark.slow
def test_grading_under_an_inherited_ulimit_v_runs_the_submissions(tmp_path):
    import resource

    lab = _toy_course(tmp_path)
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.copyfile(lab / "toy.ipynb", subs / "ann.ipynb")
    hard = 6 * 2**30          # below the grader's 8 GiB default, far above what the toy lab needs

    def lower():
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))

    r = subprocess.run([sys.executable, "-m", "labkit", "grade", str(lab), str(subs), "--out", str(tmp_path / "out"),
                        "--no-progress", "--memory-mb", "8192"], preexec_fn=lower, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, (r.stdout[-1500:], r.stderr[-1500:])
    assert "ulimit -v" in r.stderr and "6144 MiB" in r.stderr
    fb = json.loads((tmp_path / "out" / "feedback" / "ann.json").read_text())
    assert fb["status"] == "graded" and fb["score"] == 1, fb["notes"]
    assert any("ulimit -v" in n for n in fb["notes"])


@pytest.mark.parametrize("user_ns", [False, True], ids=["root", "user-namespace"])
def test_the_cage_walls_off_the_files_the_scratch_layer_and_the_grader(tmp_path, user_ns):
    import os

    from labkit.teaching.grading.isolation import Cage, _unshare, isolation, probe

    if isolation()[0] is None or (not user_ns and os.geteuid() != 0) or probe(user_ns):
        pytest.skip(f"no cage of this kind here: {isolation()[1]}")
    lower = tmp_path / "a course, with: odd chars"    # overlayfs options split on ',' and ':'
    (lower / "work").mkdir(parents=True)
    (lower / "checks.py").write_text("OK = True\n")
    cage = Cage([lower], [lower / "work"], tmp_path / "scratch")
    code = f"""
import os, signal, subprocess
out = []
open('{lower}/checks.py', 'w').write('OK = False')
try:
    os.listdir('{tmp_path / "scratch"}')
    out.append('scratch visible')
except OSError:
    out.append('scratch hidden')
r = subprocess.run(['umount', '{lower}'], capture_output=True)
out.append('umount refused' if r.returncode else 'umount worked')
try:
    os.kill({os.getpid()}, signal.SIGTERM)
    out.append('signalled a process')
except OSError:
    out.append('no grader here')
open('{lower}/work/out.txt', 'w').write(' | '.join(out))
"""
    try:
        r = subprocess.run(cage.command(_unshare(user_ns), [sys.executable, "-c", code], lower / "work"),
                           capture_output=True, text=True, timeout=60)
        touched = cage.touched()
    finally:
        cage.remove()
    assert r.returncode == 0, r.stderr[-1000:]
    said = (lower / "work" / "out.txt").read_text()
    assert said == "scratch hidden | umount refused | no grader here", said
    assert (lower / "checks.py").read_text() == "OK = True\n"
    assert touched == [f"changed {lower / 'checks.py'}"]
    assert not (tmp_path / "scratch").exists()
