"""Trace analysis at the size of a real job: time and peak memory vs job size, and HTA 0.5.0 vs labkit.

Run from the repo root (issue #28)::

    .venv/bin/python benchmarks/bench_trace_scale.py                       # 2-core default: 4 ranks, up to 1,200 steps
    .venv/bin/python benchmarks/bench_trace_scale.py --ranks 16 --steps 5000 --nccl 8   # a big machine
    .venv/bin/python benchmarks/bench_trace_scale.py --hta-python /tmp/htavenv/bin/python

It writes a SYNTHETIC multi-rank job (Kineto layout as :mod:`labkit.trace.synthetic`: ``ProfilerStep#N``
on the host thread, ``cudaLaunchKernel`` linked by ``correlation`` to compute kernels on one stream and
``--nccl`` NCCL all-reduce kernels per step on another, a memcpy per step) at several sizes — a quarter,
half and all of ``--steps`` on half and all of ``--ranks`` — and analyses each in a fresh process
(``labkit.trace.analyze``: steps, breakdown, overlap, collectives, stragglers, top ops; imports excluded),
printing wall time, CPU seconds (the figure to read on a shared machine) and peak RSS above the process's RSS after its imports (the largest of the process and
its reader pool's workers) against the job's MB, and the slopes of log time and log
memory against log size (1 = linear). With ``--hta-python`` (a Python with HolisticTraceAnalysis==0.5.0 and
pandas < 3; default build/hta-venv, or ``LABKIT_HTA_PYTHON``) it also times HTA's TraceAnalysis +
get_temporal_breakdown + get_comm_comp_overlap on the largest job and on the shipped real traces
(datasets/traces/hta), in a fresh process each, and prints HTA ÷ labkit (goal ≥ 8).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "datasets" / "traces" / "hta"
_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_kernel"
_NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def write_rank(path: Path, rank: int, world: int, steps: int, kernels: int, nccl: int) -> None:
    """One rank's SYNTHETIC trace, written event by event (the generator never holds the job in memory)."""
    pid = tid = 1000 + rank
    corr = 1
    t = 1.7e12 + rank * 3.0
    with open(path, "w") as f:
        w = f.write
        w('{"schemaVersion": 1, "labkit_synthetic": {"SYNTHETIC": true, "generator": "benchmarks/bench_trace_scale.py",'
          f' "note": "SYNTHETIC trace for a scaling benchmark; not recorded on a GPU", "rank": {rank}}},'
          f' "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world}}},'
          ' "deviceProperties": [{"id": 0, "name": "SYNTHETIC GPU", "totalGlobalMem": 85899345920}],'
          ' "traceEvents": [\n')
        w(f'{{"ph": "M", "name": "thread_name", "pid": {pid}, "tid": {tid}, "args": {{"name": "thread (pt_main_thread)"}}}}')
        for s in range(steps):
            h0 = t
            dev = t + 20.0
            for j in range(kernels + nccl + 1):
                is_nccl = j >= kernels and j < kernels + nccl
                is_copy = j == kernels + nccl
                launch = h0 + 2.0 + 3.0 * j
                name = _NCCL if is_nccl else ("Memcpy DtoH (Device -> Pinned)" if is_copy else _GEMM)
                cat = "gpu_memcpy" if is_copy else "kernel"
                stream = 20 if is_nccl else 7
                dur = 120.0 if is_nccl else (15.0 if is_copy else 40.0 + (j % 7))
                start = dev if not is_nccl else dev - 60.0     # NCCL partly under the last compute kernels
                w(f',\n{{"ph": "X", "cat": "cuda_runtime", "name": "{"cudaMemcpyAsync" if is_copy else "cudaLaunchKernel"}",'
                  f' "pid": {pid}, "tid": {tid}, "ts": {launch:.3f}, "dur": 4.0,'
                  f' "args": {{"correlation": {corr}, "External id": {corr}}}}}')
                extra = (', "Collective name": "allreduce", "In msg nelems": 4194304, "Out msg nelems": 4194304, '
                         f'"Group size": {world}, "dtype": "Float"') if is_nccl else ""
                w(f',\n{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": 0, "tid": {stream}, "ts": {start:.3f},'
                  f' "dur": {dur}, "args": {{"device": 0, "stream": {stream}, "correlation": {corr},'
                  f' "External id": {corr}, "grid": [132, 1, 1], "block": [384, 1, 1],'
                  f' "registers per thread": 168, "est. achieved occupancy %": 12{extra}}}}}')
                corr += 1
                dev = max(dev, start + dur)
            end = dev + 30.0
            w(f',\n{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{s}", "pid": {pid}, "tid": {tid},'
              f' "ts": {h0:.3f}, "dur": {end - h0:.3f}, "args": {{}}}}')
            t = end
        w("\n], \"displayTimeUnit\": \"ms\"}\n")


