"""Name the bottleneck of a training run: metrics → logs → topology → strategy.

:func:`diagnose` reads a :class:`~labkit.record.RunRecord` (and, when there is one, a
:class:`~labkit.trace.TraceAnalysis` of the same run) and walks the seed's order: MFU and utilisation
first, then exposed communication, then data loading, memory and scheduling. Each finding belongs to
one of five families — ``compute``, ``communication``, ``memory``, ``data``, ``scheduling`` — and
carries its evidence (the figures and the thresholds they crossed), a severity, and concrete advice
(what to change and what to expect). The *verdict* names the family whose finding puts the most step
time at stake (``score``: the estimated fraction of step time the bottleneck costs), or says
"no clear bottleneck".

Thresholds (:class:`Thresholds`) and why:

- ``mfu_low = 0.30``: tuned dense-transformer training reaches 40–55 % MFU (PaLM 540B 46.2 %,
  Chowdhery et al. 2022, Table 3; Megatron-LM 175B 51.4 %, Korthikanti et al. 2022, Table 5);
  below 30 % a run is untuned. Compute is blamed only when the MFU *of the busy time*
  (MFU ÷ (1 − exposed comm − data wait)) is low too — otherwise the time is lost elsewhere.
- ``comm_exposed = 0.15``: communication not hidden under compute above 15 % of the step is the
  point where overlap, bucketing or a different sharding strategy pays (Ch. 19–21).
- ``data_wait = 0.05`` (medium) / ``0.10`` (high): the loader should be invisible; a few percent is
  normal jitter, above 5 % more workers/prefetch or a faster format pays off directly.
- ``memory_near = 0.90`` of capacity: no room to grow the micro-batch; a memory budget that forced
  activation recomputation or a smaller micro-batch makes memory the root cause of the lost MFU.
- ``host_wait = 0.10`` of the step with short kernels (median < ``tiny_kernel_us = 10`` µs, about
  twice CUDA's ≈ 5 µs launch latency — NVIDIA, "CUDA C++ Best Practices Guide", §"Kernel launch"):
  the device waits for the host → scheduling (CUDA graphs, torch.compile, fewer larger kernels);
  on CPU traces, time between ops in no op at all above ``host_gap = 0.25``.
- ``peer_wait = 0.10``: exposed communication is split into *waiting for a late peer* (every rank
  but the last to arrive at a collective sits in it until the last one comes; :attr:`TraceAnalysis.
  peer_wait_share`) and *moving bytes*. Only the second is a communication problem (its score is
  the transfer share); the wait is load imbalance or jitter — a scheduling finding once it passes a
  tenth of the step, the same bar as a loader wait that should be invisible. A rank that is last
  more often than chance (``labkit.trace``: binomial test) is named as the straggler.

Severity from the score: high ≥ ``severity_high = 0.25``, medium ≥ ``severity_medium = 0.10``, low
otherwise; a finding below ``min_score = 0.05`` is not reported. Recomputation is read off the record
when HFU > MFU × ``recompute_hfu_ratio = 1.02`` (or the config says ``checkpoint``).

The verdict follows the seed's order: waits before math. When a communication, data, memory or
scheduling finding is at least medium, the largest of them is the primary bottleneck even if the
compute finding's score is larger — the MFU of the busy time can only be judged once the waits are
gone, and removing a wait needs no change to the model. Compute is primary when nothing else is.
Ranks waiting for each other with no single late rank (jitter) are the exception: no one change
removes that wait, so it competes on its score like compute.

Taught in chapter 14 (systematic diagnosis) and chapter 2 (the method: metrics first).

Files: :mod:`~labkit.diagnose.verdict` (:class:`Thresholds`, :class:`Finding`, :class:`Diagnosis`),
:mod:`~labkit.diagnose.rules` (one rule per family and :func:`diagnose`), :mod:`~labkit.diagnose.hang`
(:func:`diagnose_hang`: which rank a hung job waits for, from Flight Recorder dumps; chapter 27),
:mod:`~labkit.diagnose.seeded_hangs` (seeded live hangs), and
:mod:`~labkit.diagnose.workloads` (workloads with a bottleneck injected, to check the diagnosis).
"""
from __future__ import annotations

from labkit.diagnose.hang import HangDiagnosis, diagnose_hang
from labkit.diagnose.rules import diagnose
from labkit.diagnose.verdict import FAMILIES, Diagnosis, Finding, Thresholds
from labkit.diagnose.workloads import run_workload, run_workloads, workload

__all__ = ["diagnose_hang", "HangDiagnosis", "diagnose", "Diagnosis", "Finding", "Thresholds", "FAMILIES", "workload", "run_workload",
           "run_workloads"]
