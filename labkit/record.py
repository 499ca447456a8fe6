"""The run record: one type that carries a run's measured figures everywhere.

The meter, the trainer, the trace analysis, the CLI, the grader and the regression monitor all
read and write :class:`RunRecord`, and it round-trips through JSON. Its core is the *baseline
record* of chapter 14 (tokens/s, utilisation and MFU, communication wait share, data-loader time,
peak memory), plus what is needed to reproduce and compare it (config, device, peak source, versions).

Terms (they are easy to confuse):

- ``tokens_per_s`` is **global** throughput (all ranks together); ``tokens_per_s_per_device`` divides
  it by ``n_devices``.
- ``mfu`` uses *model* FLOPs (no recomputation); ``hfu`` uses the FLOPs the hardware executed
  (recomputation included) — PaLM (Chowdhery et al. 2022, App. B). Both are fractions in [0, 1].
- ``comm_wait_share`` is *exposed* communication (not hidden under compute) as a fraction of step
  time; ``data_wait_share`` the same for waiting on the data loader.

Taught in chapter 14 (``chapters/part2_diagnosis/ch14_systematic_diagnosis.ipynb``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1


@dataclass
class Stat:
    """Summary of repeated measurements of one quantity (seconds unless named otherwise)."""

    median: float
    p10: float
    p90: float
    n: int
    mean: float | None = None

    @classmethod
    def of(cls, values) -> Stat:
        import numpy as np

        v = np.asarray(list(values), dtype=float)
        if v.size == 0:
            raise ValueError("Stat.of needs at least one value, got an empty sequence")
        return cls(median=float(np.median(v)), p10=float(np.percentile(v, 10)),
                   p90=float(np.percentile(v, 90)), n=int(v.size), mean=float(v.mean()))

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative spread used to judge noise."""
        return (self.p90 - self.p10) / self.median if self.median else float("inf")


@dataclass
class RunRecord:
    """A run's measured figures (see the module docstring for the terms)."""

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

    # ---------------------------------------------------------------- derived
    @property
    def tokens_per_s_per_device(self) -> float | None:
        if self.tokens_per_s is None:
            return None
        return self.tokens_per_s / max(self.n_devices, 1)

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tokens_per_s_per_device"] = self.tokens_per_s_per_device
        return d

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), default=_jsonable, **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunRecord:
        if not isinstance(d, dict):
            raise TypeError(f"RunRecord.from_dict needs a dict, got {type(d).__name__}")
        schema = d.get("schema", SCHEMA_VERSION)
        if schema > SCHEMA_VERSION:
            raise ValueError(f"record schema {schema} is newer than this labkit understands ({SCHEMA_VERSION})")
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        unknown = {k: v for k, v in d.items() if k not in names and k != "tokens_per_s_per_device"}
        if unknown:
            kw.setdefault("extra", {}).update(unknown)
        if kw.get("step_time") is not None:
            kw["step_time"] = Stat(**kw["step_time"])
        kw["phases"] = {k: Stat(**v) for k, v in (kw.get("phases") or {}).items()}
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        return cls.from_dict(json.loads(text))

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temp file + rename): a crash never leaves a half-written record."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, self.to_json())
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> RunRecord:
        path = Path(path)
        try:
            return cls.from_json(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not a valid run record (JSON error at line {e.lineno}: {e.msg})") from e

    # ---------------------------------------------------------------- display
    def summary(self) -> str:
        """One line a human can read in a log."""
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
        if self.comm_wait_share is not None:
            parts.append(f"comm wait {self.comm_wait_share:.1%}")
        if self.data_wait_share is not None:
            parts.append(f"data wait {self.data_wait_share:.1%}")
        if self.peak_memory_bytes is not None:
            what = "peak RSS (process lifetime)" if "rss" in str(self.extra.get("peak_memory_kind", "")).lower() \
                else "peak mem"
            parts.append(f"{what} {self.peak_memory_bytes / 2**20:,.1f} MiB")
        return " | ".join(parts)


def _jsonable(o):
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and an atomic rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def environment_versions() -> dict[str, str]:
    """Versions that explain a number: Python, torch, CUDA/NCCL when present, labkit, platform."""
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
