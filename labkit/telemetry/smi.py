"""Device telemetry read from nvidia-smi and DCGM: ``labkit.telemetry.smi``.

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
keep every good row and list the bad ones ("line N: why": text, ``inf``, negative readings, lines longer
than :data:`labkit.checks.MAX_LINE`), in time linear in the input; :func:`sample` runs nvidia-smi live
when it exists.
SYNTHETIC samples in the same formats come from :mod:`labkit.telemetry.synthetic`.

Taught in chapter 12 (``chapters/part2_diagnosis/ch12_telemetry_topology.ipynb``). Commands::

    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used,power.draw,clocks.sm \\
               --format=csv,nounits -lms 500
    dcgmi dmon -e 1002,1003,1004,1005,1011,1012 -d 500
"""
from __future__ import annotations

import csv
import re
import shutil
import subprocess
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from labkit.checks import MAX_LINE, long_line, nonneg


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


_NUMBER = re.compile(r"([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(%|MiB|W|MHz|C|B/s|KB/s|MB/s)?")


def _value(s: str, col: str = "value") -> float:
    """A reading: NaN for ``[N/A]`` and friends, else a finite number >= 0 (NVML and DCGM report
    utilisations, memory, power, temperatures, clocks and byte rates as unsigned numbers), units
    stripped. Raises ValueError naming the column and the text."""
    s = s.strip()
    if s in _NA:
        if col in ("gpu", "index"):
            raise ValueError(f"{col}: {s!r} is not valid: a row needs its GPU index")
        return float("nan")
    m = _NUMBER.fullmatch(s)
    if not m:
        raise ValueError(f"{col}: {s[:40]!r} is not a number")
    v = nonneg(col, float(m.group(1)))        # 1e999 (inf) and negative readings are refused
    if col in ("gpu", "index") and (v != int(v) or v >= 2**31):
        raise ValueError(f"{col}={s[:40]} is not valid: use a GPU index (a whole number below 2**31)")
    return v


def _unit(h: str) -> tuple[str, str | None]:
    """``"power.draw [W]"`` -> ``("power.draw", "W")``; a header without ``[unit]`` -> ``(h, None)``.
    (The regular expression it replaces backtracked quadratically on headers full of ``[`` or spaces.)"""
    cut = h.find("[", 1)
    if cut < 0 or not h.endswith("]") or cut == len(h) - 2:
        return h, None
    return (h[:cut].rstrip() or h[:1]), h[cut + 1:-1]


def parse_query_gpu(text: str, *, source: str = "") -> TelemetryTable:
    """Parse ``nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]`` output.

    The header (``utilization.gpu [%]``…) names the columns and their units; ``index`` becomes ``gpu``;
    ``[N/A]`` / ``[Not Supported]`` become NaN. Rows with a wrong field count or unreadable numbers
    are skipped and reported. With ``noheader`` the columns are taken to be :data:`QUERY_FIELDS`.
    Taught in chapter 12.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_query_gpu: text must be str, got {type(text).__name__}")
    errors: list[str] = []
    lines = []
    for i, ln in enumerate(text.splitlines(), 1):
        if len(ln) > MAX_LINE:
            errors.append(long_line(i, ln, "nvidia-smi --query-gpu CSV"))
        elif ln.strip() and not ln.startswith("#"):
            lines.append((i, ln))
    if not lines:
        return TelemetryTable(pd.DataFrame(), errors=errors or ["empty input"], source=source)
    first = _csv_fields(lines[0][1])
    if first and any(re.search(r"[a-z]\.[a-z]|^index$|^timestamp$|^name$", f) for f in first):
        header, body = first, lines[1:]
    else:
        header, body = list(QUERY_FIELDS), lines
    cols, units = [], {}
    for h in header:
        name, unit = _unit(h)
        name = "gpu" if name == "index" else name
        cols.append(name)
        if unit is not None:
            units[name] = unit
    rows, row_lines = [], []
    for lineno, ln in body:
        fields = _csv_fields(ln)
        if fields is None:
            errors.append(f"line {lineno}: not a CSV row: {ln[:80]!r}")
            continue
        if len(fields) != len(cols):
            errors.append(f"line {lineno}: {len(fields)} fields, expected {len(cols)}: {ln[:80]!r}")
            continue
        row = {}
        try:
            for c, v in zip(cols, fields, strict=True):
                row[c] = v if c in ("timestamp", "name", "uuid", "pci.bus_id") else _value(v, c)
        except ValueError as e:
            errors.append(f"line {lineno}: {e}")
            continue
        rows.append(row)
        row_lines.append(lineno)
    df = pd.DataFrame(rows, columns=cols)
    if "timestamp" in df and len(df):
        df["timestamp"] = pd.to_datetime(df["timestamp"], format="%Y/%m/%d %H:%M:%S.%f", errors="coerce")
        bad = df["timestamp"].isna()
        for i in np.flatnonzero(bad.to_numpy()):
            errors.append(f"line {row_lines[i]}: unreadable timestamp")
        df = df[~bad].reset_index(drop=True)
    if "gpu" in df:
        df["gpu"] = df["gpu"].astype("Int64")
    return TelemetryTable(df, units, errors, source)


def _csv_fields(line: str) -> list[str] | None:
    """The stripped fields of one CSV line, None when the csv module refuses it (NUL byte, huge field)."""
    if '"' not in line:                 # no quoting: the csv module would split at every comma
        return [f.strip() for f in line.split(",")]
    try:
        return [f.strip() for f in next(csv.reader([line]), [])]
    except csv.Error:
        return None


def _whitespace_table(text: str, *, first_key: str, source: str, rename=None) -> TelemetryTable:
    """Shared reader for the space-aligned tables of ``nvidia-smi dmon`` and ``dcgmi dmon``."""
    header: list[str] | None = None
    rows, errors = [], []
    for lineno, ln in enumerate(text.splitlines(), 1):
        if len(ln) > MAX_LINE:
            errors.append(long_line(lineno, ln, f"{'dcgmi' if first_key == 'entity' else 'nvidia-smi'} dmon"))
            continue
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
            row = {h: (t if h.lower() in ("date", "time") else _value(t, "gpu" if j == 0 else h))
                   for j, (h, t) in enumerate(zip(header, toks, strict=True))}
        except ValueError as e:
            errors.append(f"line {lineno}: {e}")
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
