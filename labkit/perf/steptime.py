"""Step-time modelling: what a training step should take, from its parts.

The one home for predicting a step (ARCHITECTURE.md). A data-parallel step is compute, gradient
communication that may hide under the backward pass, and a serial remainder ("sync": the last bucket,
the optimizer step, barriers)::

    step ≈ max(compute, comm) + sync     when communication overlaps the backward pass
    step ≈ compute + comm + sync         when it cannot (no overlap)

(the DDP design: Li et al. 2020, "PyTorch Distributed", VLDB, §3.2.3 on bucketing and overlap).
Compute comes from FLOPs and an achieved fraction of peak (the MFU definition solved for time —
PaLM, Chowdhery et al. 2022, App. B); communication from the α–β collective models of
:mod:`labkit.comm.models` applied to the collectives a data-parallel strategy issues per step.

Taught in chapter 5 (step models, the BERT-large case), chapter 1 (tokens/s at an MFU) and chapters
19–20 (communication per step of DDP and FSDP). The performance model and layout planner grow here.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

from labkit import checks
from labkit.comm.models import ring_time
from labkit.memory.buffers import comm_buffer_bytes

__all__ = ["step_time", "StepParts", "decompose", "compute_time", "tokens_per_s_at", "data_parallel_comm_s",
           "concurrency_slowdown", "unit_overhead_s", "wrapper_overhead_s"]


def step_time(compute_s: float, comm_s: float, sync_s: float = 0.0, *, overlap: bool | float = True) -> float:
    """Modelled step time from its parts.

    ``overlap=True``: max(compute, comm) + sync; ``False``: compute + comm + sync; a float f in [0, 1]
    hides that fraction of the overlappable part: compute + comm − f·min(compute, comm) + sync.
    Taught in chapter 5.
    """
    c, m, s = checks.nonneg("compute_s", compute_s), checks.nonneg("comm_s", comm_s), \
        checks.nonneg("sync_s", sync_s)
    f = _overlap(overlap)
    return checks.finite_result("step time", c + m - f * min(c, m) + s, compute_s=compute_s, comm_s=comm_s,
                                sync_s=sync_s)


def _overlap(overlap) -> float:
    """True → 1, False → 0, a number → a fraction in [0, 1] (a NumPy bool counts as a bool)."""
    import numpy as np

    if isinstance(overlap, bool | np.bool_):
        return 1.0 if overlap else 0.0
    if isinstance(overlap, str) or not isinstance(overlap, numbers.Real):
        raise checks.ArgumentTypeError(f"overlap must be True, False or a fraction in [0, 1], got "
                                       f"{type(overlap).__name__} {overlap!r}")
    return checks.fraction("overlap", overlap)


@dataclass(frozen=True)
class StepParts:
    """The parts of one data-parallel step, in seconds (per device)."""

    compute_s: float
    comm_s: float
    sync_s: float = 0.0

    def __post_init__(self):
        for name in ("compute_s", "comm_s", "sync_s"):
            object.__setattr__(self, name, checks.nonneg(name, getattr(self, name)))

    def step(self, overlap: bool | float = True) -> float:
        return step_time(self.compute_s, self.comm_s, self.sync_s, overlap=overlap)

    def exposed_comm(self, overlap: bool | float = True) -> float:
        """Communication time not hidden under compute."""
        return self.step(overlap) - self.compute_s - self.sync_s


def decompose(t1_s: float, n: int, serial_step_s: float, overlapped_step_s: float) -> StepParts:
    """Rebuild compute/comm/sync from a case's numbers (strong scaling, work split perfectly).

    compute = t_1/N; the two step models differ by min(compute, comm), so
    comm = serial − overlapped (when that is < compute) and sync = overlapped − max(compute, comm).
    Raises ValueError when the numbers cannot come from this model. Taught in chapter 5 (BERT-large case).
    """
    t1, n = checks.positive("t1_s", t1_s), checks.count("n", n)
    ts, to = checks.positive("serial_step_s", serial_step_s), checks.positive("overlapped_step_s", overlapped_step_s)
    compute = t1 / n
    if to > ts:
        raise ValueError(f"overlapped_step_s ({to}) cannot exceed serial_step_s ({ts})")
    hidden = ts - to                      # = min(compute, comm)
    if hidden > compute + 1e-12:
        raise ValueError(f"serial_step_s − overlapped_step_s = {hidden:.4g} s exceeds the compute t1_s/n = "
                         f"{compute:.4g} s; overlap can hide at most the compute time")
    comm = hidden
    sync = to - max(compute, comm)
    if sync < -1e-12:
        raise ValueError(f"overlapped_step_s ({to}) is below max(compute, comm) = {max(compute, comm):.4g} s")
    return StepParts(compute_s=compute, comm_s=comm, sync_s=max(sync, 0.0))


def compute_time(tokens: float, *, flops_per_token: float, peak_flops: float, n_devices: int,
                 mfu: float) -> float:
    """Seconds of compute for ``tokens`` (global) at an achieved fraction ``mfu`` of the per-device peak:
    tokens × FLOPs-per-token / (MFU × peak × devices). Taught in chapter 5 and chapter 1."""
    t = checks.positive("tokens", tokens) / tokens_per_s_at(mfu=mfu, peak_flops=peak_flops,
                                                            n_devices=n_devices, flops_per_token=flops_per_token)
    return checks.finite_result("compute seconds", t, tokens=tokens, mfu=mfu, peak_flops=peak_flops,
                                flops_per_token=flops_per_token)


def tokens_per_s_at(*, mfu: float, peak_flops: float, n_devices: int, flops_per_token: float) -> float:
    """Global tokens/s a run reaches at a given MFU (the MFU definition solved for tokens/s).

    tokens/s = MFU × peak × devices / FLOPs-per-token — PaLM (Chowdhery et al. 2022, App. B).
    Taught in chapter 1; chapter 4 defines MFU itself (``labkit.flops.mfu``).
    """
    from labkit.flops.mfu import tokens_per_s_for_mfu

    m = checks.number("mfu", mfu)
    if not 0 < m <= 1:
        raise ValueError(f"mfu must be a fraction in (0, 1], got {mfu!r} (give 0.4 for 40%)")
    return tokens_per_s_for_mfu(m, flops_per_token=checks.positive("flops_per_token", flops_per_token),
                                n_devices=checks.count("n_devices", n_devices),
                                peak_flops=checks.positive("peak_flops", peak_flops))


def data_parallel_comm_s(cfg, params, n_units: int, nranks: int, alpha_beta, *,
                         reduce_scatter_as_all_reduce: bool = False, op_links: dict | None = None) -> float:
    """α–β estimate of the communication seconds per optimizer step of ``cfg`` (a
    :class:`labkit.train.TrainConfig`, ring model).

    ``params``: the model (exact DDP buckets, :func:`labkit.memory.ddp_bucket_sizes`) or a parameter
    count. DDP: one all-reduce per gradient bucket, once per step (``no_sync`` during accumulation).
    FSDP: per micro-batch an all-gather of the parameters in forward and, when resharding after
    forward, again in backward; per step one reduce-scatter of the gradients; ``n_units`` collectives
    each (FSDP1 NO_SHARD: one all-reduce per unit). ``alpha_beta``: an object with ``alpha_s`` and
    ``beta_s_per_byte`` (:class:`labkit.comm.AlphaBeta`). ``reduce_scatter_as_all_reduce``: price each
    reduce-scatter as an all-reduce of its full input — gloo has no native reduce-scatter and runs it
    that way (PLATFORM_NOTES), so use True for CPU ranks. ``op_links``: {"all_gather": α–β,
    "reduce_scatter": α–β} fitted to sweeps of those collectives themselves
    (:func:`labkit.perf.validate.fit.fit_gloo_links`): FSDP's all-gathers and reduce-scatters are then priced
    with their own fit (each as its ring formula; the reduce-scatter fit already holds how the backend runs
    it, so ``reduce_scatter_as_all_reduce`` no longer applies to it); ops missing from it use ``alpha_beta``.
    Taught in chapter 19 and chapter 20.
    """
    rs_op = "all_reduce" if checks.flag("reduce_scatter_as_all_reduce", reduce_scatter_as_all_reduce) \
        else "reduce_scatter"
    nranks = checks.count("nranks", nranks)
    n_units = checks.count("n_units", n_units)
    missing = [k for k in ("parallel", "mp_policy", "bucket_cap_mb", "reshard_after_forward",
                           "sharding_strategy", "accum") if not hasattr(cfg, k)]
    if missing:
        raise checks.ArgumentTypeError(f"cfg must be a labkit.train.TrainConfig, got {type(cfg).__name__} "
                                       f"{cfg!r:.60} (no {', '.join(missing)})")
    checks.one_of("cfg.parallel", cfg.parallel, ("single", "ddp", "fsdp", "fsdp1"))
    accum = checks.count("cfg.accum", cfg.accum)
    if hasattr(params, "parameters"):
        n_params = sum(p.numel() for p in dict.fromkeys(params.parameters()))
    else:
        n_params = checks.count("params", params, at_least=0)
    if alpha_beta is not None and not (hasattr(alpha_beta, "alpha_s") and hasattr(alpha_beta, "beta_s_per_byte")):
        raise checks.ArgumentTypeError(f"alpha_beta must have alpha_s and beta_s_per_byte (a labkit.comm.AlphaBeta) "
                                       f"or be None, got {type(alpha_beta).__name__} {alpha_beta!r:.60}")
    links = _op_links(op_links, nranks)
    if nranks < 2 or alpha_beta is None:
        return 0.0
    a = checks.nonneg("alpha_beta.alpha_s", alpha_beta.alpha_s)
    b = checks.nonneg("alpha_beta.beta_s_per_byte", alpha_beta.beta_s_per_byte)
    parallel, low = cfg.parallel, cfg.mp_policy == "bf16"
    if parallel == "ddp":
        exact = params if hasattr(params, "parameters") else n_params   # a module gives the exact buckets
        cap = 25.0 if cfg.bucket_cap_mb is None else cfg.bucket_cap_mb      # None: torch's default cap
        bufs = comm_buffer_bytes(exact, strategy="ddp", precision="fp32", bucket_cap_mb=cap)
        t = sum(ring_time("all_reduce", s, nranks, alpha=a, beta=b) for s in bufs["bucket_bytes"])
        return checks.finite_result("communication seconds", t, params=params, alpha_beta=alpha_beta)
    if parallel == "single":
        return 0.0
    reshard = cfg.reshard_after_forward is not False   # None (root kept) and an int (smaller group): bounded above
    if parallel == "fsdp1":
        if cfg.sharding_strategy == "NO_SHARD":
            return n_units * ring_time("all_reduce", n_params * 4 / n_units, nranks, alpha=a, beta=b)
        reshard = cfg.sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")
    pbytes = n_params * (2 if low else 4)
    ag_a, ag_b = links.get("all_gather", (a, b))
    ag = ring_time("all_gather", pbytes / n_units, nranks, alpha=ag_a, beta=ag_b) * n_units
    if "reduce_scatter" in links:
        rs_op, (a, b) = "reduce_scatter", links["reduce_scatter"]
    rs = ring_time(rs_op, n_params * 4 / n_units, nranks, alpha=a, beta=b) * n_units
    t = accum * ag * (2 if reshard else 1) + rs
    return checks.finite_result("communication seconds", t, params=params, alpha_beta=alpha_beta)


def _op_links(op_links, nranks: int) -> dict:
    """{op: (α, β)} of ``op_links`` ({"all_gather" / "reduce_scatter": AlphaBeta}), each checked: an
    AlphaBeta-like object fitted on ``nranks`` ranks (when it says)."""
    if op_links is None:
        return {}
    if not isinstance(op_links, dict):
        raise checks.ArgumentTypeError(f"op_links must be a dict {{op: AlphaBeta}} or None, got "
                                       f"{type(op_links).__name__} {op_links!r:.60}")
    out = {}
    for op, ab in op_links.items():
        checks.one_of("op_links key", op, ("all_gather", "reduce_scatter"))
        if not (hasattr(ab, "alpha_s") and hasattr(ab, "beta_s_per_byte")):
            raise checks.ArgumentTypeError(f"op_links[{op!r}] must have alpha_s and beta_s_per_byte (a "
                                           f"labkit.comm.AlphaBeta), got {type(ab).__name__} {ab!r:.60}")
        if getattr(ab, "nranks", nranks) != nranks:
            raise ValueError(f"op_links[{op!r}] was fitted on {ab.nranks} ranks, not nranks={nranks}")
        out[op] = (checks.nonneg(f"op_links[{op!r}].alpha_s", ab.alpha_s),
                   checks.nonneg(f"op_links[{op!r}].beta_s_per_byte", ab.beta_s_per_byte))
    return out


# ------------------------------------------------------------- terms calibrated on the machine itself
def concurrency_slowdown(rate_alone: float, rate_concurrent: float) -> float:
    """How much slower each rank computes when N ranks compute at once: rate alone / rate with N ranks.

    Both rates come from runs that do the same compute and no communication (one rank alone; N independent
    ranks at once), so the ratio holds only what sharing the machine costs: cores (when ranks × threads
    exceed them), memory bandwidth and caches — the way a GPU's achievable rate is measured, not assumed.
    Taught in chapter 5 (ranks share the machine) and chapter 24 (calibrating a model).
    """
    a = checks.positive("rate_alone", rate_alone)
    c = checks.positive("rate_concurrent", rate_concurrent)
    return checks.finite_result("concurrency slowdown", a / c, rate_alone=rate_alone, rate_concurrent=rate_concurrent)


def unit_overhead_s(wrapped_step_s: float, plain_step_s: float, n_units: int, micro_batches: int = 1) -> float:
    """Seconds a data-parallel wrapper adds per wrapped unit and micro-batch, from two 1-rank runs of the
    same model: (wrapped step − plain step) / (units × micro-batches), at least 0.

    The wrapper's own work (FSDP2: gathering and freeing each unit's parameters, its hooks and copies; DDP:
    bucketing hooks) costs time a compute rate measured without it does not hold; with one rank there is
    no link, so the difference is that work alone. A wrapped run faster than the plain one (noise) gives 0.
    Taught in chapter 20 (FSDP's per-unit costs) and chapter 19 (DDP's hooks).
    """
    w = checks.positive("wrapped_step_s", wrapped_step_s)
    p = checks.positive("plain_step_s", plain_step_s)
    per = (w - p) / (checks.count("n_units", n_units) * checks.count("micro_batches", micro_batches))
    return max(0.0, per)


def wrapper_overhead_s(per_unit_s: float, n_units: int, micro_batches: int = 1, slowdown: float = 1.0) -> float:
    """Wrapper seconds per step: per unit × units × micro-batches × the concurrency slowdown (the
    wrapper's work is CPU work on the same shared cores as the compute). Taught in chapter 20."""
    t = checks.nonneg("per_unit_s", per_unit_s) * checks.count("n_units", n_units) \
        * checks.count("micro_batches", micro_batches)
    return checks.finite_result("wrapper seconds", t * checks.positive("slowdown", slowdown), per_unit_s=per_unit_s)
