"""Text people paste when communication is slow: launcher prefixes, and which tool printed it.

``labkit.comm.pasted``. Logs copied out of ``mpirun`` / ``srun`` jobs carry a prefix on every line
(``[1,0]<stdout>:``, optionally after a timestamp; ``0: `` from ``srun --label``); every parser in
:mod:`labkit.comm.parse` strips it first. :func:`detect_format` says which parser fits a text.
Taught in chapter 11 (communication diagnostics).
"""
from __future__ import annotations

import re

# mpirun / srun / timestamp prefixes seen in pasted logs: "[1,0]<stdout>:", "Wed Sep  6 17:26:52 2023[1,7]<stdout>:",
# "0: " (srun --label)
_PREFIX = re.compile(r"^(?:.*?\[\d+,\d+\]<std(?:out|err)>:|\s*\d+:\s(?=\s*[\w#<]))")


def strip_prefix(line: str) -> str:
    """Remove an mpirun ``[1,0]<stdout>:`` (optionally timestamped) or ``srun --label`` prefix. Taught in chapter 11."""
    return _PREFIX.sub("", line, count=1)


def detect_format(text: str) -> str:
    """Which parser fits: ``"nccl-tests"``, ``"nccl-debug"``, ``"topology"`` or ``"unknown"``. Taught in chapter 11."""
    if re.search(r"#\s*size\s+count\s+type", text) or "Avg bus bandwidth" in text:
        return "nccl-tests"
    if re.search(r"^\s*GPU0\s+", text, re.M) and re.search(r"\bX\b", text) and "NCCL INFO" not in text:
        return "topology"
    if re.search(r"NCCL (INFO|WARN)", text):
        return "nccl-debug"
    return "unknown"
