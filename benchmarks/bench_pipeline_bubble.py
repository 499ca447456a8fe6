"""The pipeline bubble measured from traces against (p−1)/(v·m), on 2 gloo ranks (chapter 24).

Runs the "small" GPT (4 blocks) with pp=2 under GPipe, 1F1B (m = 2 and 8) and interleaved 1F1B (v = 2,
m = 8), profiles the last 2 steps of each, and prints each rank's measured bubble (idle time per compute
time inside the schedule, :func:`labkit.trace.pipeline_bubble`) beside the model's.

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/bench_pipeline_bubble.py [out_dir]
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from labkit.trace.pipeline import pipeline_bubble
from labkit.train import TrainConfig, run_many

CASES = (("gpipe", 2, 1), ("gpipe", 8, 1), ("1f1b", 2, 1), ("1f1b", 8, 1), ("interleaved1f1b", 8, 2))


def main(out: Path) -> None:
    base = TrainConfig(model="small", steps=4, warmup_steps=1, peak_flops=1e12, micro_batch=1)
    cfgs = []
    for schedule, m, v in CASES:
        folder = out / f"{schedule}_m{m}_v{v}"
        shutil.rmtree(folder, ignore_errors=True)
        cfgs.append(base.replace(pp=2, pp_schedule=schedule, accum=m, virtual_stages=v, profile_dir=str(folder),
                                 profile_steps=2))
    run_many(cfgs, 2, timeout_s=900)
    print(f"{'schedule':>16} {'m':>3} {'v':>2} {'model':>7} {'rank 0':>7} {'rank 1':>7}")
    for cfg in cfgs:
        b = pipeline_bubble(cfg.profile_dir, pp=2, micro_batches=cfg.accum, virtual_stages=cfg.virtual_stages)
        ranks = " ".join(f"{r.bubble:7.3f}" for r in b.ranks)
        print(f"{cfg.pp_schedule:>16} {cfg.accum:>3} {cfg.virtual_stages:>2} {b.predicted:7.3f} {ranks}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/bench_pipeline_bubble"))
