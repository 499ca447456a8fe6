"""Read Nsight Systems reports: the ``nsys stats`` CSV summaries and the SQLite export.

Nsight Systems (nsys) records what the PyTorch profiler does not: every CUDA API call on every CPU
thread, each kernel on each *stream* with its exact GPU start and end, memory copies with their
direction and size, NVTX ranges pushed by ``torch.cuda.nvtx.range_push`` / ``record_function``, OS
runtime calls. Two exports are read here, the two nsys really produces:

* ``nsys stats --report nvtx_sum,cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum --format csv
  report.nsys-rep`` — summary tables (one CSV block per report; the column names are those of the
  nsys stats scripts, e.g. ``Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),
  StdDev (ns),Style,Range`` for ``nvtx_sum``).  See the nsys User Guide, "Report Scripts":
  https://docs.nvidia.com/nsight-systems/UserGuide/index.html#report-scripts
* ``nsys export --type sqlite report.nsys-rep`` — the event tables ``NVTX_EVENTS`` (eventType 59 =
  push/pop range, 60 = start/end range), ``CUPTI_ACTIVITY_KIND_KERNEL``, ``CUPTI_ACTIVITY_KIND_RUNTIME``,
  ``CUPTI_ACTIVITY_KIND_MEMCPY`` and ``StringIds`` (names are ids into it).  Schema:
  https://docs.nvidia.com/nsight-systems/UserGuide/index.html#exporter-sqlite-schema

From the timeline, :func:`analyze` computes what a learner reads off the nsys GUI: GPU busy share,
the idle gaps and the CPU call that was running during each (a ``cudaStreamSynchronize`` from
``.item()``, a pageable ``cudaMemcpy``), the launch latency (API call to kernel start), how much of
the NCCL stream overlaps the compute stream, and each NVTX range projected onto the GPU.

No GPU here: :func:`synthesize_report` writes a seeded, SYNTHETIC report in the same schema (a
model of a training step with a host sync and a slow data loader) for the CPU path of the course.

Taught in chapter 10 (``chapters/part2_diagnosis/ch10_nsight_nvtx.ipynb``). Commands::

    nsys profile -t cuda,nvtx,osrt --capture-range=cudaProfilerApi -o step python train.py
    nsys export --type sqlite step.nsys-rep
    nsys stats --report nvtx_sum,cuda_api_sum,cuda_gpu_kern_sum --format csv step.nsys-rep
"""
from __future__ import annotations

import csv
import io
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = [
    "NsysStats", "NsysTimeline", "NsysAnalysis", "parse_stats_csv", "read_sqlite", "stats_from_timeline",
    "to_stats_csv", "analyze", "kernel_class", "plot_timeline", "synthesize_report", "MEMCPY_KINDS",
    "DATASETS", "build_dataset", "demo_training", "record", "ToyStream", "async_timing_demo",
]

# CUPTI_ActivityMemcpyKind (cupti_activity.h): the copyKind column of CUPTI_ACTIVITY_KIND_MEMCPY
MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
                9: "HtoH", 10: "PtoP"}
NVTX_PUSHPOP, NVTX_STARTEND = 59, 60          # NVTX_EVENTS.eventType (nsys stats nvtx_sum script)

# --------------------------------------------------------------------------- stats CSV
# canonical column <- the names nsys stats has used across versions
_COLS = {
    "time_pct": ("Time (%)", "Time(%)"),
    "total_ns": ("Total Time (ns)", "Total Time"),
    "count": ("Instances", "Num Calls", "Count", "Calls"),
    "avg_ns": ("Avg (ns)", "Average", "Average (ns)"),
    "med_ns": ("Med (ns)", "Median", "Median (ns)"),
    "min_ns": ("Min (ns)", "Minimum", "Minimum (ns)"),
    "max_ns": ("Max (ns)", "Maximum", "Maximum (ns)"),
    "std_ns": ("StdDev (ns)", "StdDev"),
    "style": ("Style",),
    "name": ("Range", "Name", "Operation"),
}
_NUMERIC = ("time_pct", "total_ns", "count", "avg_ns", "med_ns", "min_ns", "max_ns", "std_ns")
_REPORTS = ("nvtx_sum", "cuda_api_sum", "cuda_gpu_kern_sum", "cuda_gpu_mem_time_sum", "osrt_sum")
_HINT = re.compile(r"\((\w+_sum)\)|\[(?:[^\]]*/)?(\w+_sum)(?:\.py)?\]|_(\w+_sum)\.csv")


