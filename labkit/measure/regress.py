"""Performance regression monitor: is a new run faster, slower, or unchanged — beyond the noise?

A single timing says nothing; repeated measurements do. :func:`compare` takes a baseline sample and a
candidate sample (e.g. step times, or tokens/s) and decides with two guards:

1. **Statistics** — a seeded bootstrap confidence interval of the ratio of medians
   (candidate median ÷ baseline median; Efron & Tibshirani 1993, *An Introduction to the Bootstrap*,
   ch. 13, percentile interval). The Mann–Whitney U test (normal approximation with tie correction;
   Mann & Whitney 1947) is kept in ``Verdict.p_value`` as data, never printed beside the verdict: a report
   states ONE verdict and ONE confidence, both from the bootstrap (a p = 0.06 beside "SLOWER, confidence
   100 %" — two tests disagreeing at n = 4 — told a reader nothing).
2. **Practical effect** — a minimum effect size ``min_effect`` (default 3 %): the whole confidence
   interval must lie beyond ±``min_effect`` of "no change" before a run is called faster or slower.
   So noise is never called a regression, and a real but negligible change is "unchanged".

``confidence`` is the bootstrap probability that the change is on the reported side of the practical
threshold (for "unchanged": the probability that it lies within it); :func:`confidence_text` prints it, a
share of all resamples as "> 99.9 %" (a bootstrap cannot tell certainty from 4000 agreeing resamples).

:class:`BaselineStore` keeps named baselines as JSON files, so a CI job can ``save`` once and
``check`` every run. A save never replaces a baseline unless ``overwrite=True``, and that holds under
concurrency: the file is written whole and then linked into place create-exclusive
(:func:`labkit.record.atomic_write_text`), so of two saves racing for one name exactly one succeeds and
the other gets FileExistsError — nothing is silently lost. The direction (``higher_is_better``) must be
a real bool, in arguments and in baseline files: ``"false"`` is refused, not read as true.

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
from labkit.record import RunRecord, _num, _path, _show, _values, atomic_write_text

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
        """One verdict with one confidence, both from the bootstrap (module docstring). Taught in chapter 28."""
        what = "higher is better" if self.higher_is_better else "lower is better"
        return (f"{self.verdict.upper()} ({confidence_text(self.confidence)}): median {self.baseline_median:.6g} → "
                f"{self.candidate_median:.6g} ({self.change:+.1%}, {self.ci_level:.0%} CI "
                f"[{self.ci[0]:+.1%}, {self.ci[1]:+.1%}]; {what}); practical threshold ±{self.min_effect:.0%}; "
                f"spread (p90−p10)/median {self.baseline_spread:.1%} → "
                f"{self.candidate_spread:.1%}; n = {self.n_baseline} vs {self.n_candidate}")

    def to_dict(self) -> dict:
        return asdict(self)


def confidence_text(confidence: float) -> str:
    """``"bootstrap confidence 97 %"``; a share of all resamples (≥ 99.95 %) as "> 99.9 %", since agreeing
    resamples bound the confidence from below only. Taught in chapter 28."""
    c = checks.fraction("confidence", confidence)
    return "bootstrap confidence > 99.9 %" if c >= 0.9995 else f"bootstrap confidence {c:.1%}" if c > 0.99 else \
        f"bootstrap confidence {c:.0%}"


MAX_SAMPLES = 1_000_000            # repeated measurements of one metric: a few to a few thousand
MAX_BASELINE_BYTES = 64 * 2**20    # a stored baseline: its samples and one run record


def _sample(name, values, min_size: int = 3) -> np.ndarray:
    """Repeated measurements: finite positive numbers (times or rates), at least ``min_size``, at most
    :data:`MAX_SAMPLES`."""
    if hasattr(values, "__len__") and not isinstance(values, (str, bytes, dict)) and len(values) > MAX_SAMPLES:
        raise ValueError(f"{name} holds {len(values):,} values, more than the {MAX_SAMPLES:,} a baseline keeps")
    try:
        v = _values(name, values, low_open=True, min_size=0)
    except checks.ArgumentTypeError:
        raise
    except ValueError as e:
        raise ValueError(f"{e} (measurements are times or rates: finite and positive)") from None
    if v.size < min_size:
        raise ValueError(f"{name} needs at least {min_size} repeated measurements, got {v.size}")
    return v


def _reals(name, values) -> np.ndarray:
    if values is None or isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise checks.ArgumentTypeError(f"{name} must be a sequence of numbers, got {type(values).__name__} "
                                       f"{_show(values)}")
    v = np.array([_num(f"{name}[{i}]", x) for i, x in enumerate(values)], dtype=float)
    if v.size == 0:
        raise ValueError(f"{name} needs at least one value, got an empty sequence")
    return v


def _spread(v: np.ndarray) -> float:
    return float((np.percentile(v, 90) - np.percentile(v, 10)) / np.median(v))


def mann_whitney_p(a, b) -> float:
    """Two-sided p-value of the Mann–Whitney U test (normal approximation, tie-corrected).

    ``a``, ``b``: at least one finite number each (ValueError/ArgumentTypeError naming ``a[i]``/``b[i]``).

    Taught in chapter 28.
    """
    a, b = _reals("a", a), _reals("b", b)
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

    ``baseline``, ``candidate``: at least 3 finite positive numbers each (times or rates).
    ``higher_is_better``: True for rates such as tokens/s (the default, as in the API contract);
    pass False for times (step seconds) — a bool, never a string.
    ``min_effect``: the smallest relative change worth calling (practical threshold), in (0, 1).
    ``ci_level`` in (0.5, 1); ``n_boot``: bootstrap resamples, 200 … 10^6; ``seed``: an int >= 0.
    Raises ValueError (ArgumentTypeError, also a TypeError, for a wrong type) naming the parameter.

    Taught in chapter 28.
    """
    a = _sample("baseline", baseline)
    b = _sample("candidate", candidate)
    higher_is_better = checks.flag("higher_is_better", higher_is_better)
    min_effect = _num("min_effect", min_effect, low=0, high=1, low_open=True, high_open=True)
    ci_level = _num("ci_level", ci_level, low=0.5, high=1, low_open=True, high_open=True)
    n_boot = checks.count("n_boot", n_boot, at_least=200, at_most=1_000_000)
    seed = checks.count("seed", seed, at_least=0)
    unit = max(a.max(), b.max())
    unit = unit if unit > 1e300 else 1.0            # the ratio is scale-free: keep medians from overflowing
    a, b = a / unit, b / unit
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        ma = _boot_medians(a, rng, n_boot)
        mb = _boot_medians(b, rng, n_boot)
        boot = mb / ma - 1.0
        change = float(np.median(b) / np.median(a) - 1.0)
        spreads = (_spread(a), _spread(b))
    for name, sp in zip(("baseline", "candidate"), spreads, strict=True):
        if not math.isfinite(sp):
            raise ValueError(f"{name} values span more than a float can represent relative to their median "
                             "((p90 − p10) / median overflows); check the unit of every sample")
    if not (np.all(np.isfinite(boot)) and math.isfinite(change)):
        raise ValueError(f"baseline (median {float(np.median(a)) * unit:.3g}) and candidate (median "
                         f"{float(np.median(b)) * unit:.3g}) are too far apart for a float ratio; compare samples "
                         "in the same unit")
    lo, hi = np.percentile(boot, [(1 - ci_level) / 2 * 100, (1 + ci_level) / 2 * 100])
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
                   baseline_median=float(np.median(a)) * unit, candidate_median=float(np.median(b)) * unit,
                   baseline_spread=spreads[0], candidate_spread=spreads[1], n_baseline=a.size,
                   n_candidate=b.size, higher_is_better=higher_is_better)


