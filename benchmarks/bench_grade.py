"""Grading throughput: submissions per minute with 1 and 2 workers, on the mini lab and on a real lab.

    .venv/bin/python benchmarks/bench_grade.py                    # mini lab (6 subs) + lab01_baseline (2 subs)
    .venv/bin/python benchmarks/bench_grade.py --labs mini --n 8
    .venv/bin/python benchmarks/bench_grade.py --probe-as         # which RLIMIT_AS lets torch train

Half the submissions are the instructor source (full work), half the released learner version (no work),
so a batch is a realistic mix. Each batch is graded from scratch (--force semantics: a fresh folder).
Figures are ratios within one run on this machine (other jobs share its cores): read the speed-up of 2
workers over 1, not the absolute rate.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "adversarial" / "mini_lab"


def batch(lab, n: int, workers: int, params: dict) -> tuple[float, float]:
    from labkit.teaching.grading import Limits, load_lab, release
    from labkit.teaching.grading.batch import GradeConfig, grade

    parsed = load_lab(lab)
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as tmp:
        tmp = Path(tmp)
        learner = release(parsed.source, tmp / "rel")
        subs = tmp / "subs"
        subs.mkdir()
        for i in range(n):
            shutil.copy(parsed.source if i % 2 == 0 else learner, subs / f"s{i:02d}.ipynb")
        cfg = GradeConfig(limits=Limits(notebook_s=600, cell_s=300), workers=workers, params=params,
                          progress=False)
        t0 = time.perf_counter()
        res = grade(parsed, [subs], tmp / "out", cfg)
        wall = time.perf_counter() - t0
        scores = sorted(r["score"] for r in res.rows)
    return wall, scores


def probe_as() -> None:
    """Train a tiny model for 2 steps under RLIMIT_AS caps; report which caps torch survives."""
    code = ("import resource,sys; lim=int(sys.argv[1])*2**20; resource.setrlimit(resource.RLIMIT_AS,(lim,lim));"
            "from labkit.train import TrainConfig, train, run;"
            "cfg=TrainConfig(steps=2, warmup_steps=1, micro_batch=2, seq_len=32);"
            "r=train(cfg) if sys.argv[2]=='single' else run(cfg.replace(parallel='ddp'), 2, timeout_s=120);"
            "print('ok, VmPeak', open('/proc/self/status').read().split('VmPeak:')[1].split()[0], 'kB')")
    for kind in ("single", "ddp x2"):
        for mb in (512, 768, 1024, 2048, 4096):
            r = subprocess.run([sys.executable, "-c", code, str(mb), kind.split()[0]], capture_output=True,
                               text=True, timeout=300)
            last = (r.stdout.strip().splitlines() or r.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{kind:<7} RLIMIT_AS {mb:>5} MiB: {'trains' if r.returncode == 0 else 'FAILS '}  {last[:100]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labs", nargs="+", default=["mini", "lab01_baseline"])
    ap.add_argument("--n", type=int, default=None, help="submissions per batch (default 6 mini, 2 real)")
    ap.add_argument("--probe-as", action="store_true", help="measure which RLIMIT_AS torch survives")
    args = ap.parse_args(argv)
    if args.probe_as:
        probe_as()
        return 0
    for lab in args.labs:
        path = MINI if lab == "mini" else lab
        n = args.n or (6 if lab == "mini" else 2)
        params = {} if lab == "mini" else {"FAST": True}
        rates = {}
        for workers in (1, 2):
            wall, scores = batch(path, n, workers, params)
            rates[workers] = n / wall * 60
            print(f"{lab:<16} {n} submissions, {workers} worker(s): {wall:7.1f} s  "
                  f"{rates[workers]:6.2f} submissions/min  scores {scores}")
        print(f"{lab:<16} speed-up of 2 workers over 1: {rates[2] / rates[1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
