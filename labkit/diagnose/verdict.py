"""What a diagnosis says: the :class:`Thresholds` that turn figures into findings (severity cut-offs
included), one :class:`Finding` per diagnosed problem, and the :class:`Diagnosis` that orders them
under a verdict. The reasons and sources of each threshold are in :mod:`labkit.diagnose`.

Taught in chapter 14 (systematic diagnosis).
"""
from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

WIDTH = 100   # report lines fit a notebook's ~120-character output area with room for its margins

__all__ = ["FAMILIES", "Thresholds", "Finding", "Diagnosis"]

FAMILIES = ("compute", "communication", "memory", "data", "scheduling")


@dataclass(frozen=True)
class Thresholds:
    """Where a figure becomes a finding, and how a finding's score becomes its severity (see
    :mod:`labkit.diagnose` for the reasoning and sources).

    ``severity_high``/``severity_medium``: a score (fraction of step time at stake) at or above them is
    "high"/"medium", below "low"; a wait at least medium takes precedence over compute in the verdict.
    ``recompute_hfu_ratio``: HFU above MFU × this means recomputation ran (2 % for rounding).

    Taught in chapter 14.
    """

    mfu_low: float = 0.30
    comm_exposed: float = 0.15
    data_wait: float = 0.05
    data_wait_high: float = 0.10
    memory_near: float = 0.90
    host_wait: float = 0.10
    host_gap: float = 0.25
    tiny_kernel_us: float = 10.0
    peer_wait: float = 0.10
    min_score: float = 0.05
    severity_high: float = 0.25
    severity_medium: float = 0.10
    recompute_hfu_ratio: float = 1.02

    def severity(self, score: float) -> str:
        """"high", "medium" or "low" for a score (fraction of step time at stake). Taught in chapter 14."""
        return "high" if score >= self.severity_high else "medium" if score >= self.severity_medium else "low"


@dataclass
class Finding:
    """One diagnosed problem. ``score``: estimated fraction of step time at stake.

    Taught in chapter 14.
    """

    family: str
    severity: str
    score: float
    title: str
    evidence: dict[str, Any]
    thresholds: dict[str, float]
    advice: list[str]
    note: str = ""

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r} is not valid; choose one of {FAMILIES}")


@dataclass
class Diagnosis:
    """Findings in the diagnosis order (compute, communication, data, memory, scheduling) and a verdict.

    Taught in chapter 14.
    """

    findings: list[Finding]
    verdict: str
    primary: str | None
    figures: dict[str, Any] = field(default_factory=dict)

    def report(self, width: int = WIDTH) -> str:
        """A readable report: the figures read, then each finding with evidence and advice. Every line is at
        most ``width`` characters, wrapped at word boundaries (a notebook's output area is ~120 characters
        wide and breaks longer lines mid-word: "dat a wait", "2026-1 2-01")."""
        def wrap(text: str, indent: str = "", first: str = "") -> list[str]:
            return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=indent,
                                 break_long_words=False, break_on_hyphens=False) or [first.rstrip()]

        lines = ["Diagnosis (metrics → logs → topology → strategy)", ""]
        figures = ", ".join(f"{k} {_fmt(v)}" for k, v in self.figures.items() if v is not None)
        lines += wrap("Figures: " + figures, "  ")
        lines.append("")
        if not self.findings:
            lines.append("No finding crossed its threshold.")
        for i, f in enumerate(self.findings, 1):
            mark = "  <== primary" if f is self.primary_finding else ""
            lines += wrap(f"{i}. [{f.family}] {f.title} — severity {f.severity}, "
                          f"≈{f.score:.0%} of step time at stake{mark}", "     ")
            pad = " " * 15
            for k, v in f.evidence.items():
                lines += wrap(f"{k} = {_fmt(v)}", pad, "     evidence  ")
            for k, v in f.thresholds.items():
                lines += wrap(f"{k} = {_fmt(v)}", pad, "     threshold ")
            if f.note:
                lines += wrap(f.note, pad, "     note      ")
            for a in f.advice:
                lines += wrap(a, pad, "     advice    ")
        lines.append("")
        lines += wrap(f"Verdict: {self.verdict}", "  ")
        return "\n".join(lines)

    @property
    def primary_finding(self) -> Finding | None:
        """The one finding the verdict names: the highest-scoring finding of the primary family (two findings
        of one family — a straggler and a host gap are both scheduling — are not both "primary")."""
        mine = [f for f in self.findings if f.family == self.primary]
        return max(mine, key=lambda f: f.score) if mine else None

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "primary": self.primary, "figures": self.figures,
                "findings": [asdict(f) for f in self.findings]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)


def _fmt(v) -> str:
    if isinstance(v, float):
        if 0 < abs(v) < 1e-3 or abs(v) >= 1e5:
            return f"{v:.3g}"
        return f"{v:.3f}"
    return str(v)

