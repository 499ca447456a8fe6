"""The lab format: one instructor source per lab, and the learner version made from it.

An instructor source ``labs/<id>/<id>.ipynb`` is an ordinary notebook. Its graded cells carry a stable
id in ``metadata.labkit`` (the grader matches cells by id, never by position):

=========  ==============================================================================
kind        the cell
=========  ==============================================================================
answer     ``{"id": "q1", "kind": "answer", "points": 2}`` — the learner's work; holds one or more
           ``### BEGIN SOLUTION`` / ``### END SOLUTION`` regions, and ends by recording evidence
           (:class:`labkit.teaching.grading.EvidenceBook`).
check      ``{"id": "q1-check", "kind": "check", "question": "q1"}`` — a visible check: runs in the
           learner's kernel and gives immediate, specific feedback. Never graded (the kernel is not trusted).
hidden     ``{"id": "q1-hidden", "kind": "hidden", "question": "q1", "weight": 1}`` — the whole cell is a
           ``### BEGIN HIDDEN CHECKS`` / ``### END HIDDEN CHECKS`` region. It lives only in the instructor
           source, and the grader runs it in a fresh process against the recorded evidence, with
           ``evidence``, ``expect``, ``close``, ``CheckFailed``, ``LAB``, ``WORK``, ``PARAMS`` and ``SUBMITTED``
           (the submitted notebook, :mod:`labkit.teaching.grading.checker`) defined. (It
           also runs when the instructor source is executed, so the course's notebook tests exercise it: the
           lab's setup cell binds ``evidence, expect, close = book.load, grading.expect, grading.close``.) A question scores ``points`` × (weight of its passed hidden checks / total).
=========  ==============================================================================

:func:`release` writes the learner version: each solution region becomes ``...  # YOUR ANSWER HERE``
(at the region's indentation, so the cell still parses), hidden cells are removed, ids kept, outputs and
execution metadata cleared, visible checks tagged ``raises-exception``; the bytes are identical on
every re-run, and the files are world-readable (0644). :mod:`labkit.teaching.grading.course_copy` releases the
whole course (chapters + every ready lab) and keeps a learner's working copy of it.

Taught in the labs (``labs/``) and the instructor notes of ``labkit grade --help``.
"""
from __future__ import annotations

import copy
import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from labkit.teaching.grading.evidence import check_id

BEGIN_SOLUTION = re.compile(r"^(\s*)###\s*BEGIN SOLUTION\s*$")
END_SOLUTION = re.compile(r"^\s*###\s*END SOLUTION\s*$")
BEGIN_HIDDEN = re.compile(r"^\s*###\s*BEGIN HIDDEN CHECKS\s*$")
END_HIDDEN = re.compile(r"^\s*###\s*END HIDDEN CHECKS\s*$")
PROMPT = "...  # YOUR ANSWER HERE"
KINDS = ("answer", "check", "hidden")
_SKIP_SUPPORT = {"__pycache__", ".ipynb_checkpoints"}


@dataclass(frozen=True)
class HiddenCheck:
    id: str
    question: str
    weight: float
    source: str          # the code inside the hidden region


@dataclass(frozen=True)
class Question:
    id: str
    points: float


@dataclass(frozen=True)
class Lab:
    """A parsed instructor source (see the module docstring)."""

    id: str
    source: Path
    questions: tuple[Question, ...]
    checks: tuple[HiddenCheck, ...]
    sha256: str

    @property
    def dir(self) -> Path:
        return self.source.parent

    @property
    def max_score(self) -> float:
        return float(sum(q.points for q in self.questions))

    def support_files(self) -> list[Path]:
        """Files shipped beside the notebook (helper modules, data), never hidden or instructor-only ones."""
        out = []
        for p in sorted(self.dir.rglob("*")):
            rel = p.relative_to(self.dir)
            if not p.is_file() or p == self.source or any(part in _SKIP_SUPPORT for part in rel.parts):
                continue
            if any(part.startswith((".", "hidden", "instructor")) for part in rel.parts):
                continue
            if p.suffix == ".ipynb":
                continue
            out.append(p)
        return out

    def notebook(self):
        import nbformat

        return nbformat.read(self.source, as_version=4)


def _meta(cell) -> dict | None:
    m = cell.get("metadata", {}).get("labkit")
    return dict(m) if isinstance(m, dict) else None


def find_lab(lab: str | Path) -> Path:
    """The instructor source of ``lab``: a manifest id, a lab folder, or the notebook's path."""
    p = Path(lab)
    if p.suffix == ".ipynb" and p.is_file():
        return p.resolve()
    if p.is_dir():
        nb = p / f"{p.name}.ipynb"
        if nb.is_file():
            return nb.resolve()
        raise FileNotFoundError(f"lab folder {p} has no {p.name}.ipynb (the instructor source)")
    from labkit import course
    from labkit.paths import repo_root

    labs = [e for e in course.notebooks(kind="lab")]
    for e in labs:
        if e.id == str(lab):
            return (repo_root() / e.path).resolve()
    raise ValueError(f"lab={str(lab)!r}: not a lab id, lab folder or .ipynb; lab ids: "
                     f"{', '.join(e.id for e in labs)}")


