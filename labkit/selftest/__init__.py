"""``labkit selftest --gpu``: every GPU-only path of labkit, run once on a GPU machine, as a recorded report.

The course runs on CPUs (gloo ranks stand in for GPUs), and the CUDA branches — the CUDA-event meter,
NCCL launches, DDP and FSDP2 on GPUs, ``max_memory_allocated`` against the memory model, the measured
peak against the catalogue, the MFU of the ~1B reference model — are tested with fakes. This package
runs them for real, in under 8 minutes on one H200, and writes a report (JSON + Markdown) that can be
committed as evidence of what ran where:

- ``gpu.py`` — the checks (:data:`CHECKS`), each through the real labkit API;
- ``base.py`` — :class:`Check` and its outcomes; ``runner.py`` — :func:`run_checks`: budgets, one
  failure never stopping the others;
- ``backend.py`` — the only code that touches CUDA (:class:`CudaBackend`), thin and replaceable, and
  :class:`RehearsalBackend`, the same checks on CPU gloo ranks;
- ``report.py`` — :func:`write_report`, atomic and never overwriting.

Taught in chapter 4 (MFU), chapter 6 (peak), chapter 7 (timing), chapter 11 (communication), chapter 13
(memory), chapter 19 (DDP) and chapter 20 (FSDP).
"""
from labkit.selftest.backend import PLANS, CudaBackend, HostClockEvent, RehearsalBackend
from labkit.selftest.base import Check, CheckResult, Failed, Skip
from labkit.selftest.gpu import CHECKS, check_by_name
from labkit.selftest.report import default_out_dir, to_markdown, write_report
from labkit.selftest.runner import TOTAL_BUDGET_S, run_checks

__all__ = ["run_checks", "CHECKS", "check_by_name", "Check", "CheckResult", "Skip", "Failed", "TOTAL_BUDGET_S",
           "CudaBackend", "RehearsalBackend", "HostClockEvent", "PLANS", "write_report", "to_markdown",
           "default_out_dir"]
