"""Check-yourself questions with automatic, specific feedback.

Every chapter ends its sections with a few questions. The expected answer is always **computed by
labkit** (a formula or a measurement in the notebook), never typed as a literal, so the question stays
right when the learner's machine or parameters change.

How a notebook uses it (one question = two cells)::

    # cell 1 (author): the question; its answer comes from a labkit call
    from labkit.teaching import quiz
    from labkit.perf import cost
    q1 = quiz.Question(
        "ch01-q1",
        "Throughput drops by 30%. How much longer (as a fraction, e.g. 0.25) does the run take?",
        answer=cost.extra_wallclock_fraction(0.30),
        explanation="Time ∝ 1/throughput: 1/(1-0.30) - 1 ≈ 0.43, more than the 30% drop.",
        mistakes={0.30: "that is the drop in throughput; time grows by 1/(1-drop) - 1"},
    )
    q1.show()

    # cell 2 (learner): replace None with your answer and run the cell
    answer = None
    quiz.check(q1, answer)

``check`` prints one of: "not answered yet" (the value is ``None``: nothing is wrong, the learner has
not tried), "correct" (within ``tol_rel``), or why the answer is wrong — too high / too low and by how
much, a known mistake named in ``mistakes``, or a percentage given where a fraction was asked (and
the reverse). It returns ``True`` only for a correct answer, so an executed notebook can assert that a
check passes for the computed answer and fails for a wrong one.

A notebook verifies its own questions (the right answer passes, a known mistake fails) with
:func:`verify`, or with ``assert quiz.check(...)``: a check that is the test of an ``assert`` statement prints
nothing, so Run All never shows the answers under questions the learner has not answered yet.

Answers may be numbers (relative tolerance ``tol_rel``, absolute ``tol_abs`` for answers near 0),
strings (compared case- and space-insensitively; ``choices`` lists the valid options) or booleans.

Used by every chapter; written for chapter 1 (``chapters/part1_cognition/ch01_why_throughput.ipynb``).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Question", "Prediction", "check", "check_all", "verify", "Feedback", "evaluate"]


@dataclass(frozen=True)
class Question:
    """One check-yourself question.

    ``answer`` is a number, string or bool computed by labkit. ``tol_rel`` is the accepted relative
    error for numbers (default 2%); ``tol_abs`` an absolute slack used when the answer is 0 or tiny.
    ``choices`` (strings) restricts and documents the accepted words. ``mistakes`` maps a known wrong
    answer (computed, like the answer) to the reason it is wrong. Taught in chapter 1.
    """

    id: str
    prompt: str
    answer: Any
    tol_rel: float = 0.02
    explanation: str = ""
    tol_abs: float = 0.0
    choices: tuple[str, ...] = ()
    mistakes: dict = field(default_factory=dict)
    unit: str = ""

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Question id must be a non-empty string, got {self.id!r}")
        if self.answer is None:
            raise ValueError(f"Question {self.id}: answer is None; compute it with labkit before asking")
        if isinstance(self.answer, bool) or isinstance(self.answer, str):
            pass
        elif isinstance(self.answer, numbers.Real):
            if not math.isfinite(float(self.answer)):
                raise ValueError(f"Question {self.id}: answer must be finite, got {self.answer!r}")
        else:
            raise TypeError(f"Question {self.id}: answer must be a number, str or bool, "
                            f"got {type(self.answer).__name__}")
        if not (0 <= self.tol_rel < 1):
            raise ValueError(f"Question {self.id}: tol_rel must be in [0, 1), got {self.tol_rel!r}")
        if self.tol_abs < 0:
            raise ValueError(f"Question {self.id}: tol_abs must be >= 0, got {self.tol_abs!r}")
        object.__setattr__(self, "choices", tuple(self.choices))
        if self.choices and isinstance(self.answer, str) and _norm(self.answer) not in map(_norm, self.choices):
            raise ValueError(f"Question {self.id}: answer {self.answer!r} is not one of choices {self.choices}")

    # ------------------------------------------------------------------ display
    def text(self) -> str:
        s = f"[{self.id}] {self.prompt}"
        if self.choices:
            s += f"  (one of: {', '.join(self.choices)})"
        if self.unit:
            s += f"  [unit: {self.unit}]"
        return s

    def _repr_markdown_(self) -> str:
        return self.text().replace("[", "**[", 1).replace("]", "]**", 1)

    def show(self) -> None:
        """Print the question (works with and without a notebook front end)."""
        print(self.text())


@dataclass(frozen=True)
class Feedback:
    """The outcome of one check: ``status`` in {"correct", "wrong", "unanswered"} and the message."""

    question_id: str
    status: str
    message: str

    @property
    def ok(self) -> bool:
        return self.status == "correct"


#: What a prediction is compared with (the word :meth:`Prediction.reveal` prints before the value).
BASES = ("measured", "modelled", "computed")


@dataclass(frozen=True)
class Prediction:
    """A "predict, then measure" question: the learner writes a guess *before* a measurement runs.

    Unlike a :class:`Question`, the answer does not exist when the question is asked — it is the
    measurement the next cells make. ``reveal`` compares the guess with it and says by how much the
    learner's mental model was off, and in which direction; ``tol_rel`` is how close counts as a good
    prediction (default 25 %: a prediction is a model, not a measurement). ``basis`` names where the value
    comes from — "measured" (a live run), "modelled" (labkit's model or a SYNTHETIC artefact) or "computed"
    (arithmetic on given numbers) — and is the word ``reveal`` prints. Taught in chapter 1::

        p = quiz.Prediction("ch05-p1", "How much faster will 2 ranks train than 1?", unit="×")
        p.show()
        my_prediction = None          # write your guess here, then run the measurement below
        ...                           # the measurement
        p.reveal(my_prediction, actual=speedup, why="two ranks share two cores and a memory bus")
    """

    id: str
    prompt: str
    unit: str = ""
    tol_rel: float = 0.25
    basis: str = "measured"

    def __post_init__(self):
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Prediction id must be a non-empty string, got {self.id!r}")
        if not (0 < self.tol_rel < 1):
            raise ValueError(f"Prediction {self.id}: tol_rel must be in (0, 1), got {self.tol_rel!r}")
        if self.basis not in BASES:
            raise ValueError(f"Prediction {self.id}: basis={self.basis!r} is not valid; use one of {BASES}")

    def text(self) -> str:
        unit = f"  [unit: {self.unit}]" if self.unit else ""
        return f"[{self.id}] Predict before you measure: {self.prompt}{unit}"

    def show(self) -> None:
        """Print the question; the learner answers in the next cell, before the measurement runs."""
        print(self.text())

    def evaluate(self, guess: Any, actual: float) -> Feedback:
        """Compare ``guess`` with ``actual`` (the value the cells produced) without printing (``reveal``
        prints this)."""
        if isinstance(actual, bool) or not isinstance(actual, numbers.Real) or not math.isfinite(actual):
            raise ValueError(f"Prediction {self.id}: actual must be a finite number, got {actual!r}")
        unit = f" {self.unit}" if self.unit else ""
        got = f"{self.basis} {_fmt(actual)}{unit}"
        if guess is None or guess is Ellipsis:
            return Feedback(self.id, "unanswered",
                            f"no prediction written ({got}) — next time write a guess before running the cells that produce it")
        if isinstance(guess, bool) or not isinstance(guess, numbers.Real) or not math.isfinite(guess):
            return Feedback(self.id, "wrong", f"a prediction is a finite number, got {guess!r} ({got})")
        if actual == 0:
            off = abs(guess)
            close = off <= self.tol_rel
            detail = f"off by {_fmt(off)}{unit}"
        else:
            rel = (guess - actual) / abs(actual)
            close = abs(rel) <= self.tol_rel
            detail = f"{abs(rel):.0%} {'too high' if rel > 0 else 'too low'}" if rel else "exact"
        status = "correct" if close else "wrong"
        verdict = "a good prediction" if close else "your model of the system missed something"
        return Feedback(self.id, status, f"you predicted {_fmt(guess)}{unit}, {got}: {detail} — {verdict}")

    def reveal(self, guess: Any, *, actual: float, why: str = "") -> None:
        """Print how the guess compares with the value the cells produced (and ``why``, the mechanism).

        Returns nothing, so a notebook cell ending in it shows only the printed lines; :meth:`evaluate`
        gives the verdict as a :class:`Feedback`."""
        fb = self.evaluate(guess, actual)
        mark = {"correct": "✔", "wrong": "✘", "unanswered": "…"}[fb.status]
        print(f"{mark} [{fb.question_id}] {fb.message}")
        if why:
            print(f"  why: {why}")


def _norm(s: str) -> str:
    return " ".join(str(s).lower().split())


def _fmt(x: float) -> str:
    x = float(x)
    if x == 0:
        return "0"
    if abs(x) >= 1e5 or abs(x) < 1e-3:
        return f"{x:.3g}"
    return f"{x:.4g}"


def _close(a: float, b: float, tol_rel: float, tol_abs: float) -> bool:
    return abs(a - b) <= max(tol_rel * abs(b), tol_abs)


def evaluate(question: Question, value: Any) -> Feedback:
    """Judge ``value`` against ``question`` without printing (``check`` prints this)."""
    if not isinstance(question, Question):
        raise TypeError(f"question must be a labkit.teaching.quiz.Question, got {type(question).__name__}")
    q = question
    if value is None or value is Ellipsis:
        return Feedback(q.id, "unanswered", "not answered yet — replace None with your answer and re-run the cell")

    # booleans
    if isinstance(q.answer, bool):
        v = value
        if isinstance(value, str) and _norm(value) in {"true", "yes", "false", "no"}:
            v = _norm(value) in {"true", "yes"}
        if not isinstance(v, bool):
            return Feedback(q.id, "wrong", f"expected True or False, got {value!r}")
        if v == q.answer:
            return Feedback(q.id, "correct", "correct")
        return Feedback(q.id, "wrong", f"not quite: the answer is {q.answer}")

    # strings / choices
    if isinstance(q.answer, str):
        if not isinstance(value, str):
            return Feedback(q.id, "wrong", f"expected a word or phrase, got {type(value).__name__} {value!r}")
        nv = _norm(value)
        if nv == _norm(q.answer):
            return Feedback(q.id, "correct", "correct")
        for wrong, why in q.mistakes.items():
            if isinstance(wrong, str) and nv == _norm(wrong):
                return Feedback(q.id, "wrong", f"{value!r} is a common mistake: {why}")
        if q.choices and nv not in map(_norm, q.choices):
            return Feedback(q.id, "wrong", f"{value!r} is not one of the options: {', '.join(q.choices)}")
        return Feedback(q.id, "wrong", f"{value!r} is not the answer")

    # numbers
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        try:
            value = float(value)
        except (TypeError, ValueError):
            return Feedback(q.id, "wrong", f"expected a number, got {type(value).__name__} {value!r}")
    v, a = float(value), float(q.answer)
    if not math.isfinite(v):
        return Feedback(q.id, "wrong", f"expected a finite number, got {v}")
    unit = f" {q.unit}" if q.unit else ""
    if _close(v, a, q.tol_rel, q.tol_abs):
        return Feedback(q.id, "correct", f"correct ({_fmt(v)}{unit}; expected {_fmt(a)}{unit})")
    for wrong, why in q.mistakes.items():
        if isinstance(wrong, numbers.Real) and _close(v, float(wrong), q.tol_rel, q.tol_abs):
            return Feedback(q.id, "wrong", f"{_fmt(v)}{unit} is a common mistake: {why}")
    if a != 0 and _close(v, a * 100, q.tol_rel, q.tol_abs):
        return Feedback(q.id, "wrong", f"{_fmt(v)} looks like a percentage; give a fraction (e.g. 0.43, not 43)")
    if a != 0 and _close(v, a / 100, q.tol_rel, q.tol_abs):
        return Feedback(q.id, "wrong", f"{_fmt(v)} looks like a fraction; this answer is a percentage")
    if a != 0 and v != 0 and (v / a) > 0:
        ratio = v / a
        order = math.log10(ratio)
        if abs(order - round(order)) < 0.02 and round(order) != 0:
            return Feedback(q.id, "wrong", f"off by a factor of 10^{round(order)} — check your units{unit}")
    if a != 0 and (v > 0) != (a > 0):
        return Feedback(q.id, "wrong", f"{_fmt(v)}{unit} has the wrong sign")
    direction = "too high" if v > a else "too low"
    off = f" by {abs(v - a) / abs(a):.0%}" if a != 0 else f" by {_fmt(abs(v - a))}{unit}"
    return Feedback(q.id, "wrong", f"{_fmt(v)}{unit} is {direction}{off} (tolerance {q.tol_rel:.0%})")


def verify(question: Question, value: Any) -> bool:
    """True when ``value`` is a correct answer to ``question``, printing nothing: how a notebook checks its own
    questions without revealing their answers before the learner has tried. Taught in chapter 1."""
    return evaluate(question, value).ok


def _in_assert(depth: int = 2) -> bool:
    """Whether the caller ``depth`` frames up is evaluating the test of an ``assert`` statement (read from its
    source, a file or a notebook cell in ``linecache``; False when the source cannot be read)."""
    import ast
    import linecache
    import sys

    try:
        frame = sys._getframe(depth)
    except ValueError:
        return False
    src = "".join(linecache.getlines(frame.f_code.co_filename, frame.f_globals))
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return False
    line = frame.f_lineno
    return any(isinstance(node, ast.Assert) and node.lineno <= line <= (node.end_lineno or node.lineno)
               for node in ast.walk(tree))


def check(question: Question, value: Any) -> bool:
    """Print feedback on the learner's ``value`` and return True only when it is correct.

    ``None`` prints "not answered yet" and returns False (not an error: an unanswered notebook still
    runs top to bottom). A wrong answer prints why. After a correct answer or a wrong one the
    explanation is printed too. Inside an ``assert`` (a notebook verifying its own question) it prints
    nothing, as :func:`verify`: the answer is not revealed before the learner answers. Taught in chapter 1.
    """
    fb = evaluate(question, value)
    if fb.status != "unanswered" and _in_assert():   # the notebook verifying itself: reveal nothing
        return fb.ok
    mark = {"correct": "✔", "wrong": "✘", "unanswered": "…"}[fb.status]
    print(f"{mark} [{fb.question_id}] {fb.message}")
    if fb.status != "unanswered" and question.explanation:
        print(f"  why: {question.explanation}")
    return fb.ok


def check_all(questions: list[Question], answers: dict[str, Any]) -> dict[str, bool]:
    """Check several answers given as ``{question.id: value}``; prints a one-line score at the end."""
    ids = [q.id for q in questions]
    unknown = sorted(set(answers) - set(ids))
    if unknown:
        raise ValueError(f"answers has ids {unknown} that are not questions here; valid ids: {ids}")
    res = {q.id: check(q, answers.get(q.id)) for q in questions}
    print(f"score: {sum(res.values())}/{len(res)}")
    return res
