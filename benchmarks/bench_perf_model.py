"""The performance model against live gloo runs on this machine: predicted vs measured step times.

    .venv/bin/python benchmarks/bench_perf_model.py [--models tiny small] [--ranks 1 2 4] [--steps 5]
        [--repeats 3] [--rounds 3] [--mp tp pp tpxpp] [--mp-model small] [--mp-ranks 2 4]

``--parallels`` with no names skips the DDP/FSDP2 cells; ``--mp`` with no names skips the TP/PP ones.

First calibrate this machine with runs that are never the ones predicted (labkit.perf.validate.calibrate):
the compute rate a synchronous step keeps while N ranks train the same model independently with no communication (the
achievable rate at N ranks: sharing cores, memory bandwidth, caches), the data-parallel wrapper's own
seconds per unit from 1-rank DDP / FSDP2 runs against a 1-rank plain run, and α–β from the p10 of a gloo
sweep per collective type (all-reduce; FSDP2's all-gather and reduce-scatter) and rank count, and FSDP2's
unit cycle from a synthetic fully_shard stack. Then predict each model size × {DDP, FSDP2} × rank count with
labkit.perf.steptime's functions, train the same config live (warm-up steps, then the median of the
measured steps), and print the calibrated terms with their sources and a table: config, ranks, size,
predicted parts, predicted, measured, error %, within 15 %?. The goal (issue #15) is printed, never
asserted (the exit code is 0 unless a run fails).

Timings on a shared machine are noisy: every launch runs its configurations interleaved, --repeats times,
and keeps each one's median run; each rank count is calibrated just before it is measured; --rounds > 1
repeats everything and prints each cell's spread over the rounds. The load average is printed before and
after; read the table with it. About 4–5 minutes a round (13 minutes for the default 3) on an idle 2-core
machine, and as much again for the TP/PP cells.

The TP, PP (1F1B) and TP×PP cells (issue #24; :mod:`labkit.perf.validate.model_parallel`) are predicted the same
way — compute at the rate n plain ranks keep, measured in the same processes right after the cells; α–β of gloo
all-reduce and send/recv fitted on n ranks — and print each term: TP all-reduces (4 per block and micro-batch),
TP's own work (per column/row pair: a synthetic parallelize_module-d stack of the GPT's widths on tp ranks minus
its plain local shard run by all ranks at once and its bare all-reduces — DTensor and the wait at each collective:
labkit.perf.validate.tp_cycle), PP sends (2·v·m per rank, plus the tied embedding's all-reduce) and the bubble;
each rank's share of the compute by the measured times of the GPT's parts (embeddings, blocks, tail; a TP rank's
block by its measured local shard: labkit.perf.validate.stage_times), and the pipeline played op by op on this
machine's cores (labkit.perf.validate.pipeline_sim: with more ranks than cores a waiting rank's core goes to
the others).
"""
from __future__ import annotations

import argparse
import os
import time

from labkit.perf import validate as perf_validate
from labkit.perf.validate import model_parallel


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "small"])
    ap.add_argument("--parallels", nargs="*", default=list(perf_validate.PARALLELS))
    ap.add_argument("--mp", nargs="*", default=list(model_parallel.MP_KINDS), help="TP/PP cells (none: skip)")
    ap.add_argument("--mp-model", default="small")
    ap.add_argument("--mp-ranks", nargs="+", type=int, default=[2, 4])
    ap.add_argument("--mp-micro-batch", type=int, default=2)
    ap.add_argument("--mp-accum", type=int, default=4, help="micro-batches per step of the TP/PP cells (m)")
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=5, help="timed steps per run (after --warmup)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved runs per configuration in each launch")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--link-iters", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.15)
    ap.add_argument("--rounds", type=int, default=3,
                    help="repeat calibration + measurement; compare medians (one round's cells scatter by 15-30 %% here)")
    a = ap.parse_args(argv)
    print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    t0 = time.perf_counter()
    say = lambda s: print(f"# {s}", flush=True)                                        # noqa: E731
    if a.parallels:
        v = perf_validate.validate(a.models, a.parallels, a.ranks, steps=a.steps + a.warmup, warmup_steps=a.warmup,
                                   target=a.target, link_iters=a.link_iters, rounds=a.rounds, repeats=a.repeats,
                                   progress=say)
        print(v.format())
    if a.mp:
        mp = model_parallel.validate_mp(a.mp_model, a.mp, a.mp_ranks, micro_batch=a.mp_micro_batch, accum=a.mp_accum,
                                        steps=a.steps + a.warmup, warmup_steps=a.warmup, target=a.target,
                                        link_iters=a.link_iters, rounds=a.rounds, repeats=a.repeats, progress=say)
        print(mp.format())
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"wall time {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
