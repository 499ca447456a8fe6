"""Read the SQLite export of an Nsight Systems report into event tables (the nsys timeline).

``nsys export --type sqlite report.nsys-rep`` writes the event tables ``NVTX_EVENTS`` (eventType 59 =
push/pop range, 60 = start/end range), ``CUPTI_ACTIVITY_KIND_KERNEL``, ``CUPTI_ACTIVITY_KIND_RUNTIME``,
``CUPTI_ACTIVITY_KIND_MEMCPY`` and ``StringIds`` (names are ids into it). :func:`read_sqlite` reads
them into an :class:`NsysTimeline`, names resolved. Schema:
https://docs.nvidia.com/nsight-systems/UserGuide/index.html#exporter-sqlite-schema

Taught in chapter 10 (``chapters/part2_diagnosis/ch10_nsight_nvtx.ipynb``).
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from labkit.checks import refuse_special

__all__ = ["NsysTimeline", "read_sqlite", "MEMCPY_KINDS", "NVTX_PUSHPOP", "NVTX_STARTEND"]

# CUPTI_ActivityMemcpyKind (cupti_activity.h): the copyKind column of CUPTI_ACTIVITY_KIND_MEMCPY
MEMCPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
                9: "HtoH", 10: "PtoP"}
NVTX_PUSHPOP, NVTX_STARTEND = 59, 60          # NVTX_EVENTS.eventType (nsys stats nvtx_sum script)


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
    refuse_special("read_sqlite: file", path)
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
