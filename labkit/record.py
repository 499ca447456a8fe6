"""The run record: one type that carries a run's measured figures everywhere.

The meter, the trainer, the trace analysis, the CLI, the grader and the regression monitor all
read and write :class:`RunRecord`, and it round-trips through JSON. Its core is the *baseline
record* of chapter 14 (tokens/s, utilisation and MFU, communication wait share, data-loader time,
peak memory), plus what is needed to reproduce and compare it (config, device, peak source, versions).

Terms (they are easy to confuse):

- ``tokens_per_s`` is **global** throughput (all ranks); ``tokens_per_s_per_device`` divides by ``n_devices``.
- ``mfu`` uses *model* FLOPs (no recomputation); ``hfu`` uses the FLOPs the hardware executed
  (recomputation included) — PaLM (Chowdhery et al. 2022, App. B). Both are fractions in [0, 1].
- ``comm_wait_share`` is *exposed* communication (not hidden under compute) as a fraction of step
  time; ``data_wait_share`` the same for waiting on the data loader.

Every field is checked when set (construction, load, assignment) and again before a save: shares, MFU,
HFU, utilisation in [0, 1] (float noise of 1e-9 clamped), times, rates, FLOPs, peaks finite and > 0, counts
ints >= 1, hardware >= model FLOPs, comm + data <= 1; None means unknown. Errors name the field, the bad
value and what is valid (and the file, on load).

Taught in chapter 14 (``chapters/part2_diagnosis/ch14_systematic_diagnosis.ipynb``).
"""
from __future__ import annotations

import dataclasses
import errno
import json
import numbers
import os
import platform
import tempfile
from dataclasses import dataclass, field
from functools import partial, reduce
from pathlib import Path
from typing import Any

from labkit import checks
from labkit.units import si

SCHEMA_VERSION = 1
_EPS = 1e-9          # float noise tolerated (and clamped) at the edges of [0, 1] and in cross-field checks


