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
_MPI_PREFIX = re.compile(r".*?\[\d+,\d+\]<std(?:out|err)>:")
_SRUN_PREFIX = re.compile(r"\s*\d+:\s(?=\s*[\w#<])")


def strip_prefix(line: str) -> str:
    """Remove an mpirun ``[1,0]<stdout>:`` (optionally timestamped) or ``srun --label`` prefix. Taught in chapter 11."""
    if ":" not in line:                 # both prefixes end in ":" (the common case: nothing to strip)
        return line
    # the lazy ".*?" walks the whole line when there is no "]<std" in it: look for that first
    m = (_MPI_PREFIX.match(line) if "]<std" in line else None) or _SRUN_PREFIX.match(line)
    return line[m.end():] if m else line


def detect_format(text: str) -> str:
    """Which parser fits: ``"nccl-tests"``, ``"nccl-debug"``, ``"topology"`` or ``"unknown"``. Taught in chapter 11.

    Linear in the length of ``text`` (no pattern here can cross a line it has already read).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if re.search(r"#\s*size\s+count\s+type", text) or "Avg bus bandwidth" in text:
        return "nccl-tests"
    # [ \t]* not \s*: with re.M, \s* at the start of every line ran over all the blank lines below it
    if ("GPU0" in text and re.search(r"^[ \t]*GPU0\s", text, re.M) and re.search(r"\bX\b", text)
            and "NCCL INFO" not in text):
        return "topology"
    if "NCCL INFO" in text or "NCCL WARN" in text:
        return "nccl-debug"
    return "unknown"
