"""Units, defined once: decimal (SI) and binary byte sizes, and FLOP/s prefixes.

Datasheets and nccl-tests use decimal units (1 GB/s = 1e9 B/s, 1 TFLOP/s = 1e12 FLOP/s); memory
tools use binary ones (1 GiB = 2^30 B, what ``nvidia-smi`` calls "MiB"). DeepSpeed's estimators
print GiB values labelled "GB" — a 7 % gap at this size (chapter 13).
"""
from __future__ import annotations

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12            # decimal bytes (datasheets, nccl-tests GB/s)
KIB, MIB, GIB, TIB = 2**10, 2**20, 2**30, 2**40  # binary bytes (allocators, nvidia-smi "MiB")
GIGA, TERA, PETA = 1e9, 1e12, 1e15               # FLOP/s prefixes (TFLOP/s = 1e12 FLOP/s)
MS, US = 1e-3, 1e-6                              # seconds

__all__ = ["KB", "MB", "GB", "TB", "KIB", "MIB", "GIB", "TIB", "GIGA", "TERA", "PETA", "MS", "US"]
