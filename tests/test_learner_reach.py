"""Solutions never reach learners (issue #27, item 1), and the learner's work is theirs (item 5).

Walks what a learner's server can reach — the released course tree `make course` serves, the hub image's
learner paths (the Dockerfile's stages emulated file by file: no container daemon on CI) — and fails on any
solution or hidden-check marker or hidden-check code. Before the fix, `make course` served the repository
root (the index's lab links opened the instructor sources) and the hub image copied the whole repository,
labs/ included: both walks found every lab's solutions.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import nbformat
import pytest
from _makefile import lab_flags

from labkit import course
from labkit.paths import repo_root
from labkit.teaching.grading.course_copy import leaks, release_course, sync_copy, update_name

ROOT = repo_root()
LABS = [e for e in course.notebooks(kind="lab", ready_only=True)]


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    return release_course(tmp_path_factory.mktemp("course") / "tree")


def test_the_walk_finds_solutions_where_they_are(tmp_path):
    """The detector itself: the instructor sources and a learner version with one hidden check's code pasted
    in are caught (a check that cannot fail is a defect)."""
    for e in LABS:
        shutil.copy(ROOT / e.path, tmp_path / f"{e.id}.ipynb")
    assert len(leaks(tmp_path)) == len(LABS)
    from labkit.teaching.grading import learner_notebook, load_lab

    lab = load_lab("lab02_profiler")
    nb = learner_notebook(lab)
    nb.cells.append(nbformat.v4.new_code_cell(lab.checks[-1].source))
    clean = tmp_path / "clean"
    clean.mkdir()
    nbformat.write(nb, clean / "pasted.ipynb")
    assert [f for f in leaks(clean) if "code of a hidden check" in f]


def test_the_released_course_links_to_released_labs_and_holds_no_solution(released):
    assert leaks(released) == []
    index = released / "chapters" / "index.ipynb"
    assert index.is_file()
    text = index.read_text()
    for e in LABS:     # the index's link to each lab (../labs/<id>/<id>.ipynb) opens the learner version
        target = (index.parent / ("../" + e.path)).resolve()
        assert target.is_file(), f"the index's link to {e.id} opens nothing in the released course"
        nb = json.loads(target.read_text())
        assert nb["metadata"]["labkit"] == {"lab": e.id, "version": "learner"}
    assert "labs/" in text
    modes = {oct(p.stat().st_mode & 0o777) for p in released.rglob("*") if p.is_file()}
    assert modes == {"0o644"}, f"released files must be world-readable, not private: {modes}"


def test_make_course_serves_the_ignored_working_copy():
    """`make course` serves my-course/ (made there by `labkit release --course`), which git ignores, so
    running a chapter never writes into a tracked notebook."""
    root = lab_flags()["ServerApp.root_dir"]
    assert root not in (".", "", str(ROOT)), "make course must not serve the repository (it holds labs/ sources)"
    make = (ROOT / "Makefile").read_text()
    assert re.search(rf"labkit release --course {re.escape(root)}\b", make)
    if (ROOT / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", "-q", f"{root}/chapters/index.ipynb"], cwd=ROOT)
        assert ignored.returncode == 0, f"{root}/ is not git-ignored"


def _stages() -> list[dict]:
    """hub/Dockerfile as stages: name, base, COPY (source, dest, from-stage), rm -rf paths of RUN lines."""
    text = re.sub(r"\\\n", " ", (ROOT / "hub" / "Dockerfile").read_text())
    stages = []
    for line in (ln.strip() for ln in text.splitlines()):
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            stages.append({"name": parts[2] if len(parts) > 2 else "", "base": parts[0], "copy": [], "rm": []})
        elif word == "COPY":
            opts = [p for p in rest.split() if p.startswith("--")]
            src, dest = [p for p in rest.split() if not p.startswith("--")][:2]
            frm = next((o.split("=", 1)[1] for o in opts if o.startswith("--from=")), None)
            stages[-1]["copy"].append((src, dest, frm))
        elif word == "RUN":
            for m in re.finditer(r"rm -rf ((?:/\S+\s*)+)", rest):
                stages[-1]["rm"] += m.group(1).split()
    return stages


def test_the_hub_learner_image_reaches_no_instructor_source(tmp_path, released):
    """The learner stage (the default target, the last) emulated: its base chain's COPYs of the build context
    (less what the `tree` stage removes) and of the released tree; walked for solutions."""
    stages = {s["name"]: s for s in _stages()}
    learner = _stages()[-1]
    assert learner["name"] == "learner"
    tracked = [f for f in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
               .stdout.splitlines() if f] if (ROOT / ".git").exists() else []
    if not tracked:
        pytest.skip("not a git checkout: the build context cannot be listed")
    image = tmp_path / "image"
    chain, s = [], learner
    while s:
        chain.append(s)
        s = stages.get(s["base"])
    for st in reversed(chain):
        for src, dest, frm in st["copy"]:
            if frm is None:           # from the build context: only labkit's config file may come straight in
                assert src.startswith("hub/"), f"stage {st['name']} copies {src} from the repository"
                (image / dest.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / src, image / dest.lstrip("/"))
            elif frm == "tree":
                tree = stages["tree"]
                ctx = [c for c in tree["copy"] if c[2] is None]
                assert ctx == [(".", "/src", None)], tree["copy"]
                gone = [p.removeprefix("/src/") for p in tree["rm"]]
                assert {"labs", "tests"} <= set(gone), "the tree stage must drop labs/ and tests/"
                for f in tracked:
                    if not any(f == g or f.startswith(g + "/") for g in gone):
                        (image / dest.lstrip("/") / f).parent.mkdir(parents=True, exist_ok=True)
                        (image / dest.lstrip("/") / f).symlink_to(ROOT / f)
            elif frm == "release":
                assert src == "/course" and "--course-tree /course" in (ROOT / "hub/Dockerfile").read_text()
                shutil.copytree(released, image / dest.lstrip("/"), dirs_exist_ok=True)
            else:
                pytest.fail(f"COPY --from={frm}: a stage this test does not know")
    assert (image / "opt/labkit/course/labs").is_dir() and (image / "opt/labkit/labkit").is_dir()
    assert not (image / "opt/labkit/labs").exists()
    assert leaks(image) == []


def test_the_working_copy_keeps_the_learners_edits_and_takes_updates(tmp_path):
    tree = tmp_path / "tree"
    (tree / "chapters").mkdir(parents=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(nb, tree / "chapters" / "a.ipynb")
    nbformat.write(nb, tree / "chapters" / "b.ipynb")
    mine = tmp_path / "my-course"
    rep = sync_copy(tree, mine)
    assert sorted(rep.created) == ["chapters/a.ipynb", "chapters/b.ipynb"]
    # the learner runs a.ipynb (outputs only) and edits b.ipynb; the course then changes both
    ran = nbformat.read(mine / "chapters" / "a.ipynb", as_version=4)
    ran.cells[0].outputs = [nbformat.v4.new_output("stream", text="1\n")]
    nbformat.write(ran, mine / "chapters" / "a.ipynb")
    edited = nbformat.read(mine / "chapters" / "b.ipynb", as_version=4)
    edited.cells[0].source = "x = 2  # my answer"
    nbformat.write(edited, mine / "chapters" / "b.ipynb")
    nb.cells[0].source = "x = 1  # course update"
    nbformat.write(nb, tree / "chapters" / "a.ipynb")
    nbformat.write(nb, tree / "chapters" / "b.ipynb")
    rep = sync_copy(tree, mine)
    assert rep.updated == ["chapters/a.ipynb"] and rep.kept == ["chapters/b.ipynb"]
    assert "course update" in (mine / "chapters" / "a.ipynb").read_text()
    assert "my answer" in (mine / "chapters" / "b.ipynb").read_text()
    assert "course update" in (mine / update_name("chapters/b.ipynb")).read_text()
    assert any("kept your chapters/b.ipynb" in ln for ln in rep.lines())
    again = sync_copy(tree, mine)               # nothing new from the course: nothing offered again
    assert (again.created, again.updated, again.kept) == ([], [], []) and again.unchanged == 2
    with pytest.raises(FileNotFoundError, match="does not exist"):
        sync_copy(tmp_path / "nope", mine)
