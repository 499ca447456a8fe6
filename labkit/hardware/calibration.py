"""Calibrated peaks: measure this machine's achievable matmul rate and copy bandwidth once, store them
with the conditions they were measured under, and divide every MFU by the same number.

Why: a peak measured inside each process in a short time box swings with whatever else the machine is
doing (2–100× low on a loaded 2-core machine), so MFU of the *same* run differed from chapter to
chapter. ``labkit calibrate`` measures long enough to be stable — large shapes, the best of several
rounds (other work only ever slows a run, so the best round is the least disturbed) — per device,
dtype and thread count, and stores each entry with its conditions (CPU or GPU model, torch version,
threads, date) in the user's cache directory (``$LABKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/labkit``,
else ``~/.cache/labkit``; file ``calibration.json``). :func:`labkit.hardware.resolve_peak` uses a
matching entry (source ``calibrated:…``), re-calibrates one whose conditions changed, and measures in
the process only when none exists (source ``measured:… (not calibrated: run labkit calibrate)``).

**Stability.** A peak is stored only when it is reproduced: at least :data:`CONFIRM` rounds within
:data:`STABLE_WITHIN` of the best (a single lucky or a single disturbed round proves nothing). Until then the
sweep **measures longer** — more rounds, each with twice the time box — up to ``max_rounds``; a peak still
unconfirmed, or a CPU entry whose fewer threads beat more threads (a disturbed many-thread run: a 1-thread bf16
peak above the 2-thread one), raises :class:`UnstableCalibration` naming the rounds and their spread, and
nothing is stored. :func:`spread` is what ``labkit calibrate`` prints beside each entry.

**Dtype capability.** :func:`capability` says whether each low-precision dtype is *fast* on a device:
its calibrated (or quickly measured) matmul rate against fp32's. Some CPUs run bf16 in hardware
(AVX512-BF16/AMX: several × fp32), others emulate it (≈ 1/150 of fp32 seen on an AMD EPYC without
those units). ``LABKIT_ASSUME_SLOW_BF16=1`` forces bf16 (and fp16) to count as slow — for testing the
slow path on a machine that has fast bf16.

Taught in chapter 4 (MFU's denominator) and chapter 6 (the roofline's peak).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit import checks
from labkit.hardware.catalogue import normalize_dtype

CACHE_ENV = "LABKIT_CACHE_DIR"
SLOW_BF16_ENV = "LABKIT_ASSUME_SLOW_BF16"
FILE = "calibration.json"
LOW_PRECISION = ("bf16", "fp16")
_CPU_SIZES = [(n, n, n) for n in (256, 512, 1024, 2048)]
STABLE_WITHIN = 0.90   # a round "agrees" with the best when it reaches 90 % of it
CONFIRM = 2            # rounds that must agree (the best and one more) before a peak is stored


class UnstableCalibration(ValueError):
    """A peak that the rounds did not reproduce (or that contradicts another thread count): not stored."""


def spread(rounds) -> float:
    """1 − worst round ÷ best round (0 when all agree). Taught in chapter 4."""
    rounds = [float(r) for r in rounds]
    return 1.0 - min(rounds) / max(rounds) if rounds and max(rounds) > 0 else 0.0


def _confirmed(rounds) -> int:
    return sum(r >= STABLE_WITHIN * max(rounds) for r in rounds)


def cache_dir() -> Path:
    """Where calibrations live: ``$LABKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/labkit``, else ``~/.cache/labkit``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "labkit"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def conditions(device, threads: int | None = None) -> dict:
    """What a calibration depends on: device model, torch version, threads (CPU), machine."""
    import torch

    from labkit.hardware.measure import resolve_device

    dev = resolve_device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else _cpu_model()
    return {"device": dev.type if dev.type == "cpu" else str(dev), "model": name, "torch": torch.__version__,
            "threads": int(threads if threads is not None else torch.get_num_threads()) if dev.type == "cpu" else None,
            "machine": platform.machine()}


@dataclass
class Calibration:
    """One calibrated entry: the best matmul rate of ``dtype`` on a device, and copy bandwidth."""

    dtype: str
    flops: float
    shape: list
    bandwidth: float
    conditions: dict
    rounds: list = field(default_factory=list)     # best FLOP/s of each round
    date: str = ""
    seconds: float = 0.0

    def describe(self) -> str:
        m, n, k = self.shape
        c = self.conditions
        where = f"{c['device']} ({c['model']}, {c['threads']} threads)" if c.get("threads") else \
            f"{c['device']} ({c['model']})"
        return f"matmul {m}x{k}@{k}x{n} {self.dtype} on {where}, best of {len(self.rounds)} rounds, {self.date[:10]}"

    @property
    def key(self) -> str:
        return _key(self.conditions, self.dtype)


