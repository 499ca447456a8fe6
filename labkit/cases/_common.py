"""What both seed cases share: a ⚠ record (:class:`CaseWarning`) and its Markdown rendering. Taught in
chapter 5 (the first ⚠ box of a case)."""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["CaseWarning", "warnings_markdown", "SYLLABUS", "ISSUE_14"]

SYLLABUS = "the course syllabus, shared/course/SYLLABUS.md"
ISSUE_14 = "issue #14, quoting the source document"


@dataclass(frozen=True)
class CaseWarning:
    """One ⚠ point: what the source claims, the arithmetic that tests it, what is right, and why."""

    key: str
    title: str
    claim: str
    arithmetic: str
    right: str
    why: str
    source: str

    def __post_init__(self):
        for k in ("key", "title", "claim", "arithmetic", "right", "why", "source"):
            v = getattr(self, k)
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"CaseWarning.{k} must be a non-empty str, got {v!r}")

    def markdown(self) -> str:
        """The record as a Markdown quote box. Taught in chapter 5 (the first ⚠ box of a case)."""
        return "\n".join([f"> **⚠ ({self.key}) {self.title}**", ">",
                          f"> *The source says:* {self.claim} ({self.source})", ">",
                          f"> *Arithmetic:* {self.arithmetic}", ">",
                          f"> *What is right:* {self.right}", ">", f"> *Why:* {self.why}"])


def warnings_markdown(case, keys: str | None = None) -> str:
    """A case's ⚠ records as Markdown, one box each, for ``display(Markdown(...))`` in a chapter;
    ``keys`` (e.g. ``"ae"``) picks records by their letters, in that order (default: all).

    Taught in chapter 5 (BERT-large), chapter 11 and chapter 14 (both cases).
    """
    ws = getattr(case, "warnings", None)
    if not isinstance(ws, tuple) or not all(isinstance(w, CaseWarning) for w in ws):
        raise checks.ArgumentTypeError(f"case must be a labkit.cases case (bert_large(), thirteen_b()), got "
                                       f"{type(case).__name__} {case!r:.60}")
    by_key = {w.key: w for w in ws}
    if keys is not None:
        if not isinstance(keys, str) or not keys or any(k not in by_key for k in keys):
            raise ValueError(f"keys={keys!r} is not valid: use letters of {''.join(by_key)}")
        ws = tuple(by_key[k] for k in keys)
    return "\n\n".join(w.markdown() for w in ws)
