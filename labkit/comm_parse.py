"""Parsers for the outputs people paste when communication is slow.

- :func:`parse_nccl_tests` — tables of NVIDIA/nccl-tests (``all_reduce_perf`` …), old format
  (``size count type redop time algbw busbw error``) and new (``… redop root time algbw busbw #wrong``),
  out-of-place and in-place columns, ``[1,0]<stdout>:`` prefixes from mpirun, ``N/A``, the
  ``# Avg bus bandwidth`` line.
- :func:`parse_nccl_debug` — ``NCCL_DEBUG=INFO`` logs: version, ranks and nodes, channels, rings and
  trees, transports (P2P / SHM / NET/IB / NET/Socket), ``NCCL_*`` settings in force, warnings.
- :func:`parse_topology` — ``nvidia-smi topo -m``: the link matrix (X, NV#, PIX, PXB, PHB, NODE, SYS),
  CPU / NUMA affinity columns and the legend.

Every parser keeps the good lines and reports the bad ones (``.errors``: list of (line number, reason,
line)); none raises on garbage. Taught in chapter 11 (communication diagnostics) and chapter 23.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

# mpirun / srun / timestamp prefixes seen in pasted logs: "[1,0]<stdout>:", "Wed Sep  6 17:26:52 2023[1,7]<stdout>:",
# "0: " (srun --label)
_PREFIX = re.compile(r"^(?:.*?\[\d+,\d+\]<std(?:out|err)>:|\s*\d+:\s(?=\s*[\w#<]))")
_NUM = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")
_DTYPES = {"float", "half", "double", "int8", "uint8", "int32", "uint32", "int64", "uint64", "bfloat16",
           "fp8_e4m3", "fp8_e5m2", "f8e4m3", "f8e5m2", "float32", "float16", "int", "char", "bf16"}


def strip_prefix(line: str) -> str:
    """Remove an mpirun ``[1,0]<stdout>:`` (optionally timestamped) or ``srun --label`` prefix. Taught in chapter 11."""
    return _PREFIX.sub("", line, count=1)


def _num(tok: str):
    if tok in ("N/A", "n/a", "-"):
        return None
    if not _NUM.match(tok):
        raise ValueError(f"{tok!r} is not a number")
    return float(tok)


# ----------------------------------------------------------------------------------- nccl-tests
@dataclass
class NcclTestsResult:
    """Parsed nccl-tests output. ``rows``: one per size with out-of-place (``oop_*``) and in-place
    (``ip_*``) time (us), algbw and busbw (GB/s = 1e9 B/s), wrong counts (None = N/A).

    Taught in chapter 11 (communication diagnostics).
    """

    rows: pd.DataFrame
    avg_busbw: float | None = None          # GB/s, from "# Avg bus bandwidth"
    errors: list = field(default_factory=list)   # (line number, reason, line)
    op: str | None = None
    nranks: int | None = None
    params: dict = field(default_factory=dict)   # nThread, nGpus, minBytes, ... from the header
    devices: list = field(default_factory=list)  # "Rank N ... on host device d [bus] NAME" lines
    out_of_bounds: str | None = None
    format: str | None = None                  # "new" (root, #wrong) or "old" (error)

    def implied_bus_factor(self) -> pd.Series:
        """busbw/algbw per row (out-of-place): compare with :func:`labkit.comm.bus_factor`."""
        return self.rows["oop_busbw"] / self.rows["oop_algbw"]

    def summary(self) -> str:
        if self.rows.empty:
            return f"nccl-tests: no rows parsed ({len(self.errors)} bad lines)"
        big = self.rows.iloc[-1]
        s = (f"nccl-tests {self.op or '?'} on {self.nranks or '?'} ranks: {len(self.rows)} sizes "
             f"{int(self.rows['size'].min())}..{int(self.rows['size'].max())} B; largest: busbw "
             f"{big['oop_busbw']:.2f} GB/s")
        if self.avg_busbw is not None:
            s += f"; Avg bus bandwidth {self.avg_busbw:.2f} GB/s"
        if self.errors:
            s += f"; {len(self.errors)} bad line(s) skipped"
        return s


_COLS = ["size", "count", "type", "redop", "root", "oop_time_us", "oop_algbw", "oop_busbw", "oop_wrong",
         "ip_time_us", "ip_algbw", "ip_busbw", "ip_wrong"]
_LEADS = {5: ["size", "count", "type", "redop", "root"],   # new format (nccl-tests >= 2.10)
          4: ["size", "count", "type", "redop"],           # old format, reductions
          3: ["size", "count", "type"]}                    # old format, all_gather / broadcast
_RANK_TAG = re.compile(r"^\[\d+\]\s+")                     # "[0] " tags (mpirun --tag-output, pdsh ...)


def _lead_from_count(n: int) -> list[str]:
    for lead in (5, 4, 3):
        if n in (lead + 8, lead + 4):
            return _LEADS[lead]
    raise ValueError(f"{n} fields do not match any nccl-tests row layout (7, 8, 9, 11, 12 or 13 fields)")


def _parse_row(toks: list[str], lead: list[str]) -> dict:
    """One data row: the lead columns (size count type [redop] [root]) then 4 columns per placement."""
    nlead = len(lead)
    if len(toks) not in (nlead + 4, nlead + 8):
        raise ValueError(f"expected {nlead + 8} fields ({' '.join(lead)} + 2x time algbw busbw wrong), "
                         f"got {len(toks)}")
    size, count = toks[0], toks[1]
    if not (size.isdigit() and count.isdigit()):
        raise ValueError("size and count must be integers")
    if toks[2] not in _DTYPES and not re.match(r"^[a-z][a-z0-9_]*$", toks[2]):
        raise ValueError(f"unknown type {toks[2]!r}")
    row = {"size": int(size), "count": int(count), "type": toks[2], "redop": None, "root": None}
    if "redop" in lead:
        if not re.match(r"^[a-z][a-z0-9_]*$", toks[3]):
            raise ValueError(f"redop {toks[3]!r} is not a reduction name")
        row["redop"] = toks[3]
    if "root" in lead:
        if not re.match(r"^-?\d+$", toks[4]):
            raise ValueError(f"root {toks[4]!r} is not an integer")
        row["root"] = int(toks[4])
    rest = toks[nlead:]
    for prefix, chunk in (("oop", rest[:4]), ("ip", rest[4:8])):
        if not chunk:
            for k in ("time_us", "algbw", "busbw", "wrong"):
                row[f"{prefix}_{k}"] = None
            continue
        t, a, b = (_num(x) for x in chunk[:3])
        if any(v is not None and v < 0 for v in (t, a, b)):
            raise ValueError("negative time or bandwidth")
        w = _num(chunk[3])
        row.update({f"{prefix}_time_us": t, f"{prefix}_algbw": a, f"{prefix}_busbw": b, f"{prefix}_wrong": w})
    return row


def parse_nccl_tests(text: str, *, op: str | None = None) -> NcclTestsResult:
    """Parse nccl-tests output (any op, old or new format); never raises on bad lines.

    The column layout is read from the ``# size count type ...`` header when there is one, else
    inferred from the number of fields. ``op`` names the test when the text does not (it is detected
    from ``*_perf`` command lines). Taught in chapter 11 (communication diagnostics).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    from labkit.comm_models import canonical_op

    rows, errors, devices, params = [], [], [], {}
    lead, fmt, avg, oob, found_op = None, None, None, None, None
    if op is not None:
        found_op = canonical_op(op)
    for i, raw in enumerate(text.splitlines(), 1):
        line = _RANK_TAG.sub("", strip_prefix(raw)).rstrip()
        s = line.strip()
        if not s:
            continue
        m = re.search(r"\b([a-z_]+)_perf\b", s)
        if m and found_op is None:
            try:
                found_op = canonical_op(m.group(1))
            except ValueError:
                pass
        if s.startswith("#"):
            body = s.lstrip("#").strip()
            if re.match(r"^size\s+count\s+type", body):
                cols = body.split()
                lead = cols[:cols.index("time")] if "time" in cols else None
                fmt = "new" if "root" in cols else "old"
            elif body.startswith("Avg bus bandwidth"):
                m2 = re.search(r":\s*([0-9.eE+-]+)", body)
                try:
                    avg = float(m2.group(1)) if m2 else None
                except ValueError:
                    errors.append((i, "unreadable Avg bus bandwidth", raw))
            elif body.startswith("Out of bounds values"):
                oob = body.split(":", 1)[-1].strip()
            elif body.startswith("nThread"):
                toks = body.split()
                for k, v in zip(toks[0::2], toks[1::2], strict=False):
                    params[k.rstrip(":")] = v
            elif re.match(r"^Rank\s+\d+", body):
                devices.append(body)
            continue
        if not s[0].isdigit():
            continue  # NCCL INFO lines, shell prompts, ... are not ours
        toks = s.split()
        try:
            use = lead if lead and len(toks) in (len(lead) + 4, len(lead) + 8) else _lead_from_count(len(toks))
            rows.append(_parse_row(toks, use))
        except (ValueError, IndexError) as e:
            errors.append((i, str(e), raw))
    df = pd.DataFrame(rows, columns=_COLS)
    ranks = {re.match(r"^Rank\s+(\d+)", d).group(1) for d in devices}
    return NcclTestsResult(rows=df, avg_busbw=avg, errors=errors, op=found_op, nranks=len(ranks) or None,
                           params=params, devices=devices, out_of_bounds=oob, format=fmt)