def _key(cond: dict, dtype: str) -> str:
    return f"{cond['device']}|{cond['threads']}|{dtype}"


def _load_all(path: Path | None = None) -> dict:
    path = path or cache_dir() / FILE
    checks.refuse_special("calibration cache", path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a labkit calibration file ({e}); delete it and run `labkit calibrate`") from e
    return data if isinstance(data, dict) else {}


def _save(entries: list[Calibration]) -> Path:
    from labkit.record import atomic_write_text

    path = cache_dir() / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _load_all(path)
    for e in entries:
        data[e.key] = asdict(e)
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True))
    return path


def find(device="auto", dtype="fp32", threads: int | None = None) -> tuple[Calibration | None, bool]:
    """(the stored calibration for this device, dtype and thread count or None, whether its conditions
    still hold). Taught in chapter 4."""
    cond = conditions(device, threads)
    raw = _load_all().get(_key(cond, normalize_dtype(dtype)))
    if raw is None:
        return None, False
    cal = Calibration(**raw)
    return cal, cal.conditions == cond


def calibrate_one(device="auto", dtype="fp32", *, threads: int | None = None, rounds: int = 3,
                  max_seconds: float = 4.0, save: bool = True, max_rounds: int | None = None,
                  strict: bool = True) -> Calibration:
    """Measure and (by default) store one entry: ``rounds`` time-boxed shape sweeps (large shapes
    first on a GPU, up to 2048³ on a CPU while they fit the box), keeping the best once :data:`CONFIRM` rounds
    agree within :data:`STABLE_WITHIN`; until then more rounds with twice the box, up to ``max_rounds``
    (default 3 × rounds), then :class:`UnstableCalibration` and nothing stored — unless ``strict=False`` (the
    test session on a shared CI machine), which keeps the best round anyway. Taught in chapter 4."""
    import time

    import torch

    from labkit.hardware.measure import (
        _default_sizes,
        measure_matmul_peak,
        measure_memory_bandwidth,
        resolve_device,
    )

    checks.count("rounds", rounds)
    checks.positive("max_seconds", max_seconds)
    max_rounds = 3 * rounds if max_rounds is None else checks.count("max_rounds", max_rounds, at_least=rounds)
    dev = resolve_device(device)
    old = torch.get_num_threads()
    if threads is not None and dev.type == "cpu":
        torch.set_num_threads(checks.count("threads", threads))
    try:
        t0 = time.perf_counter()
        sizes = _CPU_SIZES if dev.type == "cpu" else _default_sizes("cuda")
        runs = [measure_matmul_peak(dev, dtype, sizes=sizes, max_seconds=max_seconds) for _ in range(rounds)]
        while _confirmed([r.flops for r in runs]) < CONFIRM and len(runs) < max_rounds:     # measure longer
            runs.append(measure_matmul_peak(dev, dtype, sizes=sizes, max_seconds=2 * max_seconds))
        got = [r.flops for r in runs]
        if _confirmed(got) < CONFIRM and checks.flag("strict", strict):
            raise UnstableCalibration(
                f"calibration of {normalize_dtype(dtype)} on {dev} ({threads or torch.get_num_threads()} threads) is "
                f"unstable: rounds {', '.join(f'{g / 1e9:,.1f}' for g in got)} GFLOP/s, spread {spread(got):.0%}; "
                f"the best was not reproduced within {1 - STABLE_WITHIN:.0%} by {CONFIRM - 1} more of {len(got)} "
                "rounds — not stored. Stop other work on the machine and run `labkit calibrate` again (or give "
                "--rounds / --max-seconds more)")
        best = max(runs, key=lambda r: r.flops)
        bw = max(measure_memory_bandwidth(dev) for _ in range(rounds))
        cal = Calibration(dtype=best.dtype, flops=best.flops, shape=list(best.shape), bandwidth=bw,
                          conditions=conditions(dev, threads), rounds=[r.flops for r in runs],
                          date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                          seconds=time.perf_counter() - t0)
    finally:
        torch.set_num_threads(old)
    if save:
        _save([cal])
    return cal


