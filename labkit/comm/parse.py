"""Parsers for the outputs people paste when communication is slow: ``labkit.comm.parse``.

The face of the parsers (the old ``labkit.comm_parse`` is this module); each lives in a file named for
what it reads:

- :mod:`labkit.comm.nccl_tests` — :func:`parse_nccl_tests`: tables of NVIDIA/nccl-tests
  (``all_reduce_perf`` …), old and new formats, out-of-place and in-place columns, ``N/A``, the
  ``# Avg bus bandwidth`` line.
- :mod:`labkit.comm.nccl_log` — :func:`parse_nccl_debug`: ``NCCL_DEBUG=INFO`` logs (version, ranks and
  nodes, channels, rings and trees, transports, ``NCCL_*`` settings in force, warnings).
- :mod:`labkit.comm.topology` — :func:`parse_topology`: ``nvidia-smi topo -m`` (link matrix, CPU / NUMA
  affinity columns, legend).
- :mod:`labkit.comm.pasted` — :func:`strip_prefix` (mpirun / srun prefixes) and :func:`detect_format`.

Every parser keeps the good lines and reports the bad ones (``.errors``: list of (line number, reason,
line)); none raises on garbage. :func:`parse` picks the parser. Taught in chapter 11 (communication
diagnostics) and chapter 23.
"""
from __future__ import annotations

from labkit.comm.nccl_log import NcclDebugInfo, parse_nccl_debug
from labkit.comm.nccl_tests import NcclTestsResult, parse_nccl_tests
from labkit.comm.pasted import detect_format, strip_prefix
from labkit.comm.topology import Topology, parse_topology

__all__ = ["NcclDebugInfo", "NcclTestsResult", "Topology", "detect_format", "parse", "parse_nccl_debug",
           "parse_nccl_tests", "parse_topology", "strip_prefix"]


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
