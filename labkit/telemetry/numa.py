"""Host topology: NUMA nodes, the CPUs this process may use, and which CPUs each GPU's rank should use.

``labkit.telemetry.numa``. :func:`cpu_topology` reads this machine's NUMA nodes and allowed CPUs
(``/sys/devices/system/node``, ``os.sched_getaffinity``, ``lscpu``); :func:`affinity_plan` turns a
parsed ``nvidia-smi topo -m`` (:func:`labkit.comm.topology.parse_topology`) into a ``numactl`` prefix
per GPU. Taught in chapter 12 (``chapters/part2_diagnosis/ch12_telemetry_topology.ipynb``). Commands::

    nvidia-smi topo -m ; lscpu ; numactl --hardware
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from labkit.checks import MAX_LINE, long_line

#: most CPU ids a cpulist may name (Linux's NR_CPUS is at most 8192 on common kernels)
MAX_CPUS = 1 << 16


def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` (Linux cpulist format, /sys and lscpu) -> ``[0, 1, 2, 3, 8, 10, 11]``.
    Taught in chapter 12."""
    if not isinstance(text, str):
        raise TypeError(f"parse_cpulist: text must be str, got {type(text).__name__}")
    if len(text) > MAX_LINE:
        raise ValueError(f"parse_cpulist: the cpulist is {len(text):,} characters long, longer than any real "
                         f"one (at most {MAX_LINE:,} are read); is this the right file?")
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d{1,6})(?:-(\d{1,6}))?", part)
        if not m:
            raise ValueError(f"parse_cpulist: {part[:40]!r} in {text[:80]!r} is not 'N' or 'N-M' "
                             f"(CPU ids of at most 6 digits)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"parse_cpulist: range {part!r} runs backwards")
        if hi >= MAX_CPUS:
            raise ValueError(f"parse_cpulist: CPU id {hi} in {part!r} is not valid: use ids below {MAX_CPUS}")
        if len(out) + hi - lo + 1 > MAX_CPUS:
            raise ValueError(f"parse_cpulist: {text[:80]!r} names more than {MAX_CPUS} CPUs in all")
        out.extend(range(lo, hi + 1))
    return out


def parse_lscpu(text: str) -> dict[str, str]:
    """``lscpu`` output as a dict (``"Model name"``, ``"Socket(s)"``, ``"NUMA node0 CPU(s)"``...).
    Lines without a colon are ignored; a line longer than :data:`labkit.checks.MAX_LINE` raises
    ValueError (no lscpu prints one). Taught in chapter 12."""
    if not isinstance(text, str):
        raise TypeError(f"parse_lscpu: text must be str, got {type(text).__name__}")
    out = {}
    for i, ln in enumerate(text.splitlines(), 1):
        too_long = long_line(i, ln, "lscpu")
        if too_long:
            raise ValueError(f"parse_lscpu: {too_long}")
        if ":" in ln:
            k, v = ln.split(":", 1)
            out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class CpuTopology:
    """This host's CPUs: ``numa`` maps node -> CPU ids; ``allowed`` the CPUs this process may use.
    Taught in chapter 12."""

    model: str
    n_cpus: int
    sockets: int
    threads_per_core: int
    numa: dict[int, list[int]]
    allowed: list[int]
    source: str

    def node_of(self, cpu: int) -> int | None:
        return next((n for n, cpus in self.numa.items() if cpu in cpus), None)

    def summary(self) -> str:
        nodes = "; ".join(f"node{n}: {_fmt_cpus(c)}" for n, c in sorted(self.numa.items()))
        return (f"{self.model}: {self.n_cpus} CPUs, {self.sockets} socket(s), {self.threads_per_core} thread(s)/core; "
                f"NUMA {nodes}; this process may run on {_fmt_cpus(self.allowed)} ({self.source})")


def _fmt_cpus(cpus: list[int]) -> str:
    parts, cpus = [], sorted(cpus)
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def cpu_topology(*, sys_root: str | Path = "/sys", lscpu_text: str | None = None) -> CpuTopology:
    """Read this machine's NUMA layout from ``<sys_root>/devices/system/node/node*/cpulist``, the
    allowed CPUs from ``os.sched_getaffinity(0)``, and model/sockets from ``lscpu`` (run when present,
    or pass its text). Taught in chapter 12."""
    sources = []
    numa: dict[int, list[int]] = {}
    node_dir = Path(sys_root) / "devices/system/node"
    for d in sorted(node_dir.glob("node[0-9]*")):
        f = d / "cpulist"
        if f.is_file():
            numa[int(d.name[4:])] = parse_cpulist(f.read_text())
    if numa:
        sources.append(str(node_dir))
    if lscpu_text is None and shutil.which("lscpu"):
        lscpu_text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10,
                                    env={**os.environ, "LC_ALL": "C"}).stdout
        sources.append("lscpu")
    info = parse_lscpu(lscpu_text or "")
    if not numa:
        for k, v in info.items():
            m = re.fullmatch(r"NUMA node(\d+) CPU\(s\)", k)
            if m:
                numa[int(m.group(1))] = parse_cpulist(v)
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    if not numa:
        numa = {0: list(range(os.cpu_count() or 1))}
        sources.append("no NUMA information: one node assumed")
    n_cpus = int(info.get("CPU(s)", 0) or sum(len(c) for c in numa.values()))
    return CpuTopology(model=info.get("Model name", "unknown CPU"), n_cpus=n_cpus,
                       sockets=int(info.get("Socket(s)", 1) or 1),
                       threads_per_core=int(info.get("Thread(s) per core", 1) or 1),
                       numa=numa, allowed=allowed, source=", ".join(sources))


def affinity_plan(topology) -> pd.DataFrame:
    """Which CPUs and memory node each GPU's rank should use, from a parsed ``nvidia-smi topo -m``
    (``labkit.comm.parse_topology``): one row per GPU with its NUMA node, its CPU list and the
    ``numactl --cpunodebind=N --membind=N`` prefix that keeps the rank's threads and pinned buffers on
    the socket wired to that GPU (a data loader on the far socket pays the inter-socket link on every
    host-to-device copy). Taught in chapter 12."""
    rows = []
    for g in topology.gpus:
        node = topology.numa_affinity.get(g, "N/A")
        cpus = topology.cpu_affinity.get(g, "")
        try:
            n_cpus = len(parse_cpulist(cpus)) if cpus else 0
        except ValueError:
            n_cpus = 0
        cmd = (f"numactl --cpunodebind={node} --membind={node} python train.py" if str(node).isdigit()
               else f"taskset -c {cpus} python train.py" if n_cpus else "(no affinity information)")
        rows.append({"gpu": g, "numa_node": int(node) if str(node).isdigit() else None, "cpus": cpus,
                     "n_cpus": n_cpus, "command": cmd})
    return pd.DataFrame(rows)
