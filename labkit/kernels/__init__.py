"""Kernels: what one operation costs on a device and why — the roofline, attention's implementations, fusion.

- ``roofline`` — arithmetic intensity and the roofline: memory- or compute-bound (chapter 6);
- ``attention`` — attention implementations, the SDPA backend that ran, their time, memory and FLOPs (chapter 16);
- ``fusion`` — many small ops against one fused op, torch.compile, CUDA graphs (chapter 17).

``from labkit.kernels import <name>`` works for every name in ``__all__``; inside labkit, import the file
(``labkit.kernels.<file>``).
"""
from __future__ import annotations

from labkit import _compat

# The face hands each name out from the file that defines it, imported on first use
# (so importing one file of the package never imports the others, nor torch).
_FILES = ('roofline', 'attention', 'fusion')
_NAMES = {
    'ATTENTIONS': 'attention',
    'AttentionMeasurement': 'attention',
    'BACKENDS': 'attention',
    'attend': 'attention',
    'attention_flops': 'attention',
    'backend_context': 'attention',
    'backend_ran': 'attention',
    'backends': 'attention',
    'measure': 'attention',
    'sweep': 'attention',
    'CompileCost': 'fusion',
    'OpCounts': 'fusion',
    'ab_fusion': 'fusion',
    'ab_optimizer': 'fusion',
    'chain_inputs': 'fusion',
    'compile_cost': 'fusion',
    'compiled_chain': 'fusion',
    'elementwise_chain': 'fusion',
    'fused_chain': 'fusion',
    'fused_constants': 'fusion',
    'graph_step_us': 'fusion',
    'graph_traces': 'fusion',
    'launch_crossover': 'fusion',
    'op_counts': 'fusion',
    'profile_calls': 'fusion',
    'sweep_sizes': 'fusion',
    'DTYPE_BYTES': 'roofline',
    'MatmulTiming': 'roofline',
    'arithmetic_intensity': 'roofline',
    'attainable': 'roofline',
    'bound': 'roofline',
    'default_shapes': 'roofline',
    'matmul_bytes': 'roofline',
    'matmul_flops': 'roofline',
    'ridge_point': 'roofline',
    'sweep_matmul': 'roofline',
    'time_matmul': 'roofline',
}
__all__ = [
    'ATTENTIONS',
    'AttentionMeasurement',
    'BACKENDS',
    'CompileCost',
    'DTYPE_BYTES',
    'MatmulTiming',
    'OpCounts',
    'ab_fusion',
    'ab_optimizer',
    'arithmetic_intensity',
    'attainable',
    'attend',
    'attention_flops',
    'backend_context',
    'backend_ran',
    'backends',
    'bound',
    'chain_inputs',
    'compile_cost',
    'compiled_chain',
    'default_shapes',
    'elementwise_chain',
    'fused_chain',
    'fused_constants',
    'graph_step_us',
    'graph_traces',
    'launch_crossover',
    'matmul_bytes',
    'matmul_flops',
    'measure',
    'op_counts',
    'profile_calls',
    'ridge_point',
    'sweep',
    'sweep_matmul',
    'sweep_sizes',
    'time_matmul',
]
_FALLBACK = None   # the file whose every attribute the face also hands out (its old module path)

__getattr__, __dir__ = _compat.lazy_face(__name__, _NAMES, _FILES, __all__, _FALLBACK)
