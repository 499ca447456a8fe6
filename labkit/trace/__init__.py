"""Profiler traces (torch.profiler / Kineto Chrome traces): read them, break each step down, find who is late.

The face of the trace family; each file is one concept:

- :mod:`labkit.trace.load` — read Chrome traces into flat numpy arrays, one rank per file
  (:func:`load`, :func:`trace_files`);
- :mod:`labkit.trace.fastload` — size and event limits checked while reading, typed decoding of only the
  fields used (msgspec);
- :mod:`labkit.trace.runs` — ``read_ranks``: every rank of a run, read in a process pool, checked to be
  one run;
- :mod:`labkit.trace.summary` — each rank's trace reduced (in a worker pool, one file per worker at a time) to
  what the job-level analyses need: :func:`analyze` and :func:`critical_path` read folders through it, so no
  rank's events reach the parent;
- :mod:`labkit.trace.spill`, :mod:`labkit.trace.jobtables`, :mod:`labkit.trace.ondisk` — the summaries' arrays
  and the job's own tables (ranks × steps, ranks × collectives) kept on disk, read back a rank or a slab at a time
  and, for the result tables, when they are asked for: the analysing process holds of each rank only its
  summary's identity and op tables, not its rows;
- :mod:`labkit.trace.breakdown` — labkit's definitions of compute, exposed/hidden communication,
  memcpy, idle (host wait vs other) and data wait per step window;
- :mod:`labkit.trace.analysis` — :func:`analyze` and its result :class:`TraceAnalysis` (tables,
  summaries, top ops), with :mod:`labkit.trace.stragglers` for who arrives last at each collective;
- :mod:`labkit.trace.hta` — HTA 0.5.0's temporal breakdown and comm/compute overlap in HTA's own
  definitions (a peer check);
- :mod:`labkit.trace.timeline` — :func:`ddp_timeline`: one DDP step of one rank, backward compute and
  each gradient bucket's all-reduce (launch and run) on a timeline;
- :mod:`labkit.trace.pipeline` — :func:`pipeline_bubble`: the idle time per compute time of each
  pipeline rank, measured from a pipelined run's traces, beside (p−1)/(v·m) (chapter 24);
- :mod:`labkit.trace.critical_path` — :func:`critical_path`: each step's cross-rank critical path — the rank
  that set the pace, why (compute, data loader, host, communication), and how long the others waited for it;
- :mod:`labkit.trace.flight` — :func:`read_dumps`: each rank's PyTorch Flight Recorder dump (torch's pickle,
  through an allow-listed Unpickler, or JSON), what :func:`labkit.diagnose.hang.diagnose_hang` reads (chapter 27);
- :mod:`labkit.trace.synthetic` — SYNTHETIC GPU-style traces with known answers
  (:func:`synthesize_traces`, also ``write_traces``).

Interval maths (unions, intersections) is :mod:`labkit.intervals`. ``labkit.trace.load`` is the
function :func:`load`; import the reader file itself with ``from labkit.trace.load import ...``.

Taught in chapter 9 (``chapters/part2_diagnosis/ch09_trace_analytics.ipynb``).
"""
from __future__ import annotations

from labkit.trace.analysis import TraceAnalysis, analyze
from labkit.trace.breakdown import COLUMNS, collective_type
from labkit.trace.critical_path import CriticalPath, StepPath, critical_path
from labkit.trace.flight import FlightDump, FlightEntry, read_dump, read_dumps
from labkit.trace.hta import hta_comm_comp_overlap, hta_summary, hta_temporal_breakdown
from labkit.trace.load import NotATraceError, RankEvents, load, trace_files
from labkit.trace.pipeline import PipelineBubble, pipeline_bubble
from labkit.trace.runs import read_ranks
from labkit.trace.synthetic import SyntheticSpec, synthesize_trace, synthesize_traces
from labkit.trace.timeline import DDPTimeline, ddp_timeline

__all__ = ["load", "analyze", "TraceAnalysis", "trace_files", "hta_temporal_breakdown",
           "hta_comm_comp_overlap", "hta_summary", "read_ranks", "RankEvents", "NotATraceError",
           "COLUMNS", "collective_type", "SyntheticSpec", "synthesize_trace", "synthesize_traces",
           "DDPTimeline", "ddp_timeline", "pipeline_bubble", "PipelineBubble", "critical_path", "CriticalPath",
           "StepPath", "read_dump", "read_dumps", "FlightDump", "FlightEntry"]
