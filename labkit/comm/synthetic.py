"""Seeded generators of SYNTHETIC nccl-tests tables and NCCL_DEBUG=INFO logs: ``labkit.comm.synthetic``.

There is no GPU on the course machines, so the recorded artefacts in ``datasets/comm/`` are generated
here from the α–β models of :mod:`labkit.comm.models` with labelled parameters, plus seeded
log-normal noise, and every file says SYNTHETIC in its first line. They have the layout of the real
tools' output (nccl-tests ``common.cu`` print format, NCCL's ``host:pid:tid [dev] NCCL INFO`` lines),
so the same parsers read real and synthetic files. The ``nvidia-smi topo -m`` matrix comes from
:func:`labkit.comm.topology.synthetic_topology` (re-exported here, as ``TOPO_LEGEND`` is).

Taught in chapter 11 (communication diagnostics), chapter 23 and chapter 29 (case: 2 nodes over
25 Gb/s Ethernet).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from labkit import checks
from labkit.comm.models import bus_factor, canonical_op, hierarchical_time, ring_time
from labkit.comm.topology import TOPO_LEGEND, synthetic_topology

__all__ = ["FABRICS", "Fabric", "TOPO_LEGEND", "ethernet_fabric", "fabric", "synthetic_nccl_debug", "synthetic_nccl_tests",
           "synthetic_topology"]


@dataclass(frozen=True)
class Fabric:
    """Labelled link parameters of a synthetic cluster (per rank: latency α per step, bandwidth).

    Taught in chapter 11 and chapter 23 (two-level fabrics)."""

    name: str
    gpu: str
    nodes: int
    gpus_per_node: int
    intra_alpha_s: float
    intra_bw: float          # bytes/s per rank (bus bandwidth a bandwidth-bound ring reaches)
    inter_alpha_s: float = 0.0
    inter_bw: float = 0.0    # bytes/s of the slowest inter-node link in a flat ring
    network: str = "IB"      # "IB" or "Socket"
    intra_transport: str = "P2P/CUMEM"
    model: str = "flat"      # "flat": NCCL's flat rings (slowest link bounds busbw); "hierarchical"

    @property
    def nranks(self) -> int:
        return self.nodes * self.gpus_per_node

    def time(self, op: str, size: float) -> float:
        n = self.nranks
        if self.nodes == 1:
            return ring_time(op, size, n, alpha=self.intra_alpha_s, beta=1 / self.intra_bw)
        if self.model == "hierarchical":
            return hierarchical_time(op, size, n, alpha=self.intra_alpha_s, beta=1 / self.intra_bw,
                                     ranks_per_node=self.gpus_per_node, alpha_inter=self.inter_alpha_s,
                                     beta_inter=self.gpus_per_node / self.inter_bw)
        # flat ring across nodes: every step waits for its slowest hop, the network one
        return ring_time(op, size, n, alpha=max(self.intra_alpha_s, self.inter_alpha_s),
                         beta=1 / min(self.intra_bw, self.inter_bw))

    def describe(self) -> str:
        s = (f"{self.name}: {self.nodes} node(s) x {self.gpus_per_node} {self.gpu}; intra-node alpha "
             f"{self.intra_alpha_s * 1e6:.1f} us/step, bw {self.intra_bw / 1e9:.1f} GB/s ({self.intra_transport})")
        if self.nodes > 1:
            s += (f"; inter-node alpha {self.inter_alpha_s * 1e6:.1f} us/step, bw {self.inter_bw / 1e9:.2f} GB/s "
                  f"(NET/{self.network}); {self.model} ring model")
        return s


# Labelled parameter sets. The numbers are assumptions stated here, chosen to match public figures:
# H100 SXM NVLink4 = 900 GB/s bidirectional per GPU -> ~450 GB/s per direction; nccl-tests all_reduce busbw
# on DGX H100 is typically ~360-480 GB/s. 25 Gb/s Ethernet = 3.125 GB/s line rate, ~93% usable over TCP.
# The PCIe node's 22 GB/s is PCIe Gen4 x16 (~25 GB/s) at ~88% efficiency.
FABRICS = {
    "h100-nvlink-node": Fabric("h100-nvlink-node", "NVIDIA H100 80GB HBM3", 1, 8,
                               intra_alpha_s=1.8e-6, intra_bw=370e9),
    "pcie-2node-25gbe": Fabric("pcie-2node-25gbe", "NVIDIA A10", 2, 8,
                               intra_alpha_s=3.0e-6, intra_bw=22e9, inter_alpha_s=25e-6,
                               inter_bw=0.93 * 25e9 / 8, network="Socket", intra_transport="P2P/IPC/read"),
    "pcie-node": Fabric("pcie-node", "NVIDIA A10", 1, 8, intra_alpha_s=3.0e-6, intra_bw=22e9,
                        intra_transport="P2P/IPC/read"),
}


def fabric(name: str) -> Fabric:
    """A labelled synthetic fabric from :data:`FABRICS`. Taught in chapter 11."""
    if name not in FABRICS:
        raise ValueError(f"fabric={name!r} unknown; valid: {', '.join(FABRICS)}")
    return FABRICS[name]


def ethernet_fabric(gbit_s: float, *, nodes: int = 2, gpus_per_node: int = 8, gpu: str = "NVIDIA A100-SXM4-80GB",
                    tcp_share: float = 0.93, intra_gb_s: float = 230.0) -> Fabric:
    """``nodes`` nodes of ``gpus_per_node`` GPUs joined by ONE ``gbit_s`` Ethernet port each, reaching
    ``tcp_share`` of its line rate (gbit_s / 8 GB/s) over NCCL's NET/Socket, ``intra_gb_s`` busbw inside a
    node (NVLink on an A100 board; an assumption): the labelled parameters of a SYNTHETIC nccl-tests table
    or NCCL log, named in its first line. Taught in chapter 29 (the 13B case's 25 Gb/s link)."""
    gbit_s = checks.positive("gbit_s", gbit_s)
    nodes = checks.count("nodes", nodes)
    tcp_share = checks.fraction("tcp_share", tcp_share, open_low=True)
    return Fabric(f"{gpus_per_node}gpu-{nodes}node-{gbit_s:g}gbe", gpu, nodes, checks.count("gpus_per_node", gpus_per_node),
                  intra_alpha_s=5e-6, intra_bw=checks.positive("intra_gb_s", intra_gb_s) * 1e9, inter_alpha_s=25e-6,
                  inter_bw=tcp_share * gbit_s / 8 * 1e9, network="Socket", intra_transport="P2P/CUMEM")


def synthetic_nccl_tests(fab: Fabric | str = "h100-nvlink-node", op: str = "all_reduce", *, min_bytes: int = 8,
                         max_bytes: int = 8 * 2**30, factor: int = 2, noise: float = 0.03, seed: int = 0,
                         prefix: str = "") -> str:
    """nccl-tests-format text (new format: root and #wrong columns) generated from an α–β model.

    SYNTHETIC: the first line says so and names the parameters. Taught in chapter 11.
    """
    fab = fabric(fab) if isinstance(fab, str) else fab
    op = canonical_op(op)
    min_bytes = checks.count("min_bytes", min_bytes)
    max_bytes = checks.count("max_bytes", max_bytes, at_least=min_bytes)
    factor = checks.count("factor", factor, at_least=2)
    noise = checks.nonneg("noise", noise)
    rng = np.random.default_rng(seed)
    n = fab.nranks
    sizes = []
    s = min_bytes
    while s <= max_bytes:
        sizes.append(int(s))
        s *= factor
    exe = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
           "reduce_scatter": "reduce_scatter_perf", "broadcast": "broadcast_perf", "reduce": "reduce_perf",
           "all_to_all": "alltoall_perf", "send_recv": "sendrecv_perf"}[op]
    redop = "sum" if op in ("all_reduce", "reduce_scatter", "reduce") else "none"
    root = 0 if op in ("broadcast", "reduce") else -1
    out = [f"# SYNTHETIC nccl-tests output generated by labkit.comm.synthetic.synthetic_nccl_tests(seed={seed}, "
           f"noise={noise}) — {fab.describe()}",
           f"# mpirun -np {n} {exe} -b {min_bytes} -e {max_bytes} -f {factor} -g 1",
           f"# nThread 1 nGpus 1 minBytes {min_bytes} maxBytes {max_bytes} step: {factor}(factor) warmup iters: 5 "
           "iters: 20 agg iters: 1 validation: 1 graph: 0", "#", "# Using devices"]
    for r in range(n):
        node, local = divmod(r, fab.gpus_per_node)
        out.append(f"#  Rank {r:2d} Group  0 Pid {4100 + r:6d} on     node{node:02d} device {local:2d} "
                   f"[0000:{0x18 + 0x10 * local:02x}:00] {fab.gpu}")
    out += ["#",
            "#                                                              out-of-place                       in-place          ",
            "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       "]
    busbws = []
    for size in sizes:
        count = size // 4
        if count < (n if op in ("all_gather", "reduce_scatter", "all_to_all") else 1):
            continue
        cols = []
        for _ in range(2):
            t = fab.time(op, size) * float(rng.lognormal(0.0, noise))
            t = max(t, 1e-6)
            a = size / t / 1e9
            b = a * bus_factor(op, n)
            busbws.append(b)
            tu = f"{t * 1e6:8.2f}" if t * 1e6 < 10000 else f"{t * 1e6:8.0f}"
            cols.append(f"{tu} {a:7.2f} {b:7.2f} {0:6d}")
        out.append(f"{size:12d}  {count:12d}  {'float':>8}  {redop:>6}  {root:6d}  " + "  ".join(cols))
    out += ["# Out of bounds values : 0 OK", f"# Avg bus bandwidth    : {np.mean(busbws):.4g} ", "#"]
    return "\n".join(prefix + line for line in out) + "\n"


