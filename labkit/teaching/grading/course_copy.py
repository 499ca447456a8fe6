"""The course a learner opens: the released course tree, and the learner's own working copy of it.

Instructor sources (``labs/<id>/<id>.ipynb``) hold solutions and hidden checks; a learner never opens
them. What a learner opens is built in two steps:

1. :func:`release_course` writes the **released course tree**: every chapter notebook (with its stored
   outputs, so the figures show before anything runs), the index and glossary, and the learner version of
   every ready lab (:func:`labkit.teaching.grading.labfmt.release`) under ``labs/<id>/``, so the index's links
   (``../labs/<id>/<id>.ipynb``) open released copies. Files are world-readable (0644, folders 0755) and
   byte-identical on every run. The hub image builds it at ``/opt/labkit/course`` (``hub/Dockerfile``).
2. :func:`sync_copy` makes or updates the learner's **working copy** from a released tree: the folder
   JupyterLab serves (``my-course/`` in a clone — git-ignored, made by ``make course`` — or ``~/labkit``
   on the hub). Running a chapter saves outputs into the working copy, never into the tracked notebooks,
   so ``git pull`` never conflicts with a learner's work. A file is updated only while the learner has not
   edited it (a notebook counts as edited when its cells' sources differ from what was last delivered —
   outputs from running it do not count); an edited file is kept and the new version is written beside it
   as ``<name>.update.<ext>`` for the learner to compare. What was delivered is recorded in
   ``.labkit-course.json`` in the working copy.

Command line: ``labkit release --course DIR`` (from the sources) or ``labkit release --course DIR --from
TREE`` (from a released tree, as the hub does at each server start). Taught in the course index and
``labs/README.md`` (instructor notes).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

STATE = ".labkit-course.json"
MANIFEST = ".labkit-release.json"     # what `labkit release` wrote into a folder (install_release)
_SKIP = {"__pycache__", ".ipynb_checkpoints"}


@dataclass
class SyncReport:
    """What :func:`sync_copy` did, path by path (relative to the working copy)."""

    dest: Path
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)       # edited by the learner: the update is beside it
    unchanged: int = 0

    def lines(self) -> list[str]:
        out = [f"your course copy: {self.dest} ({len(self.created)} new, {len(self.updated)} updated, "
               f"{self.unchanged} unchanged, {len(self.kept)} edited by you and kept)"]
        out += [f"  kept your {p}; the course's new version is beside it: {update_name(p)}" for p in self.kept]
        return out


def update_name(rel: str) -> str:
    """Where the course's new version of a learner-edited file goes (``ch04.ipynb`` -> ``ch04.update.ipynb``)."""
    p = Path(rel)
    return str(p.with_name(f"{p.stem}.update{p.suffix}"))


