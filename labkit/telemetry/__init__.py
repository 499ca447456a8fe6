"""Device telemetry (nvidia-smi, DCGM) and host topology (NUMA, CPU affinity), parsed.

Why "GPU-Util 100%" is not MFU, and what DCGM's profiling fields (SMACT, SMOCC, TENSO, DRAMA, NVLink
bytes) measure instead, is written out in :mod:`labkit.telemetry.smi`. The code lives in small files;
this package is the public face:

- :mod:`labkit.telemetry.smi` — ``parse_query_gpu``, ``parse_smi_dmon``, ``parse_dcgmi_dmon`` (keep every
  good row, list the bad ones), ``sample`` (nvidia-smi live), ``DCGM_FIELDS``, ``QUERY_FIELDS``.
- :mod:`labkit.telemetry.numa` — ``parse_cpulist``, ``parse_lscpu``, ``cpu_topology`` (this machine's NUMA
  nodes and allowed CPUs), ``affinity_plan`` (a ``numactl`` prefix per GPU from ``nvidia-smi topo -m``).
- :mod:`labkit.telemetry.synthetic` — SYNTHETIC ``synthesize_telemetry`` (a kernel-activity model, no GPU
  here), ``synthesize_topology`` (made by :func:`labkit.comm.topology.synthetic_topology`, the one
  topology generator) and ``build_dataset`` (``datasets/telemetry/``).
- :mod:`labkit.telemetry.busy` — ``tensor_flops_estimate`` (TENSO × dense peak) and ``busy_vs_flops``.

Taught in chapter 12 (``chapters/part2_diagnosis/ch12_telemetry_topology.ipynb``).
"""
from __future__ import annotations

from labkit.telemetry.busy import busy_vs_flops, tensor_flops_estimate
from labkit.telemetry.numa import CpuTopology, affinity_plan, cpu_topology, parse_cpulist, parse_lscpu
from labkit.telemetry.smi import (
    DCGM_FIELDS,
    QUERY_FIELDS,
    DcgmField,
    TelemetryTable,
    parse_dcgmi_dmon,
    parse_query_gpu,
    parse_smi_dmon,
    sample,
)
from labkit.telemetry.synthetic import (
    SCENARIOS,
    SYSTEMS,
    build_dataset,
    synthesize_telemetry,
    synthesize_topology,
)

__all__ = [
    "DCGM_FIELDS", "DcgmField", "TelemetryTable", "parse_query_gpu", "parse_smi_dmon", "parse_dcgmi_dmon",
    "sample", "QUERY_FIELDS", "SCENARIOS", "SYSTEMS", "synthesize_telemetry", "tensor_flops_estimate",
    "parse_cpulist", "parse_lscpu", "CpuTopology", "cpu_topology", "synthesize_topology", "build_dataset",
    "affinity_plan", "busy_vs_flops",
]
