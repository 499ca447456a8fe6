"""Device telemetry (nvidia-smi, DCGM) and host topology (NUMA, CPU affinity), parsed.

Why "GPU-Util 100%" is not MFU: NVML's ``utilization.gpu`` is the "percent of time over the past
sample period during which one or more kernels was executing on the GPU" (nvidia-smi manual,
``--help-query-gpu``). One tiny kernel on one SM for the whole period reads 100%. DCGM's profiling
fields look inside the GPU (DCGM user guide, "Profiling Metrics",
https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/feature-overview.html#profiling-metrics):

* ``DCGM_FI_PROF_SM_ACTIVE`` (1002, SMACT): fraction of cycles an SM has at least one warp resident,
  averaged over all SMs — a kernel using 10 of 132 SMs reads ≤ 0.08 while GPU-Util reads 100%;
* ``DCGM_FI_PROF_SM_OCCUPANCY`` (1003, SMOCC): resident warps / maximum warps, averaged;
* ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` (1004, TENSO): fraction of cycles the tensor (HMMA/IMMA) pipe
  is busy — the counter closest to the FLOPs behind MFU: achieved tensor FLOP/s ≈ TENSO × dense peak;
* ``DCGM_FI_PROF_DRAM_ACTIVE`` (1005, DRAMA): fraction of cycles the memory interface is busy;
* ``DCGM_FI_PROF_PCIE_{TX,RX}_BYTES`` (1009/1010), ``DCGM_FI_PROF_NVLINK_{TX,RX}_BYTES`` (1011/1012): B/s.

Parsers for ``nvidia-smi --query-gpu=... --format=csv``, ``nvidia-smi dmon`` and ``dcgmi dmon -e ...``
keep every good row and list the bad ones; :func:`sample` runs nvidia-smi live when it exists.
:func:`synthesize_telemetry` writes SYNTHETIC samples from a kernel-activity model (no GPU here) and
:func:`synthesize_topology` a SYNTHETIC ``nvidia-smi topo -m`` matrix (parsed by
``labkit.comm.parse_topology``). :func:`cpu_topology` reads this machine's NUMA nodes and the CPUs
this process may run on (``/sys/devices/system/node``, ``os.sched_getaffinity``, ``lscpu``).

Taught in chapter 12 (``chapters/part2_diagnosis/ch12_telemetry_topology.ipynb``). Commands::

    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw,clocks.sm \\
               --format=csv,nounits -lms 500
    dcgmi dmon -e 1002,1003,1004,1005,1011,1012 -d 500
    nvidia-smi topo -m ; lscpu ; numactl --hardware
"""
from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from labkit.comm_synth import TOPO_LEGEND

__all__ = [
    "DCGM_FIELDS", "DcgmField", "TelemetryTable", "parse_query_gpu", "parse_smi_dmon", "parse_dcgmi_dmon",
    "sample", "QUERY_FIELDS", "SCENARIOS", "synthesize_telemetry", "tensor_flops_estimate",
    "parse_cpulist", "parse_lscpu", "CpuTopology", "cpu_topology", "synthesize_topology", "build_dataset",
    "affinity_plan", "busy_vs_flops",
]


@dataclass(frozen=True)
class DcgmField:
    """One DCGM profiling field: id, full name, the short column name dcgmi dmon prints, meaning, unit.
    Taught in chapter 12."""

    id: int
    name: str
    short: str
    meaning: str
    unit: str = "ratio"