# ----------------------------------------------------------------------------- field checks
def _show(value) -> str:
    """A short repr for error messages (huge lists and ints stay readable)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) > 10**30:
        return f"<int of {int(value).bit_length()} bits>"
    r = repr(value)
    return r if len(r) <= 80 else r[:77] + "..."


_num = checks.number                            # an int beyond a float's range is a ValueError there too
_positive = checks.positive
_nonneg = partial(_num, low=0)
_count = partial(checks.count, at_most=2**63 - 1)      # counts fit an int64 (numpy, other JSON readers)


def _share(name, value) -> float:
    """A fraction in [0, 1]; float noise within 1e-9 of an edge is clamped onto it."""
    try:
        v = _num(name, value)
    except checks.ArgumentTypeError:
        raise
    except ValueError:                          # NaN, inf, too large: the message below states the range
        v = float("nan")
    return min(max(v, 0.0), 1.0) if -_EPS <= v <= 1 + _EPS else _num(name, value, low=0, high=1)


def _bytes(name, value):
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return _count(name, value, at_least=0)
    return _nonneg(name, value)


def _typed(name, value, kind=str, what="a string"):
    if not isinstance(value, kind):
        raise checks.ArgumentTypeError(f"{name} must be {what}, got {type(value).__name__} {_show(value)}")
    return value


_text = _typed
_mapping = partial(_typed, kind=dict, what="a dict")


def _optional(check):
    return lambda name, value: None if value is None else check(name, value)


def _values(name: str, values, *, low_open: bool = False, min_size: int = 1):
    """``values`` (a sequence or 1-D array of real numbers; no strings, bools or nesting) as a float
    array, each finite and >= 0 (> 0 with ``low_open``); an error names ``name[i]``."""
    import numpy as np

    if values is None or isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise checks.ArgumentTypeError(f"{name} must be a sequence of numbers, got {type(values).__name__} "
                                       f"{_show(values)}")
    v = np.array([_num(f"{name}[{i}]", x, low=0, low_open=low_open) for i, x in enumerate(values)], dtype=float)
    if v.size < min_size:
        raise ValueError(f"{name} needs at least {min_size} value(s), got {v.size}")
    return v


def _path(name: str, value) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise checks.ArgumentTypeError(f"{name} must be a path (str or os.PathLike), got "
                                       f"{type(value).__name__} {_show(value)}")
    if os.fspath(value) == "":
        raise ValueError(f"{name}='' is not valid: use a file path (an empty path would mean the current folder)")
    return Path(value)


# ----------------------------------------------------------------------------- Stat
@dataclass
class Stat:
    """Summary of repeated measurements of one quantity (seconds unless named otherwise): finite
    values >= 0, p10 <= median <= p90, ``n`` an int >= 1. Taught in chapter 7 (timing)."""

    median: float
    p10: float
    p90: float
    n: int
    mean: float | None = None

    def __post_init__(self):
        self.validate()

    def validate(self, name: str = "Stat") -> Stat:
        """Check (and normalise to Python numbers) every field; errors name ``<name>.<field>``."""
        med, p10, p90 = (_nonneg(f"{name}.{k}", getattr(self, k)) for k in ("median", "p10", "p90"))
        n = _count(f"{name}.n", self.n)
        mean = None if self.mean is None else _nonneg(f"{name}.mean", self.mean)
        tol = _EPS * p90
        if not (p10 <= med + tol and med <= p90 + tol):
            raise ValueError(f"{name} is not valid: p10 <= median <= p90 must hold, got p10={p10!r}, "
                             f"median={med!r}, p90={p90!r}")
        self.median, self.p10, self.p90, self.n, self.mean = med, p10, p90, n, mean
        return self

    @classmethod
    def _from_dict(cls, name: str, d) -> Stat:
        if isinstance(d, Stat):
            return d.validate(name)
        _mapping(name, d)
        missing = sorted({"median", "p10", "p90", "n"} - set(d))
        unknown = sorted(map(str, set(d) - {"median", "p10", "p90", "n", "mean"}))
        if missing or unknown:
            raise ValueError(f"{name} is not a valid Stat: missing {missing}, unknown {unknown}; "
                             "use {'median', 'p10', 'p90', 'n'[, 'mean']}")
        s = cls.__new__(cls)
        s.__dict__.update({"mean": None, **d})
        return s.validate(name)

    @classmethod
    def of(cls, values) -> Stat:
        """Median, p10, p90 and mean of ``values`` (finite numbers >= 0, at least one)."""
        import numpy as np

        v = _values("values", values)
        scale = float(v.max()) if v.max() > 1e300 else 1.0     # huge values: no overflow in the means
        w = v / scale
        return cls(median=float(np.median(w)) * scale, p10=float(np.percentile(w, 10)) * scale,
                   p90=float(np.percentile(w, 90)) * scale, n=int(v.size), mean=float(w.mean()) * scale)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative spread used to judge noise (ValueError when the median is 0
        and the values differ: a spread relative to nothing)."""
        if self.median > 0:
            return (self.p90 - self.p10) / self.median
        if self.p90 == self.p10:
            return 0.0
        raise ValueError(f"Stat.spread is undefined: median=0 with p10={self.p10!r} < p90={self.p90!r}")


def _step_stat(name, value) -> Stat:
    s = Stat._from_dict(name, value)
    if s.median <= 0:
        raise ValueError(f"{name}.median={s.median!r} is not valid: a step takes time, use a finite number > 0")
    return s


def _phases(name, value) -> dict:
    _mapping(name, value)
    out, same = {}, True
    for k, v in value.items():
        if not isinstance(k, str) or not k:
            raise checks.ArgumentTypeError(f"{name} keys must be non-empty phase names, got {_show(k)}")
        out[k] = Stat._from_dict(f"{name}[{k!r}]", v)
        same = same and out[k] is v
    return value if same else out


def _losses(name, value) -> list:
    items = value.tolist() if hasattr(value, "tolist") else value      # a numpy array too
    if not isinstance(items, (list, tuple)):
        raise checks.ArgumentTypeError(f"{name} must be a list of numbers, got {type(value).__name__} {_show(value)}")
    # NaN and inf stay allowed: a diverged run's loss is a measurement too
    return [_num(f"{name}[{i}]", x, finite=False) if x == x else float("nan") for i, x in enumerate(items)]


def _schema(name, value) -> int:
    v = checks.count(name, value)
    if v > SCHEMA_VERSION:
        raise ValueError(f"record schema {v} is newer than this labkit understands ({SCHEMA_VERSION})")
    return v


_FIELD_CHECKS = {
    "label": _text, "step_time": _optional(_step_stat), "tokens_per_step": _optional(_count),
    "tokens_per_s": _optional(_positive), "n_devices": _count, "model_flops_per_token": _optional(_positive),
    "hardware_flops_per_token": _optional(_positive), "peak_flops": _optional(_positive),
    "peak_source": _optional(_text), "dtype": _optional(_text), "mfu": _optional(_share),
    "hfu": _optional(_share), "utilisation": _optional(_share), "phases": _phases,
    "comm_wait_share": _optional(_share), "data_wait_share": _optional(_share),
    "peak_memory_bytes": _optional(_bytes), "loss": _losses, "config": _mapping, "device": _mapping,
    "versions": _mapping, "extra": _mapping, "schema": _schema,
}