def load_lab(lab: str | Path) -> Lab:
    """Parse and validate an instructor source; ValueError names the cell and what is wrong."""
    source = find_lab(lab)
    raw = source.read_bytes()
    import nbformat

    nb = nbformat.reads(raw.decode("utf-8"), as_version=4)
    lab_id = check_id(source.stem, "lab")
    questions: dict[str, Question] = {}
    checks: list[HiddenCheck] = []
    ids: set[str] = set()
    pending_refs: list[tuple[str, str]] = []
    for i, cell in enumerate(nb.cells):
        m = _meta(cell)
        text = cell.get("source", "")
        has_hidden = any(BEGIN_HIDDEN.match(ln) for ln in text.splitlines())
        has_solution = any(BEGIN_SOLUTION.match(ln) for ln in text.splitlines())
        where = f"{source.name} cell {i}"
        if m is None:
            if has_hidden or has_solution:
                raise ValueError(f"{where} has a solution or hidden region but no metadata.labkit id")
            continue
        cid = check_id(m.get("id"), f"{where}: metadata.labkit.id")
        if cid in ids:
            raise ValueError(f"{where}: id {cid!r} is used by two cells; ids must be unique")
        ids.add(cid)
        kind = m.get("kind")
        if kind not in KINDS:
            raise ValueError(f"{where} ({cid}): kind={kind!r}; valid kinds: {KINDS}")
        if cell.cell_type != "code":
            raise ValueError(f"{where} ({cid}): graded cells must be code cells, got {cell.cell_type}")
        if kind == "answer":
            pts = m.get("points")
            if not isinstance(pts, (int, float)) or isinstance(pts, bool) or pts <= 0:
                raise ValueError(f"{where} ({cid}): points={pts!r}; an answer cell needs points > 0")
            if not has_solution:
                raise ValueError(f"{where} ({cid}): an answer cell needs a ### BEGIN SOLUTION region")
            strip_solutions(text, where)  # validates the regions
            questions[cid] = Question(cid, float(pts))
        elif kind == "check":
            if has_hidden:
                raise ValueError(f"{where} ({cid}): hidden regions belong in kind='hidden' cells")
            pending_refs.append((cid, str(m.get("question"))))
        else:
            pending_refs.append((cid, str(m.get("question"))))
            w = m.get("weight", 1)
            if not isinstance(w, (int, float)) or isinstance(w, bool) or w <= 0:
                raise ValueError(f"{where} ({cid}): weight={w!r}; must be a number > 0")
            checks.append(HiddenCheck(cid, str(m.get("question")), float(w), hidden_body(text, where)))
    for cid, q in pending_refs:
        if q not in questions:
            raise ValueError(f"{source.name}: cell {cid!r} refers to question {q!r}, which has no answer cell "
                             f"(questions: {sorted(questions)})")
    for q in questions:
        if not any(c.question == q for c in checks):
            raise ValueError(f"{source.name}: question {q!r} has no hidden check, so it could never be graded")
    return Lab(lab_id, source, tuple(questions.values()), tuple(checks), hashlib.sha256(raw).hexdigest())


def strip_solutions(text: str, where: str = "cell") -> str:
    """Replace each solution region by the answer prompt at the region's indentation."""
    out, inside, indent = [], False, ""
    for ln in text.splitlines():
        b = BEGIN_SOLUTION.match(ln)
        if b:
            if inside:
                raise ValueError(f"{where}: nested ### BEGIN SOLUTION")
            inside, indent = True, b.group(1)
            continue
        if END_SOLUTION.match(ln):
            if not inside:
                raise ValueError(f"{where}: ### END SOLUTION without a BEGIN")
            inside = False
            out.append(indent + PROMPT)
            continue
        if not inside:
            out.append(ln)
    if inside:
        raise ValueError(f"{where}: ### BEGIN SOLUTION is never closed by ### END SOLUTION")
    return "\n".join(out)


