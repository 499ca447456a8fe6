"""Checked claims: a cell that teaches a direction states it, checks it, and says what it found.

A lesson such as "a slower loader lowers tokens/s" or "recomputation costs time" is shown by a live
measurement, and a loaded machine can invert a small effect. :func:`claim` turns the sentence into a
comparison of two measured numbers (both ≥ 0), ``left op right`` (``op`` is ``">"`` or ``"<"``), and
judges it:

- the **effect** is the relative change in the claimed direction: for ``">"`` it is
  ``left / right − 1``, for ``"<"`` it is ``1 − left / right`` (so a positive effect agrees with the claim);
- the **resolution** is the smallest effect this measurement can tell from noise: the larger of
  ``margin`` (the smallest effect the lesson cares about) and ``noise`` (what the same measurement moved
  against itself on this machine — e.g. the p10–p90 spread of a run's step times, or an A vs A' interval
  from :func:`labkit.measure.ab.ab_compare`);
- **holds** when the effect exceeds the resolution, **contradicted** when it is below minus the
  resolution, **inconclusive** otherwise.

A contradicted claim raises :class:`ClaimContradicted` (the notebook stops: the lesson is wrong on
this machine, or its effect was sized too small); an inconclusive one prints why and lets the notebook go
on. Every claim is also published with its numbers in the cell's output metadata (key ``labkit_claim``),
so ``make refresh`` refuses to store outputs in which a claim does not hold, and the test suite re-judges
every stored claim from its stored numbers (:func:`stored_claims`, :func:`judge`).

Used by the chapters of Parts I–II and the labs; the method is taught in chapter 28 (regression testing).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from labkit import checks

STATUSES = ("holds", "inconclusive", "contradicted")
OPS = (">", "<")
METADATA_KEY = "labkit_claim"
__all__ = ["Claim", "ClaimContradicted", "claim", "judge", "stored_claims", "rejudge", "STATUSES", "OPS", "METADATA_KEY"]


class ClaimContradicted(AssertionError):
    """A measured result contradicts the lesson its cell teaches, beyond this machine's noise."""

    def _render_traceback_(self) -> list[str]:
        """What Jupyter shows instead of a traceback into labkit (the message carries the numbers)."""
        return [str(self), "Re-run the cell on a quieter machine; if it repeats, the effect is real: tell the course."]


def effect(left: float, op: str, right: float) -> float:
    """Relative change in the claimed direction (positive: agrees with ``left op right``).

    Against a reference of 0 (e.g. "some communication is hidden" against none), any positive ``left``
    is an unbounded effect: ±inf, in the direction it agrees or disagrees with ``op``.
    """
    if right == 0:
        return 0.0 if left == 0 else (math.inf if op == ">" else -math.inf)
    ratio = left / right
    return ratio - 1.0 if op == ">" else 1.0 - ratio


def judge(left: float, op: str, right: float, *, margin: float, noise: float = 0.0) -> str:
    """``"holds"``, ``"contradicted"`` or ``"inconclusive"`` for ``left op right`` (see the module docs).
    Every argument is checked (finite numbers >= 0, ``op`` one of :data:`OPS`): a ValueError naming it."""
    checks.one_of("op", op, OPS)
    left, right = checks.nonneg("left", left), checks.nonneg("right", right)
    margin, noise = checks.nonneg("margin", margin), checks.nonneg("noise", noise)
    e = effect(left, op, right)
    resolution = max(margin, noise)
    if e > resolution:
        return "holds"
    if e < -resolution:
        return "contradicted"
    return "inconclusive"