@dataclass
class NsysStats:
    """The summary tables of ``nsys stats`` (one DataFrame per report, canonical columns).

    ``tables`` maps a report name (``nvtx_sum``, ``cuda_api_sum``, ``cuda_gpu_kern_sum``,
    ``cuda_gpu_mem_time_sum``, ``osrt_sum``) to a DataFrame with columns ``name, count, total_ns,
    avg_ns, med_ns, min_ns, max_ns, std_ns, time_pct`` (+ ``style`` for NVTX). ``errors`` lists the
    lines that could not be read ("line N: why"); good rows around them are kept. Taught in chapter 10.
    """

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __getitem__(self, report: str) -> pd.DataFrame:
        if report not in self.tables:
            raise KeyError(f"no {report!r} table in this nsys stats output; have {sorted(self.tables)}")
        return self.tables[report]

    def top(self, report: str = "cuda_gpu_kern_sum", n: int = 10) -> pd.DataFrame:
        """The ``n`` rows with the most total time (nanoseconds shown as milliseconds)."""
        t = self[report].sort_values("total_ns", ascending=False).head(n)
        out = t[["name", "count", "total_ns", "avg_ns"]].copy()
        out["total_ms"] = out.pop("total_ns") / 1e6
        out["avg_us"] = out.pop("avg_ns") / 1e3
        out["share"] = out["total_ms"] / (self[report]["total_ns"].sum() / 1e6)
        return out.reset_index(drop=True)


def _kind_from_columns(cols: set[str]) -> str | None:
    if "style" in cols or any(c == "Range" for c in cols):
        return "nvtx_sum"
    if "Operation" in cols:
        return "cuda_gpu_mem_time_sum"
    if "Instances" in cols and "Name" in cols:
        return "cuda_gpu_kern_sum"
    if ("Num Calls" in cols or "Calls" in cols) and "Name" in cols:
        return "cuda_api_sum"
    return None


def _canon(header: list[str]) -> list[str | None]:
    out = []
    for h in header:
        h = h.strip()
        out.append(next((k for k, names in _COLS.items() if h in names), None))
    return out


def _num(s: str) -> float:
    s = s.strip().replace(",", "")
    if s in ("", "-", "N/A"):
        return float("nan")
    return float(s)


