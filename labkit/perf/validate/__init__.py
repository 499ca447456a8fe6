"""Validate the performance model against live gloo runs on this machine (issue #15): one package, three files —
:mod:`~labkit.perf.validate.cells` (predict and compare), :mod:`~labkit.perf.validate.fit` (α–β per gloo
collective, FSDP2's unit cycle), :mod:`~labkit.perf.validate.runs` (the launches: interleaved repeats,
median runs, the rate N ranks keep); :mod:`~labkit.perf.validate.model_parallel` prices and measures the TP, PP and
TP×PP cells of the trainer the same way (issue #24: TP all-reduces, PP sends, the bubble);
:mod:`~labkit.perf.validate.tp_cycle` measures what TP adds to the GPT's own blocks (all-reduces, DTensor, waits) and
:mod:`~labkit.perf.validate.stage_times` divides a GPT's time between pipeline ranks by its measured parts (a TP
rank's block by its measured local shard); :mod:`~labkit.perf.validate.pipeline_sim` plays a GPipe or 1F1B step op
by op on fewer cores than ranks.

`labkit.perf` predicts a step from a compute rate per rank and an α–β link. For a GPU cluster
both come from catalogues (a datasheet peak × an assumed achievable fraction; NVLink and InfiniBand
line rates). Here every input is *measured* on the machine the CPU ranks run on, by calibration runs
that are never the runs being predicted (:func:`calibrate`):

- **compute at this concurrency**: the achieved hardware FLOP/s a synchronous step keeps (:func:`labkit.perf.validate.runs.pace`: the
  slowest rank's while each has a core, else the harmonic mean) while N ranks train the same
  model independently, with no communication (``parallel="single"``, one thread each) — the "achievable
  rate at N ranks", as one measures a GPU's achievable rate instead of assuming it. It holds what
  sharing the machine costs (cores when ranks exceed them, memory bandwidth, caches); 1 rank alone gives
  the rate of the 1-rank cells. :func:`labkit.perf.steptime.concurrency_slowdown` is the ratio.
- **the wrapper's own work**: a 1-rank DDP and a 1-rank FSDP2 run against the 1-rank plain run of the
  same model give seconds per wrapped unit (DDP bucket, FSDP2 unit) and micro-batch
  (:func:`labkit.perf.steptime.unit_overhead_s`): FSDP2's gathers, frees, copies and hooks that a plain
  compute rate does not hold.
- **communication**: α and β of the ring model fitted to a live gloo sweep on N ranks of each collective
  the wrappers issue — all-reduce (DDP), all-gather and reduce-scatter (FSDP2's ``all_gather_single`` /
  ``reduce_scatter_single``; gloo runs them slower per call than its all-reduce) — from each size's p10
  (the collective undisturbed, as ``benchmarks/bench_alpha_beta.py``); one fit per op and rank count
  (:mod:`labkit.perf.validate.fit`), so 4 ranks on 2 cores are fitted as they run.
- **FSDP2's unit cycle at N ranks** (gathers, copies, waits, reduce-scatter; more than the bare collectives):
  :func:`fsdp_unit_cycle`, a synthetic Linear stack on N ranks − 1 rank, a + b·bytes per unit; it *replaces*
  the FSDP2 α–β seconds above (it contains the collectives), which are printed, not added.

The step of DDP or FSDP2 on N ranks is then (:func:`predict_step`, from :mod:`labkit.perf.steptime`)::

    compute  = compute_time(tokens, hardware FLOPs/token, the pace of N ranks computing)
    comm     = data_parallel_comm_s(cfg, model, units, N, α–β per collective type)      (DDP)
             = micro-batches × Σ_units (a + b·unit bytes), the calibrated unit cycle       (FSDP2)
    wrapper  = per-unit seconds × units × micro-batches × concurrency slowdown (CPU work on shared cores)
    step     = compute + comm + wrapper

Assumptions, printed with every table:

- **no overlap**: a rank's gloo thread needs a core too; with every core computing, communication does
  not hide under the backward pass (PLATFORM_NOTES: overlap gains are invisible on 2 cores);
- the wrapper's per-unit cost measured on 1 rank holds on N ranks, slowed as compute is; FSDP2's extra cost
  per unit on N ranks is that of a synthetic unit of the same bytes (a GPT block's hooks add none);
- the 1-rank plain run's optimizer step, data loading and Python overheads count as compute;
- the 1-rank DDP and FSDP2 cells repeat a calibration configuration (a separate run): they check
  repeatability, not the model; the 2- and 4-rank cells are the model's test.
- given a 1-rank rate, ranks × threads beyond the cores slow compute by their ratio (:func:`oversubscription`).

Why not :func:`labkit.perf.predict`: its Cluster is a catalogued GPU and its DP term one all-reduce of all
gradients; :func:`~labkit.perf.steptime.data_parallel_comm_s` prices the collectives a TrainConfig issues
(exact DDP buckets, FSDP units, gloo's reduce-scatter), without stretching the cluster type.

Every launch runs its configurations interleaved, ``repeats`` times, and keeps each one's median run
(:mod:`labkit.perf.validate.runs`): this machine's speed drifts over seconds, and one short run per
configuration lets a slow moment land on one side of a comparison only. For the same reason each rank
count's links and unit cycle are calibrated just before its cells are measured, and :func:`validate` takes
the compute rate at N ranks in the *same launch* as the N-rank cells, right after them (the ranks leave
the process group and train plain): the same 1-rank run came out at 32–36 GFLOP/s in six launches a
minute apart on this kind of VM, and a rate measured in other processes carries such a difference into the
prediction.

Layer 3 (ARCHITECTURE.md): it launches ranks and measures; the prediction is labkit.perf's (and the unit
cycle's, :mod:`labkit.perf.validate.fit`). Taught in chapter 5 (scaling), chapter 19 (DDP), chapter 20 (FSDP)
and chapter 24 (choosing a layout: how far to trust a model's numbers). Run ``benchmarks/bench_perf_model.py`` for the whole table.
"""
from __future__ import annotations

