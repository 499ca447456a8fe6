"""``nvidia-smi topo -m``: the parser, nvidia-smi's legend, and the one SYNTHETIC DGX-like matrix.

``labkit.comm.topology``. :func:`parse_topology` reads the link matrix (X, NV#, PIX, PXB, PHB, NODE,
SYS), the CPU / NUMA affinity columns, the legend and the NIC legend; bad rows (and lines longer than
:data:`labkit.checks.MAX_LINE`) go to ``.errors``, it never raises on garbage and runs in linear time.
:func:`synthetic_topology` writes the matrix of a DGX-like node in nvidia-smi's layout (tab separated,
``CPU Affinity`` / ``NUMA Affinity`` / ``GPU NUMA ID`` columns, the legend) — the only topology
generator in labkit: ``labkit.telemetry.synthesize_topology`` and the shipped
``datasets/comm/topo_dgx_h100_like.SYNTHETIC.txt`` and ``datasets/telemetry/topo_*.txt`` are made by it.
Taught in chapter 11 (communication diagnostics), chapter 12 (topology and NUMA affinity) and chapter 23.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from labkit.checks import MAX_LINE, count, long_line, one_of
from labkit.comm.pasted import strip_prefix

_LINK = re.compile(r"^(X|SYS|NODE|PHB|PXB|PIX|NV\d{1,3}|SOC|N/A)$")
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
    legend: dict[str, list[str]] = {}      # joined at the end: += on a growing string is quadratic
    in_legend = False
    for i, raw in enumerate(text.splitlines(), 1):
        if len(raw) > MAX_LINE:
            topo.errors.append((i, long_line(i, raw, "nvidia-smi topo -m"), raw[:200]))
            continue
        if not raw or raw.isspace():
            continue
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
                legend[m.group(1)] = [m.group(2).strip()]
            elif legend:
                legend[next(reversed(legend))].append(s)
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
    topo.legend = {k: " ".join(v) for k, v in legend.items()}
    if not topo.devices:
        topo.errors.append((0, "no header row starting with GPU0 found", ""))
    return topo


# ----------------------------------------------------------------------------------- synthetic matrices
#: nvidia-smi's legend, as ``nvidia-smi topo -m`` prints it under the matrix
TOPO_LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

# A GPU and "its" NIC. On DGX systems each compute NIC sits behind the same PCIe switch as its GPU, and
# nvidia-smi reports that path as PXB (several PCIe bridges of the switch, no host bridge), not PIX:
# - DGX A100: the `nvidia-smi topo -m` in https://github.com/NVIDIA/DCGM/issues/149 ("DGX-A100 320GB",
#   NV12): GPU0/GPU1 - NIC0/NIC1 PXB, every other NIC SYS (same in rapidsai/ucx-py issue #749);
# - DGX H100: https://github.com/bytedance/flux/issues/14 (8x H100 80GB HBM3, NV18, CPU affinity
#   0-55,112-167 / 56-111,168-223, 12 NICs = DGX H100's 8 single-port compute ConnectX-7 + 2 dual-port
#   storage NICs): each GPU PXB to its own NIC. The DGX H100 User Guide (1.2.3 "Network Modules",
#   table 6) pairs each of the 8 compute ports with one GPU.
# OEM HGX H100 servers often print PIX there (NIC on the GPU's own switch port, e.g. the matrix in
# https://github.com/NVIDIA/nccl/issues/1264); "DGX-like" here means PXB.
GPU_NIC_LINK = "PXB"


def synthetic_topology(n_gpus: int = 8, *, nvlinks: int = 18, n_nics: int = 8, sockets: int = 2,
                       cores_per_socket: int = 56, pcie_link: str = "NODE") -> str:
    """``nvidia-smi topo -m`` text of a DGX-like node, SYNTHETIC-labelled (first line).

    Defaults: a DGX H100 — 8 GPUs, every pair ``NV18`` (18 NVLinks through NVSwitch), one NIC per GPU
    behind the GPU's PCIe switch (``PXB``, see :data:`GPU_NIC_LINK`), two sockets of 56 cores with SMT
    (GPUs 0-3 on NUMA node 0). ``nvlinks=0`` gives a PCIe machine: GPU pairs on one socket are
    ``pcie_link`` (``"PIX"``: one switch; ``"NODE"``: different host bridges), across sockets ``SYS``.
    NIC ``i`` sits next to GPU ``i * n_gpus // n_nics``; a GPU reaches the other NICs of its socket
    through ``NODE`` and those of the other socket through ``SYS``. Built from the systems' published
    layouts, not recorded. Taught in chapter 11 (communication diagnostics) and chapter 12.
    """
    n_gpus = count("n_gpus", n_gpus)
    nvlinks = count("nvlinks", nvlinks, at_least=0)
    sockets = count("sockets", sockets)
    n_nics = count("n_nics", n_nics, at_least=0, at_most=n_gpus)
    cores_per_socket = count("cores_per_socket", cores_per_socket)
    pcie_link = one_of("pcie_link", pcie_link, ("PIX", "PXB", "PHB", "NODE"))
    if n_gpus % sockets:
        raise ValueError(f"n_gpus={n_gpus} must be a positive multiple of sockets={sockets}")
    if n_nics and n_gpus % n_nics:
        raise ValueError(f"n_nics={n_nics} must divide n_gpus={n_gpus} (one NIC next to every n_gpus/n_nics-th GPU)")
    per_socket = n_gpus // sockets
    nic_gpu = {f"NIC{i}": i * (n_gpus // n_nics) for i in range(n_nics)}
    devs = [f"GPU{i}" for i in range(n_gpus)] + list(nic_gpu)

    def gpu_of(d: str) -> int:
        return int(d[3:]) if d.startswith("GPU") else nic_gpu[d]

    def code(a: str, b: str) -> str:
        if a == b:
            return " X "
        same_socket = gpu_of(a) // per_socket == gpu_of(b) // per_socket
        if a.startswith("GPU") and b.startswith("GPU"):
            if nvlinks:
                return f"NV{nvlinks}"
            return pcie_link if same_socket else "SYS"
        if gpu_of(a) == gpu_of(b):              # a GPU and its own NIC
            return GPU_NIC_LINK
        return "NODE" if same_socket else "SYS"

    what = ({18: "a DGX-H100-like node", 12: "a DGX-A100-like node"}.get(nvlinks, f"a node with NV{nvlinks} GPU pairs")
            if nvlinks else "a PCIe node without NVLink")
    total = cores_per_socket * sockets
    lines = [f"# SYNTHETIC nvidia-smi topo -m generated by labkit.comm.topology.synthetic_topology(n_gpus={n_gpus}, "
             f"nvlinks={nvlinks}, n_nics={n_nics}, sockets={sockets}, cores_per_socket={cores_per_socket}, "
             f"pcie_link={pcie_link!r}) — {what}, not a recording",
             "\t" + "\t".join(devs) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for a in devs:
        row = [a] + [code(a, b) for b in devs]
        if a.startswith("GPU"):
            s = gpu_of(a) // per_socket
            lo, hi = s * cores_per_socket, (s + 1) * cores_per_socket - 1
            row += [f"{lo}-{hi},{lo + total}-{hi + total}", str(s), "N/A"]
        lines.append("\t".join(row))
    lines += ["", TOPO_LEGEND, "NIC Legend:", ""]
    lines += [f"  NIC{i}: mlx5_{i}" for i in range(n_nics)]
    return "\n".join(lines) + "\n"