# ----------------------------------------------------------------------------------- NCCL_DEBUG=INFO
_NCCL_LINE = re.compile(
    r"(?:(?P<host>[\w.\-<>]+):(?P<pid>\d+):(?P<tid>\d+)\s+)?\[(?P<dev>\d+)\]\s+NCCL\s+(?P<level>INFO|WARN|TRACE)\s+(?P<msg>.*)")


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
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    info = NcclDebugInfo()
    hosts, channels_max, ring_seen = set(), 0, set()
    for i, raw in enumerate(text.splitlines(), 1):
        line = strip_prefix(raw)
        m = _NCCL_LINE.search(line)
        bare = re.match(r"^\s*NCCL version (\d+\.\d+\.\d+)(?:\+cuda([\d.]+))?", line)
        if bare and not m:   # rank 0 prints the version without the host:pid:tid header
            info.version, info.cuda = bare.group(1), bare.group(2)
            info.n_lines += 1
            continue
        if not m:
            if "NCCL INFO" in line or "NCCL WARN" in line:
                info.errors.append((i, "NCCL line without the 'host:pid:tid [dev]' header", raw))
            continue
        info.n_lines += 1
        if m.group("host"):
            hosts.add(m.group("host"))
        msg = m.group("msg").strip()
        if m.group("level") == "WARN":
            info.warnings.append(msg)
            continue
        try:
            _parse_debug_msg(msg, info, ring_seen)
            c = re.match(r"^(?:Channel|Ring)\s+(\d+)(?:/(\d+))?", msg)
            if c:
                channels_max = max(channels_max, int(c.group(1)) + 1)
                if c.group(2) and int(c.group(2)) > 0 and " via " not in msg:
                    channels_max = max(channels_max, int(c.group(2)))
        except (ValueError, IndexError) as e:
            info.errors.append((i, str(e), raw))
    info.hosts = sorted(hosts)
    if info.nnodes is None and len(hosts) > 1:
        info.nnodes = len(hosts)
    info.n_channels = channels_max or None
    return info