@dataclass(frozen=True)
class Claim:
    """One judged claim: the sentence, the two numbers compared, and what the comparison found."""

    statement: str
    left: float
    op: str
    right: float
    labels: tuple[str, str]
    margin: float
    noise: float
    noise_from: str
    status: str

    @property
    def effect(self) -> float:
        return effect(self.left, self.op, self.right)

    @property
    def resolution(self) -> float:
        return max(self.margin, self.noise)

    def text(self) -> str:
        a, b = self.labels
        nums = f"{a} {self.left:.4g} {self.op} {b} {self.right:.4g}"
        size = f"effect {self.effect:+.1%}, resolution ±{self.resolution:.1%}"
        if self.status == "holds":
            return f"✔ claim holds: {self.statement} — {nums} ({size})"
        where = (f"this machine's noise ({self.noise:.1%}, {self.noise_from})" if self.noise >= self.margin
                 else f"the smallest effect that matters here ({self.margin:.0%})")
        if self.status == "inconclusive":
            return (f"? claim inconclusive: {self.statement} — {nums} ({size}): the effect is within {where}. "
                    f"Re-run on a quieter machine, or with more steps, before drawing the lesson from it.")
        return (f"✘ claim contradicted: {self.statement} — {nums} ({size}): the opposite of the lesson, beyond "
                f"{where}.")

    def _ipython_display_(self) -> None:
        """A claim left as a cell's last expression was already shown by :func:`claim`: don't repeat it."""
        if not getattr(self, "_shown", False):
            _publish(self)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["labels"] = list(self.labels)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Claim:
        try:
            return cls(statement=str(d["statement"]), left=float(d["left"]), op=str(d["op"]),
                       right=float(d["right"]), labels=tuple(d["labels"]), margin=float(d["margin"]),
                       noise=float(d["noise"]), noise_from=str(d.get("noise_from", "")), status=str(d["status"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a stored labkit claim ({e}): {d!r}") from None


def claim(statement: str, left: float, op: str, right: float, *, labels: tuple[str, str] = ("measured", "reference"),
          margin: float = 0.05, noise: float = 0.0, noise_from: str = "", show: bool = True) -> Claim:
    """Judge ``left op right`` as evidence for ``statement``; print (and publish) the verdict.

    ``margin``: the smallest relative effect that counts (a fraction, default 5 %); ``noise``: the
    relative change the same measurement showed against itself here (≥ 0), described by ``noise_from``.
    Raises :class:`ClaimContradicted` when the result is the opposite of the claim beyond both.
    Returns the :class:`Claim`. Taught in chapter 28; used by the chapters of Parts I–II.
    """
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError(f"statement must be a non-empty sentence, got {statement!r}")
    checks.one_of("op", op, OPS)
    left = checks.number("left", left, low=0)
    right = checks.nonneg("right", right)
    margin = checks.number("margin", margin, low=0, high=1, low_open=True, high_open=True)
    noise = checks.nonneg("noise", noise)
    if not (isinstance(labels, (tuple, list)) and len(labels) == 2 and all(isinstance(s, str) for s in labels)):
        raise ValueError(f"labels must be two names (left, right), got {labels!r}")
    if noise > 0 and not noise_from:
        raise ValueError("noise_from must say where the noise figure came from (e.g. 'p10–p90 spread of the baseline')")
    status = judge(left, op, right, margin=margin, noise=noise)
    c = Claim(statement.strip(), left, op, right, (labels[0], labels[1]), margin, noise, noise_from, status)
    if show:
        _publish(c)
    if status == "contradicted":
        raise ClaimContradicted(c.text())
    return c


def _publish(c: Claim) -> None:
    """Print the verdict; inside a Jupyter kernel also attach the numbers as output metadata."""
    object.__setattr__(c, "_shown", True)     # frozen dataclass: a display flag, not a field
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # plain Python: a printed line is the whole report
        print(c.text())
        return
    if get_ipython() is None:
        print(c.text())
        return
    display({"text/plain": c.text()}, raw=True, metadata={METADATA_KEY: c.to_dict()})


def stored_claims(nb) -> list[tuple[str, Claim]]:
    """Every claim stored in a notebook's outputs, as (cell id, :class:`Claim`).

    ``nb`` is a parsed notebook (``nbformat`` node or the plain JSON dict); a value that is not one (no
    ``cells`` list, a cell or output that is not an object) is a ValueError saying what it holds."""
    from collections.abc import Mapping

    if not isinstance(nb, Mapping) or not isinstance(nb.get("cells"), list):
        got = f"keys {sorted(map(str, nb))[:6]}" if isinstance(nb, Mapping) else type(nb).__name__
        raise ValueError(f"nb must be a parsed notebook (an object with a 'cells' list), got {got}")
    found = []
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, Mapping):
            raise ValueError(f"nb cells[{i}] is {type(cell).__name__}, not a notebook cell (an object)")
        if cell.get("cell_type") != "code":
            continue
        outs = cell.get("outputs", [])
        if not isinstance(outs, list):
            raise ValueError(f"nb cells[{i}].outputs is {type(outs).__name__}, not a list")
        for out in outs:
            meta = (out.get("metadata") or {}) if isinstance(out, Mapping) else {}
            if isinstance(meta, Mapping) and METADATA_KEY in meta:
                found.append((cell.get("id", "?"), Claim.from_dict(meta[METADATA_KEY])))
    return found


def rejudge(c: Claim) -> str:
    """The status ``c``'s own numbers give (a stored claim must agree with its stored status)."""
    if c.op not in OPS or not all(math.isfinite(x) and x >= 0 for x in (c.left, c.right, c.margin, c.noise)):
        return "contradicted"
    return judge(c.left, c.op, c.right, margin=c.margin, noise=c.noise)
