"""Training: one config, one loop, parallelism applied from outside the model.

- :class:`TrainConfig` (``config.py``) — what a run is, validated;
- :func:`parallelize` (``parallel.py``) — the one place DDP / FSDP2 / FSDP1 / checkpointing / compile
  are applied, and with tp/pp > 1 the device mesh (:func:`mesh_shape`, :func:`layout`), tensor
  parallelism (``tensor_parallel.py``) and pipeline stages and schedules (``pipeline.py``, chapter 24);
- :func:`train` (``loop.py``) — the one training loop, one rank;
- ``inject.py`` — bottleneck injections (chapters 2, 9, 14), ``report.py`` — the run record;
- ``accum.py`` — does accumulation give the whole batch's gradient? measured (chapter 15);
- ``adaptive.py`` — the adaptive-accumulation controller and its safeguards, called between steps (chapter 25);
- ``optim.py`` — AdamW for-loop / foreach / fused (``optimizer_impl``), ``graphs.py`` — ``cuda_graphs`` (chapter 17);
- ``precision.py`` — formats, the loss-scaling rule and per-layer gradient statistics (chapter 18);
  ``batch.py`` — tokens and sequences per step, accumulation steps per rank (chapter 15, torch-free);
  ``ring_attention.py`` — attention of one sequence split over a context-parallel group (chapter 26);
  ``option_checks.py`` — the checks of the later chapters' options, called by :class:`TrainConfig`;
- :func:`run` / :func:`run_many` (``launch.py``) — the loop on N ranks through :func:`labkit.launch`.

Taught in chapter 4, chapter 14, chapter 15, chapter 19, chapter 20, chapter 24 and chapter 25.
"""
from labkit.train.config import (
           BACKWARD_PREFETCH,
           DTYPES,
           INJECTIONS,
           PARALLEL,
           PP_SCHEDULES,
           SHARDING,
           TrainConfig,
)
from labkit.train.launch import run, run_many
from labkit.train.loop import build_model, forward_backward, train
from labkit.train.parallel import layout, mesh_shape, parallelize, sync_context, world
from labkit.train.report import peak_memory

__all__ = ["TrainConfig", "train", "run", "run_many", "build_model", "forward_backward", "parallelize",
           "sync_context", "world", "peak_memory", "PARALLEL", "DTYPES", "INJECTIONS", "SHARDING",
           "BACKWARD_PREFETCH", "PP_SCHEDULES", "mesh_shape", "layout"]


def __getattr__(name: str):
    """This package's files on first use (``labkit.train.<file>``), so the face stays cheap."""
    import importlib
    import pkgutil

    if name in {m.name for m in pkgutil.iter_modules(__path__)}:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
