"""Graded labs: the lab format, evidence, release and batch grading.

- :class:`EvidenceBook` — what a lab's answer cell calls to record its evidence (light: no torch import).
- :func:`expect`, :class:`CheckFailed`, :func:`close`, :func:`note` — the verbs of visible and hidden checks
  (written to the grading rule in :mod:`~labkit.teaching.grading.evidence`'s docstring).
- :func:`load_lab`, :func:`release` — parse an instructor source; write the learner version.
- :func:`grade`, :class:`GradeConfig`, :class:`Limits` — grade a batch of submissions.
- :mod:`~labkit.teaching.grading.students` (LMS names, roster, late uploads, shards), :mod:`~labkit.teaching.grading.feedback`
  (the learner's Markdown, withheld values), :mod:`~labkit.teaching.grading.gradebook` (the CSV, merging shards).

Command line: ``labkit release LAB --out DIR``, ``labkit grade LAB SUBMISSIONS... --out DIR`` and
``labkit grade-merge OUT SHARD...``; the instructor's workflow is in ``labs/README.md``.

Taught in the labs (``labs/``): every lab records its evidence with :class:`EvidenceBook`.
"""
from __future__ import annotations

from labkit.teaching.grading.evidence import CheckFailed, Evidence, EvidenceBook, close, expect, note
from labkit.teaching.grading.labfmt import Lab, learner_notebook, load_lab, release
from labkit.teaching.grading.sandbox import Limits


def grade(lab, submissions, out, config=None):
    """Grade ``submissions`` of ``lab`` into ``out``; see :mod:`labkit.teaching.grading.batch`."""
    from labkit.teaching.grading.batch import grade as _grade

    return _grade(lab, submissions, out, config)


def __getattr__(name):
    if name in ("GradeConfig", "GradeResult"):
        from labkit.teaching.grading import batch

        return getattr(batch, name)
    raise AttributeError(f"module 'labkit.teaching.grading' has no attribute {name!r}")


__all__ = ["CheckFailed", "Evidence", "EvidenceBook", "close", "expect", "note", "Lab", "learner_notebook", "load_lab",
           "release", "Limits", "grade", "GradeConfig", "GradeResult"]