DCGM_FIELDS: dict[int, DcgmField] = {f.id: f for f in (
    DcgmField(1001, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "GRACT", "time the graphics/compute engine is active"),
    DcgmField(1002, "DCGM_FI_PROF_SM_ACTIVE", "SMACT", "cycles with >= 1 warp resident on an SM, mean over SMs"),
    DcgmField(1003, "DCGM_FI_PROF_SM_OCCUPANCY", "SMOCC", "resident warps / max warps, mean over SMs"),
    DcgmField(1004, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "TENSO", "cycles the tensor pipe is active"),
    DcgmField(1005, "DCGM_FI_PROF_DRAM_ACTIVE", "DRAMA", "cycles the device memory interface is busy"),
    DcgmField(1006, "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "FP64A", "cycles the FP64 pipe is active"),
    DcgmField(1007, "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "FP32A", "cycles the FP32 pipe is active"),
    DcgmField(1008, "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "FP16A", "cycles the FP16 (non-tensor) pipe is active"),
    DcgmField(1009, "DCGM_FI_PROF_PCIE_TX_BYTES", "PCITX", "PCIe bytes transmitted", "B/s"),
    DcgmField(1010, "DCGM_FI_PROF_PCIE_RX_BYTES", "PCIRX", "PCIe bytes received", "B/s"),
    DcgmField(1011, "DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLTX", "NVLink bytes transmitted", "B/s"),
    DcgmField(1012, "DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLRX", "NVLink bytes received", "B/s"),
)}
_SHORT = {f.short: f for f in DCGM_FIELDS.values()}

#: what :func:`sample` asks nvidia-smi for (names from ``nvidia-smi --help-query-gpu``)
QUERY_FIELDS = ("timestamp", "index", "utilization.gpu", "utilization.memory", "memory.used", "power.draw",
                "temperature.gpu", "clocks.sm")
_NA = {"", "-", "N/A", "[N/A]", "[Not Supported]", "[Unknown Error]", "ERR!", "[Insufficient Permissions]"}


@dataclass
class TelemetryTable:
    """Parsed samples: ``frame`` (one row per sample and GPU, numbers as floats, units stripped),
    ``units`` (column -> unit), ``errors`` ("line N: why" for rows that were skipped), ``source``.
    Taught in chapter 12."""

    frame: pd.DataFrame
    units: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    source: str = ""

    def per_gpu(self) -> pd.DataFrame:
        """Median of every numeric column per GPU (``gpu`` column)."""
        num = self.frame.select_dtypes("number")
        return num.groupby(self.frame["gpu"]).median().drop(columns=["gpu"], errors="ignore")


def _value(s: str) -> float:
    s = s.strip()
    if s in _NA:
        return float("nan")
    m = re.fullmatch(r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(%|MiB|W|MHz|C|B/s|KB/s|MB/s)?", s)
    if not m:
        raise ValueError(s)
    return float(m.group(1))


def parse_query_gpu(text: str, *, source: str = "") -> TelemetryTable:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`` output.

    The header (``utilization.gpu [%]``…) names the columns and their units; ``index`` becomes ``gpu``;
    ``[N/A]`` / ``[Not Supported]`` become NaN. Rows with a wrong field count or unreadable numbers
    are skipped and reported. With ``noheader`` the columns are taken to be :data:`QUERY_FIELDS`.
    Taught in chapter 12.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_query_gpu: text must be str, got {type(text).__name__}")
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip() and not ln.startswith("#")]
    errors: list[str] = []
    if not lines:
        return TelemetryTable(pd.DataFrame(), errors=["empty input"], source=source)
    first = [f.strip() for f in next(csv.reader([lines[0][1]]))]
    if any(re.search(r"[a-z]\.[a-z]|^index$|^timestamp$|^name$", f) for f in first):
        header, body = first, lines[1:]
    else:
        header, body = list(QUERY_FIELDS), lines
    cols, units = [], {}
    for h in header:
        m = re.fullmatch(r"(.+?)\s*\[(.+)\]", h)
        name = m.group(1) if m else h
        name = "gpu" if name == "index" else name
        cols.append(name)
        if m:
            units[name] = m.group(2)
    rows = []
    for lineno, ln in body:
        fields = [f.strip() for f in next(csv.reader([ln]))]
        if len(fields) != len(cols):
            errors.append(f"line {lineno}: {len(fields)} fields, expected {len(cols)}: {ln[:80]!r}")
            continue
        row = {}
        try:
            for c, v in zip(cols, fields, strict=True):
                row[c] = v if c in ("timestamp", "name", "uuid", "pci.bus_id") else _value(v)
        except ValueError as e:
            errors.append(f"line {lineno}: not a number in {c!r}: {e}")
            continue
        rows.append(row)
    df = pd.DataFrame(rows, columns=cols)
    if "timestamp" in df and len(df):
        df["timestamp"] = pd.to_datetime(df["timestamp"], format="%Y/%m/%d %H:%M:%S.%f", errors="coerce")
        bad = df["timestamp"].isna()
        for i in np.flatnonzero(bad.to_numpy()):
            errors.append(f"row {i}: unreadable timestamp")
        df = df[~bad].reset_index(drop=True)
    if "gpu" in df:
        df["gpu"] = df["gpu"].astype("Int64")
    return TelemetryTable(df, units, errors, source)


def _whitespace_table(text: str, *, first_key: str, source: str, rename=None) -> TelemetryTable:
    """Shared reader for the space-aligned tables of ``nvidia-smi dmon`` and ``dcgmi dmon``."""
    header: list[str] | None = None
    rows, errors = [], []
    for lineno, ln in enumerate(text.splitlines(), 1):
        s = ln.strip()
        if not s:
            continue
        if s.startswith("#"):
            toks = s.lstrip("#").split()
            if toks and toks[0].lower() in (first_key, "date") and header is None:
                header = toks
            continue
        if header is None:
            if s.split()[0].upper() in ("ID", "IDX"):
                continue
            errors.append(f"line {lineno}: data before any header: {s[:80]!r}")
            continue
        toks = s.split()
        if toks[0].upper() in ("ID", "IDX"):
            continue
        if first_key == "entity":               # "GPU 0" is two tokens for one column
            if len(toks) < 2 or toks[0] != "GPU" or not toks[1].isdigit():
                errors.append(f"line {lineno}: not a 'GPU <n>' row: {s[:80]!r}")
                continue
            toks = [toks[1]] + toks[2:]
        if len(toks) != len(header):
            errors.append(f"line {lineno}: {len(toks)} fields, expected {len(header)}: {s[:80]!r}")
            continue
        try:
            row = {h: (t if h.lower() in ("date", "time") else _value(t)) for h, t in zip(header, toks, strict=True)}
        except ValueError as e:
            errors.append(f"line {lineno}: not a number: {e}")
            continue
        rows.append(row)
    if header is None:
        errors.append("no header line found")
        return TelemetryTable(pd.DataFrame(), errors=errors, source=source)
    df = pd.DataFrame(rows, columns=header)
    if header[0].lower() != "date":
        df = df.rename(columns={header[0]: "gpu"})
    if rename:
        df = df.rename(columns=rename)
    if "gpu" in df:
        df["gpu"] = df["gpu"].astype("Int64")
    return TelemetryTable(df, errors=errors, source=source)


def parse_smi_dmon(text: str, *, source: str = "") -> TelemetryTable:
    """Parse ``nvidia-smi dmon [-s pucm]`` output (``# gpu pwr gtemp mtemp sm mem enc dec mclk pclk``
    header, a units line, space-aligned rows, ``-`` for unsupported). ``sm`` is the same "a kernel ran"
    percentage as GPU-Util, not SM activity. Taught in chapter 12."""
    if not isinstance(text, str):
        raise TypeError(f"parse_smi_dmon: text must be str, got {type(text).__name__}")
    return _whitespace_table(text, first_key="gpu", source=source)


def parse_dcgmi_dmon(text: str, *, source: str = "") -> TelemetryTable:
    """Parse ``dcgmi dmon -e <field ids>`` output (``#Entity  SMACT  SMOCC  TENSO ...`` header, an
    ``ID`` line, rows ``GPU 0  0.912 ...``). Columns keep dcgmi's short names (see
    :data:`DCGM_FIELDS`); ``N/A`` becomes NaN. Taught in chapter 12."""
    if not isinstance(text, str):
        raise TypeError(f"parse_dcgmi_dmon: text must be str, got {type(text).__name__}")
    return _whitespace_table(text, first_key="entity", source=source, rename={"Entity": "gpu"})


def sample(duration_s: float = 2.0, *, interval_ms: int = 200, fields=QUERY_FIELDS,
           nvidia_smi: str = "nvidia-smi") -> TelemetryTable:
    """Sample the GPUs live with ``nvidia-smi --query-gpu=... --format=csv -lms interval_ms`` for
    ``duration_s`` seconds and parse what it printed. Raises RuntimeError when nvidia-smi is absent
    (check ``shutil.which("nvidia-smi")`` first). Taught in chapter 12."""
    if duration_s <= 0 or interval_ms < 10:
        raise ValueError(f"sample: need duration_s > 0 and interval_ms >= 10, got {duration_s}, {interval_ms}")
    exe = shutil.which(nvidia_smi)
    if exe is None:
        raise RuntimeError(f"sample: {nvidia_smi!r} is not on PATH; read a recorded file instead")
    cmd = [exe, f"--query-gpu={','.join(fields)}", "--format=csv", f"-lms={int(interval_ms)}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s).stdout
    except subprocess.TimeoutExpired as e:           # -lms loops forever: the timeout ends the sampling
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    return parse_query_gpu(out, source=" ".join(cmd))


# --------------------------------------------------------------------------- synthetic samples
#: workload models: per step a list of kernels (ms, share of SMs busy, tensor-pipe share while busy,
#: DRAM share while busy, NVLink bytes/s while busy) and host time with no kernel (idle_ms)
SCENARIOS = {
    "healthy": dict(kernels=[(4.0, 1.0, 0.62, 0.35, 0.0), (1.2, 1.0, 0.05, 0.80, 0.0),
                             (2.0, 0.9, 0.0, 0.15, 140e9)], idle_ms=0.2,
                    about="large bf16 GEMMs keep every SM and the tensor pipes busy; NCCL on NVLink"),
    "launch_bound": dict(kernels=[(0.012, 0.06, 0.30, 0.05, 0.0)] * 60 + [(0.02, 0.1, 0.0, 0.1, 0.0)] * 20,
                         idle_ms=0.01,
                         about="tiny kernels back to back: a kernel is always running (GPU-Util ~100%) "
                               "but it occupies a few SMs"),
    "data_starved": dict(kernels=[(4.0, 1.0, 0.62, 0.35, 0.0), (1.2, 1.0, 0.05, 0.80, 0.0)], idle_ms=6.0,
                         about="healthy kernels, then the GPU waits for the next batch"),
    "comm_bound": dict(kernels=[(2.0, 1.0, 0.62, 0.35, 0.0), (6.0, 0.2, 0.0, 0.25, 60e9)], idle_ms=0.2,
                       about="all-reduce dominates: a few SMs run NCCL, tensor pipes idle"),
}


def synthesize_telemetry(scenario: str = "healthy", *, seed: int = 0, seconds: float = 10.0,
                         interval_s: float = 0.5, n_gpus: int = 1, peak_power_w: float = 700.0,
                         name: str = "NVIDIA H100 80GB HBM3") -> dict[str, str]:
    """SYNTHETIC nvidia-smi and dcgmi samples of a workload model from :data:`SCENARIOS`.

    A step's kernels are laid on a 10 µs grid (durations jittered by a seeded generator); each sample
    window then gets the *definitions* of the counters: GPU-Util = % of the window with any kernel
    running (NVML), SMACT = time-mean of the share of SMs busy, SMOCC ≈ 0.5 × SMACT (half the warp
    slots), TENSO = time-mean of SM share × tensor share, DRAMA likewise, NVLink bytes/s likewise. Power
    is a linear model (90 W idle + activity share of ``peak_power_w``); only the counters' definitions are
    real. Returns ``{"query_gpu": csv text, "dcgmi_dmon": text}`` whose first line says SYNTHETIC.
    Taught in chapter 12.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"synthesize_telemetry: scenario {scenario!r} unknown; choose from {sorted(SCENARIOS)}")
    if seconds <= 0 or interval_s <= 0 or interval_s > seconds or n_gpus < 1:
        raise ValueError(f"synthesize_telemetry: need 0 < interval_s <= seconds and n_gpus >= 1, got "
                         f"seconds={seconds}, interval_s={interval_s}, n_gpus={n_gpus}")
    rng = np.random.default_rng(seed)
    sc = SCENARIOS[scenario]
    dt = 1e-5
    n = int(round(seconds / dt))
    label = (f"# SYNTHETIC: labkit.telemetry.synthesize_telemetry({scenario!r}, seed={seed}, seconds={seconds}, "
             f"interval_s={interval_s}) -- a workload model, not a recording")
    q_lines = [label, "timestamp, index, name, utilization.gpu [%], utilization.memory [%], memory.used [MiB], "
                      "power.draw [W], temperature.gpu, clocks.sm [MHz]"]
    d_lines = [label, "#Entity   SMACT  SMOCC  TENSO  DRAMA  NVLTX         NVLRX", "ID"]
    t0 = pd.Timestamp("2026-11-29 10:00:00")
    per = int(round(interval_s / dt))
    acts = []
    for _g in range(n_gpus):
        sm, tc, dr, nv = (np.zeros(n) for _ in range(4))
        i = 0
        while i < n:
            for ms, sm_s, tc_s, dr_s, nv_s in sc["kernels"]:
                k = max(1, int(round(ms * 1e-3 / dt * rng.lognormal(0, 0.05))))
                sl = slice(i, min(n, i + k))
                sm[sl], tc[sl], dr[sl], nv[sl] = sm_s, sm_s * tc_s, dr_s, nv_s
                i += k
            i += int(round(sc["idle_ms"] * 1e-3 / dt * rng.lognormal(0, 0.1)))
        acts.append((sm, tc, dr, nv))
    for s in range(n // per):
        ts = (t0 + pd.Timedelta(seconds=(s + 1) * interval_s)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        for g, (sm, tc, dr, nv) in enumerate(acts):
            w = slice(s * per, (s + 1) * per)
            util = 100 * np.mean(sm[w] > 0)
            smact, tenso, drama, nvl = sm[w].mean(), tc[w].mean(), dr[w].mean(), nv[w].mean()
            power = min(peak_power_w, 90 + (peak_power_w - 90) * (0.35 * smact + 0.65 * tenso) + rng.normal(0, 4))
            q_lines.append(f"{ts}, {g}, {name}, {util:.0f} %, {100 * drama:.0f} %, 61234 MiB, {power:.2f} W, "
                           f"{int(55 + 20 * smact)}, 1980 MHz")
            d_lines.append(f"GPU {g}     {smact:.3f}  {0.5 * smact:.3f}  {tenso:.3f}  {drama:.3f}  "
                           f"{nvl:<12.0f}  {nvl:.0f}")
    return {"query_gpu": "\n".join(q_lines) + "\n", "dcgmi_dmon": "\n".join(d_lines) + "\n"}


def tensor_flops_estimate(tensor_active: float, dense_peak_flops: float) -> float:
    """Achieved tensor-core FLOP/s ≈ PIPE_TENSOR_ACTIVE × dense peak (DCGM profiling metrics: the tensor
    pipe issuing every cycle it can is the dense peak). It counts every FLOP executed, recomputation
    included, so compare it with HFU rather than MFU (chapter 4). Taught in chapter 12."""
    if not 0 <= tensor_active <= 1:
        raise ValueError(f"tensor_flops_estimate: tensor_active is a ratio in [0, 1], got {tensor_active!r}")
    if dense_peak_flops <= 0:
        raise ValueError(f"tensor_flops_estimate: dense_peak_flops must be > 0, got {dense_peak_flops!r}")
    return tensor_active * dense_peak_flops


# --------------------------------------------------------------------------- host topology
def parse_cpulist(text: str) -> list[int]:
    """``"0-3,8,10-11"`` (Linux cpulist format, /sys and lscpu) -> ``[0, 1, 2, 3, 8, 10, 11]``.
    Taught in chapter 12."""
    if not isinstance(text, str):
        raise TypeError(f"parse_cpulist: text must be str, got {type(text).__name__}")
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"parse_cpulist: {part!r} in {text!r} is not 'N' or 'N-M'")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"parse_cpulist: range {part!r} runs backwards")
        out.extend(range(lo, hi + 1))
    return out


def parse_lscpu(text: str) -> dict[str, str]:
    """``lscpu`` output as a dict (``"Model name"``, ``"Socket(s)"``, ``"NUMA node0 CPU(s)"``...).
    Lines without a colon are ignored. Taught in chapter 12."""
    out = {}
    for ln in text.splitlines():
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


# nvidia-smi's legend, shared with labkit.comm_synth (one copy of the text)
_LEGEND = "\n" + TOPO_LEGEND


def synthesize_topology(system: str = "dgx-h100") -> str:
    """A SYNTHETIC ``nvidia-smi topo -m`` matrix of a typical machine, in nvidia-smi's layout (tab
    separated, ``CPU Affinity`` and ``NUMA Affinity`` columns, the legend). ``"dgx-h100"``: 8 GPUs all
    pairs NV18 (18 NVLinks through NVSwitch), 4 NICs, two sockets of 56 cores with SMT (GPUs 0-3 on
    node 0); ``"pcie-4gpu"``: a 4-GPU workstation without NVLink (pairs on one switch PIX, across
    sockets SYS). Built from the systems' published layouts, not recorded. Taught in chapter 12."""
    if system == "dgx-h100":
        n_gpu, gpu_node = 8, [0, 0, 0, 0, 1, 1, 1, 1]
        aff = {0: "0-55,112-167", 1: "56-111,168-223"}
        nics = {"NIC0": 0, "NIC1": 2, "NIC2": 4, "NIC3": 6}            # NIC next to GPU

        def link(a, b):
            return "NV18"
    elif system == "pcie-4gpu":
        n_gpu, gpu_node = 4, [0, 0, 1, 1]
        aff = {0: "0-15,32-47", 1: "16-31,48-63"}
        nics = {"NIC0": 0}

        def link(a, b):
            return "PIX" if gpu_node[a] == gpu_node[b] else "SYS"
    else:
        raise ValueError(f"synthesize_topology: system {system!r} unknown; choose 'dgx-h100' or 'pcie-4gpu'")
    gpus = [f"GPU{i}" for i in range(n_gpu)]
    cols = gpus + list(nics) + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]
    lines = [f"# SYNTHETIC: labkit.telemetry.synthesize_topology({system!r}) -- typical layout, not recorded",
             "\t" + "\t".join(cols)]

    def nic_link(gpu, nic_gpu):
        if gpu == nic_gpu:
            return "PXB"
        return "NODE" if gpu_node[gpu] == gpu_node[nic_gpu] else "SYS"

    for i in range(n_gpu):
        cells = ["X" if i == j else link(i, j) for j in range(n_gpu)]
        cells += [nic_link(i, g) for g in nics.values()]
        cells += [aff[gpu_node[i]], str(gpu_node[i]), "N/A"]
        lines.append(f"GPU{i}\t" + "\t".join(cells))
    for nic, g in nics.items():
        cells = [nic_link(j, g) for j in range(n_gpu)]
        cells += ["X" if nic == o else ("NODE" if gpu_node[g] == gpu_node[og] else "SYS") for o, og in nics.items()]
        lines.append(f"{nic}\t" + "\t".join(cells))
    lines.append(_LEGEND)
    lines.append("NIC Legend:\n")
    lines += [f"  {nic}: mlx5_{i}" for i, nic in enumerate(nics)]
    return "\n".join(lines) + "\n"


def build_dataset(out_dir: str | Path, *, seconds: float = 5.0, interval_s: float = 0.5) -> list[Path]:
    """(Re)generate ``datasets/telemetry/``: per scenario of :data:`SCENARIOS` a ``<scenario>_query_gpu.csv``
    and ``<scenario>_dcgmi_dmon.txt`` (seed 0), and ``topo_<system>.txt`` for both synthetic systems;
    every file starts with a SYNTHETIC line. Taught in chapter 12."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for sc in SCENARIOS:
        d = synthesize_telemetry(sc, seed=0, seconds=seconds, interval_s=interval_s)
        for key, ext in (("query_gpu", "csv"), ("dcgmi_dmon", "txt")):
            p = out_dir / f"{sc}_{key}.{ext}"
            p.write_text(d[key])
            written.append(p)
    for system in ("dgx-h100", "pcie-4gpu"):
        p = out_dir / f"topo_{system.replace('-', '_')}.txt"
        p.write_text(synthesize_topology(system))
        written.append(p)
    return written


def busy_vs_flops(sizes=(32, 1024), *, seconds: float = 0.5, dtype: str = "fp32") -> pd.DataFrame:
    """The CPU version of "GPU-Util 100% is not MFU", measured: for each square matmul size, run
    matmuls back to back for ``seconds`` and report the *busy share* (process CPU time / wall time on one
    thread, what ``top`` calls utilisation) beside the achieved FLOP/s (2·n³ per matmul) and
    its ratio to the best size's rate. Both loops keep the processor ~100% busy; only the big matmuls
    do much arithmetic. One warm-up matmul per size; matmuls are timed in ~10 ms batches and the rate is
    the median over batches (robust to other processes taking the CPU); the clock is
    ``time.perf_counter`` (CPU work is synchronous). Taught in chapter 12."""
    import torch

    if seconds <= 0:
        raise ValueError(f"busy_vs_flops: seconds must be > 0, got {seconds!r}")
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(dtype)
    if dt is None:
        raise ValueError(f"busy_vs_flops: dtype {dtype!r} not supported; use 'fp32' or 'bf16'")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)      # one thread: no OpenMP barriers, which stall badly on a shared machine
    try:
        return _busy_vs_flops(torch, sizes, seconds, dt)
    finally:
        torch.set_num_threads(threads)


def _busy_vs_flops(torch, sizes, seconds, dt) -> pd.DataFrame:
    import time

    rows = []
    for n in sizes:
        if int(n) < 1:
            raise ValueError(f"busy_vs_flops: sizes must be positive ints, got {n!r}")
        a = torch.randn(int(n), int(n), dtype=dt)
        b = torch.randn(int(n), int(n), dtype=dt)
        a @ b                                                     # warm-up
        t = time.perf_counter()
        for _ in range(3):
            a @ b
        per_batch = max(1, int(0.01 / max((time.perf_counter() - t) / 3, 1e-7)))   # ~10 ms batches
        rates, calls = [], 0
        w0, c0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - w0 < seconds or len(rates) < 3:
            t = time.perf_counter()
            for _ in range(per_batch):
                a @ b
            rates.append(2.0 * n ** 3 * per_batch / (time.perf_counter() - t))
            calls += per_batch
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        rows.append({"n": int(n), "matmuls": calls, "wall_s": wall, "busy_share": min(1.0, cpu / wall),
                     "flops_per_s": float(np.median(rates))})
    df = pd.DataFrame(rows)
    df["share_of_best"] = df["flops_per_s"] / df["flops_per_s"].max()
    return df
