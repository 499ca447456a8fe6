"""Accelerator catalogue, safe device-name matching, and live peak measurements.

MFU divides achieved FLOP/s by a *peak*; this package says which peak, and where it came from:

- :mod:`labkit.hardware.catalogue` — :class:`DeviceSpec` (dense peaks per dtype, plus ``fp64_tensor``
  and ``*_sparse`` by name, memory, bandwidth, cited sources; the rows live in
  :mod:`labkit.hardware.datasheets`), :func:`lookup` by exact token sets (never substrings),
  :func:`family` / :func:`lookup_peak` for family names ("A100"), :func:`known_devices`,
  :func:`normalize_dtype`. Torch-free.
- :mod:`labkit.hardware.measure` — :func:`resolve_device`, :func:`time_fn`, the matmul-peak and
  bandwidth measurements.
- :mod:`labkit.hardware.calibration` — :func:`calibrate` (this machine's peaks, stored once with their
  conditions), :func:`capability` (is bf16 fast here?), :func:`best_dtype`.
- :mod:`labkit.hardware.peak` — :func:`resolve_peak` (user value → catalogue → calibration → a peak
  measured in-process; :func:`remeasure_peak` raises a peak measured on a loaded machine).

Taught in chapter 3 (FLOPs) and chapter 4 (MFU and HFU); the ``measure_*`` functions in chapter 6
(roofline), :func:`time_fn` in chapter 7 (timing).
"""
from __future__ import annotations

from labkit.hardware.calibration import Calibration, best_dtype, calibrate, capability
from labkit.hardware.catalogue import (
    CATALOGUE,
    DTYPES,
    PEAK_KEYS,
    DeviceFamily,
    DeviceSpec,
    family,
    known_devices,
    lookup,
    lookup_peak,
    normalize_dtype,
)
from labkit.hardware.measure import (
    PeakMeasurement,
    last_level_cache_bytes,
    measure_matmul_peak,
    measure_memory_bandwidth,
    resolve_device,
    time_fn,
)
from labkit.hardware.peak import remeasure_peak, resolve_bandwidth, resolve_peak
from labkit.units import GB, GIB  # noqa: F401 - old names (labkit.hardware.GB, .GIB); use labkit.units
from labkit.units import TERA as T  # noqa: F401 - old name (labkit.hardware.T); use labkit.units.TERA

__all__ = [
    # catalogue
    "DTYPES", "PEAK_KEYS", "DeviceSpec", "DeviceFamily", "CATALOGUE", "normalize_dtype", "known_devices", "lookup",
    "family", "lookup_peak",
    # measurement and the peak to divide by
    "resolve_device", "time_fn", "PeakMeasurement", "measure_matmul_peak", "measure_memory_bandwidth",
    "last_level_cache_bytes", "resolve_peak", "resolve_bandwidth", "remeasure_peak",
    # calibration and dtype capability
    "Calibration", "calibrate", "capability", "best_dtype",
]
