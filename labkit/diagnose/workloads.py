"""Runs with a bottleneck injected on purpose, profiled — for checking that :func:`labkit.diagnose.diagnose`
names what we made (chapters 2, 9 and 14, ``labkit diagnose --inject``).

A workload is a :class:`labkit.train.TrainConfig` of the reference trainer — the same model, loop and
record the chapters teach — with one of its ``inject`` options set (:mod:`labkit.train.inject`) and a
profiler trace per rank. Sizes: the tiny GPT at 128 sequences × 8 tokens per micro-batch (1024 rows
per GEMM), so the compute injection (micro-batches of one sequence) makes GEMMs 128× smaller. Measured
with 1 thread per rank on an AMD EPYC (Zen 5), whose AVX-512 keeps even small GEMMs busy: baseline MFU
0.63–0.65, compute injection 0.09–0.10 (at 32 × 32 tokens the injection only fell to 0.36–0.40, above the
30 % threshold: a 32-row GEMM is not small enough on every CPU).

Taught in chapter 14 (systematic diagnosis).
"""
from __future__ import annotations

from pathlib import Path

from labkit.train import INJECTIONS, TrainConfig, run_many

# the baseline every injection is made against: DDP on gloo ranks, one gradient bucket
BASELINE = TrainConfig(model="small", seq_len=8, micro_batch=128, parallel="ddp", label="workload")


def workload(inject: str = "none", *, steps: int = 6, warmup_steps: int = 2, **changes) -> TrainConfig:
    """The baseline with ``inject`` on: ``warmup_steps`` un-timed steps, then ``steps`` timed and
    profiled ones; ``changes`` override other TrainConfig fields. Taught in chapter 14."""
    if inject not in INJECTIONS:
        raise ValueError(f"inject={inject!r} is not valid; choose one of {INJECTIONS}")
    return BASELINE.replace(inject=inject, steps=steps + warmup_steps, warmup_steps=warmup_steps,
                            profile_steps=steps, label=f"workload:{inject}", **changes)


def run_workloads(cfgs, out_dirs, nprocs: int = 2, *, timeout_s: float = 600) -> list:
    """Several workloads in one launch of ``nprocs`` ranks (process start is the slow part on a loaded
    machine); one :class:`~labkit.record.RunRecord` per config, its traces in the matching folder
    (``rank{r}.json``, older traces there removed first). Taught in chapter 14."""
    cfgs, out_dirs = list(cfgs), [Path(d) for d in out_dirs]
    if not cfgs or len(cfgs) != len(out_dirs):
        raise ValueError(f"need one out_dir per config (got {len(cfgs)} configs, {len(out_dirs)} folders)")
    for cfg in cfgs:
        if not isinstance(cfg, TrainConfig):
            raise TypeError(f"a workload is a labkit.train.TrainConfig (see workload()), got {type(cfg).__name__}")
    for out in out_dirs:
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("rank*.json"):
            old.unlink()
    runs = [c.replace(profile_dir=str(d)) for c, d in zip(cfgs, out_dirs, strict=True)]
    return run_many(runs, nprocs, timeout_s=timeout_s)


def run_workload(cfg: TrainConfig, out_dir, nprocs: int = 2, *, timeout_s: float = 300):
    """One workload on ``nprocs`` ranks; rank 0's record, traces in ``out_dir``. Taught in chapter 14."""
    return run_workloads([cfg], [out_dir], nprocs, timeout_s=timeout_s)[0]
