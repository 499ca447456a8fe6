"""HTA's temporal breakdown and comm/compute overlap, re-implemented in HTA's own definitions.

Holistic Trace Analysis (HTA, https://github.com/facebookresearch/HolisticTraceAnalysis, v0.5.0) is
the reference tool for these two figures; labkit reproduces them so chapter 9 can compare its own
breakdown with the figure a practitioner would get from HTA, without pandas per-event overhead.
The definitions below are read off HTA 0.5.0's source:

- Trace parsing (``hta/common/trace_parser.py``): events need ``dur`` and ``cat``; ``cat == "Trace"``
  is dropped; ``stream``/``correlation`` come from ``args`` (default -1); when ``ts`` is a float
  (nanosecond-resolution traces) times are rounded: ``ts = ceil(ts)``, ``end = floor(ts + dur)``.
- Filtering (``hta/common/trace.py: _filter_irrelevant_gpu_kernels``): with ≥ 2 ``ProfilerStep``
  names, GPU kernels (``stream >= 0 and correlation >= 0``) are kept only when a CPU event with the
  same correlation starts before the *last* ``ProfilerStep`` — so the last step is excluded.
- Kernel type (``hta/utils/utils.py: get_kernel_type``): communication if the name matches
  ``^nccl.*Kernel``; memory if ``^Memcpy|^Memset|^dma``; computation if it does not match
  ``(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)``; otherwise "other".
- Temporal breakdown (``hta/analyzers/breakdown_analysis.py: get_temporal_breakdown``): over all
  rows with ``stream != -1``, kernel_time = end of the last merged interval − start of the first;
  idle = kernel_time − merged busy time; compute = merged computation kernels; non-compute = the rest.
- Overlap (``hta/analyzers/communication_analysis.py: get_comm_comp_overlap``): time where merged
  communication and merged computation kernels run together ÷ merged communication time.

Note the difference from labkit's own breakdown (:mod:`labkit.trace.breakdown`): HTA has no step windows,
no exposed/hidden split, and only the ``nccl…Kernel`` names (not ``rccl``).

Taught in chapter 9 (profiler traces; peer check against HTA).
"""
from __future__ import annotations

import math
import re

import numpy as np

import labkit.intervals as iv
from labkit.trace.load import RankEvents
from labkit.trace.runs import read_ranks

HTA_VERSION = "0.5.0"
_COMM = re.compile(r"^nccl.*Kernel")
_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NON_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")


def _kernel_type(name: str) -> str:
    if _COMM.match(name):
        return "communication"
    if _MEMORY.match(name):
        return "memory"
    if not _NON_COMPUTE.match(name):
        return "computation"
    return "other"


def _hta_rows(ev: RankEvents):
    """Times (rounded as HTA does) and the mask of rows HTA's breakdown uses."""
    ts, end = ev.ts, ev.ts + ev.dur
    if ev.ts_is_float:
        ts, end = np.ceil(ts), np.floor(end)
    gpu = (ev.stream >= 0) & (ev.corr >= 0)
    cpu = ~gpu
    step_names = [i for i, n in enumerate(ev.names) if "ProfilerStep" in n]
    rows = ev.stream != -1
    if len(step_names) >= 2:
        is_step = cpu & np.isin(ev.name_id, step_names)
        last_start = ts[is_step].max()
        cpu_keep = cpu & (ts < last_start)
        launched = np.unique(ev.corr[cpu_keep])
        rows = (gpu & np.isin(ev.corr, launched)) | (cpu_keep & (ev.stream != -1))
    return ts, end, rows


def _types(ev: RankEvents) -> np.ndarray:
    kinds = np.array([_kernel_type(n) for n in ev.names] or [""], dtype=object)
    return kinds[ev.name_id]


def temporal_breakdown_rank(ev: RankEvents) -> dict:
    """HTA's temporal breakdown of one rank: idle/compute/non-compute µs and percentages.

    Taught in chapter 9.
    """
    ts, end, rows = _hta_rows(ev)
    if not rows.any():
        raise ValueError(f"trace file {ev.path} has no GPU kernels: HTA's temporal breakdown needs a GPU "
                         "trace (use labkit.trace.analyze for CPU traces)")
    busy = iv.union(ts[rows], end[rows])
    kernel_time = float(busy[1][-1] - busy[0][0])
    idle = kernel_time - iv.total(busy)
    kinds = _types(ev)
    comp_rows = rows & (kinds == "computation")
    compute = iv.total(iv.union(ts[comp_rows], end[comp_rows]))
    non_compute = kernel_time - compute - idle
    pct = lambda x: round(100 * x / kernel_time, 2)
    return {"rank": ev.rank, "idle_time(us)": idle, "compute_time(us)": compute,
            "non_compute_time(us)": non_compute, "kernel_time(us)": kernel_time,
            "idle_time_pctg": pct(idle), "compute_time_pctg": pct(compute),
            "non_compute_time_pctg": pct(non_compute)}


def comm_comp_overlap_rank(ev: RankEvents) -> dict:
    """HTA's communication/computation overlap of one rank, in percent (NaN without communication).

    Taught in chapter 9.
    """
    ts, end, rows = _hta_rows(ev)
    kinds = _types(ev)
    comp = rows & (kinds == "computation")
    comm = rows & (kinds == "communication")
    comp_iv = iv.union(ts[comp], end[comp])
    comm_iv = iv.union(ts[comm], end[comm])
    comm_total = iv.total(comm_iv)
    ratio = iv.intersect_total(comm_iv, comp_iv) / comm_total if comm_total else math.nan
    return {"rank": ev.rank, "comp_comm_overlap_pctg": round(100 * ratio, 2) if ratio == ratio else math.nan}


def hta_temporal_breakdown(path, **read):
    """HTA-definition temporal breakdown for every rank under ``path`` (DataFrame, one row per rank).
    ``read``: the limits and workers of :func:`labkit.trace.runs.read_ranks`.

    Taught in chapter 9.
    """
    import pandas as pd

    return pd.DataFrame([temporal_breakdown_rank(ev) for ev in read_ranks(path, **read)])


def hta_comm_comp_overlap(path, **read):
    """HTA-definition comm/compute overlap (percent) for every rank under ``path``.

    Taught in chapter 9.
    """
    import pandas as pd

    return pd.DataFrame([comm_comp_overlap_rank(ev) for ev in read_ranks(path, **read)])


def hta_summary(path, **read):
    """Both HTA figures per rank from one read of the trace(s): the temporal breakdown columns and
    ``comp_comm_overlap_pctg``.

    Taught in chapter 9.
    """
    import pandas as pd

    return pd.DataFrame([{**temporal_breakdown_rank(ev), **comm_comp_overlap_rank(ev)} for ev in read_ranks(path, **read)])
