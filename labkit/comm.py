"""Communication: bandwidth conventions, α–β models, a live benchmark, and parsers.

Taught in chapter 11 (communication diagnostics) and chapter 23 (multi-node scaling); the synthetic
2-node 25 Gb/s Ethernet logs serve chapter 29's case.

The code lives in four small modules; this one is the public face::

    from labkit import comm
    comm.bus_factor("all_reduce", 8)                 # 1.75, nccl-tests' 2(n-1)/n
    comm.busbw("all_reduce", 1 << 30, 0.0061, 8)     # bytes/s
    res = comm.benchmark(["all_reduce"], nprocs=2)   # live, nccl-tests-style table
    fit = comm.fit_alpha_beta(res.table["size"], res.table["time_us"] * 1e-6, "all_reduce", 2)
    comm.parse_nccl_tests(open("all_reduce.log").read()).rows

- :mod:`labkit.comm_models` — ``bus_factor``, ``algbw``, ``busbw``, ``ring_time``, ``tree_time``,
  ``hierarchical_time``, ``fit_alpha_beta`` (sources in its docstring: nccl-tests PERFORMANCE.md,
  Thakur et al. 2005, Patarasuk & Yuan 2009, Sanders et al. 2009).
- :mod:`labkit.comm_bench` — ``benchmark`` through ``labkit.launch`` (gloo on CPU, NCCL on GPUs).
- :mod:`labkit.comm_parse` — ``parse_nccl_tests``, ``parse_nccl_debug``, ``parse_topology``.
- :mod:`labkit.comm_synth` — seeded SYNTHETIC nccl-tests tables, NCCL logs and topologies.

Note for CPU learners: gloo has no native reduce-scatter; ``reduce_scatter_tensor`` runs as an
all_reduce of the full input, so on CPU its measured busbw is understated (``GLOO_REDUCE_SCATTER_NOTE``).
"""
from __future__ import annotations

from labkit.comm_bench import (
    GLOO_REDUCE_SCATTER_NOTE,
    BenchResult,
    bench_rank,
    benchmark,
    default_sizes,
    results_to_table,
)
from labkit.comm_models import (
    OPS,
    AlphaBeta,
    algbw,
    bus_factor,
    busbw,
    canonical_op,
    fit_alpha_beta,
    hierarchical_time,
    ring_steps,
    ring_time,
    tree_time,
)
from labkit.comm_parse import (
    NcclDebugInfo,
    NcclTestsResult,
    Topology,
    detect_format,
    parse_nccl_debug,
    parse_nccl_tests,
    parse_topology,
)
from labkit.comm_synth import FABRICS, Fabric, synthetic_nccl_debug, synthetic_nccl_tests, synthetic_topology


def parse(text: str):
    """Auto-detect and parse nccl-tests output, an NCCL_DEBUG=INFO log or ``nvidia-smi topo -m``.

    Returns ``(kind, result)``. Taught in chapter 11 (communication diagnostics).
    """
    kind = detect_format(text)
    if kind == "nccl-tests":
        return kind, parse_nccl_tests(text)
    if kind == "nccl-debug":
        return kind, parse_nccl_debug(text)
    if kind == "topology":
        return kind, parse_topology(text)
    raise ValueError("text is not nccl-tests output, an NCCL_DEBUG=INFO log or `nvidia-smi topo -m` output "
                     "(no '# size count type' header, no 'NCCL INFO' lines, no 'GPU0 ... X' matrix)")


__all__ = [
    "OPS", "AlphaBeta", "BenchResult", "FABRICS", "Fabric", "GLOO_REDUCE_SCATTER_NOTE", "NcclDebugInfo",
    "NcclTestsResult", "Topology", "algbw", "bench_rank", "benchmark", "bus_factor", "busbw", "canonical_op",
    "default_sizes", "detect_format", "fit_alpha_beta", "hierarchical_time", "parse", "parse_nccl_debug",
    "parse_nccl_tests", "parse_topology", "results_to_table", "ring_steps", "ring_time", "synthetic_nccl_debug",
    "synthetic_nccl_tests", "synthetic_topology", "tree_time",
]
