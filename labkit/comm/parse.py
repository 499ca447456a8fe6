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
line)); none raises on garbage, and each runs in time linear in its input. :func:`parse` picks the parser
(or takes the one forced) and refuses a text in which it finds nothing. Taught in chapter 11 (communication
diagnostics) and chapter 23.
"""
from __future__ import annotations

from labkit.checks import one_of
from labkit.comm.nccl_log import NcclDebugInfo, parse_nccl_debug
from labkit.comm.nccl_tests import NcclTestsResult, parse_nccl_tests
from labkit.comm.pasted import detect_format, strip_prefix
from labkit.comm.topology import Topology, parse_topology

__all__ = ["FORMATS", "NcclDebugInfo", "NcclTestsResult", "Topology", "detect_format", "parse", "parse_nccl_debug",
           "parse_nccl_tests", "parse_topology", "strip_prefix"]


FORMATS = ("auto", "nccl-tests", "nccl-debug", "topology")


def parse(text: str, format: str = "auto", *, op: str | None = None, source: str = "text"):
    """Parse nccl-tests output, an NCCL_DEBUG=INFO log or ``nvidia-smi topo -m`` (auto-detected, or the
    ``format`` forced: ``"nccl-tests"``, ``"nccl-debug"``, ``"topology"``).

    Returns ``(kind, result)``. Raises ValueError naming ``source`` (a file name, for messages) when the
    text is none of the three, or when the parser finds nothing in it (``no nccl-tests rows found in
    garbage.txt``): a result that holds nothing is never returned. ``op`` names the collective of a
    nccl-tests table that does not say. Taught in chapter 11 (communication diagnostics).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    kind = detect_format(text) if one_of("format", format, FORMATS) == "auto" else format
    if kind == "nccl-tests":
        result, empty = parse_nccl_tests(text, op=op), "no nccl-tests rows found"
        found = not result.rows.empty or result.avg_busbw is not None
    elif kind == "nccl-debug":
        result, empty = parse_nccl_debug(text), "no NCCL INFO/WARN lines with a 'host:pid:tid [dev]' header found"
        found = result.n_lines > 0
    elif kind == "topology":
        result, empty = parse_topology(text), "no nvidia-smi topo -m matrix rows found"
        found = bool(result.links)
    else:
        raise ValueError(f"{source} is not nccl-tests output, an NCCL_DEBUG=INFO log or `nvidia-smi topo -m` "
                         "output (no '# size count type' header, no 'NCCL INFO' lines, no 'GPU0 ... X' matrix)")
    if not found:
        why = f"; first bad line {result.errors[0][0]}: {result.errors[0][1]}" if result.errors else ""
        raise ValueError(f"{empty} in {source} (read as {kind}, {len(result.errors)} bad line(s){why})")
    return kind, result