def parse_stats_csv(text: str) -> NsysStats:
    """Parse what ``nsys stats --format csv`` prints (one or several reports) or one of its CSV files.

    Blocks start at a header row holding ``Total Time``; the report is named by the banner nsys
    prints before it (``** NVTX Range Summary (nvtx_sum):``, ``Processing [... nvtx_sum.py]``) or,
    failing that, by its columns. A row with the wrong number of fields or a non-number in a number
    column is skipped and reported in ``errors`` (a truncated file keeps every complete row).
    Taught in chapter 10.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_stats_csv: text must be str, got {type(text).__name__}")
    res = NsysStats()
    hint: str | None = None
    header: list[str | None] | None = None
    kind: str | None = None
    rows: dict[str, list[dict]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            header = None
            continue
        if stripped.startswith("#"):                 # provenance comments (labkit's SYNTHETIC label)
            res.notes.append(f"line {lineno}: {stripped}")
            continue
        m = _HINT.search(stripped)
        if m and "Total Time" not in stripped:
            hint = next(g for g in m.groups() if g)
            header = None
            if "SKIPPED" in stripped or "does not contain" in stripped:
                res.notes.append(f"line {lineno}: {stripped}")
            continue
        if stripped.startswith(("SKIPPED", "Generating", "Processing", "**", "NOTICE", "WARNING")):
            res.notes.append(f"line {lineno}: {stripped}") if "SKIPPED" in stripped else None
            continue
        fields = next(csv.reader([stripped]))
        if any("Total Time" in f for f in fields):
            header = _canon(fields)
            kind = hint or _kind_from_columns({f.strip() for f in fields} | {c for c in header if c})
            if kind is None or "name" not in header or "total_ns" not in header:
                res.errors.append(f"line {lineno}: header of an unknown report: {stripped[:80]!r}")
                header = None
                continue
            rows.setdefault(kind, [])
            hint = None
            continue
        if header is None:
            res.errors.append(f"line {lineno}: row outside any report table: {stripped[:80]!r}")
            continue
        if len(fields) != len(header):
            res.errors.append(f"line {lineno}: {len(fields)} fields, the header has {len(header)}: "
                              f"{stripped[:80]!r}")
            continue
        row: dict = {}
        try:
            for col, val in zip(header, fields, strict=True):
                if col is None:
                    continue
                row[col] = _num(val) if col in _NUMERIC else val.strip()
        except ValueError:
            res.errors.append(f"line {lineno}: a number column holds text: {stripped[:80]!r}")
            continue
        if not row.get("name") or not np.isfinite(row.get("total_ns", np.nan)):
            res.errors.append(f"line {lineno}: no name or no total time: {stripped[:80]!r}")
            continue
        row["name"] = row["name"].lstrip(":")
        rows[kind].append(row)
    for kind, rs in rows.items():
        df = pd.DataFrame(rs)
        for c in _NUMERIC:
            if c not in df:
                df[c] = np.nan
        if "count" in df:
            df["count"] = df["count"].fillna(0).astype(int)
        res.tables[kind] = df
    return res


# --------------------------------------------------------------------------- SQLite timeline
@dataclass
class NsysTimeline:
    """Event tables of an nsys SQLite export, names resolved, times in ns from the first event.

    ``kernels``: start, end, stream, device, correlation, name. ``runtime``: start, end, tid,
    correlation, name (``cudaLaunchKernel``…, version suffix dropped). ``nvtx``: start, end, tid, text,
    depth. ``memcpy``: start, end, stream, bytes, kind (HtoD/DtoH/…). ``source`` is the file read.
    Taught in chapter 10.
    """

    kernels: pd.DataFrame
    runtime: pd.DataFrame
    nvtx: pd.DataFrame
    memcpy: pd.DataFrame
    source: str = ""
    synthetic: str | None = None

    @property
    def window_ns(self) -> tuple[int, int]:
        frames = [f for f in (self.kernels, self.runtime, self.nvtx, self.memcpy) if len(f)]
        if not frames:
            raise ValueError(f"{self.source or 'timeline'}: no events")
        return int(min(f["start"].min() for f in frames)), int(max(f["end"].max() for f in frames))


def _table_names(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def read_sqlite(path: str | Path) -> NsysTimeline:
    """Read an ``nsys export --type sqlite`` file into an :class:`NsysTimeline`.

    Missing optional tables (no NVTX, no memcpy) give empty frames; a file that is not an nsys
    export (no ``StringIds``/kernel table) raises ValueError naming the file. Taught in chapter 10.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"read_sqlite: no file {path}")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        names = _table_names(con)
    except sqlite3.DatabaseError as e:
        raise ValueError(f"read_sqlite: {path} is not a SQLite file ({e})") from e
    need = {"StringIds", "CUPTI_ACTIVITY_KIND_KERNEL"}
    if not need <= names:
        con.close()
        raise ValueError(f"read_sqlite: {path} is not an nsys export: tables {sorted(need - names)} "
                         f"missing (have {sorted(names)[:8]})")
    q = lambda sql: pd.read_sql_query(sql, con)
    kernels = q("""SELECT k.start, k.end, k.streamId AS stream, k.deviceId AS device,
                          k.correlationId AS correlation, s.value AS name
                   FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON k.demangledName = s.id""")
    runtime = (q("""SELECT r.start, r.end, r.globalTid & 16777215 AS tid, r.correlationId AS correlation,
                           s.value AS name
                    FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON r.nameId = s.id""")
               if "CUPTI_ACTIVITY_KIND_RUNTIME" in names else
               pd.DataFrame(columns=["start", "end", "tid", "correlation", "name"]))
    runtime["name"] = runtime["name"].astype(str).str.replace(r"_v\d+$", "", regex=True)
    nvtx = (q(f"""SELECT n.start, n.end, n.globalTid & 16777215 AS tid,
                         COALESCE(n.text, s.value) AS text
                  FROM NVTX_EVENTS n LEFT JOIN StringIds s ON n.textId = s.id
                  WHERE n.eventType IN ({NVTX_PUSHPOP}, {NVTX_STARTEND}) AND n.end IS NOT NULL""")
            if "NVTX_EVENTS" in names else pd.DataFrame(columns=["start", "end", "tid", "text"]))
    memcpy = (q("""SELECT start, end, streamId AS stream, bytes, copyKind AS kind
                   FROM CUPTI_ACTIVITY_KIND_MEMCPY""")
              if "CUPTI_ACTIVITY_KIND_MEMCPY" in names else
              pd.DataFrame(columns=["start", "end", "stream", "bytes", "kind"]))
    synthetic = None
    if "META_DATA_EXPORT" in names:
        meta = dict(con.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall())
        synthetic = meta.get("SYNTHETIC")
    con.close()
    memcpy["kind"] = memcpy["kind"].map(lambda k: MEMCPY_KINDS.get(int(k), str(k)))
    nvtx = nvtx.sort_values(["tid", "start", "end"], ascending=[True, True, False]).reset_index(drop=True)
    nvtx["depth"] = _nesting_depth(nvtx)
    return NsysTimeline(kernels=kernels, runtime=runtime, nvtx=nvtx, memcpy=memcpy,
                        source=str(path), synthetic=synthetic)


