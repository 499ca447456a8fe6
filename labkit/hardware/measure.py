"""Live peak measurements and the peak an MFU divides by: matmul FLOP/s, copy bandwidth, timing.

The measurements: the best matmul rate over a shape sweep (:func:`measure_matmul_peak`), copy
bandwidth (:func:`measure_memory_bandwidth`), and :func:`time_fn`, the one timer (CUDA events on GPU,
perf_counter on CPU). Which peak an MFU divides by is decided in :mod:`labkit.hardware.peak`.
torch is imported inside the functions.

Taught in chapter 6 (roofline: the ``measure_*`` functions) and chapter 7 (timing: :func:`time_fn`).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from labkit import checks
from labkit.hardware.catalogue import normalize_dtype

__all__ = ["resolve_device", "time_fn", "PeakMeasurement", "measure_matmul_peak", "measure_memory_bandwidth",
           "last_level_cache_bytes"]

_SYS_CPU = "/sys/devices/system/cpu"
_SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def resolve_device(device="auto"):
    """``"auto"`` -> cuda if available else cpu; strings and torch.device pass through.

    Taught in chapter 6 (roofline).
    """
    import torch

    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device={device!r} is not a torch device ('auto', 'cpu', 'cuda', 'cuda:1')") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asks for CUDA but torch.cuda.is_available() is False")
    return dev


def _torch_dtype(dtype: str):
    import torch

    key = normalize_dtype(dtype)
    table = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32,
             "bf16": torch.bfloat16, "fp16": torch.float16}
    if key not in table:
        raise ValueError(f"dtype={dtype!r}: matmul peak can be measured for {sorted(table)}, not {key}")
    return table[key]


def time_fn(fn, device, *, warmup: int = 2, repeats: int = 5, inner: int = 1) -> list[float]:
    """Seconds per call of ``fn`` (list over ``repeats``), after ``warmup`` calls.

    On CUDA the interval is taken with CUDA events and one synchronize per repeat (GPU work is
    asynchronous: a host clock would time the launch, not the kernel); on CPU with perf_counter.
    Taught in chapter 7 (timing).
    """
    import torch

    dev = torch.device(device)
    for _ in range(warmup):
        fn()
    times = []
    if dev.type == "cuda":
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / inner)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) / inner)
    return times


@dataclass(frozen=True)
class PeakMeasurement:
    """Result of :func:`measure_matmul_peak`: best FLOP/s, its shape, and the whole sweep.

    Taught in chapter 6 (roofline).
    """

    flops: float
    shape: tuple[int, int, int]
    dtype: str
    device: str
    table: list = field(default_factory=list)   # [((m, n, k), flop/s), ...] in sweep order
    seconds: float = 0.0

    def describe(self) -> str:
        """"matmul MxK@KxN dtype on device" (the ``peak_source`` text). Chapter 6 (roofline)."""
        m, n, k = self.shape
        return f"matmul {m}x{k}@{k}x{n} {self.dtype} on {self.device}"


def _default_sizes(dev_type: str) -> list[tuple[int, int, int]]:
    if dev_type == "cuda":
        # a MAMF-finder-like sweep (S. Bekman, ml-engineering, compute/accelerator/benchmarks):
        # large shapes, multiples of 256, plus a few off-by-tile shapes
        return [(n, n, n) for n in (2048, 4096, 6144, 8192, 10240, 12288, 16384)] + \
               [(8192, 8192, 4096), (4096, 16384, 4096), (16384, 4096, 8192)]
    return [(n, n, n) for n in (256, 512, 1024)]


def measure_matmul_peak(device="cpu", dtype="fp32", *, sizes=None, max_seconds: float = 3.0,
                        repeats: int = 5) -> PeakMeasurement:
    """Achievable matmul FLOP/s on ``device`` for ``dtype``: the best median over a shape sweep.

    Each shape (m, n, k) does ``2·m·n·k`` FLOPs; after warm-up it is timed ``repeats`` times (CUDA
    events on GPU) and its median kept; the best shape wins (the "maximum achievable matmul FLOPS"
    idea of Stas Bekman's MAMF finder, https://github.com/stas00/ml-engineering, compute/accelerator).
    The sweep stops after ``max_seconds``, and never starts a shape that the best rate so far
    predicts would overrun it (at least one shape is always measured). ``tf32`` enables
    TF32 matmuls for the measurement and restores the setting afterwards.

    Taught in chapter 6 (roofline).
    """
    import torch

    checks.positive("max_seconds", max_seconds)
    checks.count("repeats", repeats)
    dev = resolve_device(device)
    key = normalize_dtype(dtype)
    tdtype = _torch_dtype(key)
    if key == "tf32" and dev.type != "cuda":
        raise ValueError(f"dtype={dtype!r}: TF32 is a GPU tensor-core mode; on {dev.type} measure 'fp32'")
    shapes = [tuple(int(x) for x in s) for s in (sizes or _default_sizes(dev.type))]
    for s in shapes:
        if len(s) != 3 or min(s) <= 0:
            raise ValueError(f"sizes: each entry must be (m, n, k) with positive ints, got {s}")
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    table = []
    t_start = time.perf_counter()
    try:
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = key == "tf32"
        for m, n, k in shapes:
            if table:  # don't start a shape that the best rate so far says cannot fit the time box
                predicted = 2.0 * m * n * k / max(r for _, r in table) * (repeats + 2)
                if time.perf_counter() - t_start + predicted > max_seconds:
                    break
            a = torch.randn(m, k, device=dev).to(tdtype)
            b = torch.randn(k, n, device=dev).to(tdtype)
            times = time_fn(lambda a=a, b=b: torch.matmul(a, b), dev, warmup=2, repeats=repeats)
            table.append(((m, n, k), 2.0 * m * n * k / statistics.median(times)))
            del a, b
            if time.perf_counter() - t_start > max_seconds:
                break
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    best_shape, best = max(table, key=lambda r: r[1])
    return PeakMeasurement(flops=best, shape=best_shape, dtype=key, device=str(dev), table=table,
                           seconds=time.perf_counter() - t_start)


def measure_memory_bandwidth(device="cpu", *, nbytes: int | None = None, repeats: int = 5) -> float:
    """Achievable memory bandwidth in bytes/s: a device-to-device copy of ``nbytes`` (read + write).

    ``dst.copy_(src)`` moves ``2·nbytes`` (one read, one write), as in STREAM's "copy" kernel
    (McCalpin, https://www.cs.virginia.edu/stream/). Default size: on a CPU, STREAM's rule — each
    array at least 4× the last-level cache (:func:`last_level_cache_bytes`), and at least 64 MiB —
    since a copy that fits in a large L3 times the cache, not memory (several × too fast, which puts
    the roofline's ridge point far too low); 1 GiB on a GPU. Median of ``repeats`` after warm-up.
    Taught in chapter 6 (roofline).
    """
    import torch

    dev = resolve_device(device)
    if nbytes is None:
        nbytes = 2**30 if dev.type == "cuda" else max(64 * 2**20, 4 * last_level_cache_bytes())
    if int(nbytes) < 4096:
        raise ValueError(f"nbytes={nbytes!r} must be >= 4096 (a copy that small times the call, not memory)")
    n = int(nbytes) // 4
    src = torch.ones(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    times = time_fn(lambda: dst.copy_(src), dev, warmup=2, repeats=repeats)
    return 2.0 * n * 4 / statistics.median(times)


def last_level_cache_bytes(sys_cpu: str = _SYS_CPU) -> int:
    """Size in bytes of CPU 0's last-level cache, read from Linux sysfs (``cpu0/cache/index*/size``,
    the highest ``level``); 0 where sysfs does not say (macOS, Windows, some containers).

    Used to size :func:`measure_memory_bandwidth`'s copy beyond the caches. Taught in chapter 6 (roofline).
    """
    from pathlib import Path

    best_level, size = -1, 0
    for index in sorted(Path(sys_cpu, "cpu0", "cache").glob("index*")):
        try:
            level = int((index / "level").read_text().strip())
            kind = (index / "type").read_text().strip()
            text = (index / "size").read_text().strip().upper().removesuffix("B")
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not text:
            continue
        unit = text[-1] if text[-1] in _SIZE_UNITS else ""
        try:
            nbytes = int(text[:-1] if unit else text) * _SIZE_UNITS[unit]
        except ValueError:
            continue
        if level > best_level:
            best_level, size = level, nbytes
    return size