def _chmod_tree(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


def release_course(out, *, root: Path | None = None) -> Path:
    """Write the released course tree into ``out`` (module docstring); returns ``out``. Refuses a tree in
    which a solution or hidden-check marker survives (:func:`leaks`)."""
    from labkit import course
    from labkit.paths import repo_root
    from labkit.teaching.grading.labfmt import release

    root = Path(root or repo_root())
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chapters = root / "chapters"
    for p in sorted(chapters.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and not any(part in _SKIP for part in rel.parts):
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, out / rel)
    for e in course.notebooks(kind="lab", ready_only=True):
        release(root / e.path, out / "labs")
    _chmod_tree(out)
    found = leaks(out)
    if found:
        raise ValueError(f"the released course tree {out} holds solution or hidden-check code: {found[:5]}")
    return out


def leaks(tree, *, sources=None) -> list[str]:
    """Files under ``tree`` that hold a solution or hidden-check marker on a line of its own, a cell with
    ``labkit.kind == "hidden"``, or the code of a hidden check of ``sources`` (instructor sources; default:
    the course's labs). Empty for a tree safe to put in front of learners."""
    from labkit.teaching.grading.labfmt import (
        BEGIN_HIDDEN,
        BEGIN_SOLUTION,
        END_HIDDEN,
        END_SOLUTION,
        learner_notebook,
        load_lab,
    )

    if sources is None:
        from labkit import course
        from labkit.paths import repo_root

        sources = [repo_root() / e.path for e in course.notebooks(kind="lab")
                   if (repo_root() / e.path).is_file()]
    bodies = []
    for s in sources:
        lab = load_lab(s)
        shown = "\n".join(c.source for c in learner_notebook(lab).cells)
        for chk in lab.checks:            # a few lines of each hidden check that the learner version lacks
            lines = [ln.strip() for ln in chk.source.splitlines() if len(ln.strip()) >= 40
                     and not ln.strip().startswith(("import ", "from "))]   # an import gives nothing away
            bodies += [ln for ln in lines if ln not in shown][:3]
    found = []
    for p in sorted(Path(tree).rglob("*")):
        if not p.is_file() or p.stat().st_size > 64 * 2**20:
            continue
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        lines = text.splitlines()
        if p.suffix == ".ipynb":
            try:
                nb = json.loads(text)
                lines = [ln for c in nb.get("cells", []) for ln in "".join(c.get("source", "")).splitlines()]
                text = "\n".join(lines)          # the code as a learner reads it, not JSON-escaped
                if any((c.get("metadata", {}).get("labkit") or {}).get("kind") == "hidden" for c in nb["cells"]):
                    found.append(f"{p}: a hidden-check cell")
                    continue
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
        if any(rx.match(ln) for ln in lines for rx in (BEGIN_SOLUTION, END_SOLUTION, BEGIN_HIDDEN, END_HIDDEN)):
            found.append(f"{p}: a solution or hidden-check marker")
        elif any(b in text for b in bodies):
            found.append(f"{p}: code of a hidden check")
    return found


def _digest(path: Path) -> str:
    """What counts as the learner's edit: a notebook's cell types and sources; any other file's bytes."""
    data = path.read_bytes()
    if path.suffix == ".ipynb":
        try:
            nb = json.loads(data)
            data = json.dumps([[c.get("cell_type"), "".join(c.get("source", ""))] for c in nb["cells"]]).encode()
        except (ValueError, KeyError, TypeError):
            pass
    return hashlib.sha256(data).hexdigest()


def sync_copy(tree, dest) -> SyncReport:
    """Create or update the working copy ``dest`` from the released tree ``tree`` (module docstring)."""
    tree, dest = Path(tree), Path(dest)
    if not tree.is_dir():
        raise FileNotFoundError(f"released course tree {tree} does not exist (labkit release --course makes one)")
    dest.mkdir(parents=True, exist_ok=True)
    state_path = dest / STATE
    try:
        delivered = json.loads(state_path.read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        delivered = {}
    rep = SyncReport(dest)
    for src in sorted(p for p in tree.rglob("*") if p.is_file() and p.name not in (STATE, MANIFEST)):
        rel = str(src.relative_to(tree))
        target = dest / rel
        new = _digest(src)
        if target.exists():
            have = _digest(target)
            if have == new:
                rep.unchanged += 1
                delivered[rel] = new
                continue
            if have != delivered.get(rel):        # the learner edited it: theirs stays
                if new == delivered.get(rel):     # and the course has not changed it since: nothing to offer
                    rep.unchanged += 1
                    continue
                shutil.copyfile(src, dest / update_name(rel))
                os.chmod(dest / update_name(rel), 0o644)
                rep.kept.append(rel)
                delivered[rel] = new              # offered once; offered again only when the course changes it
                continue
            rep.updated.append(rel)
        else:
            rep.created.append(rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        os.chmod(target, 0o644)
        delivered[rel] = new
    from labkit.record import atomic_write_text

    atomic_write_text(state_path, json.dumps({"files": delivered}, indent=1, sort_keys=True))
    os.chmod(state_path, 0o644)
    return rep


def working_copy(dest, *, tree=None) -> SyncReport:
    """``make course``'s step: the working copy ``dest`` made or updated from ``tree`` (a released course
    tree) or, by default, from a fresh release of this checkout's sources."""
    if tree is not None:
        return sync_copy(tree, dest)
    with tempfile.TemporaryDirectory(prefix="labkit-course-") as tmp:
        return sync_copy(release_course(Path(tmp) / "course"), dest)


# ---------------------------------------------------------------- what a release may write onto


def instructor_roots(*extra) -> list[Path]:
    """The folders no release may write into: every course lab's source folder (solutions, hidden checks),
    the course's ``chapters/`` and ``labs/`` folders, and ``extra`` (the lab being released)."""
    from labkit import course
    from labkit.paths import repo_root

    root = repo_root()
    dirs = [(root / e.path).parent for e in course.notebooks(kind="lab")]
    dirs += [root / "chapters", root / "labs", *map(Path, extra)]
    return sorted({d.resolve() for d in dirs})


def refuse_instructor_target(dest, *, option: str, extra=()) -> None:
    """ValueError naming ``option`` when ``dest`` is, or is inside, an instructor folder
    (:func:`instructor_roots`) or holds one (``--course-tree`` onto the checkout itself)."""
    dest = Path(dest).resolve()
    for d in instructor_roots(*extra):
        if dest == d or d in dest.parents or dest in d.parents:
            raise ValueError(f"{option} {dest}: {'is' if dest == d else 'overlaps'} the instructor's {d} (sources "
                             "with solutions and hidden checks); give a folder outside it, e.g. build/release")


def refuse_checkout(tree, *, option: str = "--from") -> None:
    """``--course-tree``'s check applied to a tree a working copy is made from: ValueError when ``tree`` is
    a checkout (``.git``, ``.venv``, ``pyproject.toml``, a ``labkit`` package) or holds solution or
    hidden-check code (:func:`leaks`)."""
    tree = Path(tree)
    if not tree.is_dir():
        raise FileNotFoundError(f"{option} {tree}: no such folder (labkit release --course-tree makes one)")
    marks = [n for n in (".git", ".venv", "pyproject.toml", "labkit/__init__.py") if (tree / n).exists()]
    if marks:
        raise ValueError(f"{option} {tree}: this is a checkout ({', '.join(marks)}), not a released course tree: "
                         "it holds the instructor's solutions; make one with labkit release --course-tree DIR")
    found = leaks(tree)
    if found:
        raise ValueError(f"{option} {tree}: not a released course tree, it holds solution or hidden-check code: "
                         f"{found[:3]}")


def install_release(staged, out) -> list[str]:
    """Copy the files of ``staged`` (a fresh release in a temporary folder) into ``out``; returns what was
    written. Refuses (ValueError, nothing written) to overwrite a file this command did not write: a file
    whose bytes differ from the new ones is overwritten only when ``out/.labkit-release.json`` records that a
    release wrote exactly those bytes; never through a symlink."""
    staged, out = Path(staged), Path(out)
    state = out / MANIFEST
    try:
        wrote = json.loads(state.read_text()).get("files", {}) if state.is_file() else {}
    except (OSError, ValueError, AttributeError):
        wrote = {}
    plan, refused = [], []
    for src in sorted(p for p in staged.rglob("*") if p.is_file()):
        rel = str(src.relative_to(staged))
        target = out / rel
        if any(q.is_symlink() for q in [target, *target.parents] if q != out and out in q.parents):
            refused.append(f"{target} (a symbolic link)")
        elif target.exists() and not target.is_file():
            refused.append(f"{target} (not a file)")
        elif target.is_file() and target.read_bytes() != src.read_bytes() \
                and hashlib.sha256(target.read_bytes()).hexdigest() != wrote.get(rel):
            refused.append(f"{target} (not written by labkit release, or edited since)")
        else:
            plan.append((src, target, rel))
    if refused:
        raise ValueError(f"labkit release would overwrite {len(refused)} file(s) it did not write: "
                         f"{'; '.join(refused[:3])}; move them away or choose another --out")
    for src, target, rel in plan:
        for d in reversed([target.parent, *target.parent.parents]):
            if not d.exists():           # folders it makes are world-readable too, whatever the umask
                d.mkdir()
                os.chmod(d, 0o755)
        shutil.copyfile(src, target)
        os.chmod(target, 0o644)
        wrote[rel] = hashlib.sha256(src.read_bytes()).hexdigest()
    from labkit.record import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(state, json.dumps({"files": wrote}, indent=1, sort_keys=True))
    os.chmod(state, 0o644)
    return [rel for _, _, rel in plan]
