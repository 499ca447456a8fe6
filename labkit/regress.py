"""Performance regression monitor: is a new run faster, slower, or unchanged — beyond the noise?

A single timing says nothing; repeated measurements do. :func:`compare` takes a baseline sample and a
candidate sample (e.g. step times, or tokens/s) and decides with two guards:

1. **Statistics** — a seeded bootstrap confidence interval of the ratio of medians
   (candidate median ÷ baseline median; Efron & Tibshirani 1993, *An Introduction to the Bootstrap*,
   ch. 13, percentile interval), and the Mann–Whitney U test (normal approximation with tie
   correction; Mann & Whitney 1947) as a second, rank-based opinion reported beside it.
2. **Practical effect** — a minimum effect size ``min_effect`` (default 3 %): the whole confidence
   interval must lie beyond ±``min_effect`` of "no change" before a run is called faster or slower.
   So noise is never called a regression, and a real but negligible change is "unchanged".

``confidence`` is the bootstrap probability that the change is on the reported side of the practical
threshold (for "unchanged": the probability that it lies within it).

:class:`BaselineStore` keeps named baselines as JSON files (atomic writes; never overwrites unless
``overwrite=True``), so a CI job can ``save`` once and ``check`` every run.

Taught in chapter 28 (performance regression testing).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from labkit import checks
from labkit.record import RunRecord, atomic_write_text

VERDICTS = ("faster", "slower", "unchanged")


@dataclass(frozen=True)
class Verdict:
    """Result of :func:`compare`. ``change``: candidate/baseline median ratio − 1 (for times, +0.10 is
    10 % slower). ``ci``: bootstrap interval of that change. ``p_value``: Mann–Whitney two-sided.

    Taught in chapter 28.
    """

    verdict: str
    confidence: float
    change: float
    ci: tuple[float, float]
    ci_level: float
    min_effect: float
    p_value: float
    baseline_median: float
    candidate_median: float
    baseline_spread: float
    candidate_spread: float
    n_baseline: int
    n_candidate: int
    higher_is_better: bool

    def report(self) -> str:
        what = "higher is better" if self.higher_is_better else "lower is better"
        return (f"{self.verdict.upper()} (confidence {self.confidence:.0%}): median {self.baseline_median:.6g} → "
                f"{self.candidate_median:.6g} ({self.change:+.1%}, {self.ci_level:.0%} CI "
                f"[{self.ci[0]:+.1%}, {self.ci[1]:+.1%}]; {what}); practical threshold ±{self.min_effect:.0%}; "
                f"Mann–Whitney p = {self.p_value:.3g}; spread (p90−p10)/median {self.baseline_spread:.1%} → "
                f"{self.candidate_spread:.1%}; n = {self.n_baseline} vs {self.n_candidate}")

    def to_dict(self) -> dict:
        return asdict(self)


def _sample(name, values) -> np.ndarray:
    try:
        v = np.asarray(list(values), dtype=float)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}") from e
    if v.ndim != 1 or v.size < 3:
        raise ValueError(f"{name} needs at least 3 repeated measurements, got {v.size}")
    if not np.all(np.isfinite(v)) or np.any(v <= 0):
        raise ValueError(f"{name} must hold finite positive values (times or rates), got min {v.min()}")
    return v


def _spread(v: np.ndarray) -> float:
    return float((np.percentile(v, 90) - np.percentile(v, 10)) / np.median(v))


def mann_whitney_p(a, b) -> float:
    """Two-sided p-value of the Mann–Whitney U test (normal approximation, tie-corrected).

    Taught in chapter 28.
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    n1, n2 = a.size, b.size
    allv = np.concatenate([a, b])
    order = np.argsort(allv, kind="mergesort")
    ranks = np.empty(allv.size)
    sorted_v = allv[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_v, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    u1 = ranks[:n1].sum() - n1 * (n1 + 1) / 2
    mu = n1 * n2 / 2
    n = n1 + n2
    tie = np.sum(counts ** 3 - counts)
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie / (n * (n - 1))))
    if sigma == 0:
        return 1.0
    z = (abs(u1 - mu) - 0.5) / sigma               # continuity correction
    return float(math.erfc(max(z, 0.0) / math.sqrt(2)))


