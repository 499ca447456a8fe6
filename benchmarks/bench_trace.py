"""Speed of labkit.trace vs HTA 0.5.0 and vs a bare json.load of the same file (chapter 9).

Run from the repo root::

    .venv/bin/python benchmarks/bench_trace.py [TRACE_DIR]          # default datasets/traces/hta

For each trace it prints the best of 7 interleaved rounds (wall time) of
  json      gzip + json.load of the file (the floor any Python reader pays),
  labkit    labkit.trace.analyze (full: steps, breakdown, overlap, collectives, stragglers, top ops),
  lk-hta    labkit.trace.hta_summary (HTA's temporal breakdown + comm/compute overlap, HTA's definitions),
  HTA       HTA 0.5.0 TraceAnalysis(trace_dir) + get_temporal_breakdown + get_comm_comp_overlap, timed
            inside a subprocess of build/hta-venv (HTA needs pandas < 3) — interpreter start excluded,
and the ratios HTA/lk-hta in wall and in CPU seconds (goal ≥ 8) and labkit/json (goal ≤ 2).

Two helper modes run under build/hta-venv/bin/python (they import only HTA):
  --hta-time FILE        time HTA on one file, print JSON
  --hta-reference DIR    HTA's numbers on every *.json.gz under DIR (tests/data/hta_reference.json)

Traces are found in TRACE_DIR and its sub-folders; a file's key is its path below TRACE_DIR with ``/`` as
``_`` (``trace_filter/sampled_rank-0.json.gz`` -> ``trace_filter_sampled_rank-0.json.gz``), HTA's
``tests/data/<sub>/<file>`` naming, the keys of tests/data/hta_reference.json.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HTA_PY = ROOT / "build" / "hta-venv" / "bin" / "python"
SHIPPED = ROOT / "datasets" / "traces" / "hta"


def trace_keys(folder) -> dict[str, Path]:
    """Every ``*.json.gz`` under ``folder`` by its key (path below ``folder``, ``/`` -> ``_``)."""
    folder = Path(folder)
    return {"_".join(f.relative_to(folder).parts): f for f in sorted(folder.rglob("*.json.gz"))}


def _hta_on(file: str):
    import logging
    import shutil
    import tempfile

    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    d = tempfile.mkdtemp()
    os.symlink(os.path.abspath(file), os.path.join(d, os.path.basename(file)))
    t0, c0 = time.perf_counter(), _cpu()
    ta = TraceAnalysis(trace_dir=d)
    tb = ta.get_temporal_breakdown(visualize=False)
    try:
        ov = ta.get_comm_comp_overlap(visualize=False)
    except Exception:  # noqa: BLE001 - HTA fails on traces without NCCL kernels in some versions
        ov = None
    dt, dc = time.perf_counter() - t0, _cpu() - c0
    shutil.rmtree(d)
    return (dt, dc), tb, ov


def _cpu() -> float:
    """CPU seconds of this process and its finished children (HTA parses in a process pool): on a loaded
    machine wall time measures the neighbours, CPU time the work."""
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def hta_time(file: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    runs = [_hta_on(file)[0] for _ in range(3)]
    print(json.dumps({"seconds": min(r[0] for r in runs), "cpu_seconds": min(r[1] for r in runs)}))


def hta_reference(folder: str) -> None:
    import warnings

    import hta  # noqa: F401

    warnings.filterwarnings("ignore")
    out = {"_provenance": {
        "tool": "HolisticTraceAnalysis 0.5.0 (pip install HolisticTraceAnalysis==0.5.0 'pandas<3' in build/hta-venv)",
        "made_with": "build/hta-venv/bin/python benchmarks/bench_trace.py --hta-reference datasets/traces/hta "
                     "> tests/data/hta_reference.json (TraceAnalysis(trace_dir=<folder holding one file>)"
                     ".get_temporal_breakdown(visualize=False) and .get_comm_comp_overlap(visualize=False), "
                     "one file per TraceAnalysis)",
        "traces": "datasets/traces/hta (facebookresearch/HolisticTraceAnalysis tests/data, commit f4d0062c, MIT)"},
        "files": {}}
    for key, f in trace_keys(folder).items():
        _, tb, ov = _hta_on(str(f))
        r = tb.iloc[0]
        o = None if ov is None else float(ov.iloc[0]["comp_comm_overlap_pctg"])
        out["files"][key] = {"rank": int(r["rank"]), "idle_time_pctg": float(r["idle_time_pctg"]),
                                "compute_time_pctg": float(r["compute_time_pctg"]),
                                "non_compute_time_pctg": float(r["non_compute_time_pctg"]),
                                "kernel_time_us": float(r["kernel_time(us)"]),
                                "comp_comm_overlap_pctg": None if o is None or o != o else o}
    print(json.dumps(out, indent=1))


def _best(fn, n=5) -> tuple[float, float]:
    """(best wall s, best CPU s) of ``n`` calls."""
    wall = cpu = float("inf")
    for _ in range(n):
        t0, c0 = time.perf_counter(), _cpu()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, _cpu() - c0)
    return wall, cpu


def main(folder: str) -> None:
    import gzip

    from labkit.trace import analyze, hta_summary

    files = list(trace_keys(folder).values())
    if not files:
        sys.exit(f"no *.json.gz traces in {folder}")
    cpu = sorted((ROOT / "datasets" / "traces" / "cpu_gloo_ddp_tiny").glob("*.json.gz"))[:1]
    print(f"{'file':<44} {'MB':>5} {'json s':>7} {'labkit s':>8} {'lk-hta s':>8} {'HTA s':>7} "
          f"{'HTA/lk-hta':>10} {'CPU ratio':>9} {'labkit/json':>11}")
    nan2 = (float("nan"), float("nan"))
    for f in files + cpu:
        # interleaved: each round times all three back to back, so load drift hits them alike
        js = lk = lh = (float("inf"), float("inf"))
        for _ in range(7):
            js = tuple(map(min, js, _best(lambda f=f: json.load(gzip.open(f)), 1)))
            lk = tuple(map(min, lk, _best(lambda f=f: analyze(f), 1)))
            if f not in cpu:
                lh = tuple(map(min, lh, _best(lambda f=f: hta_summary(f), 1)))
        lh = lh if f not in cpu else nan2
        hta = nan2
        if HTA_PY.exists() and f not in cpu:
            r = subprocess.run([str(HTA_PY), __file__, "--hta-time", str(f)], capture_output=True, text=True,
                               timeout=600)
            if r.returncode == 0:
                got = json.loads(r.stdout.strip().splitlines()[-1])
                hta = (got["seconds"], got["cpu_seconds"])
        mb = f.stat().st_size / 2**20
        print(f"{f.name[:44]:<44} {mb:5.2f} {js[0]:7.3f} {lk[0]:8.3f} {lh[0]:8.3f} {hta[0]:7.3f} "
              f"{hta[0] / lh[0]:10.1f} {hta[1] / lh[1]:9.1f} {lk[0] / js[0]:11.2f}")
    print("seconds: best wall time; CPU ratio: HTA's CPU seconds (its process and pool) / lk-hta's — the figure to "
          "read on a loaded machine")
    if not HTA_PY.exists():
        print(f"(HTA column empty: make {HTA_PY.parent.parent} with "
              "`python3 -m venv build/hta-venv && build/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0 'pandas<3'`)")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--hta-time":
        hta_time(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "--hta-reference":
        hta_reference(sys.argv[2])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else str(SHIPPED))
