"""Tuning by measurement: grid sweeps of training knobs, and the largest micro-batch that fits.

Taught in chapter 15 (micro-batch, accumulation, recomputation), chapter 19 (DDP buckets) and
chapter 20 (FSDP knobs).

:func:`sweep` runs every point of a grid as a real multi-rank training run — through
:func:`labkit.train.run` for knobs :class:`labkit.train.TrainConfig` covers (``bucket_cap_mb``,
``reshard_after_forward``, ``mp_policy``, ``checkpoint``, ``micro_batch``/``accum``, ``dtype``,
``parallel``, FSDP2 explicit ``prefetch``, and with ``parallel="fsdp1"`` the FSDP1 knobs
``sharding_strategy``, ``limit_all_gathers``, ``backward_prefetch``, ``forward_prefetch``) — the one
training loop, so every point's record is built the same way — and tabulates tokens/s, MFU, step-time spread, peak memory, the predicted model-state bytes per
rank (:func:`labkit.memory.model_state_bytes`) and, given a fitted :class:`labkit.comm.AlphaBeta`,
the estimated communication share of a step. The recommendation says *why*, and says "within noise"
when the step-time spreads overlap (on 2 CPU cores overlap and prefetch gains are invisible —
PLATFORM_NOTES — while volumes and memory are real).

Accumulation's costs (chapter 15) — collectives per step, case A against case B — are measured by
:mod:`labkit.tuning.accumulation` (re-exported here). Micro-batch × accumulation at a fixed global batch: use a tuple key,
``grid={("micro_batch", "accum"): [(8, 1), (4, 2), (2, 4)]}`` (or :func:`fixed_batch_pairs`).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field

import pandas as pd

from labkit.memory.buffers import comm_buffer_bytes
from labkit.memory.estimate import ATTENTION_STORES, activation_bytes, model_state_bytes
from labkit.perf.steptime import data_parallel_comm_s
from labkit.tuning.accumulation import (  # noqa: F401
    ab_gemms,
    ab_micro_batch,
    accumulation_collectives,
    collectives_per_step,
    step_gemm_shapes,
)

estimate_comm_s = data_parallel_comm_s     # the name chapters 19/20 used before labkit.perf


def fixed_batch_pairs(seqs_per_rank: int, micro_batches=None) -> list[tuple[int, int]]:
    """(micro_batch, accum) pairs with micro_batch × accum = ``seqs_per_rank``. Taught in chapter 15."""
    if isinstance(seqs_per_rank, bool) or not isinstance(seqs_per_rank, int) or seqs_per_rank < 1:
        raise ValueError(f"seqs_per_rank={seqs_per_rank!r} must be an int >= 1")
    mbs = micro_batches or [d for d in range(1, seqs_per_rank + 1) if seqs_per_rank % d == 0]
    bad = [m for m in mbs if seqs_per_rank % m]
    if bad:
        raise ValueError(f"micro_batches {bad} do not divide seqs_per_rank={seqs_per_rank}")
    return [(m, seqs_per_rank // m) for m in sorted(mbs, reverse=True)]


def _points(grid: dict) -> list[dict]:
    if not isinstance(grid, dict) or not grid:
        raise ValueError("grid must be a non-empty dict of knob -> list of values")
    keys, values = list(grid), []
    for k in keys:
        v = grid[k]
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError(f"grid[{k!r}] must be a non-empty list of values, got {v!r}")
        values.append(list(v))
    out = []
    for combo in itertools.product(*values):
        point = {}
        for k, v in zip(keys, combo, strict=True):
            if isinstance(k, tuple):
                if not isinstance(v, (list, tuple)) or len(v) != len(k):
                    raise ValueError(f"grid[{k!r}] values must be tuples of {len(k)}, got {v!r}")
                point.update(dict(zip(k, v, strict=True)))
            else:
                point[k] = v
        out.append(point)
    return out


def _label(point: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


@dataclass
class SweepResult:
    """``table``: one row per grid point; ``best``: the recommended row (a dict); ``recommendation``:
    text with the reasons; ``records``: the RunRecords. Taught in chapter 15, 19 and 20."""

    table: pd.DataFrame
    recommendation: str
    best: dict
    records: list = field(default_factory=list)

    def format(self) -> str:
        cols = [c for c in ("config", "step_ms", "spread", "n_steps", "tokens_per_s", "mfu", "peak_mem_MiB",
                            "model_state_MiB", "comm_share_est", "fits", "final_loss") if c in self.table]
        return self.table[cols].to_string(index=False, float_format=lambda v: f"{v:,.3g}") + "\n\n" + \
            self.recommendation


def _row(point, rec, cfg, nprocs, alpha_beta, budget) -> dict:
    import torch

    from labkit import flops
    from labkit.model.gpt import GPT, gpt_config

    mcfg = gpt_config(cfg.model)
    n_params = flops.n_params(mcfg.shape())
    with torch.device("meta"):       # shapes only, no memory: exact DDP buckets for the estimate
        shapes = GPT(mcfg)
    strategy = cfg.memory_strategy
    mstate = model_state_bytes(n_params, strategy=strategy, n_ranks=nprocs, precision="fp32").model_states
    st = rec.step_time
    comm = data_parallel_comm_s(cfg, shapes, mcfg.n_layers + 1, nprocs, alpha_beta)
    row = {"config": _label(point), **{str(k): v for k, v in point.items()},
           "step_ms": st.median * 1e3 if st else float("nan"),
           "p10_ms": st.p10 * 1e3 if st else float("nan"), "p90_ms": st.p90 * 1e3 if st else float("nan"),
           "spread": st.spread if st else float("nan"), "n_steps": st.n if st else 0,
           "tokens_per_s": rec.tokens_per_s, "mfu": rec.mfu,
           "peak_mem_MiB": (rec.peak_memory_bytes or float("nan")) / 2**20,
           "peak_mem_kind": rec.extra.get("peak_memory_kind", "cuda.max_memory_allocated"),
           "model_state_MiB": mstate / 2**20,
           "comm_share_est": (comm / st.median) if (st and alpha_beta is not None) else float("nan"),
           "comm_share_measured": rec.comm_wait_share,
           "final_loss": rec.loss[-1] if rec.loss else float("nan")}
    row["fits"] = True if budget is None else (mstate <= budget)
    return row


def recommend(table: pd.DataFrame, *, baseline: int = 0) -> tuple[str, dict]:
    """Pick the fastest configuration that fits, and explain (gain vs the baseline row, noise, memory).

    A gain smaller than the step-time spread (p10–p90) of either run is reported as within noise;
    then the lowest-memory configuration among those within noise of the fastest is recommended.
    Taught in chapter 15 (tuning by measurement).
    """
    if table.empty:
        raise ValueError("recommend needs at least one row")
    ok = table[table["fits"]] if "fits" in table else table
    if ok.empty:
        return ("no configuration fits the memory budget; lower micro_batch, shard more (FSDP FULL_SHARD), "
                "or enable activation checkpointing", {})
    fast = ok.loc[ok["tokens_per_s"].idxmax()]
    base = table.iloc[baseline]
    # rows whose median is inside the fastest row's p10–p90 band are indistinguishable from it
    tie = ok[ok["p10_ms"] <= fast["p90_ms"]]
    reasons = []
    if len(tie) > 1:
        pick = tie.loc[tie["model_state_MiB"].idxmin()] if tie["model_state_MiB"].nunique() > 1 else fast
        reasons.append(f"{len(tie)} configurations are within noise of the fastest ({fast['config']}: "
                       f"{fast['step_ms']:.1f} ms, p10–p90 {fast['p10_ms']:.1f}–{fast['p90_ms']:.1f} ms)")
        if pick is not fast and pick["config"] != fast["config"]:
            reasons.append(f"among them {pick['config']} holds the least model state per rank "
                           f"({pick['model_state_MiB']:.1f} MiB vs {fast['model_state_MiB']:.1f} MiB)")
    else:
        pick = fast
    gain = pick["tokens_per_s"] / base["tokens_per_s"] - 1 if base["tokens_per_s"] else float("nan")
    within = pick["p10_ms"] <= base["p90_ms"] and base["p10_ms"] <= pick["p90_ms"]
    if pick["config"] != base["config"]:
        reasons.append(f"tokens/s {gain:+.1%} vs the baseline ({base['config']})"
                       + (" — within noise" if within else " — outside the p10–p90 spread, a real difference"))
    others = ok[ok["config"] != pick["config"]]
    if not others.empty:
        nxt = others.loc[others["tokens_per_s"].idxmax()]
        sep = pick["p90_ms"] < nxt["p10_ms"]
        reasons.append(f"{pick['tokens_per_s'] / nxt['tokens_per_s'] - 1:+.1%} tokens/s vs the next best "
                       f"({nxt['config']}; step {pick['step_ms']:.1f} vs {nxt['step_ms']:.1f} ms"
                       + (", spreads do not overlap)" if sep else ", spreads overlap: treat as noise)"))
    if not math.isnan(pick.get("comm_share_est", float("nan"))):
        reasons.append(f"estimated communication share {pick['comm_share_est']:.0%} of a step (α–β model)")
    if "n_steps" in table and table["n_steps"].min() < 5:
        reasons.append(f"caution: only {int(table['n_steps'].min())} measured step(s) in some runs — p10/p90 of so "
                       "few samples are unreliable; rerun with more steps before trusting small differences")
    if "fits" in table and not table["fits"].all():
        reasons.append(f"{int((~table['fits']).sum())} configuration(s) exceed the memory budget")
    text = f"Recommendation: {pick['config']}\n  because " + ";\n  ".join(reasons) + "."
    return text, pick.to_dict()


def fit_link(nprocs: int, *, backend: str = "auto", iters: int = 5):
    """α and β of the ranks' links from a quick live all-reduce benchmark (16 KiB … 4 MiB).

    Taught in chapter 11 (communication diagnostics) and chapter 19."""
    from labkit import comm

    sizes = comm.default_sizes(16 * 1024, 4 * 2**20, 4)
    t = comm.benchmark(["all_reduce"], sizes, nprocs, iters=iters, warmup=2, backend=backend).table
    return comm.fit_alpha_beta(t["size"], t["time_us"] * 1e-6, "all_reduce", nprocs)


def sweep(base, grid: dict, *, nprocs: int = 2, progress: bool = True, memory_budget_bytes: float | None = None,
          alpha_beta="fit", timeout_s: float = 600, runner=None) -> SweepResult:
    """Run every point of ``grid`` (knob → values) on ``nprocs`` ranks and recommend one.

    ``base``: a :class:`labkit.train.TrainConfig` (FSDP1 knobs with ``parallel="fsdp1"``).
    ``alpha_beta``: a fitted :class:`labkit.comm.AlphaBeta` to estimate the communication share;
    ``"fit"`` (default) measures one first with :func:`fit_link` on the same ranks; None skips it.
    ``runner(cfg, nprocs) -> RunRecord`` replaces the default launcher (tests, custom loops).
    Taught in chapter 15, chapter 19 (DDP bucket_cap_mb) and chapter 20 (FSDP knobs).
    """
    from labkit.train import TrainConfig

    if not isinstance(base, TrainConfig):
        raise TypeError(f"base must be a labkit.train.TrainConfig, got {type(base).__name__}")
    names = {f.name for f in dataclasses.fields(base)}
    points = _points(grid)
    bad = sorted({k for p in points for k in p} - names)
    if bad:
        raise ValueError(f"grid knob(s) {bad} are not fields of {type(base).__name__}; valid: {sorted(names)}")
    if runner is None:
        runner = _default_runner(base, timeout_s)
    if isinstance(alpha_beta, str):
        if alpha_beta != "fit":
            raise ValueError(f"alpha_beta={alpha_beta!r}: pass an AlphaBeta, 'fit' or None")
        alpha_beta = fit_link(nprocs) if nprocs > 1 else None
    from tqdm.auto import tqdm

    rows, records = [], []
    for point in tqdm(points, desc="sweep", disable=not progress):
        cfg = dataclasses.replace(base, **point, label=_label(point) or base.label)
        rec = runner(cfg, nprocs)
        records.append(rec)
        rows.append(_row(point, rec, cfg, nprocs, alpha_beta, memory_budget_bytes))
    table = pd.DataFrame(rows)
    text, best = recommend(table)
    return SweepResult(table=table, recommendation=text, best=best, records=records)


def _default_runner(base, timeout_s):
    def run_train(cfg, nprocs):
        from labkit.train import run

        return run(cfg, nprocs, timeout_s=timeout_s)
    return run_train


# ------------------------------------------------------------------------------- largest micro-batch
def search_largest(fits, *, start: int = 1, limit: int = 4096) -> tuple[int, list[tuple[int, bool]]]:
    """Largest n in [start, limit] with ``fits(n)`` true, assuming monotonicity: double until it fails,
    then bisect. Returns (n or 0 when even ``start`` fails, the probes in order). Taught in chapter 15."""
    if start < 1 or limit < start:
        raise ValueError(f"need 1 <= start <= limit, got start={start}, limit={limit}")
    probes = []

    def probe(n):
        ok = bool(fits(n))
        probes.append((n, ok))
        return ok

    if not probe(start):
        return 0, probes
    lo, hi = start, None
    while hi is None:
        n = min(lo * 2, limit)
        if n == lo:
            return lo, probes
        if probe(n):
            lo = n
        else:
            hi = n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


def predicted_bytes(cfg, micro_batch: int, nprocs: int = 1) -> float:
    """Memory-model bytes per rank of ``cfg`` at ``micro_batch``: model states + activations
    (Korthikanti et al. 2022; flash attention for ``attention="sdpa"``) + communication buffers.
    Taught in chapter 13 and chapter 15."""
    from labkit import flops

    mcfg = cfg.model_config          # the run's seq_len, not only the size's
    shape = mcfg.shape()
    n = flops.n_params(shape)
    parallel, strategy = cfg.parallel, cfg.memory_strategy
    bf16 = cfg.compute_dtype == "bf16"
    precision = "bf16_autocast" if bf16 else "fp32"
    states = model_state_bytes(n, strategy=strategy, n_ranks=nprocs, precision=precision).model_states
    acts = activation_bytes(mcfg, micro_batch, recompute=cfg.recompute,
                            dtype_bytes=2 if bf16 else 4, flash_attention=ATTENTION_STORES[cfg.attention] == "lse",
                            include_head=True)
    unit = n // (mcfg.n_layers + 1)
    bufs = 0 if parallel == "single" else comm_buffer_bytes(
        n, strategy=strategy, n_ranks=nprocs, precision=precision, unit_params=unit,
        bucket_cap_mb=25.0 if cfg.bucket_cap_mb is None else cfg.bucket_cap_mb)["bytes"]   # None: torch's 25 MiB
    return states + acts + bufs


def _measured_bytes(cfg, device):
    """bytes(mb) on this CPU: model states (params, grads, Adam m and v) + saved activations of one forward."""
    import torch

    from labkit.memory.tensors import measure_activation_bytes
    from labkit.model.gpt import GPT, gpt_config
    from labkit.train.parallel import _checkpoint_blocks

    mcfg = gpt_config(cfg.model, seq_len=cfg.seq_len, attention=cfg.attention)
    torch.manual_seed(cfg.seed)
    model = GPT(mcfg).to(device)
    if cfg.checkpoint_policy != "none":         # chapter 21's policy, applied as the trainer applies it
        _checkpoint_blocks(model, cfg.checkpoint_policy)
    states = sum(p.numel() * p.element_size() for p in model.parameters()) * 4  # params, grads, Adam m, v
    gen = torch.Generator().manual_seed(cfg.seed)

    def nbytes(mb):
        idx = torch.randint(0, mcfg.vocab_size, (mb, mcfg.seq_len), generator=gen).to(device)
        return states + measure_activation_bytes(model, idx, idx)
    return nbytes, model, states


def _cuda_fits(cfg, budget, device):
    """fits(mb) from a real step on CUDA: out-of-memory (or the allocator's peak over budget) means no."""
    import torch

    nbytes, model, states = _measured_bytes(cfg, device)
    mcfg = cfg.model_config
    seen = {}

    def fits(mb):
        try:
            torch.cuda.reset_peak_memory_stats(device)
            idx = torch.randint(0, mcfg.vocab_size, (mb, mcfg.seq_len), device=device)
            model(idx, idx)[1].backward()
            model.zero_grad(set_to_none=True)
            seen[mb] = torch.cuda.max_memory_allocated(device) + states // 2
            return budget is None or seen[mb] <= budget
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            seen[mb] = float("inf")
            return False
    return fits, seen


@dataclass(frozen=True)
class MicroBatchSearch:
    """What :func:`find_micro_batch` found: ``best`` (0 when even 1 does not fit) and every probe in
    order as (micro_batch, bytes per rank, fits). Taught in chapter 15."""

    best: int
    method: str
    budget_bytes: float | None
    probes: tuple

    def table(self) -> pd.DataFrame:    # the probes in search order (doubling, then bisection)
        return pd.DataFrame([{"micro_batch": m, "MiB": b / 2**20, "fits": f} for m, b, f in self.probes])


def find_micro_batch(cfg, *, memory_budget_bytes: float | None = None, nprocs: int = 1, method: str = "model",
                     max_micro_batch: int = 4096) -> MicroBatchSearch:
    """Largest micro-batch of ``cfg`` that fits, with every probe's bytes: search doubling, then bisection
    (:func:`search_largest`).

    method "model": the memory model (:func:`predicted_bytes`) against ``memory_budget_bytes`` — works
    anywhere; "measure": exact bytes (model states + autograd-saved activations, measured) on CPU, or a
    real step on CUDA (out-of-memory = does not fit; ``torch.cuda.max_memory_allocated`` vs the budget).
    Taught in chapter 15 and chapter 13.
    """
    if method not in ("model", "measure"):
        raise ValueError(f"method={method!r} is not valid; choose 'model' or 'measure'")
    if memory_budget_bytes is not None and memory_budget_bytes <= 0:
        raise ValueError(f"memory_budget_bytes={memory_budget_bytes} must be > 0")
    from labkit.hardware.measure import resolve_device

    device = resolve_device(cfg.device)
    if memory_budget_bytes is None and not (method == "measure" and device.type == "cuda"):
        raise ValueError("memory_budget_bytes is needed on CPU (there is no out-of-memory to probe); "
                         "pass e.g. memory_budget_bytes=8 * 2**30, or method='measure' on a GPU")
    if method == "measure" and device.type == "cuda":
        fits, seen = _cuda_fits(cfg, memory_budget_bytes, device)
    else:
        nbytes = (lambda mb: predicted_bytes(cfg, mb, nprocs)) if method == "model" else _measured_bytes(cfg, device)[0]
        seen = {}
        fits = lambda mb: seen.setdefault(mb, nbytes(mb)) <= memory_budget_bytes  # noqa: E731
    best, probes = search_largest(fits, start=1, limit=max_micro_batch)
    return MicroBatchSearch(best, method, memory_budget_bytes, tuple((m, float(seen[m]), ok) for m, ok in probes))


def largest_micro_batch(cfg, *, memory_budget_bytes: float | None = None, nprocs: int = 1,
                        method: str = "model", max_micro_batch: int = 4096) -> int:
    """Largest micro-batch of ``cfg`` that fits (:func:`find_micro_batch`'s ``best``; 0 when even
    micro_batch=1 does not fit). Taught in chapter 15 and chapter 13.
    """
    return find_micro_batch(cfg, memory_budget_bytes=memory_budget_bytes, nprocs=nprocs, method=method,
                            max_micro_batch=max_micro_batch).best