def hidden_body(text: str, where: str = "cell") -> str:
    """The code of a hidden cell (between its markers); the whole cell must be the region."""
    lines = [ln for ln in text.splitlines()]
    code = [ln for ln in lines if ln.strip()]
    if not code or not BEGIN_HIDDEN.match(code[0]) or not END_HIDDEN.match(code[-1]):
        raise ValueError(f"{where}: a hidden cell must start with ### BEGIN HIDDEN CHECKS and end with "
                         "### END HIDDEN CHECKS")
    start = next(i for i, ln in enumerate(lines) if BEGIN_HIDDEN.match(ln))
    end = max(i for i, ln in enumerate(lines) if END_HIDDEN.match(ln))
    body = lines[start + 1:end]
    if any(BEGIN_HIDDEN.match(ln) or END_HIDDEN.match(ln) for ln in body):
        raise ValueError(f"{where}: one hidden region per cell")
    return "\n".join(body)


def learner_notebook(lab: Lab):
    """The learner version of ``lab`` as a notebook object (see :func:`release`)."""
    nb = copy.deepcopy(lab.notebook())
    cells = []
    for i, cell in enumerate(nb.cells):
        m = _meta(cell)
        cell.metadata.pop("execution", None)
        cell.metadata.pop("papermill", None)
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        if m and m.get("kind") == "hidden":
            continue
        if m and m.get("kind") == "answer":
            cell.source = strip_solutions(cell.source, f"{lab.source.name} cell {i}")
        if m and m.get("kind") == "check":
            tags = list(cell.metadata.get("tags", []))
            if "raises-exception" not in tags:
                tags.append("raises-exception")
            cell.metadata["tags"] = tags
        cells.append(cell)
    nb.cells = cells
    nb.metadata.pop("papermill", None)
    nb.metadata["labkit"] = {"lab": lab.id, "version": "learner"}
    text = "\n".join(c.source for c in nb.cells)
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN", "END HIDDEN"):
        if marker in text:
            raise ValueError(f"{lab.source.name}: '{marker}' survives in the learner version (a marker not on "
                             "its own line?) — refusing to release solutions")
    return nb


def release(lab: str | Path, out: str | Path) -> Path:
    """Write the learner version of ``lab`` to ``out/<id>/`` (notebook + support files); return the notebook.

    Deterministic: the same source gives byte-identical files on every run.
    """
    import nbformat

    from labkit.record import atomic_write_text

    parsed = load_lab(lab)
    dest = Path(out) / parsed.id
    dest.mkdir(parents=True, exist_ok=True)
    nb = learner_notebook(parsed)
    path = dest / f"{parsed.id}.ipynb"
    atomic_write_text(path, nbformat.writes(nb) + "\n")
    os.chmod(path, 0o644)                    # for learners to read (the atomic write's temp file is 0600)
    for f in parsed.support_files():
        target = dest / f.relative_to(parsed.dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
        os.chmod(target, 0o644)
    return path


def source_copy(lab: Lab, nb) -> str:
    """``"identical"`` when ``nb``'s code cells are the instructor source's, ``"solutions"`` when it holds a
    solution or hidden-check region (which only the instructor source has), else ``""``."""
    def code(book):
        return [c.source.strip() for c in book.cells if c.cell_type == "code"]

    if code(nb) == code(lab.notebook()):
        return "identical"
    for cell in nb.cells:
        lines = str(cell.get("source", "")).splitlines()
        if any(BEGIN_SOLUTION.match(ln) or BEGIN_HIDDEN.match(ln) for ln in lines):
            return "solutions"
    return ""


def _fixed_code(nb) -> set[str]:
    """The code a learner does not write: every code cell but the answer cells (setup, checks, the last)."""
    return {c.source.strip() for c in nb.cells if c.cell_type == "code" and c.source.strip()
            and (_meta(c) or {}).get("kind") not in ("answer", "hidden")}


def _course_labs() -> list[Lab]:
    from labkit import course
    from labkit.paths import repo_root

    labs = []
    for e in course.notebooks(kind="lab"):
        p = repo_root() / e.path
        if p.is_file():
            try:
                labs.append(load_lab(p))
            except ValueError:
                continue
    return labs


def other_lab(lab: Lab, nb, candidates: list[Lab] | None = None) -> str | None:
    """The id of the lab ``nb`` is when it is not ``lab`` (a lab01 notebook submitted as lab02), else None.

    Read from the released notebook's ``metadata.labkit.lab``; without it, from the cells a learner does
    not write (setup, visible checks): ``nb`` is another lab when more of them are that lab's than
    ``lab``'s — cell ids alone cannot tell (every lab has a ``q1``).
    """
    meta = nb.get("metadata", {}).get("labkit")
    named = meta.get("lab") if isinstance(meta, dict) else None
    if isinstance(named, str) and named and named != lab.id:
        return named
    if named == lab.id:
        return None
    mine = _fixed_code(nb)
    own = len(mine & _fixed_code(lab.notebook()))
    best, best_n = None, own
    for other in (_course_labs() if candidates is None else candidates):
        if other.id == lab.id:
            continue
        n = len(mine & _fixed_code(other.notebook()))
        if n > best_n:
            best, best_n = other.id, n
    return best