def _boot_medians(v: np.ndarray, rng, n_boot: int) -> np.ndarray:
    """Medians of ``n_boot`` resamples of ``v``, drawn in chunks of at most ~4 M indices (bounded memory;
    the same random stream as one draw)."""
    rows = max(1, 4_000_000 // v.size)
    return np.concatenate([np.median(v[rng.integers(0, v.size, (min(rows, n_boot - i), v.size))], axis=1)
                           for i in range(0, n_boot, rows)])


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class BaselineStore:
    """Named baselines in a folder, one JSON file each: ``{"samples": [...], "metric": ...,
    "higher_is_better": ..., "record": {...} | None}``.

    ``save`` writes the whole file first and links it into place create-exclusive: it never replaces
    an existing baseline unless ``overwrite=True``, even when several processes save the same name at
    once (exactly one succeeds; the others get FileExistsError). ``load`` checks the file: samples
    finite and positive, ``higher_is_better`` a JSON ``true``/``false`` (a string such as ``"false"`` is
    refused, it would flip every verdict), a valid record; errors name the file and the field.

    Taught in chapter 28.
    """

    def __init__(self, path):
        self.path = _path("path", path)
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"BaselineStore path {self.path} exists and is not a folder")

    def _file(self, name: str) -> Path:
        if not isinstance(name, str):
            raise checks.ArgumentTypeError(f"name must be a string, got {type(name).__name__} {_show(name)}")
        if not _NAME.match(name):
            raise ValueError(f"baseline name={name!r} is not valid; use letters, digits, '_', '-', '.' "
                             "(start with a letter or digit, ≤ 100 characters)")
        return self.path / f"{name}.json"

    def names(self) -> list[str]:
        """The stored baselines' names, sorted."""
        return sorted(p.stem for p in self.path.glob("*.json")) if self.path.is_dir() else []

    def save(self, name: str, samples=None, *, record: RunRecord | None = None, metric: str = "step_time_s",
             higher_is_better: bool = False, overwrite: bool = False) -> Path:
        """Store ``samples`` (or the per-step times of ``record``) under ``name``; FileExistsError when
        ``name`` exists (also when another process saved it a moment ago) unless ``overwrite=True``."""
        f = self._file(name)
        higher_is_better = checks.flag("higher_is_better", higher_is_better)
        overwrite = checks.flag("overwrite", overwrite)
        if not isinstance(metric, str) or not metric:
            raise checks.ArgumentTypeError(f"metric must be a non-empty string, got {type(metric).__name__} "
                                           f"{_show(metric)}")
        if record is not None and not isinstance(record, RunRecord):
            raise checks.ArgumentTypeError(f"record must be a labkit.record.RunRecord or None, got "
                                           f"{type(record).__name__}")
        if f.exists() and not overwrite:
            raise FileExistsError(f"baseline {name!r} already exists at {f}; pass overwrite=True to replace it")
        if samples is None:
            if record is None:
                raise ValueError("save needs samples or record= (a RunRecord with per-step times)")
            samples = record_samples(record)
        v = _sample("samples", samples)
        doc = {"name": name, "metric": metric, "higher_is_better": higher_is_better,
               "samples": v.tolist(), "record": record.to_dict() if record is not None else None}
        text = json.dumps(doc, indent=1, default=str)
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            atomic_write_text(f, text, exclusive=not overwrite)
        except FileExistsError:
            raise FileExistsError(f"baseline {name!r} already exists at {f} (another save got there first); "
                                  "pass overwrite=True to replace it") from None
        return f

    def load(self, name: str) -> dict:
        """The stored baseline (dict with ``samples``, ``metric``, ``higher_is_better``, ``record``),
        checked (see the class docstring)."""
        f = self._file(name)
        if not f.exists():
            raise FileNotFoundError(f"no baseline {name!r} in {self.path}; have: {self.names()}")
        if not f.is_file() or f.stat().st_size > MAX_BASELINE_BYTES:
            raise ValueError(f"baseline file {f} is not a regular file of at most {MAX_BASELINE_BYTES // 2**20} MB")
        try:        # ValueError: invalid JSON or UTF-8, an int of > 4300 digits; RecursionError: absurd nesting
            doc = json.loads(f.read_bytes())
        except (ValueError, RecursionError) as e:
            raise ValueError(f"baseline file {f} is corrupt (JSON error: {str(e)[:120]})") from None
        if not isinstance(doc, dict) or "samples" not in doc:
            raise ValueError(f"baseline file {f} has no 'samples'")
        try:
            doc["samples"] = _sample("samples", doc["samples"]).tolist()
            doc["higher_is_better"] = checks.flag("higher_is_better", doc.get("higher_is_better", False))
            if not isinstance(doc.get("metric", ""), str):
                raise checks.ArgumentTypeError(f"metric must be a string, got {_show(doc['metric'])}")
            if doc.get("record") is not None:
                RunRecord.from_dict(doc["record"])
        except checks.ArgumentTypeError as e:
            raise checks.ArgumentTypeError(f"baseline file {f}: {e}") from None
        except ValueError as e:
            raise ValueError(f"baseline file {f}: {e}") from None
        return doc

    def check(self, name: str, candidate, *, higher_is_better: bool | None = None, min_effect: float = 0.03,
              ci_level: float = 0.95, n_boot: int = 4000, seed: int = 0) -> Verdict:
        """Compare ``candidate`` samples against the stored baseline ``name`` (:func:`compare`);
        ``higher_is_better=None`` uses the baseline's own direction."""
        if higher_is_better is not None:
            checks.flag("higher_is_better", higher_is_better)
        doc = self.load(name)
        hib = doc["higher_is_better"] if higher_is_better is None else higher_is_better
        return compare(doc["samples"], candidate, higher_is_better=hib, min_effect=min_effect,
                       ci_level=ci_level, n_boot=n_boot, seed=seed)


def record_samples(record: RunRecord) -> list[float]:
    """Per-step times of a record: ``extra["step_times"]`` when the producer kept them (finite, > 0).

    Taught in chapter 28.
    """
    if not isinstance(record, RunRecord):
        raise checks.ArgumentTypeError(f"record must be a labkit.record.RunRecord, got {type(record).__name__}")
    st = (record.extra or {}).get("step_times")
    if st is None or (hasattr(st, "__len__") and len(st) == 0):
        raise ValueError(f"record {record.label!r} has no per-step times (extra['step_times']); "
                         "pass the samples explicitly")
    return _values("record.extra['step_times']", st, low_open=True).tolist()