def compare(baseline, candidate, *, higher_is_better: bool = True, min_effect: float = 0.03,
            ci_level: float = 0.95, n_boot: int = 4000, seed: int = 0) -> Verdict:
    """Compare repeated measurements of a candidate against a baseline (see the module docstring).

    ``higher_is_better``: True for rates such as tokens/s (the default, as in the API contract);
    pass False for times (step seconds).
    ``min_effect``: the smallest relative change worth calling (practical threshold).

    Taught in chapter 28.
    """
    a = _sample("baseline", baseline)
    b = _sample("candidate", candidate)
    if not 0 < checks.number("min_effect", min_effect) < 1:
        raise ValueError(f"min_effect={min_effect!r} must be a fraction in (0, 1), e.g. 0.03 for 3 %")
    checks.number("ci_level", ci_level, low=0.5, high=1, low_open=True, high_open=True)
    checks.count("n_boot", n_boot, at_least=200)
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1)
    mb = np.median(b[rng.integers(0, b.size, (n_boot, b.size))], axis=1)
    boot = mb / ma - 1.0
    lo, hi = np.percentile(boot, [(1 - ci_level) / 2 * 100, (1 + ci_level) / 2 * 100])
    change = float(np.median(b) / np.median(a) - 1.0)
    up = float(np.mean(boot > min_effect))
    down = float(np.mean(boot < -min_effect))
    inside = 1.0 - up - down
    if lo > min_effect:
        direction, conf = "up", up
    elif hi < -min_effect:
        direction, conf = "down", down
    else:
        direction, conf = None, inside
    if direction is None:
        verdict = "unchanged"
    elif (direction == "up") == higher_is_better:
        verdict = "faster"
    else:
        verdict = "slower"
    return Verdict(verdict=verdict, confidence=conf, change=change, ci=(float(lo), float(hi)),
                   ci_level=ci_level, min_effect=min_effect, p_value=mann_whitney_p(a, b),
                   baseline_median=float(np.median(a)), candidate_median=float(np.median(b)),
                   baseline_spread=_spread(a), candidate_spread=_spread(b), n_baseline=a.size,
                   n_candidate=b.size, higher_is_better=higher_is_better)


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class BaselineStore:
    """Named baselines in a folder, one JSON file each: ``{"samples": [...], "metric": ...,
    "higher_is_better": ..., "record": {...} | None}``.

    Writes are atomic (temp file + rename) and ``save`` refuses to replace an existing baseline
    unless ``overwrite=True``.

    Taught in chapter 28.
    """

    def __init__(self, path):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"BaselineStore path {self.path} exists and is not a folder")

    def _file(self, name: str) -> Path:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"baseline name {name!r} is not valid; use letters, digits, '_', '-', '.' "
                             "(start with a letter or digit, ≤ 100 characters)")
        return self.path / f"{name}.json"

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.path.glob("*.json")) if self.path.is_dir() else []

    def save(self, name: str, samples=None, *, record: RunRecord | None = None, metric: str = "step_time_s",
             higher_is_better: bool = False, overwrite: bool = False) -> Path:
        """Store ``samples`` (or the per-step times of ``record``) under ``name``."""
        f = self._file(name)
        if f.exists() and not overwrite:
            raise FileExistsError(f"baseline {name!r} already exists at {f}; pass overwrite=True to replace it")
        if samples is None:
            if record is None:
                raise ValueError("save needs samples or record= (a RunRecord with per-step times)")
            samples = record_samples(record)
        v = _sample("samples", samples)
        self.path.mkdir(parents=True, exist_ok=True)
        doc = {"name": name, "metric": metric, "higher_is_better": bool(higher_is_better),
               "samples": v.tolist(), "record": record.to_dict() if record is not None else None}
        atomic_write_text(f, json.dumps(doc, indent=1, default=str))
        return f

    def load(self, name: str) -> dict:
        """The stored baseline (dict with ``samples``, ``metric``, ``higher_is_better``, ``record``)."""
        f = self._file(name)
        if not f.exists():
            raise FileNotFoundError(f"no baseline {name!r} in {self.path}; have: {self.names()}")
        try:
            doc = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"baseline file {f} is corrupt (JSON error line {e.lineno}: {e.msg})") from e
        if not isinstance(doc, dict) or "samples" not in doc:
            raise ValueError(f"baseline file {f} has no 'samples'")
        return doc

    def check(self, name: str, candidate, **kw) -> Verdict:
        """Compare ``candidate`` samples against the stored baseline ``name``."""
        doc = self.load(name)
        kw.setdefault("higher_is_better", doc.get("higher_is_better", False))
        return compare(doc["samples"], candidate, **kw)


def record_samples(record: RunRecord) -> list[float]:
    """Per-step times of a record: ``extra["step_times"]`` when the producer kept them.

    Taught in chapter 28.
    """
    st = (record.extra or {}).get("step_times")
    if st:
        return [float(x) for x in st]
    raise ValueError(f"record {record.label!r} has no per-step times (extra['step_times']); "
                     "pass the samples explicitly")
