"""Trace analysis at job scale: time and peak memory vs ranks (16 → 128) and vs steps, HTA 0.5.0 beside it.

Run from the repo root (issue #35)::

    .venv/bin/python benchmarks/bench_trace_jobscale.py                      # 2-core default: 8 MB per rank
    .venv/bin/python benchmarks/bench_trace_jobscale.py --mb-per-rank 100    # the issue's size (~13 GB on disk)

It writes one SYNTHETIC rank file per rank of the largest job (the layout of
``benchmarks/bench_trace_scale.py``: ``ProfilerStep#N``, ``cudaLaunchKernel`` → compute kernels, NCCL
all-reduce kernels, a memcpy per step; every file ``--mb-per-rank`` MB, all with ``world_size`` the largest
job's) once, and makes each smaller job a folder of links to its first ranks; the steps sweep writes two more
16-rank jobs with a quarter and half the steps. Each job is analysed in a fresh process by
``labkit.trace.analyze`` then ``labkit.trace.critical_path`` (both streamed: every rank reduced to a summary
in ``--workers`` processes, :mod:`labkit.trace.summary`) and, where it can run, by HTA's
``TraceAnalysis`` + ``get_temporal_breakdown`` (``--hta-python``: a Python with HolisticTraceAnalysis==0.5.0
and pandas < 3, default build/hta-venv).

Memory is sampled from /proc every 50 ms over the whole process tree (the analysing process, its
forkserver and workers): ``peak MB`` is the most RSS the tree held at once, ``parent MB`` the analysing
process's high-water mark (VmHWM), ``worker MB`` the largest VmHWM of any other process in the tree (a
worker reading one rank). A process's fixed overhead (interpreter, numpy, pandas, msgspec imported) is
measured once and printed; ``worker/file`` is (worker MB − fixed) ÷ the largest file's MB, and each job's
worker peak and its parent peak are checked against the goal of issue #35, 2 × the largest file + the fixed
overhead (``ok`` or ``OVER``; printed, not asserted). ``parent MB/rank`` is the slope of the parent's peak against ranks. HTA is stopped where its tree
passes ``--hta-cap-gb`` or ``--hta-timeout`` seconds, and not run on larger jobs (the table says where and
why). Slopes are least-squares fits of log figure against log job MB (1 = linear). Delete the files with
``--clean`` (the default) or keep them with ``--keep``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_trace_scale import slope, write_rank  # noqa: E402

KERNELS, NCCL = 24, 4

_LABKIT = """
import json, sys, time
from labkit.trace import analyze, critical_path
import pandas
print("READY", flush=True); sys.stdin.readline()
t0 = time.perf_counter()
a = analyze(sys.argv[1], workers=int(sys.argv[2]))
a.summary()
t1 = time.perf_counter()
cp = critical_path(sys.argv[1], workers=int(sys.argv[2]))
cp.summary()
t2 = time.perf_counter()
print(json.dumps({"analyze_s": t1 - t0, "critical_path_s": t2 - t1, "ranks": len(a.ranks), "steps": len(a.steps),
                  "verdict": cp.verdict()}))
"""

_HTA = """
import json, logging, sys, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
print("READY", flush=True); sys.stdin.readline()
t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
ta.get_temporal_breakdown(visualize=False)
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""

