"""What a learner gets back: ``feedback/<student>.md`` beside the instructor's ``feedback/<student>.json``.

The JSON is the instructor's full record. The Markdown file is written for the learner: the score,
one line per question, each failed check's message (every one, none twice; a question's row starts with
its own check, :func:`row_messages`), and the grader's notes; the ``[hidden]`` footer only when a value
was withheld.

Correct values (``--feedback-values``, default ``hide``). A hidden check's message often names the
value it expected ("q2: 123 is not 0.5 / MFU = 3.374"). The checker therefore records each message
twice: ``message`` as the check wrote it, and ``learner_message`` in which every number that the
learner's own evidence does not contain is replaced by ``[hidden]`` (:func:`withhold`): numbers the
learner submitted or measured stay, numbers the check computed go ("q2: 123 is not [hidden] / MFU =
[hidden]"); a withheld number goes with its sign. ``hide`` puts the learner messages in the Markdown, ``show`` the messages as written. A
number counts as the learner's when one of their evidence numbers, rounded to the digits shown,
reads the same — so a check that wants a value kept shows it with the precision it was recorded at.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from labkit import checks

VALUES = ("show", "hide")
HIDDEN = "[hidden]"
# a number with its sign: a withheld "-0.0103" becomes "[hidden]", never "-[hidden]" (the sign is part of it)
_NUMBER = re.compile(r"(?<![\w.*])(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)(?!\w|\.\d)")


def check_values(setting: str) -> str:
    """``setting`` if it is a valid ``--feedback-values`` choice (show / hide), else a ValueError."""
    return checks.one_of("feedback_values", setting, VALUES)


def learner_numbers(work_root, lab: str, limit_bytes: int = 4 * 2**20) -> list[float]:
    """Every number in the evidence files of ``lab`` under ``work_root`` (absolute values, no booleans)."""
    found: list[float] = []
    for p in sorted((Path(work_root) / "evidence" / lab).glob("*.json")):
        try:
            if p.stat().st_size > limit_bytes:
                continue
            stack = [json.loads(p.read_text())]
        except (OSError, ValueError, RecursionError):
            continue
        while stack:
            v = stack.pop()
            if isinstance(v, dict):
                stack.extend(v.values())
            elif isinstance(v, list):
                stack.extend(v)
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
                found.append(abs(float(v)))
    return found


def _digits(token: str) -> int:
    mantissa = re.split(r"[eE]", token)[0].replace(".", "").lstrip("0")
    return max(1, len(mantissa))


def _shown(token: str, numbers) -> bool:
    value, sig = abs(float(token)), _digits(token.lstrip("-"))
    for x in numbers:
        if x == value:
            return True
        try:
            if float(f"{x:.{sig}g}") == value:
                return True
        except (OverflowError, ValueError):
            continue
    return False


def withhold(message: str, numbers) -> str:
    """``message`` with every number not among the learner's ``numbers`` replaced by ``[hidden]``."""
    numbers = sorted(set(numbers))
    return _NUMBER.sub(lambda m: m.group(0) if _shown(m.group(1), numbers) else HIDDEN, message)


_PREFIX = re.compile(r"^\s*([A-Za-z][\w.\-]{0,63}):\s")


def row_messages(qid: str, checks, key: str = "message", questions=()) -> list[str]:
    """The failed checks' messages of question ``qid``, each once, its own first: the row of a question starts
    with that question's check. A check of ``qid`` that failed on another question's evidence (a q2 check that
    reads q1's run: "q1: no run record…") is said as ``qid``'s ("q2: needs q1's evidence — q1: no run
    record…") and comes after ``qid``'s own messages. ``key``: ``message`` or ``learner_message``."""
    own, other = [], []
    for c in checks:
        if c.get("passed"):
            continue
        text = " ".join(str(c.get(key) or c.get("message") or "check failed").split())
        m = _PREFIX.match(text)
        named = m.group(1) if m else None
        if named is not None and named != qid and (named in questions or not questions):
            other.append(f"{qid}: needs {named}'s evidence — {text}")
        else:
            own.append(text)
    return list(dict.fromkeys(own + other))


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def render(fb: dict, values: str = "hide") -> str:
    """The learner's Markdown feedback of one feedback dict; ``values`` as in ``--feedback-values``."""
    check_values(values)
    key = "message" if values == "show" else "learner_message"
    lines = [f"# {fb.get('lab')}: feedback for {fb.get('student')}", ""]
    score = f"**Score: {fb.get('score', 0):g} / {fb.get('max_score', 0):g}**"
    status = fb.get("status")
    lines.append(score if status == "graded" else f"{score} (status: {status})")
    sub = fb.get("submitted_as") or {}
    if sub.get("file"):
        extra = " (late)" if sub.get("late") else ""
        lines += ["", f"Graded file: `{sub['file']}`{extra}"]
        if sub.get("replaced"):
            lines.append(f"It replaces your earlier upload(s): {', '.join(f'`{n}`' for n in sub['replaced'])}")
    questions = fb.get("questions") or {}
    if questions:
        lines += ["", "| question | score | feedback |", "|---|---|---|"]
        rest: dict[str, list[str]] = {}
        for qid, q in questions.items():
            # every failed check's message once, the question's own first: the first in the table, the
            # others under "also to fix"
            msgs = [_cell(m) for m in row_messages(qid, q.get("checks", []), key, questions=list(questions))]
            if msgs:
                text = msgs[0] + (f" (and {len(msgs) - 1} more below)" if len(msgs) > 1 else "")
            else:
                text = _cell(q.get("feedback")) if not q.get("checks") else "all checks passed"
            lines.append(f"| {qid} | {q.get('score', 0):g} / {q.get('max_score', 0):g} | {text} |")
            if len(msgs) > 1:
                rest[qid] = msgs[1:]
        for qid, msgs in rest.items():
            lines += ["", f"## {qid}: also to fix", ""] + [f"- {m}" for m in msgs]
    if fb.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in dict.fromkeys(_cell(n) for n in fb["notes"])]
    if values == "hide" and any(HIDDEN in line for line in lines):    # the footer only when something was hidden
        lines += ["", f"_Values your evidence does not contain are shown as {HIDDEN}._"]
    return "\n".join(lines) + "\n"


def write(out: Path, fb: dict, values: str = "hide") -> Path:
    """Write ``out/feedback/<student>.md`` atomically; returns its path."""
    from labkit.record import atomic_write_text

    path = Path(out) / "feedback" / f"{fb['student']}.md"
    atomic_write_text(path, render(fb, values))
    return path
