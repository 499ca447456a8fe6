"""Performance modelling: predict what a step of a training layout should take (ARCHITECTURE.md).

- ``steptime.py`` — step time from compute, communication (α–β) and sync, with overlap; compute from
  FLOPs and MFU; the collectives a data-parallel strategy issues per step.

Taught in chapter 5, chapter 1 and chapters 19–20.
"""
from labkit.perf.steptime import (
    StepParts,
    compute_time,
    data_parallel_comm_s,
    decompose,
    step_time,
    tokens_per_s_at,
)

__all__ = ["step_time", "StepParts", "decompose", "compute_time", "tokens_per_s_at", "data_parallel_comm_s"]
