"""Tuning by measurement: sweeps of training knobs through the one loop, and what an accumulated step costs.

- ``sweep`` — grid sweeps of knobs, the largest micro-batch that fits (chapter 15);
- ``accumulation`` — collectives per accumulated step; one large micro-batch against several accumulated ones (chapter 15).

``from labkit.tuning import <name>`` works for every name in ``__all__``; inside labkit, import the file
(``labkit.tuning.<file>``).
"""
from __future__ import annotations

from labkit import _compat

# The face hands each name out from the file that defines it, imported on first use
# (so importing one file of the package never imports the others, nor torch).
_FILES = ('sweep', 'accumulation')
_NAMES = {
    'ab_gemms': 'accumulation',
    'ab_micro_batch': 'accumulation',
    'accumulation_collectives': 'accumulation',
    'collectives_per_step': 'accumulation',
    'step_gemm_shapes': 'accumulation',
    'MicroBatchSearch': 'sweep',
    'SweepResult': 'sweep',
    'find_micro_batch': 'sweep',
    'fit_link': 'sweep',
    'fixed_batch_pairs': 'sweep',
    'largest_micro_batch': 'sweep',
    'predicted_bytes': 'sweep',
    'recommend': 'sweep',
    'search_largest': 'sweep',
    'sweep': 'sweep',
}
__all__ = [
    'MicroBatchSearch',
    'SweepResult',
    'ab_gemms',
    'ab_micro_batch',
    'accumulation_collectives',
    'collectives_per_step',
    'find_micro_batch',
    'fit_link',
    'fixed_batch_pairs',
    'largest_micro_batch',
    'predicted_bytes',
    'recommend',
    'search_largest',
    'step_gemm_shapes',
    'sweep',
]
_FALLBACK = None   # the file whose every attribute the face also hands out (its old module path)

__getattr__, __dir__ = _compat.lazy_face(__name__, _NAMES, _FILES, __all__, _FALLBACK)