def _nesting_depth(nvtx: pd.DataFrame) -> list[int]:
    depth, stacks = [], {}
    for tid, s, e in zip(nvtx["tid"], nvtx["start"], nvtx["end"], strict=True):
        st = stacks.setdefault(tid, [])
        while st and st[-1] <= s:
            st.pop()
        depth.append(len(st))
        st.append(e)
    return depth


# --------------------------------------------------------------------------- summaries
def _summ(df: pd.DataFrame, key: str) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame(columns=["name", "count", "total_ns", "avg_ns", "med_ns", "min_ns", "max_ns",
                                     "std_ns", "time_pct"])
    d = (df["end"] - df["start"]).astype(float)
    g = d.groupby(df[key])
    out = pd.DataFrame({"count": g.size(), "total_ns": g.sum(), "avg_ns": g.mean(), "med_ns": g.median(),
                        "min_ns": g.min(), "max_ns": g.max(), "std_ns": g.std(ddof=1).fillna(0.0)})
    out["time_pct"] = 100 * out["total_ns"] / out["total_ns"].sum()
    out = out.rename_axis("name").reset_index().sort_values("total_ns", ascending=False)
    return out.reset_index(drop=True)


def stats_from_timeline(tl: NsysTimeline) -> NsysStats:
    """The ``nsys stats`` summaries computed from a timeline (same definitions as the nsys scripts:
    per name the instances, total, mean, median, min, max, sample standard deviation, and the share of
    the report's total). Taught in chapter 10."""
    nv = _summ(tl.nvtx.rename(columns={"text": "name"}), "name")
    nv["style"] = "PushPop"
    mem = tl.memcpy.assign(name=lambda m: "[CUDA memcpy " + m["kind"].astype(str) + "]")
    return NsysStats(tables={"nvtx_sum": nv, "cuda_api_sum": _summ(tl.runtime, "name"),
                             "cuda_gpu_kern_sum": _summ(tl.kernels, "name"),
                             "cuda_gpu_mem_time_sum": _summ(mem, "name")})


_HEADERS = {
    "nvtx_sum": ["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
                 "StdDev (ns)", "Style", "Range"],
    "cuda_api_sum": ["Time (%)", "Total Time (ns)", "Num Calls", "Avg (ns)", "Med (ns)", "Min (ns)",
                     "Max (ns)", "StdDev (ns)", "Name"],
    "cuda_gpu_kern_sum": ["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)",
                          "Max (ns)", "StdDev (ns)", "Name"],
    "cuda_gpu_mem_time_sum": ["Time (%)", "Total Time (ns)", "Count", "Avg (ns)", "Med (ns)", "Min (ns)",
                              "Max (ns)", "StdDev (ns)", "Operation"],
}
_TITLES = {"nvtx_sum": "NVTX Range Summary", "cuda_api_sum": "CUDA API Summary",
           "cuda_gpu_kern_sum": "CUDA GPU Kernel Summary", "cuda_gpu_mem_time_sum": "CUDA GPU MemOps Summary (by Time)"}