# ----------------------------------------------------------------------------- RunRecord
@dataclass
class RunRecord:
    """A run's measured figures (see the module docstring for the terms and the checks).

    Taught in chapter 14.
    """

    label: str = "run"
    # throughput
    step_time: Stat | None = None           # seconds per optimizer step
    tokens_per_step: int | None = None      # global tokens per optimizer step (unpadded)
    tokens_per_s: float | None = None       # global
    n_devices: int = 1
    # efficiency
    model_flops_per_token: float | None = None
    hardware_flops_per_token: float | None = None
    peak_flops: float | None = None         # per device, for `dtype`
    peak_source: str | None = None          # "catalogue:<name>", "measured:<how>", "user"
    dtype: str | None = None
    mfu: float | None = None
    hfu: float | None = None
    utilisation: float | None = None        # fraction of the window the device was busy (trace)
    # where the time goes
    phases: dict[str, Stat] = field(default_factory=dict)   # per-step phase times (data, forward, ...)
    comm_wait_share: float | None = None
    data_wait_share: float | None = None
    # memory
    peak_memory_bytes: int | None = None
    # learning
    loss: list[float] = field(default_factory=list)
    # provenance
    config: dict[str, Any] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)    # name, kind (cpu/cuda), backend, count
    versions: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    schema: int = SCHEMA_VERSION

    def __setattr__(self, name, value):
        check = _FIELD_CHECKS.get(name)
        object.__setattr__(self, name, value if check is None else check(name, value))

    def __post_init__(self):
        self._check_together()

    def validate(self) -> RunRecord:
        """Check every field again (e.g. after ``phases`` was edited in place) and the figures that must
        agree (hardware >= model FLOPs, comm + data wait <= 1); returns the record, raises
        ValueError (a TypeError too for a wrong type) naming the field. Taught in chapter 14."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name))
        self._check_together()
        return self

    def _check_together(self) -> None:
        # (HFU < MFU is not refused: a record with hand-edited figures must still load, so that a grader
        # can judge it by its own consistency checks — lab 1's forged-record test)
        m, h = self.model_flops_per_token, self.hardware_flops_per_token
        if m is not None and h is not None and h < m * (1 - _EPS):
            raise ValueError(f"hardware_flops_per_token={h!r} < model_flops_per_token={m!r} is not valid: "
                             "recomputation only adds FLOPs, so use hardware >= model")
        c, d = self.comm_wait_share, self.data_wait_share
        if c is not None and d is not None and c + d > 1 + _EPS:
            raise ValueError(f"comm_wait_share={c!r} + data_wait_share={d!r} > 1 is not valid: both are parts "
                             "of the same step time, so their sum must be <= 1")

    # ---------------------------------------------------------------- derived
    @property
    def tokens_per_s_per_device(self) -> float | None:
        return None if self.tokens_per_s is None else self.tokens_per_s / self.n_devices

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the record is validated first)."""
        self.validate()
        return {**dataclasses.asdict(self), "tokens_per_s_per_device": self.tokens_per_s_per_device}

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), default=_jsonable, **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecord:
        """A record from :meth:`to_dict`'s shape; unknown keys go to ``extra``. Validated like any record."""
        if not isinstance(d, dict):
            raise checks.ArgumentTypeError(f"RunRecord.from_dict needs a dict, got {type(d).__name__} {_show(d)}")
        if "schema" in d:
            _schema("schema", d["schema"])     # a newer schema is named before any field it may have changed
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        unknown = {k: v for k, v in d.items() if k not in names and k != "tokens_per_s_per_device"}
        if unknown:
            kw["extra"] = {**_mapping("extra", kw.get("extra", {})), **unknown}
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        if not isinstance(text, str):
            raise checks.ArgumentTypeError(f"text must be a JSON string, got {type(text).__name__} {_show(text)}")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"text is not a valid run record (JSON error: {str(e)[:120]})") from None
        _typed("text (a JSON object)", doc, dict, "a run record object")
        return cls.from_dict(doc)

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temp file + rename): a crash never leaves a half-written record."""
        path = _path("path", path)
        text = self.to_json()
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> RunRecord:
        """Read and validate a saved record; every error names the file (and the field)."""
        path = _path("path", path)
        checks.refuse_special("run record file", path)
        if not path.is_file():
            raise FileNotFoundError(f"run record file {path} does not exist")
        try:        # ValueError: invalid JSON or UTF-8, an int of > 4300 digits; RecursionError: absurd nesting
            doc = json.loads(path.read_bytes())
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{path} is not a valid run record (JSON error: {str(e)[:120]})") from None
        try:
            return cls.from_dict(doc)
        except checks.ArgumentTypeError as e:
            raise checks.ArgumentTypeError(f"run record {path}: {e}") from None
        except ValueError as e:
            raise ValueError(f"run record {path}: {e}") from None

    # ---------------------------------------------------------------- display
    def mfu_line(self) -> str:
        """MFU with its arithmetic and the peak's source (``MFU 41.20% = 9,812 tok/s × … [peak: calibrated:…]``)."""
        if self.mfu is None or self.tokens_per_s is None or self.peak_flops is None:
            return f"{self.label}: no MFU (tokens/s, FLOPs per token or peak missing)"
        return (f"MFU {self.mfu:.2%} = {self.tokens_per_s:,.0f} tok/s × {self.model_flops_per_token:.3g} FLOP/token "
                f"÷ ({self.n_devices} × {si(self.peak_flops, 'FLOP/s')}) [peak: {self.peak_source}]")

    def summary(self, width: int = 100) -> str:
        """Parts joined by `` | ``, wrapped between parts at ``width`` (0: one line; notebooks break longer mid-word)."""
        parts = [self.label]
        if self.step_time:
            # tokens/s is total tokens / total time, so it matches the *mean* step, not the median
            mean = f", mean {self.step_time.mean * 1e3:.1f}" if self.step_time.mean is not None else ""
            parts.append(f"step median {self.step_time.median * 1e3:.1f} ms (p10 {self.step_time.p10 * 1e3:.1f}, "
                         f"p90 {self.step_time.p90 * 1e3:.1f}{mean}, n={self.step_time.n})")
        if self.tokens_per_s is not None:
            parts.append(f"{self.tokens_per_s:,.0f} tok/s ({self.tokens_per_s_per_device:,.0f}/device)")
        if self.mfu is not None:
            parts.append(f"MFU {self.mfu:.1%}")
        if self.hfu is not None and self.hfu != self.mfu:
            parts.append(f"HFU {self.hfu:.1%}")
        parts += [f"{n} {v:.1%}" for n, v in (("comm wait", self.comm_wait_share), ("data wait", self.data_wait_share)) if v is not None]
        if self.peak_memory_bytes is not None:
            rss = "rss" in str(self.extra.get("peak_memory_kind", "")).lower()
            parts.append(f"{'peak RSS (process lifetime)' if rss else 'peak mem'} {self.peak_memory_bytes / 2**20:,.1f} MiB")
        return reduce(lambda t, p: t + ("\n  " if width and len(t.rsplit("\n", 1)[-1]) + 3 + len(p) > width
                                                  else " | ") + p, parts[1:], parts[0])