def write_job(folder: Path, ranks: int, steps: int, kernels: int, nccl: int) -> float:
    folder.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        write_rank(folder / f"rank{r}.SYNTHETIC.pt.trace.json", r, ranks, steps, kernels, nccl)
    return sum(f.stat().st_size for f in folder.iterdir()) / 2**20


_LABKIT = """
import json, resource, sys, time
import pandas
from labkit.trace import analyze
def cpu():
    u, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime + c.ru_utime + c.ru_stime
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0, c0 = time.perf_counter(), cpu()
a = analyze(sys.argv[1], workers=int(sys.argv[2]))
a.summary()
dt, dc = time.perf_counter() - t0, cpu() - c0
rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "rss_mb": rss / 1024, "base_mb": base / 1024, "steps": len(a.steps),
                  "ranks": len(a.ranks)}))
"""

_HTA = """
import json, logging, os, resource, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
def cpu():
    u, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime + c.ru_utime + c.ru_stime
t0, c0 = time.perf_counter(), cpu()
ta = TraceAnalysis(trace_dir=sys.argv[1])
ta.get_temporal_breakdown(visualize=False)
try:
    ta.get_comm_comp_overlap(visualize=False)
except Exception:
    pass
dt, dc = time.perf_counter() - t0, cpu() - c0
rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"seconds": dt, "cpu_seconds": dc, "rss_mb": rss / 1024}))
"""