from labkit.perf.validate.cells import (
    PARALLELS,
    Calibration,
    StepPrediction,
    Validation,
    calibrate,
    calibrate_count,
    calibrate_one_rank,
    oversubscription,
    predict_step,
    validate,
    wrapped_units,
)
from labkit.perf.validate.fit import (
    CYCLE_UNIT_BYTES,
    LINK_OPS,
    UnitCycle,
    fit_gloo_link,
    fit_gloo_links,
    fit_unit_cycle,
    fsdp_cycle_s,
    fsdp_unit_bytes,
    fsdp_unit_cycle,
    medians_over_rounds,
)
from labkit.perf.validate.pipeline_sim import PipelinePlay, play_schedule
from labkit.perf.validate.runs import (
    compute_rate,
    measure_compute_rate,
    measure_concurrent_rates,
    measure_steps,
    measure_steps_then_rates,
    median_run,
    pace,
    run_medians,
)
from labkit.perf.validate.stage_times import PartTimes, measure_part_times, rank_time_shares, shard_block
from labkit.perf.validate.tp_cycle import TPCycle, fit_tp_cycle, tp_block_cycle

__all__ = ["PARALLELS", "Calibration", "StepPrediction", "Validation", "calibrate", "calibrate_count",
           "calibrate_one_rank", "oversubscription", "predict_step", "validate", "wrapped_units",
           "CYCLE_UNIT_BYTES", "LINK_OPS", "UnitCycle", "fit_gloo_link", "fit_gloo_links", "fit_unit_cycle",
           "fsdp_cycle_s", "fsdp_unit_bytes", "fsdp_unit_cycle", "medians_over_rounds", "compute_rate",
           "measure_compute_rate", "measure_concurrent_rates", "measure_steps", "measure_steps_then_rates",
           "median_run", "pace", "run_medians", "TPCycle", "fit_tp_cycle", "tp_block_cycle",
           "PartTimes", "measure_part_times", "rank_time_shares", "shard_block", "PipelinePlay", "play_schedule"]