_BASE = """
import sys, numpy, pandas, msgspec, labkit.trace, labkit.trace.summary
print(open("/proc/self/status").read().split("VmHWM:")[1].split()[0])
"""


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (from /proc/*/stat's parent ids)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float | None:
    """User + system CPU seconds of one process so far (/proc/PID/stat fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Samples a process tree's total RSS and each process's VmHWM every ``dt`` s; kills it past ``cap_kb``."""

    def __init__(self, pid: int, cap_kb: float = math.inf, dt: float = 0.05):
        super().__init__(daemon=True)
        self.pid, self.cap_kb, self.dt = pid, cap_kb, dt
        self.peak_kb = self.proc_kb = self.parent_kb = self.worker_kb = 0
        self.capped = False
        self.stop = threading.Event()
        self.cpu0 = _cpu_of(pid) or 0.0         # the imports, before the timed part
        self.cpu: dict[int, float] = {}

    @property
    def cpu_s(self) -> float:
        """CPU seconds of the tree since the start (each process's last sample; the last 50 ms may be missed)."""
        return sum(self.cpu.values()) - self.cpu0

    def run(self):
        while not self.stop.is_set():
            pids = _tree(self.pid)
            for q in pids:
                c = _cpu_of(q)
                if c is not None:
                    self.cpu[q] = c
            total = sum(_status_kb(p, "VmRSS:") for p in pids)
            self.peak_kb = max(self.peak_kb, total)
            hwm = {p: _status_kb(p, "VmHWM:") for p in pids}
            self.proc_kb = max([self.proc_kb, *hwm.values()])
            self.parent_kb = max(self.parent_kb, hwm.get(self.pid, 0))
            self.worker_kb = max([self.worker_kb] + [k for p, k in hwm.items() if p != self.pid])
            if total > self.cap_kb:
                self.capped = True
                for p in reversed(pids):
                    try:
                        os.kill(p, 9)
                    except OSError:
                        pass
                return
            time.sleep(self.dt)


def measure(python: str, code: str, folder: Path, extra=(), env=None, cap_gb=math.inf, timeout=3600) -> dict:
    """Run ``code`` on ``folder`` in a fresh process (timed after its imports), with the tree sampled."""
    p = subprocess.Popen([python, "-c", code, str(folder), *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = p.stdout.readline()
    if line.strip() != "READY":
        p.kill()
        return {"error": (line + p.stderr.read()).strip().splitlines()[-1:]}
    s = Sampler(p.pid, cap_gb * 2**20)
    s.start()
    t0 = time.perf_counter()
    p.stdin.write("go\n")
    p.stdin.flush()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for q in reversed(_tree(p.pid)):
            try:
                os.kill(q, 9)
            except OSError:
                pass
        p.communicate()
        s.stop.set()
        return {"error": f"stopped after {timeout:.0f} s (--hta-timeout)", "peak_mb": s.peak_kb / 1024}
    wall = time.perf_counter() - t0
    s.stop.set()
    s.join()
    cpu = s.cpu_s
    if s.capped:
        return {"error": f"stopped: its processes passed {cap_gb:g} GB (--hta-cap-gb) at {wall:.0f} s",
                "peak_mb": s.peak_kb / 1024}
    if p.returncode:
        return {"error": (err.strip().splitlines() or ["?"])[-1][:160], "peak_mb": s.peak_kb / 1024}
    r = json.loads(out.strip().splitlines()[-1])
    return {**r, "wall_s": r.get("seconds", r.get("analyze_s", 0) + r.get("critical_path_s", 0)), "process_s": wall,
            "cpu_s": cpu, "peak_mb": s.peak_kb / 1024, "proc_mb": s.proc_kb / 1024, "parent_mb": s.parent_kb / 1024,
            "worker_mb": s.worker_kb / 1024}


def _write(args):
    path, rank, world, steps = args
    if not path.exists():
        write_rank(path, rank, world, steps, KERNELS, NCCL)
    return path.stat().st_size


def make_jobs(base: Path, ranks: list[int], steps: int, steps_ranks: int, procs: int) -> dict:
    """The rank files (written once) and a folder of links per job: ranks sweep and steps sweep."""
    world = max(ranks)
    pool_dir = base / f"files_{steps}"
    pool_dir.mkdir(parents=True, exist_ok=True)
    todo = [(pool_dir / f"rank{r}.SYNTHETIC.pt.trace.json", r, world, steps) for r in range(world)]
    sweep = [(steps_ranks, steps // 4), (steps_ranks, steps // 2)] if steps_ranks else []
    for _, s in sweep:
        d = base / f"files_{s}"
        d.mkdir(exist_ok=True)
        todo += [(d / f"rank{r}.SYNTHETIC.pt.trace.json", r, world, s) for r in range(steps_ranks)]
    with Pool(procs) as pool:
        pool.map(_write, todo, chunksize=1)
    jobs = {}
    for n_ranks, s in [(r, steps) for r in ranks] + sweep:
        d = base / f"job_{n_ranks}x{s}"
        d.mkdir(exist_ok=True)
        for r in range(n_ranks):
            link = d / f"rank{r}.SYNTHETIC.pt.trace.json"
            if not link.exists():
                link.symlink_to(base / f"files_{s}" / link.name)
        sizes = [f.stat().st_size for f in d.iterdir()]
        jobs[(n_ranks, s)] = (d, sum(sizes) / 2**20, max(sizes) / 2**20)
    return jobs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb-per-rank", type=float, default=8.0, help="MB of trace per rank (default 8; the issue: 100)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 32, 64, 128])
    ap.add_argument("--steps-ranks", type=int, default=16, help="ranks of the steps sweep (default 16; 0: none)")
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)), help="labkit's processes")
    ap.add_argument("--dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "labkit-jobscale"))
    ap.add_argument("--keep", action="store_true", help="keep the generated files (default: delete them)")
    ap.add_argument("--hta-python", default=os.environ.get("LABKIT_HTA_PYTHON", str(ROOT / "build/hta-venv/bin/python")))
    ap.add_argument("--hta-cap-gb", type=float, default=6.0, help="stop HTA when its processes hold this much")
    ap.add_argument("--hta-timeout", type=float, default=600.0, help="stop HTA after this many seconds")
    args = ap.parse_args()
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    sample = base / "sample.json"
    write_rank(sample, 0, 1, 100, KERNELS, NCCL)
    per_step = (sample.stat().st_size - 400) / 100
    sample.unlink()
    steps = max(int(args.mb_per_rank * 2**20 / per_step), 8)
    cores = len(os.sched_getaffinity(0))
    t0 = time.perf_counter()
    jobs = make_jobs(base, sorted(args.ranks), steps, args.steps_ranks, cores)
    print(f"SYNTHETIC jobs in {base} ({KERNELS} compute + {NCCL} NCCL kernels per step, {steps} steps = "
          f"{args.mb_per_rank:g} MB per rank; written in {time.perf_counter() - t0:.0f} s); cores: {cores}, "
          f"labkit workers: {args.workers}")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    fixed = int(subprocess.run([sys.executable, "-c", _BASE], capture_output=True, text=True, env=env,
                               cwd=ROOT).stdout.strip()) / 1024
    print(f"fixed overhead: one process with labkit.trace, numpy, pandas, msgspec imported holds {fixed:.0f} MB")
    hta = Path(args.hta_python)
    hta_ok = hta.exists()
    if not hta_ok:
        print(f"(no HTA: {hta} does not exist; python3 -m venv build/hta-venv && build/hta-venv/bin/pip install "
              "HolisticTraceAnalysis==0.5.0 'pandas<3')")
    hta_stop = None
    print(f"goal (issue #35): worker and parent peak <= 2 x largest file + {fixed:.0f} MB fixed, whatever the rank count")
    print(f"{'ranks':>5} {'steps':>6} {'job MB':>8} {'file MB':>7} | {'labkit s':>8} {'(an.+cp)':>11} {'CPU s':>7} "
          f"{'peak MB':>7} {'parent MB':>9} {'goal':>4} {'worker MB':>9} {'worker/file':>11} {'goal':>4} | {'HTA s':>7} "
          f"{'HTA CPU s':>9} {'HTA peak MB':>11}")
    rows = {}
    # smallest job first: HTA runs until a job is too big for it, and is not tried on larger ones
    order = sorted(jobs, key=lambda k: jobs[k][1])
    for key in order:
        folder, mb, fmb = jobs[key]
        r = measure(sys.executable, _LABKIT, folder, (str(args.workers),), env)
        h = {"error": "no HTA"} if not hta_ok else {"error": hta_stop} if hta_stop else \
            measure(str(hta), _HTA, folder, env=dict(os.environ, PYTHONPATH=""), cap_gb=args.hta_cap_gb,
                    timeout=args.hta_timeout)
        if hta_ok and "error" in h and not hta_stop:
            hta_stop = f"not run: HTA stopped at {key[0]} ranks x {key[1]} steps ({h['error']})"
        rows[key] = (mb, fmb, r, h)
        if "error" in r:
            print(f"{key[0]:>5} {key[1]:>6} {mb:8.0f} {fmb:7.1f} | labkit failed: {r['error']}")
            continue
        hs = (f"{h['wall_s']:7.1f} {h['cpu_s']:9.1f} {h['peak_mb']:11.0f}" if "error" not in h else
              f"{h['error'][:90]}" + (f" (peak {h['peak_mb']:.0f} MB)" if h.get("peak_mb") else ""))
        print(f"{key[0]:>5} {key[1]:>6} {mb:8.0f} {fmb:7.1f} | {r['wall_s']:8.1f} "
              f"{r['analyze_s']:5.1f}+{r['critical_path_s']:<5.1f} {r['cpu_s']:7.1f} {r['peak_mb']:7.0f} "
              f"{r['parent_mb']:9.0f} {'ok' if r['parent_mb'] <= 2 * fmb + fixed else 'OVER':>4} "
              f"{_worker(r['worker_mb'], fmb, fixed)} | {hs}", flush=True)
    _slopes("vs ranks (fixed steps)", [rows[(r, steps)] for r in sorted(args.ranks) if (r, steps) in rows])
    _per_rank([(r, rows[(r, steps)]) for r in sorted(args.ranks) if (r, steps) in rows])
    _slopes(f"vs steps ({args.steps_ranks} ranks)", [rows[(args.steps_ranks, s)] for s in
                                                      (steps // 4, steps // 2, steps) if (args.steps_ranks, s) in rows])
    if hta_stop:
        print(f"HTA: {hta_stop}")
    if not args.keep:
        shutil.rmtree(base)
        print(f"deleted {base}")


def _worker(mb: float, fmb: float, fixed: float) -> str:
    """worker MB, worker/file and the goal's verdict; a job read in the parent alone (under
    ``runs.POOL_MIN_BYTES``, no pool) has no worker."""
    if mb == 0:
        return f"{'(none: read in the parent)':>31}"
    return f"{mb:9.0f} {(mb - fixed) / fmb:11.2f} {'ok' if mb <= 2 * fmb + fixed else 'OVER':>4}"


def _per_rank(rows) -> None:
    """The parent's growth per rank: least-squares slope of its peak (MB) against the rank count."""
    ok = [(n, r["parent_mb"], r["worker_mb"]) for n, (_, _, r, _) in rows if "error" not in r]
    if len(ok) < 2:
        return
    n_mean = sum(n for n, _, _ in ok) / len(ok)
    sxx = sum((n - n_mean) ** 2 for n, _, _ in ok)

    def fit(k):
        y_mean = sum(x[k] for x in ok) / len(ok)
        return sum((x[0] - n_mean) * (x[k] - y_mean) for x in ok) / sxx

    print(f"per rank (least squares over {[n for n, _, _ in ok]} ranks): parent MB/rank {fit(1):.2f}, "
          f"worker peak MB/rank {fit(2):.3f}")


def _slopes(label, rows) -> None:
    ok = [(mb, r, h) for mb, _, r, h in rows if "error" not in r]
    if len(ok) < 2:
        return
    mbs = [x[0] for x in ok]
    line = (f"slopes {label}: labkit time {slope(mbs, [x[1]['wall_s'] for x in ok]):.2f}, CPU "
            f"{slope(mbs, [x[1]['cpu_s'] for x in ok]):.2f}, peak memory {slope(mbs, [x[1]['peak_mb'] for x in ok]):.2f}, "
            f"largest process {slope(mbs, [x[1]['proc_mb'] for x in ok]):.2f}")
    hta = [(mb, h) for mb, _, h in ok if "error" not in h]
    if len(hta) >= 2:
        line += (f"; HTA time {slope([x[0] for x in hta], [x[1]['wall_s'] for x in hta]):.2f}, peak memory "
                 f"{slope([x[0] for x in hta], [x[1]['peak_mb'] for x in hta]):.2f}")
    print(line + "  (log-log vs job MB; 1 = linear)")


if __name__ == "__main__":
    main()