def _parse_debug_msg(msg: str, info: NcclDebugInfo, ring_seen: set) -> None:
    m = re.match(r"^NCCL version (\d+\.\d+\.\d+)(?:\+cuda([\d.]+))?", msg)
    if m:
        info.version, info.cuda = m.group(1), m.group(2)
        return
    m = re.match(r"^Using network (\S+)", msg)
    if m:
        info.network = m.group(1)
        return
    m = re.match(r"^(NCCL_[A-Z0-9_]+) set by environment to (.*?)\.?\s*$", msg)
    if m:
        info.env[m.group(1)] = m.group(2)
        return
    m = re.search(r"\brank \d+ n[Rr]anks (\d+)(?: nNodes (\d+))?", msg)
    if m:
        info.nranks = max(info.nranks or 0, int(m.group(1)))
        if m.group(2):
            info.nnodes = int(m.group(2))
        return
    m = re.search(r"\bvia (\S+(?: pointer)?)", msg)
    if m:
        info.transports[_transport_kind(m.group(1))] += 1
        return
    m = re.match(r"^(?:Channel|Ring) (\d+)(?:/\d+)?\s*:\s*((?:-?\d+\s*(?:->\s*)?)+)$", msg)
    if m:
        order = [int(x) for x in re.findall(r"-?\d+", m.group(2))]
        key = (int(m.group(1)), tuple(order))
        if key not in ring_seen:
            ring_seen.add(key)
            info.rings.append(order)
        return
    if msg.startswith("Trees"):
        info.trees.extend(re.findall(r"\[\d+\]\s*(\S+)", msg))


# ----------------------------------------------------------------------------------- nvidia-smi topo -m
_LINK = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV\d+|SOC|N/A)$")
_AFFINITY_COLS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


