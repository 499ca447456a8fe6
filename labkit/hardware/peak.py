"""The peak an MFU divides by, and where it came from.

Order (:func:`resolve_peak`): a user value (``"user"``); the datasheet catalogue for a catalogued part
named directly ("H100-SXM"; a family name such as "A100" when all its parts share the peak) or for the present GPU (``"catalogue:<name>"``); this machine's stored
calibration for the device, dtype and thread count (``"calibrated:…"``, :mod:`labkit.hardware.calibration`),
re-calibrated first when the conditions it was measured under changed (torch upgraded, other CPU);
and only when no calibration exists, a live matmul measurement in this process, cached for the rest of
it (``"measured:… (not calibrated: run labkit calibrate)"``) — which swings with the machine's load.

Taught in chapter 4 (MFU and HFU).
"""
from __future__ import annotations

from labkit import checks
from labkit.hardware import calibration
from labkit.hardware.catalogue import family, lookup, normalize_dtype
from labkit.hardware.measure import (
    PeakMeasurement,
    measure_matmul_peak,
    measure_memory_bandwidth,
    resolve_device,
)

__all__ = ["resolve_peak", "resolve_bandwidth", "remeasure_peak"]

# the best live measurement per (device, dtype) in this process: a CPU learner re-resolving the peak
# in every cell pays once; remeasure_peak() may raise it
_MEASURED: dict[tuple[str, str], PeakMeasurement] = {}
NOT_CALIBRATED = " (not calibrated: run `labkit calibrate`)"


def _measured_peak_cached(device: str, dtype: str) -> PeakMeasurement:
    if (device, dtype) not in _MEASURED:
        _MEASURED[(device, dtype)] = measure_matmul_peak(device, dtype, max_seconds=1.0)
    return _MEASURED[(device, dtype)]


def _catalogued_gpu(dev):
    """The catalogue's entry for the GPU ``dev`` is, or None (a CPU, or a GPU the catalogue lacks)."""
    if dev.type != "cuda":
        return None
    import torch

    try:
        return lookup(torch.cuda.get_device_name(dev))
    except ValueError:
        return None


def _fresh_calibration(dev, dtype: str):
    """This machine's stored calibration for ``dev`` and ``dtype`` (None when there is none); one measured
    under other conditions (torch upgraded, other CPU, other threads) is measured again and stored first."""
    cal, fresh = calibration.find(dev, dtype)
    if cal is None or fresh:
        return cal
    try:
        return calibration.calibrate_one(dev, dtype)
    except calibration.UnstableCalibration:     # nothing stored: this process measures (and says so)
        return None


def resolve_peak(device="auto", dtype="bf16", peak_flops: float | None = None) -> tuple[float, str]:
    """The per-device peak FLOP/s to divide by, and its source (see the module docstring).

    A catalogued GPU without a peak for ``dtype`` raises (no silent fallback to another dtype).
    Taught in chapter 4 (MFU and HFU).
    """
    if peak_flops is not None:
        return checks.positive("peak_flops", peak_flops), "user"      # FLOP/s per device
    key = normalize_dtype(dtype)
    if isinstance(device, str) and device != "auto":
        import torch

        try:
            torch.device(device)
        except (RuntimeError, TypeError):      # not a torch device string: a catalogue name or a family
            fam = family(device)
            where = fam.names[0] if len(fam.parts) == 1 else f"{device} = {'|'.join(fam.names)}"
            return fam.peak(key), f"catalogue:{where}"
    dev = resolve_device(device)
    spec = _catalogued_gpu(dev)
    if spec is not None:
        return spec.peak(key), f"catalogue:{spec.name}"
    cal = _fresh_calibration(dev, key)
    if cal is not None:
        return cal.flops, f"calibrated:{cal.describe()}"
    m = _measured_peak_cached(str(dev), key)
    return m.flops, f"measured:{m.describe()}{NOT_CALIBRATED}"


def resolve_bandwidth(device="auto", dtype="fp32") -> tuple[float, str]:
    """The memory bandwidth (bytes/s) a roofline puts beside :func:`resolve_peak`'s roof, and its source.

    Same order as the peak: the datasheet HBM bandwidth of a catalogued GPU (``"catalogue:<name>"``);
    the copy bandwidth stored with this machine's calibration for ``dtype`` and the thread count
    (``"calibrated:…"``), measured in the same sitting as its peak, so the ridge point (peak ÷ bandwidth)
    comes from one set of conditions; else a live copy (``"measured: copy … (not calibrated…)"``).
    Taught in chapter 6 (roofline).
    """
    key = normalize_dtype(dtype)
    dev = resolve_device(device)
    spec = _catalogued_gpu(dev)
    if spec is not None:
        return spec.memory_bw, f"catalogue:{spec.name}"
    cal = _fresh_calibration(dev, key)
    if cal is not None:
        return cal.bandwidth, f"calibrated:copy beside {cal.describe()}"
    return measure_memory_bandwidth(dev), f"measured:copy on {dev}{NOT_CALIBRATED}"


def remeasure_peak(device="auto", dtype="bf16", *, max_seconds: float = 2.0) -> PeakMeasurement:
    """Measure the matmul peak again and keep the better of this and the cached in-process measurement.

    A live peak taken while other work loads the machine comes out low, and a run measured later
    can then show MFU > 100%. The trainer calls this once in that case (only for a ``measured:`` peak);
    the best measurement is what the hardware can do, so it replaces the cached one for the rest of the
    process. Taught in chapter 4 (MFU and HFU).
    """
    dev = resolve_device(device)
    key = normalize_dtype(dtype)
    old = _measured_peak_cached(str(dev), key)
    new = measure_matmul_peak(dev, key, max_seconds=max_seconds)
    best = new if new.flops > old.flops else old
    _MEASURED[(str(dev), key)] = best
    return best
