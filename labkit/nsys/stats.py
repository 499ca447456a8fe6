"""Read ``nsys stats`` summaries: the CSV the report scripts print, and the same tables from a timeline.

``nsys stats --report nvtx_sum,cuda_api_sum,cuda_gpu_kern_sum,cuda_gpu_mem_time_sum --format csv
report.nsys-rep`` prints summary tables (one CSV block per report; the column names are those of the
nsys stats scripts, e.g. ``Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),
StdDev (ns),Style,Range`` for ``nvtx_sum``). :func:`parse_stats_csv` reads them,
:func:`stats_from_timeline` computes them from an SQLite export (:mod:`labkit.nsys.sqlite`) and
:func:`to_stats_csv` writes them back in nsys's layout. See the nsys User Guide, "Report Scripts":
https://docs.nvidia.com/nsight-systems/UserGuide/index.html#report-scripts

Taught in chapter 10 (``chapters/part2_diagnosis/ch10_nsight_nvtx.ipynb``).
"""
from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from labkit.checks import MAX_LINE, long_line, nonneg

if TYPE_CHECKING:
    from labkit.nsys.sqlite import NsysTimeline

__all__ = ["NsysStats", "parse_stats_csv", "stats_from_timeline", "to_stats_csv"]

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
# The report a banner names: "(nvtx_sum)", "[/path/reports/nvtx_sum.py]", "report_nvtx_sum.csv". Every
# pattern here is linear: "[^][]*" stops at the next bracket (the old "[^]]*" rescanned the rest of the line
# from every "["), and the file name is read from a whole run of word characters (the old "_(\w+_sum)"
# restarted at every "_" of the run).
_HINT_PAREN = re.compile(r"\((\w+_sum)\)|\[(?:[^\]\[]*/)?(\w+_sum)(?:\.py)?\]")
_CSV_NAME = re.compile(r"(?<!\w)(\w+)\.csv")


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


def _hint(line: str) -> str | None:
    """The report named in a banner line (the leftmost of the three spellings), else None."""
    found = []
    m = _HINT_PAREN.search(line)
    if m:
        found.append((m.start(), m.group(1) or m.group(2)))
    for m in _CSV_NAME.finditer(line):           # "<anything>_<report>_sum.csv": after the first "_"
        run = m.group(1)
        cut = run.find("_")
        if cut >= 0 and run.endswith("_sum") and len(run) - cut - 1 > 4:
            found.append((m.start() + cut, run[cut + 1:]))
            break
    return min(found)[1] if found else None


_MISSING = ("", "-", "N/A")


def _num(s: str, col: str) -> float:
    """A number column: NaN where nsys prints nothing, else a finite number >= 0 (times, counts, shares).

    Raises ValueError naming the column: text, ``inf`` / ``1e999`` / ``nan`` and negative figures.
    """
    s = s.strip().replace(",", "")
    if s in _MISSING:
        return float("nan")
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"{col} holds text {s[:40]!r}, not a number") from None
    v = nonneg(col, v)
    if col == "count" and (v != int(v) or v >= 2**53):
        raise ValueError(f"count={s[:40]} is not valid: use a whole number of calls below 2**53")
    return v


def parse_stats_csv(text: str) -> NsysStats:
    """Parse what ``nsys stats --format csv`` prints (one or several reports) or one of its CSV files.

    Blocks start at a header row holding ``Total Time``; the report is named by the banner nsys
    prints before it (``** NVTX Range Summary (nvtx_sum):``, ``Processing [... nvtx_sum.py]``) or,
    failing that, by its columns. A row with the wrong number of fields or a non-number in a number
    column (text, ``inf``, ``nan``, a negative time or count) is skipped and reported in ``errors`` with
    its line number (a truncated file keeps every complete row), and so is a line longer than
    :data:`labkit.checks.MAX_LINE`. Linear in the length of ``text``; never raises on garbage.
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
        if len(line) > MAX_LINE:
            res.errors.append(long_line(lineno, line, "nsys stats CSV"))
            continue
        stripped = line.strip()
        if not stripped:
            header = None
            continue
        if stripped.startswith("#"):                 # provenance comments (labkit's SYNTHETIC label)
            res.notes.append(f"line {lineno}: {stripped}")
            continue
        found = _hint(stripped) if "_sum" in stripped and "Total Time" not in stripped else None
        if found:
            hint = found
            header = None
            if "SKIPPED" in stripped or "does not contain" in stripped:
                res.notes.append(f"line {lineno}: {stripped}")
            continue
        if stripped.startswith(("SKIPPED", "Generating", "Processing", "**", "NOTICE", "WARNING")):
            res.notes.append(f"line {lineno}: {stripped}") if "SKIPPED" in stripped else None
            continue
        if header is None and "Total Time" not in stripped:
            res.errors.append(f"line {lineno}: row outside any report table: {stripped[:80]!r}")
            continue
        try:
            fields = next(csv.reader([stripped]))
        except csv.Error as e:                        # NUL bytes, a quote left open ...
            res.errors.append(f"line {lineno}: not a CSV row ({e}): {stripped[:80]!r}")
            continue
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
                row[col] = _num(val, col) if col in _NUMERIC else val.strip()
        except ValueError as e:
            res.errors.append(f"line {lineno}: bad number: {e}: {stripped[:80]!r}")
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


# --------------------------------------------------------------------------- from a timeline
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
