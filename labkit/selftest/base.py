"""What a self-check is and what it gives back: :class:`Check`, :class:`CheckResult`, :class:`Skip`, :class:`Failed`.

A check's function ``fn(backend, plan, budget_s) -> figures`` returns its figures when the path works
and its numbers are plausible, raises :class:`Skip` when it cannot apply here and :class:`Failed` when a
number is outside its band (:mod:`labkit.selftest.runner` turns any other exception into a failure).

Taught in chapter 7 (timing) and chapter 4 (MFU).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

__all__ = ["Check", "CheckResult", "Skip", "Failed", "STATUSES"]

STATUSES = ("passed", "failed", "skipped")


class Skip(Exception):  # noqa: N818 - a control-flow signal, read as "skip(reason)"
    """Raised by a check that does not apply here; ``figures`` are kept in the report."""

    def __init__(self, reason: str, figures: dict | None = None):
        super().__init__(reason)
        self.figures = dict(figures or {})


class Failed(Exception):  # noqa: N818 - a verdict, read as "failed(reason)"
    """Raised by a check that ran but whose numbers are outside their band; ``figures`` are kept."""

    def __init__(self, reason: str, figures: dict | None = None):
        super().__init__(reason)
        self.figures = dict(figures or {})


@dataclass(frozen=True)
class Check:
    """One GPU path to exercise. ``fn(backend, plan, budget_s) -> dict`` of figures. Chapter 7."""

    name: str
    title: str
    chapters: str
    budget_s: float
    quick_budget_s: float
    fn: Callable

    def budget(self, quick: bool) -> float:
        return self.quick_budget_s if quick else self.budget_s


@dataclass
class CheckResult:
    """The outcome of one check: status, figures, wall seconds against its budget, error text."""

    name: str
    title: str
    chapters: str
    status: str
    seconds: float
    budget_s: float
    figures: dict = field(default_factory=dict)
    reason: str | None = None       # why it failed or was skipped (a verdict or a budget)
    error: str | None = None        # the exception, when the path itself broke

    def to_dict(self) -> dict:
        return asdict(self)