def run(python: str, code: str, folder: Path, env=None, timeout=1800, *extra) -> dict | None:
    r = subprocess.run([python, "-c", code, str(folder), *extra], capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=ROOT)
    if r.returncode:
        print(f"  ({Path(python).name} failed on {folder}: {r.stderr.strip().splitlines()[-1:]})")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def slope(xs, ys) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=4, help="ranks of the largest job (default 4)")
    ap.add_argument("--steps", type=int, default=1200, help="steps per rank of the largest job (default 1200)")
    ap.add_argument("--kernels", type=int, default=24, help="compute kernels per step (default 24)")
    ap.add_argument("--nccl", type=int, default=4, help="NCCL kernels per step (default 4)")
    ap.add_argument("--hta-python", default=os.environ.get("LABKIT_HTA_PYTHON", str(ROOT / "build/hta-venv/bin/python")))
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds on each shipped trace (default 3; "
                    "the generated job gets one)")
    ap.add_argument("--workers", type=int, default=1, help="labkit's reader processes (default 1: its CPU seconds "
                    "are then all in one process, and on a shared machine CPU seconds are the figure to read)")
    ap.add_argument("--keep", help="write the jobs under this folder and keep them (default: a temp folder)")
    args = ap.parse_args()
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="labkit-trace-scale-"))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    sizes = sorted({(max(args.ranks // 2, 1), args.steps // 4), (max(args.ranks // 2, 1), args.steps // 2),
                    (args.ranks, args.steps // 2), (args.ranks, args.steps)})
    rows = []
    print(f"SYNTHETIC jobs ({args.kernels} compute + {args.nccl} NCCL kernels per step) in {base}; "
          f"cores: {len(os.sched_getaffinity(0))}")
    print(f"{'ranks':>5} {'steps':>6} {'MB':>8} {'labkit s':>9} {'CPU s':>7} {'+peak MB':>8} {'MB/CPU s':>8}")
    for ranks, steps in sizes:
        folder = base / f"job_{ranks}x{steps}"
        mb = write_job(folder, ranks, steps, args.kernels, args.nccl)
        r = run(sys.executable, _LABKIT, folder, env, 1800, str(args.workers))
        if r is None:
            continue
        peak = max(r["rss_mb"] - r["base_mb"], 1.0)
        rows.append((ranks, steps, mb, r["cpu_seconds"], peak, folder))
        print(f"{ranks:>5} {steps:>6} {mb:8.1f} {r['seconds']:9.2f} {r['cpu_seconds']:7.2f} {peak:8.0f} "
              f"{mb / r['cpu_seconds']:8.1f}")
    if len(rows) >= 2:
        mbs = [x[2] for x in rows]
        print(f"slope of log CPU time vs log size: {slope(mbs, [x[3] for x in rows]):.2f}; of log peak memory: "
              f"{slope(mbs, [x[4] for x in rows]):.2f}  (1 = linear)")
        one = [x for x in rows if x[0] == rows[-1][0]]
        if len(one) >= 2:
            print(f"  at {one[0][0]} ranks (steps only): time slope {slope([x[2] for x in one], [x[3] for x in one]):.2f}, "
                  f"memory slope {slope([x[2] for x in one], [x[4] for x in one]):.2f}")
    hta = Path(args.hta_python)
    if not hta.exists():
        print(f"(no HTA: {hta} does not exist; make a venv with HolisticTraceAnalysis==0.5.0 'pandas<3' and pass "
              "--hta-python)")
    else:
        print(f"HTA 0.5.0 ({hta}) vs labkit, each in a fresh process (interpreter start and imports excluded):")
        targets = [(f"SYNTHETIC job {rows[-1][0]}x{rows[-1][1]} ({rows[-1][2]:.0f} MB)", rows[-1][5])] if rows else []
        tmp = Path(tempfile.mkdtemp(prefix="labkit-hta-one-"))
        for f in sorted(SHIPPED.rglob("*.json.gz")):          # HTA reads a folder: one file per folder
            d = tmp / f.stem.replace(".", "_")
            d.mkdir()
            os.symlink(f.resolve(), d / f.name)
            targets.append((f"{f.parent.name}/{f.name} ({f.stat().st_size / 2**20:.1f} MB gz)", d))
        for k, (label, folder) in enumerate(targets):
            # interleaved rounds, best of each: load drift on a shared machine hits both alike
            inf = {"seconds": math.inf, "cpu_seconds": math.inf}
            lk, hs = dict(inf), dict(inf)
            for _ in range(1 if k == 0 and rows else args.rounds):
                got = run(sys.executable, _LABKIT, folder, env, 1800, str(args.workers)) or inf
                lk = {key: min(lk[key], got[key]) for key in inf}
                got = run(str(hta), _HTA, folder, dict(os.environ, PYTHONPATH="")) or inf
                hs = {key: min(hs[key], got[key]) for key in inf}
            print(f"  {label:<62} wall: labkit {lk['seconds']:6.2f} s, HTA {hs['seconds']:6.2f} s, "
                  f"{hs['seconds'] / lk['seconds']:5.1f}x;  CPU: labkit {lk['cpu_seconds']:6.2f} s, "
                  f"HTA {hs['cpu_seconds']:6.2f} s, {hs['cpu_seconds'] / lk['cpu_seconds']:5.1f}x")
        shutil.rmtree(tmp)
    if not args.keep:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
