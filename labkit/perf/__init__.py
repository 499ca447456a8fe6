"""Performance modelling: predict what a step of a training layout should take (ARCHITECTURE.md).

- ``steptime.py`` — step time from compute, communication (α–β) and sync, with overlap; compute from
  FLOPs and MFU; the collectives a data-parallel strategy issues per step; terms calibrated on the
  machine itself (compute slowdown at N concurrent ranks, a wrapper's seconds per unit).
- ``layout.py`` — :class:`Layout` (dp/tp/pp/cp/ep, DP strategy, pipeline schedule, micro-batching,
  recompute, dtype) and :class:`Cluster` (nodes × GPUs of a catalogued device, intra- and inter-node
  links), with cited presets (:data:`CLUSTERS`, :func:`cluster`).
- ``predict.py`` — :func:`predict`: a :class:`Prediction` of one step of a layout on a cluster (compute,
  bubble, each collective and how much of it hides, memory per GPU, tokens/s, MFU, assumptions).
- ``calibrate.py`` — :func:`calibrate_achievable`: the achievable fraction solved from one measured or
  published run of the same model family on the same GPU, instead of the assumed 50 %.
- ``planner.py`` — :func:`plan`: every feasible layout ranked by predicted tokens/s, with
  :meth:`Plan.explain`.
- ``exercise.py`` — lab 10's problem per seed (a published model, a global batch, a cluster; never a layout)
  and a layout's round trip through recorded evidence (``layout_dict`` / ``layout_from``);
- ``cost.py`` — what throughput costs: wall-clock, device-hours, energy and money (chapters 1 and 28);
- ``scheduling.py`` — a shared cluster's job queue, seeded: where GPU-hours go besides training (chapter 27);
- ``validate/`` — the model checked against live gloo runs of this machine (layer 3: it launches ranks; its
  own face). ``labkit.perf.cost`` and the others are handed out on first use.

Taught in chapter 5, chapter 1, chapters 19–20, chapter 24 (choosing a layout) and chapters 29–30.
"""
from labkit.perf.calibrate import Calibration, calibrate_achievable
from labkit.perf.layout import CLUSTERS, Cluster, Layout, cluster
from labkit.perf.planner import Plan, plan
from labkit.perf.predict import Prediction, predict, resolve_model
from labkit.perf.steptime import (
    StepParts,
    compute_time,
    concurrency_slowdown,
    data_parallel_comm_s,
    decompose,
    step_time,
    tokens_per_s_at,
    unit_overhead_s,
    wrapper_overhead_s,
)

__all__ = ["step_time", "StepParts", "decompose", "compute_time", "tokens_per_s_at", "data_parallel_comm_s",
           "concurrency_slowdown", "unit_overhead_s", "wrapper_overhead_s",
           "Layout", "Cluster", "CLUSTERS", "cluster", "Prediction", "predict", "resolve_model", "Plan", "plan",
           "Calibration", "calibrate_achievable"]


def __getattr__(name: str):
    """This package's files on first use (``labkit.perf.<file>``), so the face stays cheap."""
    import importlib
    import pkgutil

    if name in {m.name for m in pkgutil.iter_modules(__path__)}:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