def to_stats_csv(stats: NsysStats, reports=tuple(_HEADERS)) -> str:
    """Write summaries in the layout ``nsys stats --format csv`` prints to the console (a banner,
    then the CSV block, per report). Taught in chapter 10."""
    buf = io.StringIO()
    for r in reports:
        if r not in stats.tables:
            continue
        buf.write(f"\n ** {_TITLES[r]} ({r}):\n\n")
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(_HEADERS[r])
        for t in stats.tables[r].itertuples():
            nums = [f"{t.time_pct:.1f}", f"{t.total_ns:.0f}", int(t.count), f"{t.avg_ns:.1f}", f"{t.med_ns:.1f}",
                    f"{t.min_ns:.0f}", f"{t.max_ns:.0f}", f"{t.std_ns:.1f}"]
            w.writerow(nums + (["PushPop", t.name] if r == "nvtx_sum" else [t.name]))
    return buf.getvalue()


# --------------------------------------------------------------------------- analysis
def kernel_class(name: str) -> str:
    """Family of a kernel from its name: ``nccl``, ``gemm``, ``attention``, ``optimizer`` or
    ``elementwise/other`` (the words cuBLAS/CUTLASS, FlashAttention, NCCL and PyTorch put in kernel
    names). Taught in chapter 10."""
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if any(w in n for w in ("flash", "fmha", "attention", "sdpa")):   # before gemm: they name cutlass types
        return "attention"
    if any(w in n for w in ("gemm", "xmma", "cutlass", "cublas", "matmul")):
        return "gemm"
    if any(w in n for w in ("adam", "multi_tensor_apply", "optimizer")):
        return "optimizer"
    return "elementwise/other"


