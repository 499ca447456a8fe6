"""Validate the performance model against live gloo runs on this machine (issue #15).

:mod:`labkit.perf` predicts a step from a compute rate per rank and an α–β link. For a GPU cluster
both come from catalogues (a datasheet peak × an assumed achievable fraction; NVLink and InfiniBand
line rates). Here both are *measured* on the machine the CPU ranks run on, then fed to the same model:

- **compute**: the achieved hardware FLOP/s of a 1-rank run of the same model and micro-batch
  (``parallel="single"``, ``threads_per_rank`` threads — 1, as each of 2 ranks on 2 cores gets from
  the launcher): the "achievable fraction" calibrated on this machine. It is model-size specific
  (small matmuls reach less of the peak), so every model size is calibrated on its own.
- **communication**: α and β of the ring model fitted to a live gloo all-reduce sweep on N ranks
  (:func:`labkit.comm.benchmark`, :func:`labkit.comm.fit_alpha_beta`), one fit per rank count: on a
  2-core machine 4 ranks share the cores, and the 4-rank fit sees that.

The step of DDP or FSDP2 on N ranks is then (:func:`predict_step`, all three from
:mod:`labkit.perf.steptime`, the one home for step modelling)::

    compute = compute_time(tokens, hardware FLOPs/token, rate per rank, N ranks) × oversubscription
    comm    = data_parallel_comm_s(cfg, model, units, N, α–β; gloo: reduce-scatter = all-reduce)
    step    = step_time(compute, comm, overlap=False)

Assumptions, printed with every table:

- **oversubscription**: when ranks × threads per rank exceed the cores, the ranks time-share them and
  each rank's compute slows by (ranks × threads) / cores (a fair share, no cost for switching);
- **no overlap**: a rank's gloo thread needs a core too; with every core computing, communication does
  not hide under the backward pass (PLATFORM_NOTES: overlap gains are invisible on 2 cores);
- the 1-rank run's optimizer step, data loading and Python overheads count as compute; FSDP2's and
  DDP's own overheads (copies, hooks) are not in the rate — the 1-rank cells show how large they are.

Why not :func:`labkit.perf.predict`: its :class:`~labkit.perf.Cluster` is a catalogued GPU with an
HBM size, and its DP term is one all-reduce of all gradients (no per-bucket or per-unit latencies, no
gloo reduce-scatter); :func:`~labkit.perf.steptime.data_parallel_comm_s` prices the collectives a
:class:`~labkit.train.TrainConfig` issues (exact DDP buckets, FSDP units), so the steptime functions
express a CPU run without stretching the cluster type.

Layer 3 (ARCHITECTURE.md): it launches ranks and measures; the prediction itself is labkit.perf's.
Taught in chapter 5 (scaling), chapter 19 (DDP), chapter 20 (FSDP) and chapter 24 (choosing a layout:
how far to trust a model's numbers). Run ``benchmarks/bench_perf_model.py`` for the whole table.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from labkit import checks
from labkit.perf.steptime import compute_time, data_parallel_comm_s, step_time

__all__ = ["PARALLELS", "oversubscription", "compute_rate", "StepPrediction", "predict_step",
           "measure_compute_rate", "fit_gloo_link", "measure_steps", "Validation", "validate"]

#: The data-parallel strategies validated here (TrainConfig.parallel names: "fsdp" is FSDP2).
PARALLELS = ("ddp", "fsdp")
_MICRO_BATCH = {"tiny": 8, "small": 4}      # a step of ≈ 0.1–0.25 s on one core of this kind of machine


def oversubscription(nranks: int, cores: int, threads_per_rank: int = 1) -> float:
    """How much slower each rank computes when the ranks share the cores: max(1, ranks × threads / cores).

    Assumes a fair time-share and no cost for switching. Taught in chapter 5 (ranks share the cores).
    """
    n = checks.count("nranks", nranks)
    c = checks.count("cores", cores)
    t = checks.count("threads_per_rank", threads_per_rank)
    return max(1.0, n * t / c)


def compute_rate(record) -> float:
    """Achieved hardware FLOP/s per rank of a run: tokens per step × hardware FLOPs per token / median
    step / ranks — from a 1-rank run it is this machine's calibrated compute rate for that model.

    ``record``: a :class:`labkit.record.RunRecord` (or anything with its ``step_time``,
    ``tokens_per_step``, ``hardware_flops_per_token`` and ``n_devices``). Taught in chapter 5 and chapter 4.
    """
    missing = [k for k in ("step_time", "tokens_per_step", "hardware_flops_per_token", "n_devices")
               if getattr(record, k, None) is None]
    if missing:
        raise checks.ArgumentTypeError(f"record must be a labkit RunRecord with a measured step, got "
                                       f"{type(record).__name__} {record!r:.60} (no {', '.join(missing)})")
    step = checks.positive("record.step_time.median", record.step_time.median)
    tokens = checks.count("record.tokens_per_step", record.tokens_per_step)
    fpt = checks.positive("record.hardware_flops_per_token", record.hardware_flops_per_token)
    n = checks.count("record.n_devices", record.n_devices)
    return checks.finite_result("FLOP/s per rank", tokens * fpt / step / n, step=step, tokens=tokens)


@dataclass(frozen=True)
class StepPrediction:
    """A predicted step of a data-parallel :class:`~labkit.train.TrainConfig` on N CPU ranks, with the
    inputs it used (rate per rank, α, β, cores). Taught in chapter 5, chapters 19–20."""

    parallel: str
    nranks: int
    compute_s: float
    comm_s: float
    step_s: float
    oversubscription: float
    flops_per_s: float
    alpha_s: float
    beta_s_per_byte: float
    cores: int
    threads_per_rank: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _meta_model(cfg):
    """The GPT of ``cfg`` on the meta device: shapes only, for the exact DDP buckets."""
    import torch

    from labkit.models import GPT

    with torch.device("meta"):
        return GPT(cfg.model_config)


def predict_step(cfg, nranks: int, *, flops_per_s: float, alpha_beta, cores: int, threads_per_rank: int = 1,
                 params=None) -> StepPrediction:
    """Predict one optimizer step of ``cfg`` (parallel "ddp" or "fsdp" = FSDP2) on ``nranks`` gloo ranks.

    ``flops_per_s``: achieved hardware FLOP/s of one rank (:func:`compute_rate` of a 1-rank run);
    ``alpha_beta``: the link fitted on ``nranks`` ranks (:func:`fit_gloo_link`; None with 1 rank);
    ``cores``: cores the ranks share; ``params``: the model or a parameter count (default: the GPT of
    ``cfg`` on the meta device, for the exact DDP buckets). See the module docstring for the model and its
    assumptions. Taught in chapter 5 (scaling), chapter 19 (DDP) and chapter 20 (FSDP).
    """
    if not hasattr(cfg, "model_config") or not hasattr(cfg, "parallel"):
        raise checks.ArgumentTypeError(f"cfg must be a labkit.train.TrainConfig, got {type(cfg).__name__} "
                                       f"{cfg!r:.60}")
    checks.one_of("cfg.parallel", cfg.parallel, PARALLELS)
    n = checks.count("nranks", nranks)
    rate = checks.positive("flops_per_s", flops_per_s)
    if n > 1 and alpha_beta is None:
        raise ValueError(f"alpha_beta=None is not valid with nranks={n}: give the link fitted on {n} ranks "
                         "(fit_gloo_link)")
    if alpha_beta is not None and getattr(alpha_beta, "nranks", n) != n:
        raise ValueError(f"alpha_beta was fitted on {alpha_beta.nranks} ranks, not nranks={n}: on shared cores "
                         "the link depends on the rank count, fit one per count")
    over = oversubscription(n, cores, threads_per_rank)
    from labkit import flops

    mcfg = cfg.model_config
    fpt = flops.hardware_flops_per_token(mcfg.shape(), recompute="full" if cfg.checkpoint else "none")
    tokens = cfg.micro_batch * cfg.accum * n * mcfg.seq_len
    compute = compute_time(tokens, flops_per_token=fpt, peak_flops=rate, n_devices=n, mfu=1.0) * over
    model = _meta_model(cfg) if params is None else params
    comm = data_parallel_comm_s(cfg, model, mcfg.n_layers + 1, n, alpha_beta, reduce_scatter_as_all_reduce=True)
    a = alpha_beta.alpha_s if alpha_beta is not None else 0.0
    b = alpha_beta.beta_s_per_byte if alpha_beta is not None else 0.0
    return StepPrediction(parallel=cfg.parallel, nranks=n, compute_s=compute, comm_s=comm,
                          step_s=step_time(compute, comm, overlap=False), oversubscription=over,
                          flops_per_s=rate, alpha_s=a, beta_s_per_byte=b, cores=checks.count("cores", cores),
                          threads_per_rank=checks.count("threads_per_rank", threads_per_rank))


# ----------------------------------------------------------------------------- live measurement
def _rank_cells(cfgs: list) -> list:
    """What each launched rank runs: every config in turn (starting ranks is the slow part)."""
    from labkit.train import train

    return [train(c) for c in cfgs]


def measure_steps(cfgs, nranks: int, *, threads_per_rank: int = 1, timeout_s: float = 600) -> list:
    """Train each of ``cfgs`` in turn in the same ``nranks`` fresh ranks (``OMP_NUM_THREADS`` =
    ``threads_per_rank``); rank 0's :class:`~labkit.record.RunRecord` per config.
    Taught in chapter 5 (scaling), chapter 19 (DDP) and chapter 20 (FSDP)."""
    cfgs = list(cfgs)
    if not cfgs:
        raise ValueError("measure_steps needs at least one TrainConfig, got none")
    n = checks.count("nranks", nranks)
    t = checks.count("threads_per_rank", threads_per_rank)
    for c in cfgs:
        if getattr(c, "parallel", None) == "single" and n != 1:
            raise ValueError(f"nranks={n} with parallel='single' ({c.label}): use 'ddp' or 'fsdp' for > 1 rank")
    from labkit.launcher.parent import launch

    res = launch(_rank_cells, n, args=(cfgs,), env={"OMP_NUM_THREADS": str(t)}, timeout_s=timeout_s,
                 stream=False)
    return list(res.value)


def measure_compute_rate(cfg, *, threads_per_rank: int = 1, timeout_s: float = 600) -> tuple[float, object]:
    """(achieved hardware FLOP/s per rank, the record) of ``cfg`` trained alone on 1 rank with
    ``threads_per_rank`` threads — the compute input of :func:`predict_step`. Taught in chapter 5."""
    rec = measure_steps([cfg.replace(parallel="single", label=f"{cfg.label} 1-rank rate")], 1,
                        threads_per_rank=threads_per_rank, timeout_s=timeout_s)[0]
    return compute_rate(rec), rec


def fit_gloo_link(nranks: int, *, sizes=None, iters: int = 5, stat: str = "median", timeout_s: float = 300):
    """α and β (:class:`labkit.comm.AlphaBeta`) of an all-reduce sweep on ``nranks`` gloo ranks.

    ``sizes`` in bytes (default 64 KiB … 16 MiB, ×4: the tiny and small GPTs' buckets and FSDP units);
    ``stat``: the per-size time fitted, "median" (what a training step meets) or "p10" (the collective
    undisturbed). Taught in chapter 19 (DDP) and chapter 11 (α–β fits).
    """
    from labkit import comm

    n = checks.count("nranks", nranks, at_least=2)
    checks.one_of("stat", stat, ("median", "p10"))
    sizes = comm.default_sizes(64 * 1024, 16 * 2**20, 4) if sizes is None else list(sizes)
    t = comm.benchmark(["all_reduce"], sizes, n, iters=iters, warmup=2, backend="gloo", timeout_s=timeout_s).table
    col = "time_us" if stat == "median" else "p10_us"
    return comm.fit_alpha_beta(t["size"], t[col] * 1e-6, "all_reduce", n)


@dataclass
class Validation:
    """Predicted vs measured steps: ``table`` (one row per model × strategy × ranks), the compute rate
    per model, the link per rank count, cores, the target and the assumptions. Taught in chapter 24."""

    table: object
    rates: dict
    links: dict
    cores: int
    threads_per_rank: int
    target: float
    assumptions: list = field(default_factory=list)

    def format(self) -> str:
        out = [f"this machine: {self.cores} cores, {self.threads_per_rank} thread(s) per rank"]
        out += [f"compute rate ({m}, 1-rank run): {r / 1e9:.1f} GFLOP/s per rank" for m, r in self.rates.items()]
        out += [f"link on {n} ranks: alpha {ab.alpha_s * 1e6:.1f} us/step, beta {ab.beta_s_per_byte * 1e9:.3f} ns/B "
                f"({ab.bandwidth / 1e9:.2f} GB/s)" for n, ab in sorted(self.links.items())]
        cols = ["model", "parallel", "ranks", "oversub", "pred_compute_ms", "pred_comm_ms", "pred_step_ms",
                "meas_step_ms", "meas_p10_ms", "meas_p90_ms", "error"]
        t = self.table[cols].copy()
        t["error"] = [f"{e:+.1%}" for e in self.table["error"]]
        t[f"<={self.target:.0%}"] = ["met" if ok else "NOT met" for ok in self.table["met"]]
        t["oversub"] = [f"x{o:g}" for o in self.table["oversub"]]
        out.append(t.to_string(index=False, float_format=lambda v: f"{v:.1f}"))
        met = int(self.table["met"].sum())
        out.append(f"within {self.target:.0%}: {met} of {len(self.table)} cells")
        out += ["assumptions:", *(f"  - {a}" for a in self.assumptions)]
        return "\n".join(out)


def validate(models=("tiny", "small"), parallels=PARALLELS, nranks=(1, 2, 4), *, micro_batch: dict | None = None,
             steps: int = 7, warmup_steps: int = 2, threads_per_rank: int = 1, target: float = 0.15,
             link_iters: int = 5, timeout_s: float = 900, progress=None) -> Validation:
    """Calibrate this machine (a 1-rank run per model, an all-reduce fit per rank count), predict every
    model × strategy × rank-count step with :func:`predict_step`, then train each live on gloo ranks and
    compare with the median measured step. ``micro_batch``: {model: sequences per rank} (default 8 for
    "tiny", 4 for "small"); ``progress``: a callable given one line per stage (e.g. ``print``).
    Taught in chapter 24 (how far to trust a model), chapter 5, chapter 19 and chapter 20.
    """
    import pandas as pd

    from labkit.launcher.parent import cores_available
    from labkit.model_config import SIZES
    from labkit.train import TrainConfig

    say = progress or (lambda line: None)
    models = [checks.one_of("models", m, SIZES) for m in models]
    parallels = [checks.one_of("parallels", p, PARALLELS) for p in parallels]
    counts = sorted({checks.count("nranks", n) for n in nranks})
    if not models or not parallels or not counts:
        raise ValueError(f"models={models}, parallels={parallels} and nranks={counts} must each name at least one")
    checks.count("steps", steps, at_least=warmup_steps + 1)
    target = checks.fraction("target", target, open_low=True)
    mb = {**_MICRO_BATCH, **(micro_batch or {})}
    cores = cores_available()
    cfgs = {m: TrainConfig(model=m, micro_batch=checks.count(f"micro_batch[{m}]", mb.get(m, 4)), steps=steps,
                           warmup_steps=warmup_steps, dtype="fp32", device="cpu", label=m) for m in models}
    say(f"calibrating compute: 1 rank, {threads_per_rank} thread(s), models {models}")
    recs = measure_steps([c.replace(parallel="single") for c in cfgs.values()], 1,
                         threads_per_rank=threads_per_rank, timeout_s=timeout_s)
    rates = {m: compute_rate(r) for m, r in zip(models, recs, strict=True)}
    links = {}
    for n in (n for n in counts if n > 1):
        say(f"fitting alpha-beta: all-reduce sweep on {n} gloo ranks")
        links[n] = fit_gloo_link(n, iters=link_iters)
    preds = {(m, p, n): predict_step(cfgs[m].replace(parallel=p), n, flops_per_s=rates[m], alpha_beta=links.get(n),
                                     cores=cores, threads_per_rank=threads_per_rank)
             for m in models for p in parallels for n in counts}
    rows = []
    for n in counts:
        say(f"measuring: {len(models) * len(parallels)} runs on {n} rank(s)")
        cells = [(m, p) for m in models for p in parallels]
        measured = measure_steps([cfgs[m].replace(parallel=p, label=f"{m} {p} x{n}") for m, p in cells], n,
                                 threads_per_rank=threads_per_rank, timeout_s=timeout_s)
        for (m, p), rec in zip(cells, measured, strict=True):
            pr, st = preds[(m, p, n)], rec.step_time
            err = pr.step_s / st.median - 1
            rows.append({"model": m, "parallel": p, "ranks": n, "oversub": pr.oversubscription,
                         "pred_compute_ms": pr.compute_s * 1e3, "pred_comm_ms": pr.comm_s * 1e3,
                         "pred_step_ms": pr.step_s * 1e3, "meas_step_ms": st.median * 1e3,
                         "meas_p10_ms": st.p10 * 1e3, "meas_p90_ms": st.p90 * 1e3, "meas_steps": st.n,
                         "error": err, "met": abs(err) <= target})
    assumptions = [
        f"compute: hardware FLOP/s per rank from a 1-rank 'single' run of the same model and micro-batch "
        f"({', '.join(f'{m}: {mb.get(m, 4)}' for m in models)} sequences), {threads_per_rank} thread(s) per rank",
        f"oversubscription: ranks x threads > {cores} cores slows each rank's compute by ranks x threads / cores",
        "communication: ring alpha-beta fitted per rank count on a gloo all-reduce sweep (median per size); DDP: "
        "one all-reduce per bucket; FSDP2: per block + root unit an all-gather in forward and in backward "
        "(reshard_after_forward) and a reduce-scatter priced as an all-reduce (gloo has none)",
        "no overlap: step = compute + communication (a rank's gloo thread needs a core the compute holds)",
        f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {cores} cores",
    ]
    return Validation(table=pd.DataFrame(rows), rates=rates, links=links, cores=cores,
                      threads_per_rank=threads_per_rank, target=target, assumptions=assumptions)
