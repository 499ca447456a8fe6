"""Arithmetic intensity and the roofline: is a kernel limited by memory bandwidth or by compute?

The roofline model (Williams, Waterman & Patterson 2009, "Roofline: an insightful visual performance
model for multicore architectures", CACM 52(4)):

    arithmetic intensity  I = FLOPs / bytes moved to and from memory        (FLOP/byte)
    attainable FLOP/s       = min(peak FLOP/s, I × memory bandwidth)
    ridge point             = peak / bandwidth: below it a kernel is memory-(HBM-)bound, above it compute-bound

For C = A·B with A (m×k), B (k×n): FLOPs = 2·m·n·k (one multiply and one add per term), and the
minimum traffic reads A and B once and writes C once: (m·k + k·n + m·n) × bytes per element.
A square bf16 matmul of n=4096 has I ≈ 1365 FLOP/byte (compute-bound on any GPU); a matrix-vector
product (m=1) has I ≈ 1 (memory-bound everywhere).

:func:`sweep_matmul` measures real matmuls on this device (warm-up, synchronised, median of repeats)
so chapter 6 can draw them under the device's own roof (peak and bandwidth from ``labkit.hardware``).

Taught in chapter 6 (``chapters/part1_cognition/ch06_roofline.ipynb``); chapter 15 and 17 reuse it.
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["matmul_flops", "matmul_bytes", "arithmetic_intensity", "ridge_point", "attainable",
           "bound", "default_shapes", "time_matmul", "sweep_matmul", "DTYPE_BYTES", "MatmulTiming"]

DTYPE_BYTES = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}


def _dims(m, n, k) -> tuple[int, int, int]:
    """The matmul dimensions (m×k)·(k×n), each an int >= 1."""
    return checks.count("m", m), checks.count("n", n), checks.count("k", k)


def _dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES[checks.one_of("dtype", dtype, DTYPE_BYTES)]


def matmul_flops(m: int, n: int, k: int) -> int:
    """2·m·n·k FLOPs for (m×k)·(k×n). Taught in chapter 6 (and chapter 3)."""
    m, n, k = _dims(m, n, k)
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, dtype: str = "fp32") -> int:
    """Minimum memory traffic of (m×k)·(k×n): read A and B, write C once. Taught in chapter 6."""
    m, n, k = _dims(m, n, k)
    return (m * k + k * n + m * n) * _dtype_bytes(dtype)


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte moved. Taught in chapter 6."""
    i = checks.positive("flops", flops) / checks.positive("nbytes", nbytes)
    return checks.finite_result("arithmetic intensity", i, flops=flops, nbytes=nbytes)


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """Intensity (FLOP/byte) where the bandwidth roof meets the compute roof. Taught in chapter 6."""
    r = checks.positive("peak_flops", peak_flops) / checks.positive("bandwidth", bandwidth)
    return checks.finite_result("ridge point", r, peak_flops=peak_flops, bandwidth=bandwidth)