def _union(iv: np.ndarray) -> np.ndarray:
    """Merge [start, end] intervals (sorted output)."""
    if len(iv) == 0:
        return iv.reshape(0, 2)
    iv = iv[np.argsort(iv[:, 0])]
    out = [list(iv[0])]
    for s, e in iv[1:]:
        if s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return np.asarray(out, dtype=float)


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Total length of the intersection of two merged interval sets."""
    i = j = 0
    tot = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i, 0], b[j, 0]), min(a[i, 1], b[j, 1])
        tot += max(0.0, hi - lo)
        if a[i, 1] < b[j, 1]:
            i += 1
        else:
            j += 1
    return tot


@dataclass
class NsysAnalysis:
    """What the nsys timeline says about a run (times in ms unless named). Taught in chapter 10.

    ``gpu_busy_share``: fraction of the window with a kernel or copy running (what nvidia-smi calls
    utilisation); ``by_class``: GPU time per kernel family; ``gaps``: GPU idle gaps ≥ ``min_gap_us``
    with the CUDA API call and NVTX range on the CPU at that moment; ``launch_to_start_us``: median of
    kernel start − launch call start (a few µs: the GPU waits on the CPU, launch-bound; milliseconds:
    the CPU runs ahead and the GPU has a queue of work, as it should); ``nccl_overlap``: share of NCCL kernel time with a compute kernel
    running on another stream; ``nvtx_gpu``: per NVTX range, CPU time vs the GPU time of the kernels
    it launched (the GPU projection nsys draws under each range).
    """

    window_ms: float
    gpu_busy_ms: float
    gpu_busy_share: float
    by_class: pd.DataFrame
    gaps: pd.DataFrame
    launch_to_start_us: float
    nccl_overlap: float
    nvtx_gpu: pd.DataFrame
    streams: list[int]

    def summary(self) -> str:
        idle = self.gaps["gap_ms"].sum() if len(self.gaps) else 0.0
        cause = (self.gaps.groupby("cpu_call")["gap_ms"].sum().sort_values(ascending=False)
                 if len(self.gaps) else pd.Series(dtype=float))
        lines = [f"window {self.window_ms:.2f} ms, GPU busy {self.gpu_busy_ms:.2f} ms "
                 f"({100 * self.gpu_busy_share:.1f}%), streams {self.streams}",
                 f"idle gaps >= threshold: {len(self.gaps)} totalling {idle:.2f} ms"]
        for call, ms in cause.head(3).items():
            lines.append(f"  during {call}: {ms:.2f} ms")
        lines.append(f"median launch-to-start {self.launch_to_start_us:.1f} us; "
                     f"NCCL time hidden under compute {100 * self.nccl_overlap:.1f}%")
        return "\n".join(lines)


def analyze(tl: NsysTimeline, *, min_gap_us: float = 50.0) -> NsysAnalysis:
    """Analyse a timeline (see :class:`NsysAnalysis`). Taught in chapter 10."""
    if min_gap_us < 0:
        raise ValueError(f"analyze: min_gap_us must be >= 0, got {min_gap_us!r}")
    t0, t1 = tl.window_ns
    k = tl.kernels.assign(cls=tl.kernels["name"].map(kernel_class))
    gpu = np.vstack([k[["start", "end"]].to_numpy(float), tl.memcpy[["start", "end"]].to_numpy(float)])
    busy = _union(gpu)
    busy_ns = float((busy[:, 1] - busy[:, 0]).sum()) if len(busy) else 0.0
    by = (k.assign(ms=(k["end"] - k["start"]) / 1e6).groupby("cls")["ms"].agg(["count", "sum"])
          .rename(columns={"sum": "gpu_ms"}).sort_values("gpu_ms", ascending=False))
    if len(tl.memcpy):
        m = tl.memcpy
        by.loc["memcpy"] = [len(m), float((m["end"] - m["start"]).sum() / 1e6)]
    by["share"] = by["gpu_ms"] / by["gpu_ms"].sum()
    # idle gaps and what the CPU was doing meanwhile
    rows = []
    edges = [(busy[i, 1], busy[i + 1, 0]) for i in range(len(busy) - 1)]
    rt = tl.runtime
    for s, e in edges:
        if (e - s) < min_gap_us * 1e3:
            continue
        ov = (np.minimum(rt["end"], e) - np.maximum(rt["start"], s)).clip(lower=0)
        call = rt.loc[ov.idxmax(), "name"] if len(rt) and ov.max() > 0.2 * (e - s) else "(no CUDA call: host work)"
        nv = tl.nvtx.assign(ov=(np.minimum(tl.nvtx["end"], e) - np.maximum(tl.nvtx["start"], s)).clip(lower=0))
        nv = nv[nv["ov"] > 0.5 * (e - s)]            # the deepest range covering most of the gap
        rng = nv.sort_values(["depth", "ov"])["text"].iloc[-1] if len(nv) else ""
        rows.append({"start_ms": (s - t0) / 1e6, "gap_ms": (e - s) / 1e6, "cpu_call": call, "nvtx": rng})
    gaps = pd.DataFrame(rows, columns=["start_ms", "gap_ms", "cpu_call", "nvtx"])
    # launch latency via correlation ids
    j = k.merge(rt[["correlation", "start", "tid"]], on="correlation", suffixes=("", "_api"))
    lat = float(np.median(j["start"] - j["start_api"]) / 1e3) if len(j) else float("nan")
    # NCCL overlap with compute on other streams
    is_nccl = k["cls"] == "nccl"
    nccl_iv = _union(k.loc[is_nccl, ["start", "end"]].to_numpy(float))
    comp_iv = _union(k.loc[~is_nccl, ["start", "end"]].to_numpy(float))
    nccl_ns = float((nccl_iv[:, 1] - nccl_iv[:, 0]).sum()) if len(nccl_iv) else 0.0
    hidden = _overlap(nccl_iv, comp_iv) / nccl_ns if nccl_ns else 0.0
    # NVTX ranges projected onto the GPU: kernels whose launch call lies inside the range
    proj = []
    for text, grp in tl.nvtx.groupby("text", sort=False):
        cpu_ms, gpu_ms, lag = 0.0, 0.0, []
        for r in grp.itertuples():
            inside = j[(j["tid"] == r.tid) & (j["start_api"] >= r.start) & (j["start_api"] < r.end)]
            cpu_ms += (r.end - r.start) / 1e6
            if len(inside):
                gpu_ms += (inside["end"].max() - inside["start"].min()) / 1e6
                lag.append((inside["end"].max() - r.end) / 1e6)
        proj.append({"range": text, "instances": len(grp), "cpu_ms": cpu_ms, "gpu_span_ms": gpu_ms,
                     "gpu_end_after_cpu_ms": float(np.median(lag)) if lag else float("nan")})
    return NsysAnalysis(window_ms=(t1 - t0) / 1e6, gpu_busy_ms=busy_ns / 1e6, gpu_busy_share=busy_ns / (t1 - t0),
                        by_class=by, gaps=gaps, launch_to_start_us=lat, nccl_overlap=hidden,
                        nvtx_gpu=pd.DataFrame(proj), streams=sorted(int(s) for s in k["stream"].unique()))


def plot_timeline(tl: NsysTimeline, *, start_ms: float = 0.0, span_ms: float | None = None, ax=None):
    """Draw the nsys-style timeline: NVTX rows and CUDA API row per CPU thread, one row per GPU stream
    (kernels coloured by family, copies in grey). Taught in chapter 10."""
    import matplotlib.pyplot as plt

    t0, t1 = tl.window_ns
    lo = t0 + start_ms * 1e6
    hi = t1 if span_ms is None else lo + span_ms * 1e6
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 3.6))
    colours = {"gemm": "tab:blue", "attention": "tab:purple", "nccl": "tab:red", "optimizer": "tab:orange",
               "elementwise/other": "tab:cyan", "memcpy": "0.55", "api": "tab:olive", "sync": "black"}
    rows = []

    def bars(df, y, colour_of):
        df = df[(df["end"] > lo) & (df["start"] < hi)]
        segs = [((s - t0) / 1e6, (e - s) / 1e6) for s, e in zip(df["start"], df["end"], strict=True)]
        ax.broken_barh(segs, (y - 0.4, 0.8), facecolors=[colour_of(r) for r in df.itertuples()], linewidth=0)

    y = 0
    for stream in sorted(tl.kernels["stream"].unique(), reverse=True):
        ks = tl.kernels[tl.kernels["stream"] == stream]
        bars(ks, y, lambda r: colours[kernel_class(r.name)])
        ms = tl.memcpy[tl.memcpy["stream"] == stream]
        bars(ms, y, lambda r: colours["memcpy"])
        rows.append(f"GPU stream {stream}")
        y += 1
    for tid in sorted(tl.runtime["tid"].unique()):
        rt = tl.runtime[tl.runtime["tid"] == tid]
        bars(rt, y, lambda r: colours["sync"] if "Synchronize" in r.name or "Memcpy" in r.name else colours["api"])
        rows.append(f"CUDA API tid {tid}")
        y += 1
        nv = tl.nvtx[tl.nvtx["tid"] == tid]
        palette = {t: plt.cm.Pastel1(i % 9) for i, t in enumerate(sorted(tl.nvtx["text"].unique()))}
        for d in sorted(nv["depth"].unique()):
            lev = nv[nv["depth"] == d]
            bars(lev, y, lambda r, pal=palette: pal[r.text])
            for r in lev[(lev["end"] > lo) & (lev["start"] < hi)].itertuples():   # label ranges wide enough
                a, b = max(r.start, lo), min(r.end, hi)
                if b - a > 0.06 * (hi - lo):
                    ax.text(((a + b) / 2 - t0) / 1e6, y, r.text, ha="center", va="center", fontsize=7)
            rows.append(f"NVTX depth {d}")
            y += 1
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlim((lo - t0) / 1e6, (hi - t0) / 1e6)
    ax.set_xlabel("time (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ax


# SYNTHETIC reports and live recording live in their own modules; their names are part of this API.
from labkit.nsys_live import ToyStream, async_timing_demo, demo_training, record  # noqa: E402
from labkit.nsys_synth import DATASETS, build_dataset, synthesize_report  # noqa: E402
