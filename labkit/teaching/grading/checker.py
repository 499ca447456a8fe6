"""Run a lab's hidden checks against a submission's recorded evidence, in a fresh process.

``python -P -m labkit.teaching.grading.checker SPEC.json`` — started by the grader with the submission's limits,
in a folder of its own (never the submission's, which the learner's code could have filled with
modules of its own). Each check is the code of one hidden cell of the instructor source, executed with
these names defined:

``evidence(q)``  :class:`~labkit.teaching.grading.evidence.Evidence` of question ``q`` (CheckFailed if missing)
``expect(c, m)`` fail with message ``m`` unless ``c``; ``close(a, b, rel=)`` numeric agreement
``note(text)``   report a finding that costs no point (an inconclusive A/B): kept in the result's message
``CheckFailed``, ``LAB`` (lab id), ``WORK`` (the submission's work folder), ``PARAMS`` (injected parameters)
``KEY``          the instructor's key (``labkit grade --key-file``; None without one): checks of a lab whose
                 fault a ticket draws (:mod:`labkit.teaching.tickets`) verify the recorded ticket with it. It reaches this
                 process through its environment only (``LABKIT_GRADING_KEY``, removed on start), never a file
                 or the submission's kernel
``SUBMITTED``    the notebook as the learner submitted it (its outputs are what they saw before the grader
                 re-ran it: untrusted, for saying why a check failed — "that figure is stale" — never for passing one)

Checks are written to the grading rule of :mod:`labkit.teaching.grading.evidence` (its docstring): a point that rests on a
timing is judged from the learner's own recorded runs, re-derived from the evidence and bound to this execution;
the grader's re-execution proves where the evidence came from and never re-decides the effect; an inconclusive
measurement is noted, never penalised; no answer scores without the work behind it.

A check passes when its code finishes; :class:`CheckFailed` is a failed check with its message, any other
exception is a failed check reported as such, and a check past ``check_s`` seconds fails as timed out.
Each result holds ``message`` as the check wrote it and ``learner_message``, the same with the numbers
the learner's evidence does not contain withheld (:func:`labkit.teaching.grading.feedback.withhold`).
"""
from __future__ import annotations

import json
import signal
import sys
import time
import traceback
from pathlib import Path

from labkit.teaching.grading.evidence import CheckFailed, Evidence, close, expect, note
from labkit.teaching.grading.feedback import learner_numbers, withhold


class _CheckTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _CheckTimeout()


def run_checks(spec: dict) -> list[dict]:
    """Run every check of ``spec`` against the evidence under ``spec["work_root"]``; one result dict each."""
    import os

    lab, work = spec["lab"], Path(spec["work_root"])
    key = os.environ.pop("LABKIT_GRADING_KEY", None) or None
    results = []
    signal.signal(signal.SIGALRM, _alarm)
    for chk in spec["checks"]:
        notes: list[str] = []

        def _note(text: str, _notes=notes) -> None:
            note(text)   # the same validation as in a kernel (its print goes to the checker's log)
            _notes.append(text.strip())

        ns = {"__name__": f"labkit_hidden_{chk['id']}", "LAB": lab, "WORK": work,
              "PARAMS": dict(spec.get("params") or {}), "SUBMITTED": spec.get("submitted"), "KEY": key,
              "expect": expect, "close": close, "note": _note,
              "CheckFailed": CheckFailed,
              "evidence": lambda q, _lab=lab, _w=work: Evidence.load(_lab, q, root=_w)}
        res = {"id": chk["id"], "question": chk["question"], "weight": chk["weight"], "passed": False,
               "message": ""}
        t0 = time.perf_counter()
        signal.alarm(max(1, int(spec.get("check_s", 60))))
        try:
            exec(compile(chk["source"], f"<hidden check {chk['id']}>", "exec"), ns)  # noqa: S102 - instructor code
            res["passed"] = True
            res["message"] = "passed" + "".join(f"; note: {n}" for n in notes)
        except CheckFailed as e:
            res["message"] = str(e) or "check failed"
        except _CheckTimeout:
            res["message"] = f"check timed out after {spec.get('check_s', 60)} s"
        except Exception as e:  # noqa: BLE001 - a broken evidence file fails the check, never the grader
            tb = traceback.format_exception_only(type(e), e)[-1].strip()
            res["message"] = f"check could not run on this evidence: {tb[:500]}"
        finally:
            signal.alarm(0)
        res["seconds"] = round(time.perf_counter() - t0, 3)
        results.append(res)
    numbers = learner_numbers(work, lab)
    for res in results:
        res["learner_message"] = res["message"] if res["passed"] else withhold(res["message"], numbers)
    return results


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m labkit.teaching.grading.checker SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    results = run_checks(spec)
    from labkit.record import atomic_write_text

    atomic_write_text(spec["result"], json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
