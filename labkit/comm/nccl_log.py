"""Parser of ``NCCL_DEBUG=INFO`` logs: ``labkit.comm.nccl_log``.

Reads the NCCL version, ranks and nodes, channels, rings and trees, transports (P2P / SHM / NET/IB /
NET/Socket), the ``NCCL_*`` settings in force and the warnings, from any mix of ranks, launcher
prefixes and other output, and keeps one record per NCCL line (``.records``, ``.table()``). Bad lines
are reported (``.errors``), never raised. Taught in chapter 11 (communication diagnostics) and chapter 23.

Line layouts, as NCCL's ``ncclDebugLog`` prints them (NVIDIA/nccl ``src/debug.cc``)::

    host:pid:tid [dev] NCCL INFO msg
    host:pid:tid [dev] file.cc:123 NCCL WARN msg            (older releases)
    host:pid:tid [dev] file.cc:123 (function) NCCL WARN msg (recent releases)
    host:pid:tid [dev] 1234.567890 function:123 NCCL TRACE msg   (debug builds, milliseconds)

and ``NCCL version 2.19.3+cuda12.3`` with no header. NCCL does not print the subsystem of a line
(``NCCL_DEBUG_SUBSYS`` only filters); ``subsystem`` is the message's own ``NET/IB : `` style prefix.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from labkit.checks import MAX_LINE, ArgumentTypeError, long_line
from labkit.comm.pasted import strip_prefix

# "[dev] NCCL LEVEL msg"; the "host:pid:tid " header before it is read by _header(). One pattern searching
# for both backtracked over every run of host-name characters (quadratic: an 80 k-character line took
# 69 s); every pattern here looks at each character a bounded number of times.
# "[dev] [ms] [file:line] [(func)] NCCL LEVEL msg": each optional part is one whitespace-free token
_NCCL_TAIL = re.compile(r"\[(\d{1,6})\]\s+(?:(\d+\.\d+)\s+)?(?:([^\s:]+):(\d{1,9})\s+)?(?:\(([^\s()]*)\)\s+)?"
                        r"NCCL\s+(INFO|WARN|TRACE)\s+(.*)")
_HEADER_FULL_REVERSED = re.compile(r"\s+(\d{1,12}):(\d{1,12}):([\w.\-<>]+)")   # " tid:pid:host" backwards
_SUBSYS = re.compile(r"([A-Za-z][\w/]{0,40}) : ")
_COMM = re.compile(r"\bcomm (0x[0-9a-fA-F]+)")          # the communicator's address
_COMM_ID = re.compile(r"\bcommId (0x[0-9a-fA-F]+)")     # its unique id, the same on every rank
_RANK = re.compile(r"\brank (\d{1,9})\b")
_NRANKS = re.compile(r"\bn[Rr]anks (\d{1,9})\b")
_CHANNELS = re.compile(r"(\d{1,6}) (coll|collnet|nvls|p2p) channels(?! per)")
_CHANNEL_OF = re.compile(r"^(?:Channel|Ring)\s+(\d{1,6})(?:/(\d{1,6}))?")
_INT_COLUMNS = ("line", "pid", "tid", "device", "file_line", "rank", "nranks", "channel", "n_channels")
RECORD_COLUMNS = ["line", "host", "pid", "tid", "device", "level", "file", "file_line", "function", "time_ms",
                  "subsystem", "message", "comm", "comm_id", "rank", "nranks", "channel", "n_channels"]
_VERSION = re.compile(r"\s*NCCL version (\d+\.\d+\.\d+)(?:\+cuda([\d.]+))?")
_ENV = re.compile(r"(NCCL_[A-Z0-9_]+) set by environment to ")
# "Channel 00/02 :  0 1 2 ..." / "Ring 00 : 0 -> 1 -> 2": (?!\d) keeps each number whole, so no run of
# digits can be split between repetitions (the old pattern backtracked exponentially on "0 : 111...1x")
_RING = re.compile(r"(?:Channel|Ring) (\d+)(?:/\d+)?\s*:\s*((?:-?\d+(?!\d)\s*(?:->\s*)?)+)$")


@dataclass
class NcclDebugInfo:
    """What an ``NCCL_DEBUG=INFO`` log says about a run. ``transports`` counts connections by kind
    (``P2P/IPC``, ``P2P/CUMEM``, ``SHM``, ``NET/IB``, ``NET/Socket`` …; ``GDRDMA`` marks GPUDirect RDMA).

    Taught in chapter 11 (communication diagnostics) and chapter 23.
    """

    version: str | None = None
    cuda: str | None = None
    network: str | None = None             # "IB", "Socket", a plugin name
    nranks: int | None = None
    nnodes: int | None = None
    hosts: list = field(default_factory=list)
    n_channels: int | None = None
    rings: list = field(default_factory=list)    # rank orders from "Channel 00/02 :  0 1 2 ..." / "Ring 00 : ..."
    trees: list = field(default_factory=list)    # raw "Trees [0] 1/4/-1->0->-1" specs
    transports: Counter = field(default_factory=Counter)
    env: dict = field(default_factory=dict)      # NCCL_* settings in force
    warnings: list = field(default_factory=list)
    errors: list = field(default_factory=list)   # (line number, reason, line)
    n_lines: int = 0
    rows: list = field(default_factory=list, repr=False)   # one tuple per NCCL line, in RECORD_COLUMNS order

    @property
    def records(self) -> list[dict]:
        """One dict per NCCL line, keys :data:`RECORD_COLUMNS` (made on demand from :attr:`rows`: a
        tuple per line keeps a million-line log in a fifth of the memory)."""
        return [dict(zip(RECORD_COLUMNS, r, strict=True)) for r in self.rows]

    def iter_records(self):
        """The records one at a time (what a streaming writer needs)."""
        return (dict(zip(RECORD_COLUMNS, r, strict=True)) for r in self.rows)

    def table(self) -> pd.DataFrame:
        """The records as a DataFrame (columns :data:`RECORD_COLUMNS`; None where a line does not say).
        ``n_channels`` is the count a line states ("Channel 01/02" → 2; "32 coll channels" → 32)."""
        df = pd.DataFrame(self.rows, columns=RECORD_COLUMNS)
        return df.astype({c: "Int64" for c in _INT_COLUMNS})

    def summary(self) -> str:
        parts = [f"NCCL {self.version or '?'}" + (f" (CUDA {self.cuda})" if self.cuda else "")]
        if self.nranks:
            parts.append(f"{self.nranks} ranks" + (f" on {self.nnodes} nodes" if self.nnodes else ""))
        if self.network:
            parts.append(f"network {self.network}")
        if self.n_channels:
            parts.append(f"{self.n_channels} channels")
        if self.transports:
            parts.append("transports " + ", ".join(f"{k}×{v}" for k, v in self.transports.most_common()))
        if self.env:
            parts.append("settings " + ", ".join(f"{k}={v}" for k, v in sorted(self.env.items())))
        if any(k.startswith("NET/Socket") for k in self.transports) or self.network == "Socket":
            parts.append("inter-node traffic uses TCP sockets (no InfiniBand/RoCE): expect at most the NIC "
                         "line rate, e.g. 25 Gb/s = 3.1 GB/s")
        if self.warnings:
            parts.append(f"{len(self.warnings)} WARN line(s)")
        return "; ".join(parts)


def _transport_kind(via: str) -> str:
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        kind = f"NET/{parts[1]}"
        return kind + ("/GDRDMA" if "GDRDMA" in parts else "")
    if parts[0] == "P2P" and len(parts) > 1:
        return f"P2P/{parts[1].split()[0]}"
    return parts[0]


def parse_nccl_debug(text: str) -> NcclDebugInfo:
    """Parse an ``NCCL_DEBUG=INFO`` log (any mix of ranks, prefixes and other output); never raises.

    Taught in chapter 11 (communication diagnostics) and chapter 23.
    """
    if not isinstance(text, str):
        raise ArgumentTypeError(f"text must be a str (an NCCL_DEBUG=INFO log), got {type(text).__name__}")
    info = NcclDebugInfo()
    hosts, channels_max, ring_seen = set(), 0, set()
    rows = info.rows
    for i, raw in enumerate(text.splitlines(), 1):
        if "NCCL" not in raw:
            continue
        if len(raw) > MAX_LINE:
            info.errors.append((i, long_line(i, raw, "NCCL_DEBUG=INFO log"), raw[:200]))
            continue
        line = strip_prefix(raw)
        m = _NCCL_TAIL.search(line)
        if not m:
            bare = _VERSION.match(line)
            if bare:   # rank 0 prints the version without the host:pid:tid header
                info.version, info.cuda = bare.group(1), bare.group(2)
                info.n_lines += 1
                rows.append(_record(i, None, None, "VERSION", line.strip()))
            elif "NCCL INFO" in line or "NCCL WARN" in line:
                info.errors.append((i, "NCCL line without the 'host:pid:tid [dev]' header", raw))
            continue
        info.n_lines += 1
        head = _header(line, m.start())
        if head:
            hosts.add(head[0])
        msg = m.group(7).strip()
        rec = _record(i, head, m, m.group(6), msg)
        rows.append(rec)
        if m.group(6) == "WARN":
            info.warnings.append(msg)
            continue
        if rec[_NCH] and "channels" in msg:     # "32 coll channels, ..." (init)
            channels_max = max(channels_max, rec[_NCH])
        try:
            _parse_debug_msg(msg, info, ring_seen, i)
            if rec[_CH] is not None:
                channels_max = max(channels_max, rec[_CH] + 1)
                if rec[_NCH] and " via " not in msg:
                    channels_max = max(channels_max, rec[_NCH])
        except (ValueError, IndexError) as e:
            info.errors.append((i, str(e), raw))
    info.hosts = sorted(hosts)
    if info.nnodes is None and len(hosts) > 1:
        info.nnodes = len(hosts)
    info.n_channels = channels_max or None
    return info


def _header(line: str, end: int) -> tuple[str, int, int] | None:
    """(host, pid, tid) of the ``host:pid:tid `` header that ends where ``[dev]`` starts (``end``), else None.

    Matched on the reversed text, anchored at ``end``: each character is looked at once (the forward
    search the old pattern did restarted at every host-name character).
    """
    m = _HEADER_FULL_REVERSED.match(line[end - 1::-1]) if end else None
    return (m.group(3)[::-1], int(m.group(2)[::-1]), int(m.group(1)[::-1])) if m else None


_NCH, _CH = RECORD_COLUMNS.index("n_channels"), RECORD_COLUMNS.index("channel")


def _record(i: int, head, m, level: str, msg: str) -> tuple:
    """One line's record (a tuple in :data:`RECORD_COLUMNS` order): who printed it (header, device),
    where (file:line), and the rank, comm, rank count and channel figures its message states. Each
    pattern runs only when a substring it needs is in the message (most lines have none)."""
    host = pid = tid = device = time_ms = file = file_line = function = None
    if head:
        host, pid, tid = head
    if m is not None:
        device = int(m.group(1))
        t, file, fl, fn = m.group(2), m.group(3), m.group(4), m.group(5)
        time_ms = float(t) if t else None
        file_line = int(fl) if fl else None
        function = fn or (file if t else None)      # TRACE prints func:line
        if t:
            file = None
    sub = _SUBSYS.match(msg) if " : " in msg else None
    comm = comm_id = rank = nranks = channel = n_channels = None
    if "comm " in msg:
        f = _COMM.search(msg)
        comm = f.group(1) if f else None
    if "commId" in msg:
        f = _COMM_ID.search(msg)
        comm_id = f.group(1) if f else None
    if "rank " in msg:
        f = _RANK.search(msg)
        rank = int(f.group(1)) if f else None
    if "anks " in msg:
        f = _NRANKS.search(msg)
        nranks = int(f.group(1)) if f else None
    c = _CHANNEL_OF.match(msg) if msg[:1] in ("C", "R") else None
    if c:
        channel = int(c.group(1))
        if c.group(2) and int(c.group(2)) > 0 and " via " not in msg:
            n_channels = int(c.group(2))
    elif "channels" in msg:
        counts = _CHANNELS.findall(msg)      # "32 coll channels, 16 nvls channels, 32 p2p channels ..."
        if counts:
            n_channels = max(int(n) for n, _ in counts)
    return (i, host, pid, tid, device, level, file, file_line, function, time_ms,
            sub.group(1) if sub else None, msg, comm, comm_id, rank, nranks, channel, n_channels)


_MSG_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)(?:\+cuda([\d.]+))?")
_MSG_NETWORK = re.compile(r"^Using network (\S+)")
_MSG_NRANKS = re.compile(r"\brank \d+ n[Rr]anks (\d+)(?: nNodes (\d+))?")
_MSG_VIA = re.compile(r"\bvia (\S+(?: pointer)?)")
_INT = re.compile(r"-?\d+")
_TREE = re.compile(r"\[\d+\]\s*(\S+)")
MAX_RANKS = 1 << 24        # far past any job (the largest published runs use ~10^5 GPUs)


def _parse_debug_msg(msg: str, info: NcclDebugInfo, ring_seen: set, i: int = 0) -> None:
    if msg.startswith("NCCL version"):
        m = _MSG_VERSION.match(msg)
        if m:
            info.version, info.cuda = m.group(1), m.group(2)
            return
    if msg.startswith("Using network"):
        m = _MSG_NETWORK.match(msg)
        if m:
            info.network = m.group(1)
            return
    if msg.startswith("NCCL_"):
        m = _ENV.match(msg)
        if m:                                   # "NCCL_IB_DISABLE set by environment to 1."
            value = msg[m.end():].rstrip()
            info.env[m.group(1)] = value[:-1] if value.endswith(".") else value
            return
    if "anks " in msg:
        m = _MSG_NRANKS.search(msg)
        if m:
            n = int(m.group(1))
            if not 1 <= n <= MAX_RANKS:
                raise ValueError(f"line {i}: field nRanks={n} is not plausible (a job has 1 to {MAX_RANKS:,} ranks)")
            if m.group(2) is not None:
                nodes = int(m.group(2))
                if not 1 <= nodes <= n:
                    raise ValueError(f"line {i}: field nNodes={nodes} is not plausible for nRanks={n} "
                                     "(use 1 <= nNodes <= nRanks)")
                info.nnodes = nodes
            info.nranks = max(info.nranks or 0, n)
            return
    if "via " in msg:
        m = _MSG_VIA.search(msg)
        if m:
            info.transports[_transport_kind(m.group(1))] += 1
            return
    if msg[:1] in ("C", "R"):
        m = _RING.match(msg)
        if m:
            order = [int(x) for x in _INT.findall(m.group(2))]
            key = (int(m.group(1)), tuple(order))
            if key not in ring_seen:
                ring_seen.add(key)
                info.rings.append(order)
            return
    if msg.startswith("Trees"):
        info.trees.extend(_TREE.findall(msg))
