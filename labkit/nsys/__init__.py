"""Nsight Systems reports: the ``nsys stats`` CSV summaries, the SQLite timeline, and what they say.

Nsight Systems (nsys) records what the PyTorch profiler does not: every CUDA API call on every CPU
thread, each kernel on each *stream* with its exact GPU start and end, memory copies with their
direction and size, NVTX ranges pushed by ``torch.cuda.nvtx.range_push`` / ``record_function``, OS
runtime calls. The face of the Nsight family; each file is one concept:

- :mod:`labkit.nsys.stats` — ``nsys stats --format csv`` summaries: :func:`parse_stats_csv`,
  :func:`stats_from_timeline`, :func:`to_stats_csv` (:class:`NsysStats`);
- :mod:`labkit.nsys.sqlite` — the ``nsys export --type sqlite`` timeline: :func:`read_sqlite`
  (:class:`NsysTimeline`);
- :mod:`labkit.nsys.analysis` — :func:`analyze` (GPU busy share, idle gaps and the CPU call behind
  each, launch latency, NCCL overlap, NVTX ranges projected onto the GPU) and :func:`kernel_class`;
- :mod:`labkit.nsys.plot` — :func:`plot_timeline`, the nsys GUI's rows in matplotlib;
- :mod:`labkit.nsys.live` — :func:`record` runs nsys on :func:`demo_training` (GPU machines);
- :mod:`labkit.nsys.synthetic` — :func:`synthesize_report`, a seeded, SYNTHETIC report in the same
  schema for the CPU path of the course, and :func:`build_dataset` (``datasets/nsys/``).

Chapter 7's model of asynchronous streams (``ToyStream``, ``async_timing_demo``) moved to
:mod:`labkit.measure.streams`; ``labkit.nsys.ToyStream`` and ``labkit.nsys.async_timing_demo`` keep working,
with a DeprecationWarning, until labkit 0.3.

Taught in chapter 10 (``chapters/part2_diagnosis/ch10_nsight_nvtx.ipynb``). Commands::

    nsys profile -t cuda,nvtx,osrt --capture-range=cudaProfilerApi -o step python train.py
    nsys export --type sqlite step.nsys-rep
    nsys stats --report nvtx_sum,cuda_api_sum,cuda_gpu_kern_sum --format csv step.nsys-rep
"""
from __future__ import annotations

from labkit.nsys.analysis import NsysAnalysis, analyze, kernel_class
from labkit.nsys.live import demo_training, record
from labkit.nsys.plot import plot_timeline
from labkit.nsys.sqlite import MEMCPY_KINDS, NVTX_PUSHPOP, NVTX_STARTEND, NsysTimeline, read_sqlite
from labkit.nsys.stats import NsysStats, parse_stats_csv, stats_from_timeline, to_stats_csv
from labkit.nsys.synthetic import DATASETS, build_dataset, synthesize_report

__all__ = [
    "NsysStats", "NsysTimeline", "NsysAnalysis", "parse_stats_csv", "read_sqlite", "stats_from_timeline",
    "to_stats_csv", "analyze", "kernel_class", "plot_timeline", "synthesize_report", "MEMCPY_KINDS",
    "NVTX_PUSHPOP", "NVTX_STARTEND", "DATASETS", "build_dataset", "demo_training", "record",
]

# chapter 7's stream model lived here until 0.2: the old names keep working for one release
_MOVED_TO_STREAMS = ("ToyStream", "async_timing_demo")


def __getattr__(name: str):
    if name in _MOVED_TO_STREAMS:
        import warnings

        import labkit.measure.streams

        warnings.warn(f"labkit.nsys.{name} moved to labkit.measure.streams.{name}; the old name is removed in "
                      "labkit 0.3", DeprecationWarning, stacklevel=2)
        return getattr(labkit.measure.streams, name)
    raise AttributeError(f"module 'labkit.nsys' has no attribute {name!r}")
