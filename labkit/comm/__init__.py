"""Communication: bandwidth conventions, α–β models, a live benchmark, parsers and topologies.

Taught in chapter 11 (communication diagnostics) and chapter 23 (multi-node scaling); the synthetic
2-node 25 Gb/s Ethernet logs serve chapter 29's case.

The code lives in small files; this package is the public face::

    from labkit import comm
    comm.bus_factor("all_reduce", 8)                 # 1.75, nccl-tests' 2(n-1)/n
    comm.busbw("all_reduce", 1 << 30, 0.0061, 8)     # bytes/s
    res = comm.benchmark(["all_reduce"], nprocs=2)   # live, nccl-tests-style table
    fit = comm.fit_alpha_beta(res.table["size"], res.table["time_us"] * 1e-6, "all_reduce", 2)
    comm.parse_nccl_tests(open("all_reduce.log").read()).rows

- :mod:`labkit.comm.models` — ``bus_factor`` (every nccl-tests op, ``NCCL_TESTS`` maps the binaries),
  ``link_factor`` (ring vs NVLS all-reduce), ``bytes_of`` (count × nccl-tests type), ``algbw``, ``busbw``, ``ring_time``, ``tree_time``,
  ``hierarchical_time``, ``fit_alpha_beta`` (sources in its docstring: nccl-tests PERFORMANCE.md,
  Thakur et al. 2005, Patarasuk & Yuan 2009, Sanders et al. 2009). Pure (layer 1).
- :mod:`labkit.comm.bench` — ``benchmark`` through ``labkit.launch`` (gloo on CPU, NCCL on GPUs).
- :mod:`labkit.comm.parse` — the parsers' face: ``parse_nccl_tests`` (:mod:`labkit.comm.nccl_tests`),
  ``parse_nccl_debug`` (:mod:`labkit.comm.nccl_log`), ``parse_topology`` (:mod:`labkit.comm.topology`),
  ``detect_format`` and ``strip_prefix`` (:mod:`labkit.comm.pasted`), and ``parse`` that picks one.
- :mod:`labkit.comm.topology` — ``nvidia-smi topo -m``: ``parse_topology``, ``TOPO_LEGEND`` and
  ``synthetic_topology``, the one SYNTHETIC DGX-like matrix (also behind ``labkit.telemetry``).
- :mod:`labkit.comm.ring` — ``ring_all_reduce``, a naive ring all-reduce of send/recv steps to read
  (not for use), and ``run_ring``, which runs it on gloo ranks against ``dist.all_reduce`` with a log of
  every step (``labkit.teaching.viz.ring_allreduce`` draws it).
- :mod:`labkit.comm.synthetic` — seeded SYNTHETIC nccl-tests tables and NCCL logs.
- :mod:`labkit.comm.exercise` — lab 9's exercise per seed: a SYNTHETIC cluster with one limiting link and its
  ``all_reduce_perf`` table, a published model, a held-out size; ``heldout_tolerance`` (the run's own noise).
- :mod:`labkit.comm.compression` — ``hook_bytes`` / ``hook_elements``: what DDP's fp16 / bf16 / PowerSGD hooks
  all-reduce per step (pure; chapter 23).
- :mod:`labkit.comm.buckets` — DDP's gradient buckets from the parameter sizes by torch's rule (``ddp_caps``,
  ``assign_buckets``, ``ddp_buckets``) and what the bucket size does to a step (``bucket_schedule``,
  ``cap_sweep``; α–β). Pure (layer 1); chapter 19.
- :mod:`labkit.comm.bucket_sweep` — ``measure_buckets``: DDP runs on live ranks, buckets counted by torch's log,
  the traces and the rule (``bucket_probe``, ``allreduces_per_step``); chapter 19.
- :mod:`labkit.comm.env` — ``check_env``: what each NCCL / EFA environment variable of a job really does
  (exists, who reads it, default, Debugging-only, verdict, documentation), ``SOURCE_TEMPLATE`` (chapter 23).

``comm.parse`` is the auto-detecting *function*; the module of that name is ``labkit.comm_parse`` (or
``from labkit.comm.parse import ...``).

Note for CPU learners: gloo has no native reduce-scatter; ``reduce_scatter_tensor`` runs as an
all_reduce of the full input, so on CPU its measured busbw is understated (``GLOO_REDUCE_SCATTER_NOTE``).
"""
from __future__ import annotations

from labkit.comm.bench import (
    GLOO_REDUCE_SCATTER_NOTE,
    BenchResult,
    bench_rank,
    benchmark,
    default_sizes,
    results_to_table,
)
from labkit.comm.bucket_sweep import allreduces_per_step, bucket_probe, measure_buckets
from labkit.comm.buckets import BucketPlan, assign_buckets, bucket_schedule, cap_sweep, ddp_buckets, ddp_caps
from labkit.comm.compression import hook_bytes, hook_elements, param_shapes
from labkit.comm.env import SOURCE_TEMPLATE, EnvFinding, check_env
from labkit.comm.models import (
    ALL_OPS,
    DTYPE_BYTES,
    NCCL_TESTS,
    OPS,
    AlphaBeta,
    algbw,
    bus_factor,
    busbw,
    bytes_of,
    canonical_op,
    fit_alpha_beta,
    hierarchical_time,
    link_factor,
    ring_steps,
    ring_time,
    tree_time,
)
from labkit.comm.nccl_log import NcclDebugInfo, parse_nccl_debug
from labkit.comm.nccl_tests import NcclTestsResult, parse_nccl_tests
from labkit.comm.parse import parse  # the function (it shadows the submodule name on this package)
from labkit.comm.pasted import detect_format, strip_prefix
from labkit.comm.ring import RingDemo, ring_all_reduce, run_ring
from labkit.comm.synthetic import FABRICS, Fabric, fabric, synthetic_nccl_debug, synthetic_nccl_tests
from labkit.comm.topology import TOPO_LEGEND, Topology, parse_topology, synthetic_topology

__all__ = [
    "ALL_OPS", "DTYPE_BYTES", "NCCL_TESTS", "bytes_of", "link_factor", "OPS", "AlphaBeta", "BenchResult", "FABRICS", "Fabric", "GLOO_REDUCE_SCATTER_NOTE", "NcclDebugInfo",
    "NcclTestsResult", "RingDemo", "ring_all_reduce", "run_ring", "TOPO_LEGEND", "Topology", "algbw", "bench_rank", "benchmark", "bus_factor", "busbw",
    "canonical_op", "default_sizes", "detect_format", "fabric", "fit_alpha_beta", "hierarchical_time", "parse",
    "parse_nccl_debug", "parse_nccl_tests", "parse_topology", "results_to_table", "ring_steps", "ring_time",
    "strip_prefix", "synthetic_nccl_debug", "SOURCE_TEMPLATE", "EnvFinding", "check_env",
    "hook_bytes", "hook_elements", "param_shapes", "synthetic_nccl_tests", "synthetic_topology", "tree_time",
    "BucketPlan", "assign_buckets", "bucket_schedule", "cap_sweep", "ddp_buckets", "ddp_caps",
    "allreduces_per_step", "bucket_probe", "measure_buckets",
]
