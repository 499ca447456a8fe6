"""The cells of :mod:`labkit.perf.validate`: each DDP/FSDP2 step on N CPU ranks predicted by
:mod:`labkit.perf.steptime` from calibration runs (:func:`calibrate`), and compared with live runs
(:func:`validate`). The package's docstring says what is measured, how, and what is assumed.

Taught in chapter 5 (scaling), chapter 19 (DDP), chapter 20 (FSDP) and chapter 24 (how far to trust a
model's numbers).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from labkit import checks
from labkit.perf import steptime
from labkit.perf.validate import fit as _fit
from labkit.perf.validate.fit import fit_gloo_link, fit_gloo_links, fsdp_unit_cycle
from labkit.perf.validate.runs import (
    compute_rate,
    measure_compute_rate,
    measure_concurrent_rates,
    measure_steps,
    measure_steps_then_rates,
    run_medians,
)

__all__ = ["PARALLELS", "oversubscription", "compute_rate", "StepPrediction", "predict_step", "wrapped_units",
           "measure_compute_rate", "measure_concurrent_rates", "fit_gloo_link", "fit_gloo_links",
           "measure_steps", "Calibration", "calibrate", "calibrate_one_rank", "calibrate_count", "Validation",
           "validate", "fsdp_unit_cycle"]

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
    overhead_s: float = 0.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _meta_model(cfg):
    """The GPT of ``cfg`` on the meta device: shapes only, for the exact DDP buckets."""
    import torch

    from labkit.model.gpt import GPT

    with torch.device("meta"):
        return GPT(cfg.model_config)


def wrapped_units(cfg, params=None) -> int:
    """Units the data-parallel wrapper of ``cfg`` handles per micro-batch: DDP gradient buckets (exact,
    from the model's shapes) or FSDP2 units (one per block + the root). Taught in chapter 19 and chapter 20."""
    checks.one_of("cfg.parallel", getattr(cfg, "parallel", None), PARALLELS)
    if cfg.parallel == "fsdp":
        return 1 if getattr(cfg, "fsdp_wrap", "block") == "model" else cfg.model_config.n_layers + 1
    from labkit.comm.buckets import ddp_buckets
    from labkit.memory.buffers import comm_buffer_bytes

    model = _meta_model(cfg) if params is None else params
    if hasattr(model, "parameters"):   # torch's rule on the shapes, the 1 MiB first bucket of cap None included
        return ddp_buckets(model, bucket_cap_mb=cfg.bucket_cap_mb).n_buckets
    cap = 25.0 if cfg.bucket_cap_mb is None else cfg.bucket_cap_mb
    return len(comm_buffer_bytes(model, strategy="ddp", precision="fp32", bucket_cap_mb=cap)["bucket_bytes"])


def predict_step(cfg, nranks: int, *, flops_per_s: float, alpha_beta, cores: int, threads_per_rank: int = 1,
                 params=None, concurrent_rate: bool = False, overhead_s: float = 0.0,
                 op_links: dict | None = None, unit_cycle=None) -> StepPrediction:
    """Predict one optimizer step of ``cfg`` (parallel "ddp" or "fsdp" = FSDP2) on ``nranks`` gloo ranks.

    ``flops_per_s``: achieved hardware FLOP/s of one rank — measured with ``nranks`` ranks computing at
    once (``concurrent_rate=True``, :func:`measure_concurrent_rates`) or alone (then ranks × threads beyond
    ``cores`` slow it by :func:`oversubscription`); ``alpha_beta``: the link fitted on ``nranks`` ranks
    (:func:`fit_gloo_link`; None with 1 rank); ``op_links``: {"all_gather": α–β, "reduce_scatter": α–β}
    fitted on ``nranks`` ranks (:func:`fit_gloo_links`) to price FSDP2's collectives with their own fits
    (None: all priced with ``alpha_beta``, a reduce-scatter as an all-reduce); ``unit_cycle``: FSDP2's unit
    cycle on ``nranks`` ranks (:func:`fsdp_unit_cycle`): FSDP2's comm is then micro-batches × its cost summed
    over the units *instead of* the α–β collectives (it contains them); ``overhead_s``: the wrapper's seconds
    per step (:func:`labkit.perf.steptime.wrapper_overhead_s`); ``params``: the model or a parameter count (default:
    the GPT of ``cfg`` on the meta device, for the exact DDP buckets). See the module docstring.
    Taught in chapter 5 (scaling), chapter 19 (DDP) and chapter 20 (FSDP).
    """
    if not hasattr(cfg, "model_config") or not hasattr(cfg, "parallel"):
        raise checks.ArgumentTypeError(f"cfg must be a labkit.train.TrainConfig, got {type(cfg).__name__} "
                                       f"{cfg!r:.60}")
    checks.one_of("cfg.parallel", cfg.parallel, PARALLELS)
    n = checks.count("nranks", nranks)
    rate = checks.positive("flops_per_s", flops_per_s)
    extra = checks.nonneg("overhead_s", overhead_s)
    if n > 1 and alpha_beta is None:
        raise ValueError(f"alpha_beta=None is not valid with nranks={n}: give the link fitted on {n} ranks "
                         "(fit_gloo_link)")
    if alpha_beta is not None and getattr(alpha_beta, "nranks", n) != n:
        raise ValueError(f"alpha_beta was fitted on {alpha_beta.nranks} ranks, not nranks={n}: on shared cores "
                         "the link depends on the rank count, fit one per count")
    over = 1.0 if checks.flag("concurrent_rate", concurrent_rate) else oversubscription(n, cores, threads_per_rank)
    from labkit import flops

    mcfg = cfg.model_config
    fpt = flops.hardware_flops_per_token(mcfg.shape(), recompute=cfg.recompute)
    tokens = cfg.micro_batch * cfg.accum * n * mcfg.seq_len
    compute = steptime.compute_time(tokens, flops_per_token=fpt, peak_flops=rate, n_devices=n, mfu=1.0) * over
    model = _meta_model(cfg) if params is None else params
    cycle = unit_cycle is not None and cfg.parallel == "fsdp" and n > 1
    comm = _fit.fsdp_cycle_s(_fit.fsdp_unit_bytes(model), cfg.accum, unit_cycle, nranks=n) if cycle else \
        steptime.data_parallel_comm_s(cfg, model, mcfg.n_layers + 1, n, alpha_beta, reduce_scatter_as_all_reduce=True,
                                      op_links=op_links)
    a, b = (alpha_beta.alpha_s, alpha_beta.beta_s_per_byte) if alpha_beta is not None else (0.0, 0.0)
    return StepPrediction(parallel=cfg.parallel, nranks=n, compute_s=compute, comm_s=comm,
                          step_s=steptime.step_time(compute, comm, extra, overlap=False), oversubscription=over,
                          flops_per_s=rate, alpha_s=a, beta_s_per_byte=b, cores=checks.count("cores", cores),
                          threads_per_rank=checks.count("threads_per_rank", threads_per_rank), overhead_s=extra)


@dataclass
class Calibration:
    """This machine's measured inputs: ``rates[(model, n)]`` FLOP/s kept by n ranks computing (pace),
    ``unit_s[(model, parallel)]`` wrapper seconds per unit and micro-batch, ``units[(model, parallel)]``,
    ``links[n]`` (all-reduce α–β), ``op_links[n]`` ({"all_gather", "reduce_scatter": α–β}, FSDP2's
    collectives), ``cycles[n]`` FSDP2's unit cycle (:func:`fsdp_unit_cycle`), ``steps[(model, parallel)]`` the
    1-rank median steps they came from, ``sources`` (how each was measured). Taught in chapter 24."""

    rates: dict
    unit_s: dict
    units: dict
    links: dict
    steps: dict
    cores: int
    threads_per_rank: int
    sources: list = field(default_factory=list)
    op_links: dict = field(default_factory=dict)
    cycles: dict = field(default_factory=dict)

    def slowdown(self, model: str, n: int) -> float:
        return steptime.concurrency_slowdown(self.rates[(model, 1)], self.rates[(model, n)])

    def predict(self, cfg, n: int) -> StepPrediction:
        """The step of ``cfg`` (label = its model name) on ``n`` ranks from these measured inputs."""
        m, p = cfg.model, cfg.parallel
        extra = steptime.wrapper_overhead_s(self.unit_s[(m, p)], self.units[(m, p)], cfg.accum, self.slowdown(m, n))
        return predict_step(cfg, n, flops_per_s=self.rates[(m, n)], alpha_beta=self.links.get(n), cores=self.cores,
                            threads_per_rank=self.threads_per_rank, concurrent_rate=True, overhead_s=extra,
                            op_links=self.op_links.get(n), unit_cycle=self.cycles.get(n))

    def format(self) -> str:
        out = [f"calibrated on this machine ({self.cores} cores, {self.threads_per_rank} thread(s) per rank):"]
        for (m, n), r in sorted(self.rates.items()):
            out.append(f"  compute {m}, {n} rank(s) computing: {r / 1e9:.1f} GFLOP/s per rank "
                       f"(slowdown x{self.slowdown(m, n):.2f} vs alone)")
        for (m, p), u in sorted(self.unit_s.items()):
            out.append(f"  wrapper {m} {p}: {u * 1e3:.2f} ms per unit x {self.units[(m, p)]} units "
                       f"(1-rank {p} {self.steps[(m, p)] * 1e3:.1f} ms vs plain {self.steps[(m, 'single')] * 1e3:.1f} ms)")
        fits = [(n, "all_reduce", ab) for n, ab in self.links.items()]
        fits += [(n, op, ab) for n, d in self.op_links.items() for op, ab in d.items()]
        out += [f"  link on {n} ranks, {op}: alpha {ab.alpha_s * 1e6:.1f} us/step, beta {ab.beta_s_per_byte * 1e9:.3f} "
                f"ns/B ({ab.bandwidth / 1e9:.2f} GB/s)" for n, op, ab in sorted(fits, key=lambda x: x[:2])]
        out += [f"  {c.format()}" for _, c in sorted(self.cycles.items())]
        return "\n".join(out + ["sources:", *(f"  - {x}" for x in self.sources)])


def _paired_unit_s(wrapped, plain, units: int, accum: int) -> float:
    """The wrapper's seconds per unit and micro-batch: the median over interleaved repeats of
    (wrapped run − plain run of the same repeat), each by :func:`labkit.perf.steptime.unit_overhead_s`."""
    import statistics

    pairs = zip(run_medians(wrapped), run_medians(plain), strict=False)
    return statistics.median(steptime.unit_overhead_s(w, p, units, accum) for w, p in pairs)


def _one_rank_calibration(cfgs: dict, parallels, recs: dict, repeats: int, threads_per_rank: int) -> Calibration:
    """The 1-rank inputs from the records of :func:`calibrate_one_rank`'s runs ({(model, parallel): record},
    "single" = plain): the plain rate and each wrapper's paired per-unit cost."""
    from labkit.launcher.parent import cores_available

    models = list(cfgs)
    units = {(m, p): wrapped_units(cfgs[m].replace(parallel=p)) for m in models for p in parallels}
    unit_s = {(m, p): _paired_unit_s(recs[(m, p)], recs[(m, "single")], units[(m, p)], cfgs[m].accum)
              for m in models for p in parallels}
    sources = [
        f"compute: hardware FLOP/s a synchronous step keeps while n ranks train the same model with parallel='single' "
        f"and no communication, every rank computing until all have measured (n = 1: alone): the slowest rank's "
        f"with a core per rank, the harmonic mean with more ranks than cores; each rank's median of {repeats} "
        "interleaved runs; never a validated run",
        f"wrapper: median over {repeats} interleaved repeats of (1-rank DDP or FSDP2 median step - 1-rank plain median "
        "step of the same repeat) / (units x micro-batches), >= 0; DDP units = gradient buckets, FSDP2 units = "
        "blocks + root; scaled by the compute slowdown at n ranks"]
    return Calibration(rates={(m, 1): compute_rate(recs[(m, "single")]) for m in models}, unit_s=unit_s, units=units,
                       links={}, steps={k: r.step_time.median for k, r in recs.items()}, cores=cores_available(),
                       threads_per_rank=threads_per_rank, sources=sources)


def calibrate_one_rank(cfgs: dict, parallels=PARALLELS, *, repeats: int = 3, threads_per_rank: int = 1,
                       timeout_s: float = 900, say=lambda line: None) -> Calibration:
    """The 1-rank part of :func:`calibrate`: one launch training, per model, plain then each wrapper,
    ``repeats`` times interleaved; the plain rate and each wrapper's paired per-unit cost. Taught in chapter 24."""
    models = list(cfgs)
    say(f"calibrating: 1 rank, plain + {', '.join(parallels)} for {models}, {repeats} interleaved repeats")
    runs = [(m, p) for p in ("single", *parallels) for m in models]
    recs = measure_steps([cfgs[m].replace(parallel=p, label=f"{m} {p} calibration") for m, p in runs], 1,
                         repeats=repeats, threads_per_rank=threads_per_rank, timeout_s=timeout_s)
    return _one_rank_calibration(cfgs, parallels, dict(zip(runs, recs, strict=True)), repeats, threads_per_rank)


def _concurrent_cfgs(cfgs: dict, n: int) -> list:
    return [cfgs[m].replace(parallel="single", label=f"{m} x{n} concurrent calibration") for m in cfgs]


def calibrate_count(cal: Calibration, cfgs: dict, n: int, parallels=PARALLELS, *, repeats: int = 3,
                    link_iters: int = 5, link_stat: str = "p10", timeout_s: float = 900, rates: bool = True,
                    say=lambda line: None) -> None:
    """The n-rank part of :func:`calibrate` (n > 1), added to ``cal``: the rate n independent
    plain ranks keep together (``repeats`` interleaved runs; ``rates=False``: left to the caller, as
    :func:`validate` measures them in its measuring launch), α–β per collective type and, with FSDP2, its
    unit cycle. Taught in chapter 24."""
    models, n = list(cfgs), checks.count("n", n, at_least=2)
    _check_link_options(link_iters, link_stat, timeout_s)
    rates = checks.flag("rates", rates)
    fsdp_ops = ("all_gather", "reduce_scatter") if "fsdp" in parallels else ()
    if rates:
        say(f"calibrating: {n} independent plain ranks computing at once, no communication")
        cal.rates.update({(m, n): r for m, r in zip(models, measure_concurrent_rates(
            _concurrent_cfgs(cfgs, n), n, repeats=repeats, threads_per_rank=cal.threads_per_rank, timeout_s=timeout_s),
            strict=True)})
    say(f"calibrating: alpha-beta from gloo {', '.join(('all_reduce', *fsdp_ops))} sweeps on {n} ranks ({link_stat})")
    fits = fit_gloo_links(n, ("all_reduce", *fsdp_ops), iters=link_iters, stat=link_stat)
    cal.links[n] = fits.pop("all_reduce")
    if fits:
        cal.op_links[n] = fits
        say(f"calibrating: FSDP2 unit cycle on {n} ranks vs 1 (synthetic Linear units, not a GPT)")
        cal.cycles[n] = fsdp_unit_cycle(n, timeout_s=timeout_s)
    for line in (
        f"link: ring alpha-beta fitted to the {link_stat} of a gloo sweep per collective type (all_reduce for DDP; "
        "all_gather_single and reduce_scatter_single for FSDP2) and rank count (64 KiB-16 MiB)",
        *(["FSDP2 comm, n > 1: a + b x unit bytes per unit and micro-batch, fitted to forward+backward of synthetic "
           f"fully_shard-ed Linear units ({'/'.join(f'{b / 1e6:g}' for b in _fit.CYCLE_UNIT_BYTES)} MB, batch 1) on "
           "n ranks minus 1 rank; it holds the all-gathers and reduce-scatters (their alpha-beta fits are shown, not "
           "added)"] if fits else [])):
        if line not in cal.sources:
            cal.sources.append(line)


def _check_link_options(link_iters, link_stat, timeout_s) -> None:
    """The link sweep's options, checked before any launch (they were read only when the sweep ran)."""
    checks.count("link_iters", link_iters, at_most=10_000)
    checks.one_of("link_stat", link_stat, ("median", "p10"))
    checks.positive("timeout_s", timeout_s)


def calibrate(cfgs: dict, counts, parallels=PARALLELS, *, repeats: int = 3, threads_per_rank: int = 1,
              link_iters: int = 5, link_stat: str = "p10", timeout_s: float = 900, say=lambda line: None) -> Calibration:
    """Measure this machine's inputs for ``cfgs`` ({model: TrainConfig}) on each rank count in ``counts``:
    :func:`calibrate_one_rank` (one 1-rank launch: plain, then each wrapper, per model, interleaved), then
    :func:`calibrate_count` per n > 1 (one launch of n independent plain ranks, one fitting all-reduce — with
    FSDP2 also all-gather and reduce-scatter — α–β and, with FSDP2, the two of :func:`fsdp_unit_cycle` on
    synthetic units). None is a run :func:`validate` predicts. Taught in chapter 24."""
    _check_link_options(link_iters, link_stat, timeout_s)       # before the first launch, not ≈ 11 s after it
    checks.count("repeats", repeats)
    checks.count("threads_per_rank", threads_per_rank)
    ns = sorted({checks.count("counts", c) for c in counts} - {1})
    cal = calibrate_one_rank(cfgs, parallels, repeats=repeats, threads_per_rank=threads_per_rank,
                             timeout_s=timeout_s, say=say)
    for n in ns:
        calibrate_count(cal, cfgs, n, parallels, repeats=repeats, link_iters=link_iters, link_stat=link_stat,
                        timeout_s=timeout_s, say=say)
    return cal


@dataclass
class Validation:
    """Predicted vs measured steps: ``table`` (one row per model × strategy × ranks), the :class:`Calibration`
    it was predicted from, the target and the assumptions. Taught in chapter 24."""

    table: object
    calibration: Calibration
    target: float
    assumptions: list = field(default_factory=list)
    rounds: list = field(default_factory=list)          # every round's rows, before the medians

    def format(self) -> str:
        cols = {"parallel": "config", "ranks": "ranks", "model": "size", "pred_compute_ms": "compute", "pred_comm_ms":
                "comm", "pred_wrapper_ms": "wrapper", "pred_step_ms": "predicted ms", "meas_step_ms": "measured ms"}
        t = self.table[list(cols)].rename(columns=cols)
        t["config"] = [{"ddp": "DDP", "fsdp": "FSDP2"}[p] for p in self.table["parallel"]]
        t["error"] = [f"{e:+.1%}" for e in self.table["error"]]
        if len({r["round"] for r in self.rounds}) > 1:
            t["spread"] = [f"{x:.0%}" for x in self.table["meas_spread"]]
            t["by round"] = ["/".join(f"{e:+.0%}" for e in errs) for errs in self.table["round_errors"]]
        t[f"within {self.target:.0%}?"] = ["yes" if ok else "NO" for ok in self.table["met"]]
        met = int(self.table["met"].sum())
        return "\n".join([self.calibration.format(), "predicted vs measured (ms per optimizer step; compute, comm "
                          "(FSDP2 at n > 1: the unit cycle) and wrapper are the predicted parts):",
                          t.to_string(index=False, float_format=lambda v: f"{v:.1f}"),
                          f"within {self.target:.0%}: {met} of {len(self.table)} cells",
                          "assumptions:", *(f"  - {a}" for a in self.assumptions)])


def validate(models=("tiny", "small"), parallels=PARALLELS, nranks=(1, 2, 4), *, micro_batch: dict | None = None,
             steps: int = 7, warmup_steps: int = 2, threads_per_rank: int = 1, target: float = 0.15,
             link_iters: int = 5, timeout_s: float = 900, rounds: int = 1, repeats: int = 3,
             progress=None) -> Validation:
    """Calibrate this machine (:func:`calibrate`), predict every model × strategy × rank-count step from
    the calibration, then train each live on gloo ranks and compare with the median measured step.
    ``micro_batch``: {model: sequences per rank} (default 8 for "tiny", 4 for "small"); ``progress``: a
    callable given one line per stage (e.g. ``print``). ``rounds`` > 1 repeats calibration and measurement
    (each round predicts only from its own calibration) and compares the median prediction with the median
    measurement over the rounds; ``meas_spread`` (largest ÷ smallest measured median − 1) is the machine's
    own run-to-run noise on that cell, the floor under any error the table can show. Within a round every
    launch runs its configurations ``repeats`` times interleaved and keeps each one's median run
    (:mod:`labkit.perf.validate.runs`); the 1-rank calibration and the 1-rank cells share one launch, and
    each n-rank launch measures the cells and then, in the same processes, the compute rate at n ranks
    (:func:`labkit.perf.validate.runs.measure_steps_then_rates`); links and unit cycle just before.
    Taught in chapter 24 (how far to trust a model), chapter 5, chapter 19 and chapter 20.
    """
    import pandas as pd

    from labkit.model.config import SIZES
    from labkit.train import TrainConfig

    if progress is not None and not callable(progress):
        raise checks.ArgumentTypeError(f"progress must be a callable such as print, or None; got "
                                       f"{type(progress).__name__} {checks.short_repr(progress)}")
    say = progress or (lambda line: None)
    _check_link_options(link_iters, "p10", timeout_s)          # before the first launch
    checks.count("threads_per_rank", threads_per_rank)
    models = [checks.one_of("models", m, SIZES) for m in models]
    parallels = [checks.one_of("parallels", p, PARALLELS) for p in parallels]
    counts = sorted({checks.count("nranks", n) for n in nranks})
    if not models or not parallels or not counts:
        raise ValueError(f"models={models}, parallels={parallels} and nranks={counts} must each name at least one")
    checks.count("steps", steps, at_least=warmup_steps + 1)
    target = checks.fraction("target", target, open_low=True)
    mb = {**_MICRO_BATCH, **(micro_batch or {})}
    cfgs = {m: TrainConfig(model=m, micro_batch=checks.count(f"micro_batch[{m}]", mb.get(m, 4)), steps=steps,
                           warmup_steps=warmup_steps, dtype="fp32", device="cpu", label=m) for m in models}
    n_rounds, k = checks.count("rounds", rounds), checks.count("repeats", repeats)
    cells, rows = [(m, p) for m in models for p in parallels], []
    for r in range(n_rounds):
        tag = f" (round {r + 1}/{n_rounds})" if n_rounds > 1 else ""
        line = lambda text, tag=tag: say(text + tag)                                          # noqa: E731
        runs = [(m, p) for p in ("single", *parallels) for m in models]
        line(f"calibrating and measuring: 1 rank, plain + {', '.join(parallels)} for {models} (calibration) and "
             f"{len(cells) if 1 in counts else 0} cells, {k} interleaved repeats in one launch")
        recs = measure_steps([cfgs[m].replace(parallel=p, label=f"{m} {p} calibration") for m, p in runs]
                             + [cfgs[m].replace(parallel=p, label=f"{m} {p} x1") for m, p in cells if 1 in counts], 1,
                             repeats=k, threads_per_rank=threads_per_rank, timeout_s=timeout_s)
        cal = _one_rank_calibration(cfgs, parallels, dict(zip(runs, recs, strict=False)), k, threads_per_rank)
        measured = {1: recs[len(runs):]} if 1 in counts else {}
        for n in counts:          # each count calibrated just before it is measured: the machine drifts
            if n > 1:
                calibrate_count(cal, cfgs, n, parallels, repeats=k, link_iters=link_iters, timeout_s=timeout_s,
                                rates=False, say=line)
                line(f"measuring: {len(cells)} runs on {n} ranks, {k} interleaved repeats; then the same processes "
                     "compute independently (the rate at this concurrency)")
                measured[n], rates = measure_steps_then_rates(
                    [cfgs[m].replace(parallel=p, label=f"{m} {p} x{n}") for m, p in cells], _concurrent_cfgs(cfgs, n),
                    n, repeats=k, threads_per_rank=threads_per_rank, timeout_s=timeout_s)
                cal.rates.update({(m, n): x for m, x in zip(models, rates, strict=True)})
            for (m, p), rec in zip(cells, measured[n], strict=True):
                pr, st = cal.predict(cfgs[m].replace(parallel=p), n), rec.step_time
                rows.append({"model": m, "parallel": p, "ranks": n, "round": r, "pred_compute_ms": pr.compute_s * 1e3,
                             "pred_comm_ms": pr.comm_s * 1e3, "pred_wrapper_ms": pr.overhead_s * 1e3,
                             "pred_step_ms": pr.step_s * 1e3, "meas_step_ms": st.median * 1e3,
                             "meas_p10_ms": st.p10 * 1e3, "meas_p90_ms": st.p90 * 1e3, "meas_steps": st.n})
    table = _fit.medians_over_rounds(pd.DataFrame(rows), target)
    assumptions = [
        f"micro-batch per rank {', '.join(f'{m}: {mb.get(m, 4)}' for m in models)} sequences, fp32, "
        f"{threads_per_rank} thread(s) per rank, {cal.cores} cores",
        "no overlap: step = compute + communication + wrapper (a rank's gloo thread needs a core the compute "
        "holds); DDP: one all-reduce per bucket (alpha-beta); FSDP2: the calibrated unit cycle per unit and "
        "micro-batch in place of its alpha-beta collectives, on top of the 1-rank wrapper term (when compute slows "
        "at n ranks, the synthetic units' own 1-rank work slows too and counts in both)",
        "the 1-rank DDP/FSDP2 cells repeat a calibration configuration (other runs of the same launch, interleaved "
        "with it): they check the arithmetic and repeatability; the 2- and 4-rank cells test the model",
        f"measured: the median run of {k} interleaved repeats of each launch's configurations ({steps - warmup_steps} "
        f"timed steps each after {warmup_steps} warm-up); each rank count's links and unit cycle calibrated just before "
        "its cells are measured, and its compute rate in the same launch right after them (the ranks leave the "
        "process group and train plain, independently): a process's own speed on this VM varies by several per cent "
        "from one launch to the next, and a rate and the steps it predicts then share it",
        f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {cal.cores} cores",
    ]
    if n_rounds > 1:
        assumptions.append(f"{n_rounds} rounds, each predicted from its own calibration: predicted and measured are "
                           "medians over the rounds; spread = largest / smallest measured median - 1 (run-to-run "
                           "noise of this machine on that cell; the calibration printed is the last round's)")
    return Validation(table=table, calibration=cal, target=target, assumptions=assumptions, rounds=rows)

