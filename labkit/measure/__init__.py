"""Measuring and comparing: a step meter, asynchronous execution, checked claims, A/B with confidence,
regressions, scaling.

- ``meter`` — a step and phase meter cheap enough to leave on (chapter 7);
- ``streams`` — asynchronous device execution, modelled on a CPU (chapter 7);
- ``claims`` — checked claims: a cell states a direction, checks it, says what it found;
- ``ab`` — A/B with confidence: faster, slower, unchanged — or cannot tell (chapter 11);
- ``regress`` — is a new run slower than its baseline, beyond the noise? (chapter 11);
- ``series`` — a regression monitor over a series of runs and its false-alarm rate (lab 11);
- ``scaling`` — speedup, scaling efficiency and where the missing speedup goes (chapter 5).

``from labkit.measure import <name>`` works for every name in ``__all__``; inside labkit, import the file
(``labkit.measure.<file>``).
"""
from __future__ import annotations

from labkit import _compat

# The face hands each name out from the file that defines it, imported on first use
# (so importing one file of the package never imports the others, nor torch).
_FILES = ('meter', 'streams', 'claims', 'ab', 'regress', 'series', 'scaling')
_NAMES = {
    'ABResult': 'ab',
    'DEFAULT_ROUNDS': 'ab',
    'NO_DIFFERENCE': 'ab',
    'VERDICTS': 'ab',
    'ab_compare': 'ab',
    'ab_train': 'ab',
    'call_order': 'ab',
    'Claim': 'claims',
    'ClaimContradicted': 'claims',
    'METADATA_KEY': 'claims',
    'OPS': 'claims',
    'STATUSES': 'claims',
    'claim': 'claims',
    'judge': 'claims',
    'rejudge': 'claims',
    'stored_claims': 'claims',
    'CudaEventClock': 'meter',
    'Meter': 'meter',
    'PerfCounterClock': 'meter',
    'BaselineStore': 'regress',
    'Verdict': 'regress',
    'compare': 'regress',
    'confidence_text': 'regress',
    'mann_whitney_p': 'regress',
    'record_samples': 'regress',
    'StepParts': 'scaling',
    'amdahl_speedup': 'scaling',
    'decompose': 'scaling',
    'gustafson_speedup': 'scaling',
    'measure_scaling': 'scaling',
    'scaling_table': 'scaling',
    'speedup': 'scaling',
    'step_time': 'scaling',
    'strong_efficiency': 'scaling',
    'throughput_efficiency': 'scaling',
    'weak_efficiency': 'scaling',
    'FIGURES': 'series',
    'MAD_TO_SIGMA': 'series',
    'MEDIAN_SE': 'series',
    'MonitorRates': 'series',
    'NoiseModel': 'series',
    'SeriesMonitor': 'series',
    'SeriesVerdict': 'series',
    'diff_consistency': 'series',
    'mad_consistency': 'series',
    'monitor_rates': 'series',
    'series_figures': 'series',
    'size_monitor': 'series',
    'train_series': 'series',
    'ToyStream': 'streams',
    'async_timing_demo': 'streams',
}
__all__ = [
    'ABResult',
    'BaselineStore',
    'Claim',
    'ClaimContradicted',
    'CudaEventClock',
    'DEFAULT_ROUNDS',
    'FIGURES',
    'MAD_TO_SIGMA',
    'MEDIAN_SE',
    'METADATA_KEY',
    'Meter',
    'MonitorRates',
    'NO_DIFFERENCE',
    'NoiseModel',
    'OPS',
    'PerfCounterClock',
    'STATUSES',
    'SeriesMonitor',
    'SeriesVerdict',
    'StepParts',
    'ToyStream',
    'VERDICTS',
    'Verdict',
    'ab_compare',
    'ab_train',
    'amdahl_speedup',
    'async_timing_demo',
    'call_order',
    'claim',
    'compare',
    'confidence_text',
    'decompose',
    'diff_consistency',
    'gustafson_speedup',
    'judge',
    'mad_consistency',
    'mann_whitney_p',
    'measure_scaling',
    'monitor_rates',
    'record_samples',
    'rejudge',
    'scaling_table',
    'series_figures',
    'size_monitor',
    'speedup',
    'step_time',
    'stored_claims',
    'strong_efficiency',
    'throughput_efficiency',
    'train_series',
    'weak_efficiency',
]
_FALLBACK = None   # the file whose every attribute the face also hands out (its old module path)

__getattr__, __dir__ = _compat.lazy_face(__name__, _NAMES, _FILES, __all__, _FALLBACK)