def _jsonable(o):
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    return o.item() if hasattr(o, "item") else str(o)


def atomic_write_text(path: str | os.PathLike, text: str, *, exclusive: bool = False) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and an atomic rename.

    ``exclusive=True`` never replaces an existing file: the finished temp file is hard-linked into
    place, which fails with FileExistsError when ``path`` exists — of two concurrent writers exactly one
    wins and nothing is lost (on a filesystem without hard links: an ``O_EXCL`` create, then the write).

    Taught in chapter 14 (saving the baseline record) and chapter 28 (the baseline store).
    """
    path = _path("path", path)
    if not isinstance(text, str):
        raise checks.ArgumentTypeError(f"text must be a str, got {type(text).__name__} {_show(text)}")
    checks.flag("exclusive", exclusive)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if not exclusive:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)                      # atomic create-exclusive of a complete file
        except FileExistsError:
            raise FileExistsError(f"{path} already exists") from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
                raise
            with open(path, "x") as f:              # no hard links here: exclusive create, then write
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def environment_versions() -> dict[str, str]:
    """Versions that explain a number: Python, torch, CUDA/NCCL when present, labkit, platform.

    Taught in chapter 14 (what makes a record reproducible)."""
    from labkit._version import __version__

    v = {"python": platform.python_version(), "labkit": __version__, "platform": platform.platform()}
    try:
        import torch

        v["torch"] = torch.__version__
        if torch.version.cuda:
            v["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            try:
                v["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            except Exception:  # noqa: BLE001 - NCCL absent in some builds
                pass
    except ImportError:
        pass
    return v

