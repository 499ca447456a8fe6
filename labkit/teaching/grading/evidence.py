"""Evidence: what a lab notebook records so the grader can check it *outside* the learner's kernel.

A lab's answer cell ends with one call, e.g.::

    book = grading.EvidenceBook("lab01_baseline")
    book.submit("q1", answer=record.tokens_per_s, record=record, files=[trace_path], steps=cfg.steps)

which writes ``<work>/evidence/<lab>/q1.json`` (``work`` = ``labkit.paths.work_dir()``; the grader points
``LABKIT_WORK`` at each submission's own folder). Nothing printed by the kernel is ever graded: the
grader's hidden checks (run in a fresh process by :mod:`labkit.teaching.grading.checker`) load this evidence,
verify every listed file against the SHA-256 recorded with it, and recompute the derived values
(tokens/s from step time, MFU from its inputs, overlap from the trace) themselves.

Evidence written in the learner's kernel is data, not proof: the checks cross-validate it (record
against trace files, answer against record, record against the config) so that a value typed in, or a
forged record, fails on the first inconsistency.

**The grading rule** (every lab's hidden checks follow it; ``labs/README.md`` says it to instructors):

1. *A point that rests on a timing is judged from the learner's own recorded runs*, re-derived here from the
   evidence (samples rebuilt from the runs' step times, the verdict judged again, the answer compared with
   both) — never from a number typed in, and never from a timing the checks measure themselves.
2. *The grader re-executes the notebook to prove the evidence came from it*, not to re-decide the effect: runs
   are bound to the execution that recorded them (:meth:`Evidence.check_launched_here`: the kernel that wrote
   the evidence launched them, inside the execution, for at least as long as their timed steps took).
3. *An inconclusive measurement never takes a point*: an A/B that cannot tell the effect from this machine's
   noise ("no difference at this resolution") is reported (:func:`note`, kept with the check's result), not
   penalised; only the learner's own conclusive evidence against the claim fails it.
4. *No answer without the work*: a check that passes on the answer alone, with no run, record or file behind
   it, is a bug — every answered value must follow from recorded work.

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


def note(text: str) -> None:
    """Report something a check found that costs no point (an inconclusive A/B, a stale figure). In the grader
    (:mod:`labkit.teaching.grading.checker`) the note is kept with the check's result; in a kernel it is printed.
    Taught in the labs (``labs/README.md``: the grading rule, point 3)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"note(text={text!r}): say what was found, in a non-empty sentence")
    print(f"note: {text}")


