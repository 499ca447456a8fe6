"""A regression monitor for a *series* of runs, and its false-alarm rate measured on seeded series.

:func:`labkit.measure.regress.compare` judges two samples of one run's steps. A CI job sees something else: a
history of runs, one figure each (a run's median step time, or its tokens/s), and the question "are the
newest runs slower than the ones before?". Steps of one run are not independent draws of "the speed of
this commit": the load on the machine, the node the job landed on, the clocks, move whole runs. So the
unit here is the **run**, and the noise is the **run-to-run spread** — measured, not assumed.

:class:`SeriesMonitor` compares the newest ``candidate_runs`` figures with the ``baseline_runs`` before
them, in log space (a ratio of medians), and calls "slower" only when the change exceeds both

- ``min_effect`` — the smallest change worth a CI failure (practical threshold), and
- ``z`` standard errors of the change, the standard error taken from the windows themselves:
  σ̂ = 1.4826 · MAD of the log figures about each window's median (a robust σ; Hampel 1974),
  se = 1.2533 · σ̂ · √(1/B + 1/C) (the median's large-sample standard error, √(π/2)·σ/√n).

So a noisier history raises the bar by itself, and a real change must exceed the noise *and* matter.

:class:`NoiseModel` is a log-normal run-to-run model fitted to measured runs: σ = 1.4826 · MAD of the log
figures, corrected for few runs — the same robust scale the monitor uses, so one run that met a busy
neighbour does not inflate σ (and the windows, which grow as σ²) the way a standard deviation would. :func:`monitor_rates` draws many seeded series from it — unchanged, and with the
candidate window slowed by ``slowdown`` — and counts how often the monitor says "slower": the measured
**false-alarm rate** and **detection rate**, each with a Wilson 95 % interval (Wilson 1927).
:func:`size_monitor` picks the windows from σ with the normal approximation (detect ``slowdown`` with
``power`` at ``z``); :func:`monitor_rates` is the check of that arithmetic. The model assumes independent
runs: load that drifts over hours is not in it — interleave baseline and candidate when you can
(:mod:`labkit.measure.ab`).

CLI: ``labkit regress monitor HISTORY --baseline-runs B --candidate-runs C`` exits 1 on "slower".

Taught in chapter 28 (cost and regression monitoring) and lab 11.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from labkit import checks

__all__ = ["NoiseModel", "SeriesMonitor", "SeriesVerdict", "MonitorRates", "monitor_rates", "size_monitor",
           "series_figures", "mad_consistency", "diff_consistency", "MAD_TO_SIGMA", "MEDIAN_SE", "MAX_DRAWS", "FIGURES",
           "train_series"]

MAD_TO_SIGMA = 1.4826         # σ of a normal = 1.4826 × its median absolute deviation
MEDIAN_SE = math.sqrt(math.pi / 2)   # se(median) = 1.2533 σ/√n for large n (normal data)
MAX_DRAWS = 50_000_000        # monitor_rates' most seeded runs (n_series × window): 0.4 GB of float64 per kind
MAX_RUNS = 1_000_000


#: 1 / mean(1.4826 · MAD) of n standard normal draws for n < 10, measured on 200,000 seeded samples of each size
#: (``numpy.random.default_rng(0)``; its standard error ≈ 0.1 %): tests/test_regress_series.py measures it again.
SMALL_N_CONSISTENCY = {2: 1.191, 3: 1.483, 4: 1.360, 5: 1.214, 6: 1.189, 7: 1.138, 8: 1.127, 9: 1.102}


#: 1 / mean(median |Δ| / (0.6745·√2)) of n standard normal draws in sequence for n < 10, measured on 100,000 seeded
#: samples of each size (``numpy.random.default_rng(0)``); from 10 on 1 − 0.5/n matches the measured factors
#: (0.951 at 10, 0.975 at 20, 0.990 at 50, 0.995 at 100) within 0.3 %.
SMALL_N_DIFF_CONSISTENCY = {3: 0.844, 4: 0.876, 5: 0.893, 6: 0.923, 7: 0.926, 8: 0.938, 9: 0.942}


def diff_consistency(n: int) -> float:
    """Factor that makes median |Δ| / (0.6745 · √2) of ``n`` normal draws in sequence an unbiased σ (the
    successive-difference estimate of :meth:`NoiseModel.fit`). Taught in chapter 28."""
    n = checks.count("n", n, at_least=3)
    return 1 - 0.5 / n if n >= 10 else SMALL_N_DIFF_CONSISTENCY[n]


def mad_consistency(n: int) -> float:
    """Factor that makes 1.4826 · MAD of ``n`` normal draws an unbiased σ: n/(n − 0.8) for n ≥ 10 (Croux &
    Rousseeuw 1992); below 10, where that formula is off by up to 9 %, the measured :data:`SMALL_N_CONSISTENCY`
    (1.19 at n = 6). Taught in chapter 28."""
    n = checks.count("n", n, at_least=2)
    return n / (n - 0.8) if n >= 10 else SMALL_N_CONSISTENCY[n]


def _figures(name: str, values, min_size: int = 1) -> np.ndarray:
    """Per-run figures: finite numbers > 0, at least ``min_size``."""
    if values is None or isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        raise checks.ArgumentTypeError(f"{name} must be a sequence of per-run figures (numbers), got "
                                       f"{type(values).__name__}")
    if len(values) > MAX_RUNS:
        raise ValueError(f"{name} holds {len(values):,} runs, more than {MAX_RUNS:,}")
    out = []
    for i, x in enumerate(values):
        if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
            raise checks.ArgumentTypeError(f"{name}[{i}] must be a number, got {type(x).__name__} {x!r:.40}")
        v = float(x)
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name}[{i}] = {x!r} is not a finite number > 0 (a run's step time or tokens/s)")
        out.append(v)
    if len(out) < min_size:
        raise ValueError(f"{name} needs at least {min_size} runs, got {len(out)}")
    return np.array(out)


FIGURES = ("step_time_median", "tokens_per_s", "cpu_time_median")


def series_figures(records, metric: str = "step_time_median") -> list[float]:
    """One figure per run from RunRecords (or their dicts): ``"step_time_median"`` (wall seconds per step,
    lower is better), ``"tokens_per_s"`` (higher is better) or ``"cpu_time_median"`` (this process's CPU seconds
    per step, ``record.extra["cpu_step_time"]``, lower is better: on a shared CPU it carries the step's own
    work, not the neighbours' load — lab 11). Taught in chapter 28."""
    from labkit.record import RunRecord

    checks.one_of("metric", metric, FIGURES)
    if isinstance(records, (str, bytes, dict)) or not hasattr(records, "__iter__"):
        raise checks.ArgumentTypeError(f"records must be a list of RunRecords, got {type(records).__name__}")
    out = []
    for i, r in enumerate(records):
        if isinstance(r, dict):
            r = RunRecord.from_dict(r)
        if not isinstance(r, RunRecord):
            raise checks.ArgumentTypeError(f"records[{i}] must be a RunRecord or its dict, got {type(r).__name__}")
        if metric == "cpu_time_median":
            cpu = r.extra.get("cpu_step_time")
            if not isinstance(cpu, dict) or "median" not in cpu:
                raise ValueError(f"records[{i}] has no CPU seconds per step (extra['cpu_step_time']): it was not "
                                 "timed with the host clock (a CPU run of labkit's trainer records them)")
            out.append(cpu["median"])
        else:
            out.append(r.step_time.median if metric == "step_time_median" else r.tokens_per_s)
    return _figures("records' figures", out).tolist()


@dataclass(frozen=True)
class NoiseModel:
    """Log-normal run-to-run noise: a run's figure is ``center × exp(σ·ε)``, ε ~ N(0, 1), runs independent.

    :meth:`fit` takes measured per-run figures: σ = 1.4826 · MAD of their logs × a small-sample factor
    (:func:`mad_consistency`); ``method="std"`` gives the standard deviation (ddof = 1) instead, which one
    outlier run can inflate many-fold (six runs of lab 11 on a loaded CI machine gave σ = 56 %).
    Taught in chapter 28.
    """

    center: float
    sigma: float
    n_measured: int = 0

    def __post_init__(self):
        object.__setattr__(self, "center", checks.positive("center", self.center))
        object.__setattr__(self, "sigma", checks.number("sigma", self.sigma, low=0, high=2))
        object.__setattr__(self, "n_measured", checks.count("n_measured", self.n_measured, at_least=0))

    @classmethod
    def fit(cls, figures, method: str = "diff") -> NoiseModel:
        """The model of measured per-run figures, in the order they ran (at least 3 runs). ``method``:
        ``"diff"`` (the default) — run-to-run σ from successive differences, median |Δ log figure| / (0.6745·√2)
        × :func:`diff_consistency` (von Neumann's mean square successive difference, made robust with a median):
        a shift of the machine's load part-way through the runs moves one difference, not half the sample
        (tests/test_regress_series.py: a CI machine's six runs at 18.6, 18.3, 35.9, 37.7, 32.3, 16.7 ms give a
        σ under 20 % by this estimate, over 50 % by the MAD);
        ``"mad"`` — 1.4826 · MAD × :func:`mad_consistency`, robust to a run or two but not to a shift;
        ``"std"`` — the plain standard deviation."""
        checks.one_of("method", method, ("diff", "mad", "std"))
        v = np.log(_figures("figures", figures, min_size=3))
        if method == "std":
            sigma = float(np.std(v, ddof=1))
        elif method == "mad":
            sigma = MAD_TO_SIGMA * float(np.median(np.abs(v - np.median(v)))) * mad_consistency(v.size)
        else:
            d = np.abs(np.diff(v))
            sigma = float(np.median(d)) / (0.6744897501960817 * math.sqrt(2)) * diff_consistency(v.size)
        return cls(center=float(np.exp(np.median(v))), sigma=min(sigma, 2.0), n_measured=int(v.size))

    def draw(self, shape, rng) -> np.ndarray:
        """Seeded per-run figures of ``shape`` (an int or a tuple); ``rng`` a numpy Generator or an int seed."""
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(checks.count("seed", rng,
                                                                                                  at_least=0))
        return self.center * np.exp(self.sigma * rng.standard_normal(shape))

    def series(self, n_runs: int, *, seed: int, slowdown: float = 0.0, last: int = 0,
               higher_is_better: bool = False, start=None) -> list[float]:
        """One seeded series of ``n_runs`` figures; the ``last`` runs slowed by ``slowdown`` (0.05 = 5 %
        more time per step, i.e. ÷1.05 tokens/s when ``higher_is_better``). ``start``: measured figures
        that open the series (the live part; the rest is drawn)."""
        n_runs = checks.count("n_runs", n_runs, at_least=1)
        seed = checks.count("seed", seed, at_least=0)
        slowdown = checks.number("slowdown", slowdown, low=0, high=10)
        last = checks.count("last", last, at_least=0, at_most=n_runs)
        higher_is_better = checks.flag("higher_is_better", higher_is_better)
        head = [] if start is None else _figures("start", start).tolist()
        if len(head) > n_runs:
            raise ValueError(f"start holds {len(head)} runs, more than n_runs={n_runs}")
        v = np.array(head + self.draw(n_runs - len(head), seed).tolist())
        if last:
            f = 1.0 + slowdown
            v[-last:] = v[-last:] / f if higher_is_better else v[-last:] * f
        return v.tolist()


@dataclass(frozen=True)
class SeriesVerdict:
    """Result of :meth:`SeriesMonitor.check`. ``change``: candidate/baseline median − 1 (for times, +0.05
    is 5 % slower). ``threshold``: the bar on |log change|, max(log(1 + min_effect), z·se). Chapter 28."""

    verdict: str
    change: float
    threshold: float
    se: float
    sigma: float
    baseline_median: float
    candidate_median: float
    baseline_runs: int
    candidate_runs: int
    min_effect: float
    z: float
    higher_is_better: bool

    def report(self) -> str:
        what = "higher is better" if self.higher_is_better else "lower is better"
        return (f"{self.verdict.upper()}: median of the last {self.candidate_runs} runs {self.candidate_median:.6g} vs "
                f"the {self.baseline_runs} before {self.baseline_median:.6g} ({self.change:+.2%}; {what}); bar "
                f"±{math.expm1(self.threshold):.2%} = max(min_effect {self.min_effect:.1%}, z {self.z:g} × se "
                f"{self.se:.2%}); run-to-run σ {self.sigma:.2%}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SeriesMonitor:
    """The settings of a series-level regression monitor (module docstring). ``baseline_runs`` ≥ 3,
    ``candidate_runs`` ≥ 1, ``min_effect`` in (0, 1), ``z`` ≥ 0, ``higher_is_better`` a bool (False for step
    times). Taught in chapter 28; lab 11 grades the settings a learner picks."""

    baseline_runs: int
    candidate_runs: int
    min_effect: float = 0.02
    z: float = 3.0
    higher_is_better: bool = False

    def __post_init__(self):
        object.__setattr__(self, "baseline_runs", checks.count("baseline_runs", self.baseline_runs, at_least=3,
                                                               at_most=MAX_RUNS))
        object.__setattr__(self, "candidate_runs", checks.count("candidate_runs", self.candidate_runs, at_least=1,
                                                                at_most=MAX_RUNS))
        object.__setattr__(self, "min_effect", checks.number("min_effect", self.min_effect, low=0, high=1,
                                                             low_open=True, high_open=True))
        object.__setattr__(self, "z", checks.number("z", self.z, low=0, high=20))
        object.__setattr__(self, "higher_is_better", checks.flag("higher_is_better", self.higher_is_better))

    @property
    def window(self) -> int:
        return self.baseline_runs + self.candidate_runs

    def to_dict(self) -> dict:
        return asdict(self)

    def _decide(self, base: np.ndarray, cand: np.ndarray):
        """Vectorised decision on log figures of shape (series, runs): (codes, d, thr, se, sigma);
        code +1 = slower, -1 = faster, 0 = unchanged."""
        mb, mc = np.median(base, axis=-1), np.median(cand, axis=-1)
        dev = np.concatenate([np.abs(base - mb[..., None]), np.abs(cand - mc[..., None])], axis=-1)
        sigma = MAD_TO_SIGMA * np.median(dev, axis=-1)
        se = MEDIAN_SE * sigma * math.sqrt(1 / self.baseline_runs + 1 / self.candidate_runs)
        thr = np.maximum(math.log1p(self.min_effect), self.z * se)
        d = mc - mb
        worse = -d if self.higher_is_better else d
        codes = np.where(worse > thr, 1, np.where(-worse > thr, -1, 0))
        return codes, d, thr, se, sigma

    def check(self, series) -> SeriesVerdict:
        """Judge the newest ``candidate_runs`` of ``series`` (per-run figures, oldest first) against the
        ``baseline_runs`` before them; older runs are ignored."""
        v = _figures("series", series)
        if v.size < self.window:
            raise ValueError(f"series holds {v.size} runs; this monitor needs baseline_runs + candidate_runs = "
                             f"{self.baseline_runs} + {self.candidate_runs} = {self.window}")
        logs = np.log(v[-self.window:])
        base, cand = logs[None, :self.baseline_runs], logs[None, self.baseline_runs:]
        codes, d, thr, se, sigma = self._decide(base, cand)
        verdict = {1: "slower", -1: "faster", 0: "unchanged"}[int(codes[0])]
        return SeriesVerdict(verdict=verdict, change=float(math.expm1(d[0])), threshold=float(thr[0]),
                             se=float(se[0]), sigma=float(sigma[0]), baseline_median=float(np.exp(np.median(base))),
                             candidate_median=float(np.exp(np.median(cand))), baseline_runs=self.baseline_runs,
                             candidate_runs=self.candidate_runs, min_effect=self.min_effect, z=self.z,
                             higher_is_better=self.higher_is_better)


def _wilson(k: int, n: int, zc: float = 1.959964) -> tuple[float, float]:
    p = k / n
    den = 1 + zc ** 2 / n
    mid = (p + zc ** 2 / (2 * n)) / den
    half = zc * math.sqrt(p * (1 - p) / n + zc ** 2 / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


@dataclass(frozen=True)
class MonitorRates:
    """What :func:`monitor_rates` measured over seeded series: ``false_alarm`` (unchanged series called
    slower), ``detection`` (slowed series called slower), ``faster_calls`` (unchanged series called faster),
    each a fraction of ``n_series``; ``*_ci`` Wilson 95 % intervals. Chapter 28."""

    false_alarm: float
    false_alarm_ci: tuple[float, float]
    detection: float
    detection_ci: tuple[float, float]
    faster_calls: float
    slowdown: float
    n_series: int
    seed: int
    sigma: float

    def report(self) -> str:
        return (f"over {self.n_series:,} seeded series (σ {self.sigma:.2%}, seed {self.seed}): false alarms "
                f"{self.false_alarm:.2%} [{self.false_alarm_ci[0]:.2%}, {self.false_alarm_ci[1]:.2%}], "
                f"{self.slowdown:.0%} slowdown caught {self.detection:.1%} [{self.detection_ci[0]:.1%}, "
                f"{self.detection_ci[1]:.1%}]")

    def to_dict(self) -> dict:
        return asdict(self)


def monitor_rates(monitor: SeriesMonitor, noise: NoiseModel, *, slowdown: float = 0.05, n_series: int = 2000,
                  seed: int = 0) -> MonitorRates:
    """Measure ``monitor``'s false-alarm and detection rates on ``n_series`` seeded series drawn from
    ``noise``: unchanged ones, and ones whose candidate window is slowed by ``slowdown``. Same seed, same
    rates. Taught in chapter 28; lab 11's hidden checks call it with their own seeds."""
    if not isinstance(monitor, SeriesMonitor):
        raise checks.ArgumentTypeError(f"monitor must be a SeriesMonitor, got {type(monitor).__name__}")
    if not isinstance(noise, NoiseModel):
        raise checks.ArgumentTypeError(f"noise must be a NoiseModel, got {type(noise).__name__}")
    slowdown = checks.number("slowdown", slowdown, low=0, high=10, low_open=True)
    n_series = checks.count("n_series", n_series, at_least=10, at_most=200_000)
    seed = checks.count("seed", seed, at_least=0)
    if n_series * monitor.window > MAX_DRAWS:
        raise ValueError(f"n_series × runs per series = {n_series:,} × {monitor.window:,} is over MAX_DRAWS = "
                         f"{MAX_DRAWS:,}; use at most {MAX_DRAWS // monitor.window:,} series or smaller windows")
    rng = np.random.default_rng(seed)
    b, c = monitor.baseline_runs, monitor.candidate_runs
    step = max(1, 2_000_000 // monitor.window)
    alarms = hits = faster = 0
    shift = math.log1p(slowdown) * (-1 if monitor.higher_is_better else 1)
    for i in range(0, n_series, step):
        m = min(step, n_series - i)
        logs = math.log(noise.center) + noise.sigma * rng.standard_normal((2, m, b + c))
        null, _, _, _, _ = monitor._decide(logs[0, :, :b], logs[0, :, b:])
        slow, _, _, _, _ = monitor._decide(logs[1, :, :b], logs[1, :, b:] + shift)
        alarms += int(np.sum(null == 1))
        faster += int(np.sum(null == -1))
        hits += int(np.sum(slow == 1))
    return MonitorRates(false_alarm=alarms / n_series, false_alarm_ci=_wilson(alarms, n_series),
                        detection=hits / n_series, detection_ci=_wilson(hits, n_series),
                        faster_calls=faster / n_series, slowdown=slowdown, n_series=n_series, seed=seed,
                        sigma=noise.sigma)


def _phi_inv(p: float) -> float:
    """Inverse standard normal CDF (bisection on erfc; p in (0, 1))."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(-mid / math.sqrt(2)) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def size_monitor(sigma: float, *, slowdown: float = 0.05, power: float = 0.95, z: float = 3.0,
                 min_effect: float = 0.02, history_ratio: int = 4, higher_is_better: bool = False,
                 safety: float = 1.3, min_candidate_runs: int = 1) -> SeriesMonitor:
    """Smallest windows (candidate C, baseline ``history_ratio``·C) at which a ``slowdown`` is called with
    probability ``power`` by the normal approximation: log(1+slowdown) ≥ max(log(1+min_effect), z·se) +
    Φ⁻¹(power)·se, se = 1.2533·σ·√(1/B + 1/C), the run count inflated by ``safety`` for the MAD's own
    noise. ``min_candidate_runs`` floors C: the normal approximation is kind to windows of 1–3 runs, whose MADs
    estimate their own spread badly (lab 11's monitor, history ratio 2, σ 5–7 %: a floor of 4 cut
    :func:`monitor_rates`' false alarms from 0.38–1.52 % to 0.12–0.60 % over 4,000 series). Check the result with
    :func:`monitor_rates`. Taught in chapter 28.
    """
    sigma = checks.number("sigma", sigma, low=0, high=2)
    slowdown = checks.number("slowdown", slowdown, low=0, high=10, low_open=True)
    power = checks.number("power", power, low=0.5, high=1, high_open=True)
    z = checks.number("z", z, low=0, high=20)
    min_effect = checks.number("min_effect", min_effect, low=0, high=1, low_open=True, high_open=True)
    history_ratio = checks.count("history_ratio", history_ratio, at_least=1, at_most=1000)
    safety = checks.number("safety", safety, low=1, high=10)
    min_candidate_runs = checks.count("min_candidate_runs", min_candidate_runs, at_least=1, at_most=10_000)
    zp = _phi_inv(power)
    L, m = math.log1p(slowdown), math.log1p(min_effect)
    if m + 1e-12 >= L:
        raise ValueError(f"min_effect={min_effect} is not below slowdown={slowdown}: a {slowdown:.0%} slowdown "
                         "can never clear that bar")
    se_max = min(L / (z + zp), (L - m) / zp)
    k = 1 / history_ratio + 1
    c = max(min_candidate_runs, math.ceil(safety * (MEDIAN_SE * sigma) ** 2 * k / se_max ** 2))
    b = max(3, history_ratio * c)
    if b + c > 100_000:            # a monitor nobody can feed
        raise ValueError(f"sigma={sigma:.3g} needs {b + c:,} runs per check; a {slowdown:.0%} slowdown cannot be "
                         "told from this noise — reduce the run-to-run spread first")
    return SeriesMonitor(baseline_runs=b, candidate_runs=c, min_effect=min_effect, z=z,
                         higher_is_better=higher_is_better)


def train_series(cfgs) -> list[dict]:
    """Train each :class:`labkit.train.TrainConfig` of ``cfgs`` in turn in this process (``labkit.train.train``) —
    one run per config, the unit a regression monitor judges — and return their records as dicts, each stamped with
    its ``"launch"``: this process's pid and the run's UTC start and end (what
    :meth:`labkit.teaching.grading.evidence.Evidence.check_launched_here` binds to the execution that recorded them). Figures
    of the runs: :func:`series_figures`. Taught in chapter 28 and lab 11."""
    import datetime as dt
    import os

    from labkit.train.config import TrainConfig
    from labkit.train.loop import train

    if isinstance(cfgs, TrainConfig) or not hasattr(cfgs, "__iter__"):
        raise checks.ArgumentTypeError(f"cfgs must be a list of TrainConfigs, got {type(cfgs).__name__}")
    cfgs = list(cfgs)
    if not cfgs or len(cfgs) > 10_000:
        raise ValueError(f"cfgs holds {len(cfgs)} configs; train 1 to 10,000 runs")
    for i, c in enumerate(cfgs):
        if not isinstance(c, TrainConfig):
            raise checks.ArgumentTypeError(f"cfgs[{i}] must be a labkit.train.TrainConfig, got {type(c).__name__}")
        if c.parallel != "single" or c.tp * c.pp > 1:
            raise ValueError(f"cfgs[{i}] has parallel={c.parallel!r}, tp={c.tp}, pp={c.pp}: train_series runs in this "
                             "process; use parallel='single' (labkit.train.run_many launches ranks)")

    def now() -> str:
        return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")

    out = []
    for c in cfgs:
        started = now()
        rec = train(c)
        out.append({**rec.to_dict(), "launch": {"pid": os.getpid(), "started_at": started, "ended_at": now()}})
    return out
