"""Units, defined once: decimal (SI) and binary byte sizes, and FLOP/s prefixes.

Datasheets and nccl-tests use decimal units (1 GB/s = 1e9 B/s, 1 TFLOP/s = 1e12 FLOP/s); memory
tools use binary ones (1 GiB = 2^30 B, what ``nvidia-smi`` calls "MiB"). DeepSpeed's estimators
print GiB values labelled "GB" — a 7 % gap at this size (chapter 13).
"""
from __future__ import annotations

import math

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12            # decimal bytes (datasheets, nccl-tests GB/s)
KIB, MIB, GIB, TIB = 2**10, 2**20, 2**30, 2**40  # binary bytes (allocators, nvidia-smi "MiB")
GIGA, TERA, PETA = 1e9, 1e12, 1e15               # FLOP/s prefixes (TFLOP/s = 1e12 FLOP/s)
MS, US = 1e-3, 1e-6                              # seconds

__all__ = ["KB", "MB", "GB", "TB", "KIB", "MIB", "GIB", "TIB", "GIGA", "TERA", "PETA", "MS", "US", "si"]

_PREFIX = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"), (1e-6, "µ"),
           (1e-9, "n")]


def si(x: float, unit: str = "", digits: int = 3) -> str:
    """Format with an SI prefix: si(3.2e14, "FLOP/s") → '320 TFLOP/s'. Written for chapter 1."""
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return f"{x:g} {unit}".strip()
    for scale, p in _PREFIX:
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g} {p}{unit}".strip()
    return f"{x:.{digits}g} {unit}".strip()