@dataclass
class Topology:
    """``nvidia-smi topo -m`` as data: ``links[a][b]`` is the code between devices a and b
    (``NV12`` = 12 bonded NVLinks; ``PIX`` < ``PXB`` < ``PHB`` < ``NODE`` < ``SYS`` = ever farther PCIe
    paths, SYS crossing the inter-socket link). Taught in chapter 11 and chapter 23.
    """

    devices: list = field(default_factory=list)
    links: dict = field(default_factory=dict)
    cpu_affinity: dict = field(default_factory=dict)
    numa_affinity: dict = field(default_factory=dict)
    legend: dict = field(default_factory=dict)
    nic_names: dict = field(default_factory=dict)     # "NIC0" -> "mlx5_0"
    errors: list = field(default_factory=list)

    @property
    def gpus(self) -> list:
        return [d for d in self.devices if d.startswith("GPU")]

    def link(self, a: str, b: str) -> str:
        try:
            return self.links[a][b]
        except KeyError:
            raise ValueError(f"no link {a!r}–{b!r}; devices are {self.devices}") from None

    def nvlinks(self, a: str, b: str) -> int:
        """Number of bonded NVLinks between two GPUs (0 when the path is PCIe / SMP)."""
        code = self.link(a, b)
        return int(code[2:]) if code.startswith("NV") else 0

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.links).T.reindex(index=list(self.links), columns=self.devices)

    def summary(self) -> str:
        g = self.gpus
        codes = Counter(self.links[a][b] for a in g for b in g if a != b and a in self.links and b in self.links[a])
        parts = [f"{len(g)} GPUs, {len(self.devices) - len(g)} other devices"]
        if codes:
            parts.append("GPU pairs: " + ", ".join(f"{k}×{v // 2 if v > 1 else v}" for k, v in codes.most_common()))
        numa = sorted(set(self.numa_affinity.values()))
        if len(numa) > 1:
            parts.append(f"{len(numa)} NUMA nodes ({', '.join(numa)})")
        if any(c == "SYS" for c in codes):
            parts.append("some GPU pairs cross the CPU socket link (SYS): slow P2P")
        return "; ".join(parts)


def parse_topology(text: str) -> Topology:
    """Parse ``nvidia-smi topo -m`` output; never raises on bad rows (they go to ``.errors``).

    Taught in chapter 11 (communication diagnostics) and chapter 23.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    topo = Topology()
    extra: list[str] = []
    in_legend = False
    for i, raw in enumerate(text.splitlines(), 1):
        line = strip_prefix(raw).rstrip()
        s = line.strip()
        if not s:
            continue
        if s.startswith("Legend") or s.startswith("NIC Legend"):
            in_legend = True
            continue
        m = re.match(r"^(NIC\d+)\s*:\s*(\S+)$", s)
        if m:
            topo.nic_names[m.group(1)] = m.group(2)
            continue
        if in_legend:
            m = re.match(r"^(\S+)\s*=\s*(.+)$", s)
            if m:
                topo.legend[m.group(1)] = m.group(2).strip()
            elif topo.legend:
                last = list(topo.legend)[-1]
                topo.legend[last] += " " + s
            continue
        toks = s.split()
        if not topo.devices:
            if toks and re.match(r"^GPU\d+$", toks[0]) and len(toks) > 1 and not _LINK.match(toks[1]):
                names = []
                for t in toks:
                    if t in ("CPU", "NUMA", "GPU") or t in ("Affinity", "ID"):
                        break
                    names.append(t)
                topo.devices = names
                extra = [c for c in _AFFINITY_COLS if c in s]
            continue
        name = toks[0]
        nd = len(topo.devices)
        codes = toks[1:1 + nd]
        if len(codes) != nd or not all(_LINK.match(c) for c in codes):
            topo.errors.append((i, f"row {name!r}: expected {nd} link codes", raw))
            continue
        topo.links[name] = dict(zip(topo.devices, codes, strict=True))
        rest = toks[1 + nd:]
        vals = dict(zip(extra, rest, strict=False))
        if "CPU Affinity" in vals:
            topo.cpu_affinity[name] = vals["CPU Affinity"]
        if "NUMA Affinity" in vals:
            topo.numa_affinity[name] = vals["NUMA Affinity"]
    if not topo.devices:
        topo.errors.append((0, "no header row starting with GPU0 found", ""))
    return topo


def detect_format(text: str) -> str:
    """Which parser fits: ``"nccl-tests"``, ``"nccl-debug"``, ``"topology"`` or ``"unknown"``. Taught in chapter 11."""
    if re.search(r"#\s*size\s+count\s+type", text) or "Avg bus bandwidth" in text:
        return "nccl-tests"
    if re.search(r"^\s*GPU0\s+", text, re.M) and re.search(r"\bX\b", text) and "NCCL INFO" not in text:
        return "topology"
    if re.search(r"NCCL (INFO|WARN)", text):
        return "nccl-debug"
    return "unknown"
