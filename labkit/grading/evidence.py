"""Evidence: what a lab notebook records so the grader can check it *outside* the learner's kernel.

A lab's answer cell ends with one call, e.g.::

    book = grading.EvidenceBook("lab01_baseline")
    book.submit("q1", answer=record.tokens_per_s, record=record, files=[trace_path], steps=cfg.steps)

which writes ``<work>/evidence/<lab>/q1.json`` (``work`` = ``labkit.paths.work_dir()``; the grader points
``LABKIT_WORK`` at each submission's own folder). Nothing printed by the kernel is ever graded: the
grader's hidden checks (run in a fresh process by :mod:`labkit.grading.checker`) load this evidence,
verify every listed file against the SHA-256 recorded with it, and recompute the derived values
(tokens/s from step time, MFU from its inputs, overlap from the trace) themselves.

Evidence written in the learner's kernel is data, not proof: the checks cross-validate it (record
against trace files, answer against record, record against the config) so that a value typed in, or a
forged record, fails on the first inconsistency.

Taught in the labs (``labs/``); used by the hidden checks of every lab.
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")
MAX_EVIDENCE_BYTES = 4 * 2**20   # an evidence JSON is a summary; larger is refused (flood guard)


class CheckFailed(AssertionError):
    """A check did not pass; the message says what was expected and what was found."""

    def _render_traceback_(self) -> list[str]:
        """What Jupyter shows instead of a traceback into labkit: the message is the whole story."""
        return [f"\x1b[1;31m✘ check failed:\x1b[0m {self}", "Fix the answer above, then re-run this cell."]


def expect(condition: Any, message: str) -> None:
    """Raise :class:`CheckFailed` with ``message`` unless ``condition`` is true (a check's one verb)."""
    if not condition:
        raise CheckFailed(message)


def close(a: float | None, b: float | None, *, rel: float = 1e-6, abs_: float = 0.0) -> bool:
    """``a`` and ``b`` are both finite numbers and agree within ``rel`` (relative) or ``abs_``."""
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        return False
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))


def check_id(value: str, name: str = "question") -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise ValueError(f"{name}={value!r} is not a valid id; use a letter then letters, digits, '_', '-', '.' "
                         "(at most 64 characters), e.g. 'q1'")
    return value


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _work_root() -> Path:
    from labkit.paths import work_dir

    return work_dir()


def _jsonable(o):
    import dataclasses

    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (Path, set, tuple)):
        return str(o) if isinstance(o, Path) else list(o)
    raise TypeError(f"evidence value of type {type(o).__name__} cannot be stored as JSON")


@dataclass(frozen=True)
class Submitted:
    """What :meth:`EvidenceBook.submit` saved: shown in a notebook as one short line (no absolute path);
    ``os.fspath(submitted)`` / ``submitted.path`` is the evidence file."""

    question: str
    path: Path
    answered: bool

    def __fspath__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        state = "answered" if self.answered else "not answered yet"
        return f"{self.question}: evidence saved ({state}) as {self.path.parent.name}/{self.path.name}"


class EvidenceBook:
    """Writes a lab's evidence files (used in the learner's kernel; imports nothing heavy).

    ``root`` defaults to ``labkit.paths.work_dir()`` (``LABKIT_WORK`` when the grader runs the notebook).
    """

    def __init__(self, lab: str, *, root: str | os.PathLike | None = None):
        self.lab = check_id(lab, "lab")
        self.root = Path(root) if root is not None else _work_root()
        self.dir = self.root / "evidence" / self.lab

    def _rel(self, p: Path) -> str:
        p = Path(p).resolve()
        try:
            return p.relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(p)

    def submit(self, question: str, *, answer: Any = None, record: Any = None,
               files: list | tuple = (), **values: Any) -> Submitted:
        """Record the evidence of one question; returns a :class:`Submitted` (path-like: the evidence file).

        ``answer`` is the learner's answer (None = not answered yet), ``record`` a
        :class:`labkit.record.RunRecord` (or its dict), ``files`` paths the work produced (traces,
        records), each stored with its size and SHA-256, and ``values`` any further measured facts
        (steps run, device, peak source ...).
        """
        check_id(question)
        entries = []
        for f in files:
            p = Path(f)
            if not p.is_file():
                raise FileNotFoundError(f"files=[..., {str(f)!r}, ...]: no such file; evidence may only list "
                                        "files the work produced")
            entries.append({"path": self._rel(p), "bytes": p.stat().st_size, "sha256": sha256_file(p)})
        if record is not None and not isinstance(record, dict):
            record = record.to_dict()
        doc = {
            "lab": self.lab, "question": question, "answer": answer, "record": record, "files": entries,
            "values": values,
            "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "pid": os.getpid(), "python": sys.executable,
        }
        text = json.dumps(doc, indent=1, sort_keys=True, default=_jsonable, allow_nan=True)
        if len(text) > MAX_EVIDENCE_BYTES:
            raise ValueError(f"evidence for {question!r} is {len(text):,} bytes; the limit is "
                             f"{MAX_EVIDENCE_BYTES:,} — store large data in a file and list it in files=")
        from labkit.record import atomic_write_text

        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{question}.json"
        atomic_write_text(path, text)
        return Submitted(question, path, answer is not None)


    def load(self, question: str) -> Evidence:
        """Read back the evidence of ``question`` (what the hidden checks see)."""
        return Evidence.load(self.lab, question, root=self.root)