def calibrate(device="auto", dtypes=("fp32", "bf16"), *, threads=None, rounds: int = 3,
              max_seconds: float = 4.0, missing_only: bool = False, strict: bool = True) -> list[Calibration]:
    """Calibrate every dtype (and, on a CPU, every thread count in ``threads`` — default: this process's
    and 1, the count each of two ranks gets) and store the entries; ``missing_only`` keeps entries whose
    conditions still hold (and returns them). Unstable peaks raise :class:`UnstableCalibration` and nothing is
    stored (``strict=False``: stored anyway, for a test session). Taught in chapter 4."""
    import torch

    from labkit.hardware.measure import resolve_device

    dev = resolve_device(device)
    if dev.type == "cpu":
        counts = threads if threads is not None else sorted({torch.get_num_threads(), 1}, reverse=True)
        counts = [checks.count("threads", t) for t in (counts if isinstance(counts, list | tuple) else [counts])]
    else:
        counts = [None]
    out, new = [], []
    for t in counts:
        for d in dtypes:
            cal, fresh = find(dev, d, t) if missing_only else (None, False)
            if not fresh:
                cal = calibrate_one(dev, d, threads=t, rounds=rounds, max_seconds=max_seconds, save=False,
                                    strict=strict)
                new.append(cal)
            out.append(cal)
    for d in dtypes:    # more threads never lose at their best: a loss is a disturbed run, measured again, once
        by_t = sorted((c for c in out if c.dtype == normalize_dtype(d) and c.conditions.get("threads")),
                      key=lambda c: c.conditions["threads"])
        for few, many in zip(by_t, by_t[1:], strict=False):
            if few.flops > many.flops:
                again = calibrate_one(dev, d, threads=many.conditions["threads"], rounds=rounds,
                                      max_seconds=2 * max_seconds, save=False, strict=strict)
                if few.flops > again.flops and strict:
                    raise UnstableCalibration(
                        f"calibration of {many.dtype} on {dev} is inconsistent: {few.conditions['threads']} thread(s) "
                        f"reached {few.flops / 1e9:,.1f} GFLOP/s, {many.conditions['threads']} threads only "
                        f"{again.flops / 1e9:,.1f} (measured twice, spread {spread(again.rounds):.0%}) — the machine "
                        "is busy; nothing stored. Stop other work and run `labkit calibrate` again")
                out[out.index(many)] = again
                new = [again if c is many else c for c in new]
    if new:
        _save(new)
    return out


def capability(device="auto", dtypes=LOW_PRECISION, *, quick_seconds: float = 1.0) -> dict:
    """Per low-precision dtype: its matmul rate, fp32's, their ratio and a verdict — ``"fast"`` (at least
    fp32's rate), ``"no faster"`` (½–1× fp32) or ``"slow"`` (emulated, < ½ of fp32). Uses calibrations
    where they exist, else a quick measurement. ``LABKIT_ASSUME_SLOW_BF16=1`` forces "slow".
    Taught in chapter 4 and chapter 17 (mixed precision)."""
    from labkit.hardware.measure import measure_matmul_peak, resolve_device

    dev = resolve_device(device)

    def rate(dtype):
        cal, fresh = find(dev, dtype)
        if cal is not None and fresh:
            return cal.flops, "calibrated"
        sizes = [(512, 512, 512)] if dev.type == "cpu" else None
        return measure_matmul_peak(dev, dtype, sizes=sizes, max_seconds=quick_seconds).flops, "measured"

    base, src = rate("fp32")
    out = {"fp32": {"flops": base, "source": src}}
    forced = os.environ.get(SLOW_BF16_ENV, "").strip() not in ("", "0")
    for d in dtypes:
        d = normalize_dtype(d)
        try:
            f, s = rate(d)
        except (RuntimeError, ValueError) as e:      # not supported on this device
            out[d] = {"flops": None, "source": "unsupported", "verdict": "slow", "why": str(e)[:200]}
            continue
        ratio = f / base
        verdict = "fast" if ratio >= 1.0 else ("no faster" if ratio >= 0.5 else "slow")
        if forced:
            verdict, s = "slow", f"{s}; forced by {SLOW_BF16_ENV}"
        out[d] = {"flops": f, "source": s, "ratio_to_fp32": ratio, "verdict": verdict}
    return out


def best_dtype(device="auto") -> str:
    """``"bf16"`` where bf16 is fast on ``device``, else ``"fp32"`` — what benchmarks and chapters train
    in by default. Taught in chapter 17 (mixed precision)."""
    from labkit.hardware.measure import resolve_device

    dev = resolve_device(device)
    if dev.type == "cuda":
        forced = os.environ.get(SLOW_BF16_ENV, "").strip() not in ("", "0")
        return "fp32" if forced else "bf16"
    return "bf16" if capability(dev, ("bf16",))["bf16"]["verdict"] == "fast" else "fp32"
