"""What both seed cases share: a ⚠ record (:class:`CaseWarning`) and its Markdown rendering. Taught in
chapter 5 (the first ⚠ box of a case)."""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["CaseWarning", "warnings_markdown", "SOURCE", "AWS_P3"]

# The source document's numbers live in this package (each case's fields, quoted beside their meaning);
# nothing a case cites points outside the repository except public pages with their address.
SOURCE = "the course's source material, as quoted in labkit/cases"
AWS_P3 = ("AWS, Amazon EC2 P3 instances, https://aws.amazon.com/ec2/instance-types/p3/ (p3.8xlarge: 4 × V100 "
          "16 GB, GPU peer to peer: NVLink)")


def _case(cls, changes: dict):
    """``cls(**changes)`` with an unknown input named (a case's inputs are its dataclass fields)."""
    from dataclasses import fields

    valid = [f.name for f in fields(cls) if f.name != "warnings"]
    bad = sorted(set(changes) - set(valid))
    if bad:
        raise ValueError(f"{cls.__name__}: unknown input(s) {bad}; valid: {valid}")
    return cls(**changes)


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

    def markdown(self, case_label: str = "") -> str:
        """The record as a Markdown quote box, headed "⚠ <case> (<key>)". Taught in chapter 5."""
        head = f"{case_label} ({self.key})" if case_label else f"({self.key})"
        return "\n".join([f"> **⚠ {head} {self.title}**", ">",
                          f"> *The source says:* {self.claim} ({self.source})", ">",
                          f"> *Arithmetic:* {self.arithmetic}", ">",
                          f"> *What is right:* {self.right}", ">", f"> *Why:* {self.why}"])


def warnings_markdown(case, keys: str | None = None) -> str:
    """A case's ⚠ records as Markdown, one box each headed with the case's name (``case.label``), for
    ``display(Markdown(...))`` in a chapter; ``keys`` (e.g. ``"af"``) picks records by their letters, in that
    order (default: all).

    Taught in chapter 5 (BERT-large), chapter 11 and chapter 14 (both cases).
    """
    ws = getattr(case, "warnings", None)
    if not isinstance(ws, tuple) or not all(isinstance(w, CaseWarning) for w in ws):
        raise checks.ArgumentTypeError(f"case must be a labkit.teaching.cases case (bert_large(), thirteen_b()), got "
                                       f"{type(case).__name__} {case!r:.60}")
    by_key = {w.key: w for w in ws}
    if keys is not None:
        if not isinstance(keys, str) or not keys or any(k not in by_key for k in keys):
            raise ValueError(f"keys={keys!r} is not valid: use letters of {''.join(by_key)}")
        ws = tuple(by_key[k] for k in keys)
    label = getattr(case, "label", "")
    return "\n\n".join(w.markdown(label if isinstance(label, str) else "") for w in ws)