def _utc(stamp: Any) -> _dt.datetime | None:
    """An ISO-8601 time stamp as an aware datetime (None when absent or not one)."""
    if not isinstance(stamp, str):
        return None
    try:
        t = _dt.datetime.fromisoformat(stamp)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


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

    # ------------------------------------------------------------ binding runs to this execution
    def check_launched_here(self, runs: list, what: str = "the runs") -> None:
        """CheckFailed unless every run of ``runs`` (``labkit.measure.ab.ab_train(same_ranks=True)``'s, each stamped
        with its ``launch``: pid, UTC start and end) was launched by the kernel that wrote this evidence, ended
        before it was written, and its launch lasted at least the timed steps of its runs (Σ n × p10 of their
        step times). Runs pasted from another execution (another kernel, an earlier session, a classmate's
        notebook) carry another pid and older times, so they are not evidence of this one. Taught in the labs
        (``labs/README.md``: the grading rule, point 2; lab 10's q3)."""
        q = self.question
        pid, written = self.doc.get("pid"), _utc(self.doc.get("written_at"))
        expect(isinstance(pid, int) and written is not None,
               f"{q}: the evidence does not say which kernel wrote it, or when (pid, written_at)")
        expect(isinstance(runs, list) and runs, f"{q}: {what}: no runs recorded")
        launches: dict = {}
        for i, r in enumerate(runs):
            stamp = r.get("launch") if isinstance(r, dict) else None
            expect(isinstance(stamp, dict), f"{q}: run {i + 1} of {what} carries no launch stamp: it was not "
                   "recorded by labkit.measure.ab.ab_train(same_ranks=True) in this notebook's execution")
            start, end = _utc(stamp.get("started_at")), _utc(stamp.get("ended_at"))
            expect(stamp.get("pid") == pid, f"{q}: run {i + 1} of {what} was launched by process "
                   f"{stamp.get('pid')!r}, not by the kernel that recorded this evidence ({pid}): runs of another "
                   "execution (copied in?) are not evidence of this one")
            expect(start is not None and end is not None and start <= end <= written + _dt.timedelta(seconds=1),
                   f"{q}: run {i + 1} of {what} has a launch that did not end before its evidence was written")
            st = r.get("step_time") or {}
            try:
                busy = float(st["n"]) * float(st["p10"])
            except (KeyError, TypeError, ValueError):
                raise CheckFailed(f"{q}: run {i + 1} of {what} has no step times (n, p10)") from None
            key = (start, end)
            launches[key] = launches.get(key, 0.0) + busy
        for (start, end), busy in launches.items():
            took = (end - start).total_seconds()
            expect(took >= 0.99 * busy, f"{q}: {what}: a launch of {took:.3f} s holds runs whose timed steps alone "
                   f"took {busy:.3f} s — the runs were not measured in that launch")

    def ab_from_runs(self, *, metric: str = "time", min_effect: float = 0.03):
        """The A/B recorded in this evidence (values ``runs``, ``rounds``, ``warmup``, ``a``, ``b``, ``a2``, as
        ``ab_train(same_ranks=True)`` returns them) re-derived from its runs: bound to this execution
        (:meth:`check_launched_here`), in :func:`labkit.measure.ab.call_order`'s interleaved order, each run's figure from
        its step times (``metric="throughput"``: tokens per step ÷ median step), the recorded samples equal to
        those figures, and the verdict judged again by :func:`labkit.measure.ab.ab_compare`. Returns its ``ABResult``.
        Taught in the labs (``labs/README.md``: the grading rule, point 1; lab 10's q3); the A/B in chapter 28."""
        import numpy as np

        from labkit.measure import ab

        q = self.question
        runs = self.value("runs")
        expect(isinstance(runs, list) and runs, f"{q}: the evidence holds no A/B runs")
        try:
            rounds, warm = int(self.value("rounds")), int(self.value("warmup"))
            order = ab.call_order(rounds, warm)
        except (TypeError, ValueError) as e:
            raise CheckFailed(f"{q}: the A/B's rounds and warm-up are not valid ({e})") from None
        expect([[r.get("arm"), r.get("when")] if isinstance(r, dict) else None for r in runs]
               == [list(o) for o in order], f"{q}: the runs are not the A/B's interleaved calls")
        self.check_launched_here(runs, "the A/B")
        queues: dict = {"a": [], "b": []}
        for r, (arm, _) in zip(runs, order, strict=True):
            try:
                step = float(r["step_time"]["median"])
                fig = step if metric == "time" else float(r["tokens_per_step"]) / step
            except (KeyError, TypeError, ValueError, ZeroDivisionError):
                raise CheckFailed(f"{q}: a run of arm {arm} has no step time or tokens per step") from None
            expect(math.isfinite(fig) and fig > 0, f"{q}: a run of arm {arm} has no positive step time")
            queues["b" if arm == "B" else "a"].append(fig)
        res = ab.ab_compare(lambda: queues["a"].pop(0), lambda: queues["b"].pop(0), rounds=rounds, warmup=warm,
                            metric=metric, min_effect=min_effect, seed=None)
        for k in ("a", "b", "a2"):
            got = self.value(k)
            ok = isinstance(got, list) and len(got) == len(getattr(res, k))
            expect(ok and np.allclose(got, getattr(res, k), rtol=1e-9),
                   f"{q}: the A/B samples ({k}) do not follow from its runs' step times")
        return res