def synthetic_nccl_debug(fab: Fabric | str = "pcie-2node-25gbe", *, seed: int = 0, n_channels: int = 2,
                         version: str = "2.21.5", cuda: str = "12.4", env: dict | None = None) -> str:
    """An ``NCCL_DEBUG=INFO`` init log for ``fab`` (rings, trees, transports), SYNTHETIC-labelled.

    Taught in chapter 11 and chapter 29.
    """
    fab = fabric(fab) if isinstance(fab, str) else fab
    n_channels = checks.count("n_channels", n_channels)
    rng = np.random.default_rng(seed)
    n, g = fab.nranks, fab.gpus_per_node
    env = dict(env if env is not None else (
        {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "1"} if fab.network == "Socket" else
        {"NCCL_IB_HCA": "mlx5"}))
    pids = [int(rng.integers(20000, 90000)) for _ in range(n)]
    lines = [f"# SYNTHETIC NCCL_DEBUG=INFO log generated by labkit.comm.synthetic.synthetic_nccl_debug(seed={seed}) — "
             f"{fab.describe()}"]

    def L(r, msg, level="INFO"):
        node, local = divmod(r, g)
        lines.append(f"node{node:02d}:{pids[r]}:{pids[r] + 91} [{local}] NCCL {level} {msg}")

    L(0, f"NCCL version {version}+cuda{cuda}")
    for r in range(n):
        for k, v in env.items():
            L(r, f"{k} set by environment to {v}")
        L(r, "NET/Plugin : No plugin found (libnccl-net.so), using internal implementation")
        if fab.network == "Socket":
            L(r, f"NET/Socket : Using [0]eth0:10.0.0.{1 + r // g}<0>")
        L(r, f"Using network {fab.network}")
        L(r, f"comm 0x{0x55d0a0000000 + 0x1000 * r:x} rank {r} nRanks {n} nNodes {fab.nodes} localRanks {g} "
             f"localRank {r % g} MNNVL 0")
    ring = list(range(n))
    for c in range(n_channels):
        L(0, f"Channel {c:02d}/{n_channels:02d} :    " + "   ".join(str(x) for x in ring))
    for r in range(n):
        node, local = divmod(r, g)
        up = -1 if local == 0 else r - 1
        down = r + 1 if local < g - 1 else -1
        other = (r + g) % n if local == 0 and fab.nodes > 1 else -1
        L(r, "Trees " + " ".join(f"[{c}] {down}/{other}/-1->{r}->{up}" for c in range(n_channels)))
    net = f"NET/{fab.network}/0" + ("/GDRDMA" if fab.network == "IB" else "")
    for c in range(n_channels):
        for r in range(n):
            nxt = (r + 1) % n
            if nxt // g != r // g:
                L(r, f"Channel {c:02d}/0 : {r}[{r % g}] -> {nxt}[{nxt % g}] [send] via {net}")
                L(nxt, f"Channel {c:02d}/0 : {r}[{r % g}] -> {nxt}[{nxt % g}] [receive] via {net}")
            else:
                L(r, f"Channel {c:02d} : {r}[{r % g}] -> {nxt}[{nxt % g}] via {fab.intra_transport}")
    for r in range(n):
        L(r, "Connected all rings")
        L(r, "Connected all trees")
        L(r, f"comm 0x{0x55d0a0000000 + 0x1000 * r:x} rank {r} nranks {n} cudaDev {r % g} nvmlDev {r % g} - "
             "Init COMPLETE")
    return "\n".join(lines) + "\n"