def attainable(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """Roofline bound: min(peak, intensity × bandwidth) in FLOP/s. Taught in chapter 6."""
    peak = checks.positive("peak_flops", peak_flops)
    return min(peak, checks.positive("intensity", intensity) * checks.positive("bandwidth", bandwidth))


def bound(intensity: float, peak_flops: float, bandwidth: float) -> str:
    """"memory" when the intensity is below the ridge point, else "compute". Taught in chapter 6."""
    i = checks.positive("intensity", intensity)
    peak, bw = checks.positive("peak_flops", peak_flops), checks.positive("bandwidth", bandwidth)
    return "memory" if i < peak / bw else "compute"     # an overflowing ridge (inf) is still an order


def default_shapes(fast: bool = False, device_type: str = "cpu") -> list[tuple[int, int, int]]:
    """A sweep from matrix-vector (memory-bound) to square matmuls (compute-bound).

    The squares span at least 32× per side (32 to 1024 on a CPU, 256 to 8192 on a GPU), so the gain
    from a bigger GEMM (chapter 6) is far larger than the timing noise of a shared machine.

    Sizes fit the device: on a GPU up to 8192 (a few ms each); on a CPU up to 2048, or 1024 with
    ``fast=True`` (a 2-core CPU runs the whole sweep in a few seconds). Taught in chapter 6.
    """
    fast = checks.flag("fast", fast)
    if not isinstance(device_type, str):
        raise checks.ArgumentTypeError(f"device_type must be a str such as 'cpu' or 'cuda', got "
                                       f"{type(device_type).__name__} {device_type!r}")
    if device_type == "cuda":
        big, sq = 4096, [256, 512, 1024, 2048, 4096, 8192]
    elif fast:
        big, sq = 1024, [32, 128, 256, 512, 1024]
    else:
        big, sq = 2048, [32, 128, 256, 512, 1024, 2048]
    return [(m, big, big) for m in (1, 4, 16, 64)] + [(s, s, s) for s in sq]


@dataclass(frozen=True)
class MatmulTiming:
    """Median and spread of one matmul's time (seconds)."""

    median_s: float
    p10_s: float
    p90_s: float
    repeats: int


def _torch_dtype(dtype: str):
    import torch

    _dtype_bytes(dtype)
    return {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32,
            "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def time_matmul(m: int, n: int, k: int, *, device="cpu", dtype: str = "fp32", repeats: int = 5,
                warmup: int = 2, min_time_s: float = 0.002, seed: int = 0) -> MatmulTiming:
    """Time (m×k)·(k×n) on ``device``: warm-up, then ``repeats`` samples, each long enough to time.

    Each sample runs the matmul ``inner`` times (chosen so a sample lasts ≥ ``min_time_s``) through
    ``labkit.hardware.time_fn`` (CUDA events and one synchronisation per sample on GPU — GPU work is
    asynchronous —, perf_counter on CPU); the per-call time is sample / inner. Taught in chapter 6.
    """
    m, n, k = _dims(m, n, k)                   # every argument checked before torch is imported
    checks.count("repeats", repeats)
    checks.count("warmup", warmup, at_least=0)
    checks.positive("min_time_s", min_time_s)
    checks.count("seed", seed, at_least=0)
    _dtype_bytes(dtype)
    import numpy as np
    import torch

    from labkit.hardware.measure import resolve_device, time_fn

    dev = resolve_device(device)
    g = torch.Generator().manual_seed(seed)
    td = _torch_dtype(dtype)
    a = torch.randn(m, k, generator=g).to(device=dev, dtype=td)
    b = torch.randn(k, n, generator=g).to(device=dev, dtype=td)
    fn = lambda: torch.mm(a, b)
    one = min(time_fn(fn, dev, warmup=max(warmup, 1), repeats=1))
    inner = max(1, min(1000, int(min_time_s / max(one, 1e-7))))
    v = np.asarray(time_fn(fn, dev, warmup=0, repeats=repeats, inner=inner))
    return MatmulTiming(float(np.median(v)), float(np.percentile(v, 10)), float(np.percentile(v, 90)), repeats)


def sweep_matmul(shapes=None, *, device="cpu", dtype: str = "fp32", peak_flops: float,
                 bandwidth: float, repeats: int = 5, fast: bool = False, seed: int = 0):
    """Measure matmuls of several shapes and place each on the roofline of this device.

    Returns a pandas DataFrame: m, n, k, FLOPs, bytes, intensity, measured FLOP/s (median),
    roof (attainable FLOP/s), fraction of roof, bound ("memory"/"compute"). ``peak_flops`` and
    ``bandwidth`` are the device's (``labkit.hardware``: catalogue on a known GPU, else measured).
    Taught in chapter 6.
    """
    import pandas as pd

    peak, bw = checks.positive("peak_flops", peak_flops), checks.positive("bandwidth", bandwidth)
    _dtype_bytes(dtype)
    checks.count("repeats", repeats)
    fast = checks.flag("fast", fast)
    from labkit.hardware.measure import resolve_device

    shapes = default_shapes(fast, resolve_device(device).type) if shapes is None else list(shapes)
    if not shapes:
        raise ValueError("shapes must list at least one (m, n, k)")
    for shp in shapes:            # every shape checked before the first one is timed
        if not isinstance(shp, (tuple, list)) or len(shp) != 3:
            raise ValueError(f"shapes: each shape must be (m, n, k), got {shp!r}")
        _dims(*shp)
    rows = []
    for shp in shapes:
        m, n, k = shp
        t = time_matmul(m, n, k, device=device, dtype=dtype, repeats=repeats, seed=seed)
        fl, by = matmul_flops(m, n, k), matmul_bytes(m, n, k, dtype)
        ai = fl / by
        roof = attainable(ai, peak, bw)
        achieved = fl / t.median_s
        rows.append({"m": m, "n": n, "k": k, "dtype": dtype, "FLOPs": fl, "bytes": by, "intensity": ai,
                     "time_s": t.median_s, "spread": (t.p90_s - t.p10_s) / t.median_s,
                     "FLOP/s": achieved, "roof FLOP/s": roof, "fraction of roof": achieved / roof,
                     "bound": bound(ai, peak, bw)})
    return pd.DataFrame(rows)