class Evidence:
    """One question's evidence as the grader reads it (outside the learner's kernel)."""

    def __init__(self, doc: dict, root: Path, path: Path):
        self.doc, self.root, self.path = doc, root, path
        self.question = doc.get("question")

    # ------------------------------------------------------------ loading
    @classmethod
    def load(cls, lab: str, question: str, *, root: str | os.PathLike | None = None) -> Evidence:
        """Evidence of ``question``; :class:`CheckFailed` naming what is missing when there is none."""
        root = Path(root) if root is not None else _work_root()
        path = root / "evidence" / check_id(lab, "lab") / f"{check_id(question)}.json"
        if not path.is_file():
            raise CheckFailed(f"{question}: no evidence recorded ({path.relative_to(root)} is missing) — "
                              f"did the answer cell of {question} run to its submit(...) line?")
        if path.stat().st_size > MAX_EVIDENCE_BYTES:
            raise CheckFailed(f"{question}: evidence file is {path.stat().st_size:,} bytes (limit "
                              f"{MAX_EVIDENCE_BYTES:,}); refused")
        try:
            doc = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckFailed(f"{question}: evidence file is not valid JSON ({e})") from None
        expect(isinstance(doc, dict) and doc.get("question") == question and doc.get("lab") == lab,
               f"{question}: evidence file names another question or lab")
        return cls(doc, root, path)

    # ------------------------------------------------------------ fields
    @property
    def answer(self) -> Any:
        return self.doc.get("answer")

    def answered(self) -> Any:
        """The answer, or :class:`CheckFailed` 'not answered yet' when it is None."""
        expect(self.answer is not None, f"{self.question}: not answered yet (answer is None)")
        return self.answer

    def number(self) -> float:
        """The answer as a finite float (CheckFailed otherwise)."""
        a = self.answered()
        ok = isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a)
        expect(ok, f"{self.question}: the answer must be a finite number, got {a!r}")
        return float(a)

    @property
    def values(self) -> dict:
        v = self.doc.get("values")
        return v if isinstance(v, dict) else {}

    def value(self, name: str) -> Any:
        expect(name in self.values, f"{self.question}: the evidence lacks {name!r} "
               f"(recorded: {sorted(self.values)})")
        return self.values[name]

    @property
    def record(self):
        """The recorded :class:`~labkit.record.RunRecord` (CheckFailed when absent or malformed)."""
        from labkit.record import RunRecord

        r = self.doc.get("record")
        expect(isinstance(r, dict), f"{self.question}: no run record in the evidence")
        try:
            return RunRecord.from_dict(dict(r))
        except (TypeError, ValueError) as e:
            raise CheckFailed(f"{self.question}: the run record is malformed ({e})") from None

    def files(self, pattern: str = "*") -> list[Path]:
        """Listed files matching ``pattern`` (fnmatch), each verified: present, same size and SHA-256."""
        import fnmatch

        out = []
        for ent in self.doc.get("files") or []:
            rel = str(ent.get("path", ""))
            if not fnmatch.fnmatch(Path(rel).name, pattern):
                continue
            p = Path(rel) if os.path.isabs(rel) else self.root / rel
            expect(p.is_file(), f"{self.question}: the evidence lists {rel}, which no longer exists")
            expect(p.stat().st_size == ent.get("bytes") and sha256_file(p) == ent.get("sha256"),
                   f"{self.question}: {rel} changed after the evidence was recorded (size or SHA-256 differs)")
            out.append(p)
        return out
