"""Tensor- and pipeline-parallel cells of :mod:`labkit.perf.validate`: a TP, PP or TP×PP step of the trainer on N
gloo ranks predicted from calibration runs that are never the cells predicted, then measured (issue #24, item 2).

The terms are what :func:`labkit.train.train` does on gloo with ``tp``/``pp`` > 1 (``labkit.train.parallel``,
``tensor_parallel``, ``pipeline``), counted per rank and optimizer step of m = ``accum`` micro-batches of b
sequences of s tokens (h = d_model, 4-byte fp32 activations):

- **compute**: the rank's hardware FLOPs at the rate N plain ranks keep computing at once (the same
  calibration as the DDP/FSDP2 cells). TP splits the blocks (Megatron's column/row split of qkv, proj,
  fc, proj) and, with ``vocab_parallel`` (the trainer's default), the tied head and its loss over the
  vocabulary (:mod:`labkit.train.tensor_parallel`): 6·V·h/tp per token on each TP rank; with
  ``vocab_parallel=False`` the head stays whole on every TP rank. PP cuts the blocks
  into p·v consecutive chunks (:func:`labkit.train.pipeline.split_layers`), the first chunk also runs the
  embeddings, the last the head: the slowest rank sets the pace, m of its micro-batches per step. With
  measured part times (:mod:`labkit.perf.validate.stage_times`) each rank's share of the whole model's
  seconds is its parts' measured share, not its FLOPs' share (the head is half the small GPT's FLOPs, not
  half its time): t_mb(rank) = share(rank) × the whole model's micro-batch at the calibrated rate.
- **TP all-reduces**: 4 per block and micro-batch (2 forward, 2 backward: Shoeybi et al. 2019 §3), each of
  b·s·h·4 bytes, priced with the gloo all-reduce α–β fitted on tp ranks; with ``vocab_parallel`` also, per
  micro-batch, the embedding's and the head input gradient's (b·s·h·4 bytes each, on the first and last
  stage) and the loss's 3 of b·s·4 bytes (last stage) — priced apart from the block cycle below.
- **TP cycle**: everything tensor parallelism adds to a block beyond its local shard's arithmetic — the 4
  all-reduces, DTensor's dispatch and redistributions around them, and the wait at each one when ranks compute
  between them — per Megatron column/row pair (2 per block) and micro-batch: pairs × m × (a + b·b·s·h·4), a and b
  measured on 2 of the GPT's own blocks (not a GPT: no embeddings, head, loss, optimizer or data) split by the
  trainer's plan over groups of tp ranks among N as the cell runs them, minus their plain local shards run by all
  N ranks at once (:func:`labkit.perf.validate.tp_cycle.tp_block_cycle`). It holds the all-reduces, so their α–β
  (above) is printed beside it and not added, as FSDP2's unit cycle replaces its collectives' α–β.
- **PP sends**: 2·v·m point-to-point transfers per rank (activations forward, their gradients back:
  Narayanan et al. 2021 §2.2), each of b·s·h·4 bytes — the trainer sends whole activations on every TP rank
  (no scatter/gather optimisation) — priced with the gloo send/recv α–β fitted on 2 ranks; plus the trainer's
  one all-reduce of the tied embedding/head gradient (V·h·4 bytes) over the pp group per step
  (:func:`labkit.train.pipeline.sync_tied`), with the all-reduce α–β fitted on pp ranks.
- **bubble**: the pipeline's fill and drain, (p−1)/(v·m) of the compute when the stages are equal (Narayanan
  et al. 2021 §2.2); with unequal stages (the head on the last) the other ranks' micro-batch time summed,
  ÷ v: (Σ_ranks t_rank − t_slowest)/v, which is (p−1)·t/v for equal ones.
- step = compute + bubble + TP cycle + PP (no overlap: the gloo thread needs a core the compute holds); with a
  :class:`~labkit.perf.validate.tp_cycle.TPCycle` that does not hold the all-reduces (``includes_all_reduces``
  False), or none, the TP α–β is added.

Not priced (printed as assumptions): the pipeline schedule's own Python work, AdamW's per-step update of DTensor
parameters beyond a plain one's, idle pipeline ranks lending their core to others when ranks outnumber cores.

Taught in chapter 24 (choosing a parallel layout: how far to trust the model's TP and PP terms).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from labkit import checks

__all__ = ["MP_KINDS", "MPStepPrediction", "mp_config", "predict_mp_step", "rank_flops_per_token", "MPValidation",
           "validate_mp"]

#: The model-parallel cells: (kind, ranks) → TrainConfig overrides; "tpxpp" needs 4 ranks.
MP_KINDS = ("tp", "pp", "tpxpp")


def mp_config(cfg, kind: str, nranks: int):
    """``cfg`` as the ``kind`` cell on ``nranks`` ranks: tp = N, pp = N, or tp = pp = 2 on 4 ranks
    (dp = 1, ``parallel="single"``). Taught in chapter 24."""
    checks.one_of("kind", kind, MP_KINDS)
    n = checks.count("nranks", nranks, at_least=2)
    if kind == "tpxpp" and n != 4:
        raise ValueError(f"kind='tpxpp' runs tp=2 × pp=2: nranks must be 4, got {n}")
    over = {"tp": dict(tp=n, pp=1), "pp": dict(tp=1, pp=n), "tpxpp": dict(tp=2, pp=2)}[kind]
    return cfg.replace(parallel="single", label=f"{cfg.model} {kind} x{n}", **over)


def rank_flops_per_token(cfg) -> list:
    """Hardware FLOPs per token of the step's global batch that each pipeline rank executes (one entry per pp
    rank; TP ranks of a stage execute the same): blocks ÷ tp on the rank's stages, plus the embeddings' and
    head's share on the ranks holding the first and last chunk (the head ÷ tp with ``vocab_parallel``, else
    whole on every TP rank). PaLM's count,
    as the calibrated rate. Taught in chapter 24."""
    from labkit import flops
    from labkit.train.pipeline import split_layers, stage_indices

    shape = cfg.model_config.shape()
    total = flops.hardware_flops_per_token(shape, recompute=cfg.recompute)
    head = 6.0 * shape.vocab_size * shape.d_model          # the tied head's 6·V·h of 6N (the lookup costs none)
    split = cfg.tp if cfg.tp > 1 and cfg.vocab_parallel else 1      # the vocabulary-parallel head: V/tp per rank
    per_block = (total - head) / shape.n_layers
    spans = split_layers(shape.n_layers, cfg.pp * cfg.virtual_stages)
    out = []
    for r in range(cfg.pp):
        here = stage_indices(r, cfg.pp, cfg.virtual_stages)
        blocks = sum(spans[k][1] - spans[k][0] for k in here)
        out.append(blocks * per_block / cfg.tp + (head / split if len(spans) - 1 in here else 0.0))
    return out


@dataclass(frozen=True)
class MPStepPrediction:
    """A predicted TP/PP step on N gloo ranks, by term (seconds), with the counts behind each term.
    Taught in chapter 24."""

    kind: str
    nranks: int
    tp: int
    pp: int
    micro_batches: int
    compute_s: float
    bubble_s: float
    tp_s: float
    pp_s: float
    n_tp_all_reduce: int
    n_pp_sends: int
    act_bytes: int
    bubble_fraction: float
    flops_per_s: float
    tp_overhead_s: float = 0.0          # DTensor's own work (TPCycle), beside the all-reduces' α–β
    n_tp_pairs: int = 0                 # Megatron column/row pairs on the slowest rank (2 per block)
    tp_in_cycle: bool = False           # the TP cycle holds the all-reduces: tp_s is shown, not added

    @property
    def step_s(self) -> float:
        tp = 0.0 if self.tp_in_cycle else self.tp_s
        return self.compute_s + self.bubble_s + tp + self.tp_overhead_s + self.pp_s

    def as_dict(self) -> dict:
        return {**asdict(self), "step_s": self.step_s}


def _ring(link, op: str, size: float, n: int) -> float:
    from labkit.comm.models import ring_time

    if link is None:
        raise ValueError(f"a fitted gloo {op} link (α–β) is needed for this cell (n={n}), got None")
    return ring_time(op, size, n, alpha=link.alpha_s, beta=link.beta_s_per_byte)


def predict_mp_step(cfg, nranks: int, *, flops_per_s: float, tp_all_reduce=None, pp_all_reduce=None,
                    send_recv=None, tp_cycle=None, part_times=None, cores: float | None = None,
                    core_flops_per_s: float | None = None) -> MPStepPrediction:
    """Predict one optimizer step of ``cfg`` (``tp``/``pp`` > 1, dp = 1) on ``nranks`` gloo ranks by the terms of
    the module docstring. ``flops_per_s``: the hardware FLOP/s one rank keeps while ``nranks`` plain ranks
    compute at once; ``tp_all_reduce`` / ``pp_all_reduce``: :class:`labkit.comm.AlphaBeta` of the gloo
    all-reduce fitted on tp / pp ranks; ``send_recv``: of gloo send/recv (2 ranks); ``tp_cycle``: a
    :class:`labkit.perf.validate.tp_cycle.TPCycle` measured on tp ranks (None: DTensor's own work unpriced,
    ``tp_overhead_s`` = 0); ``part_times``: a :class:`labkit.perf.validate.stage_times.PartTimes` (None: each
    rank's share of the compute by its FLOPs); ``cores``: the cores the N ranks share (None: the bubble formula,
    every rank at ``flops_per_s``; a number: a GPipe or 1F1B pipeline is played op by op on that many cores,
    :mod:`labkit.perf.validate.pipeline_sim` — a rank with a core of its own computes at ``core_flops_per_s``, the
    rate measured with as many ranks as cores, or, when None, at ``flops_per_s`` × N ÷ cores: the rate N busy ranks
    keep as their time-shared one). ``tp_cycle`` measured on the GPT's blocks (:func:`labkit.perf.validate.tp_cycle.
    tp_block_cycle`) holds the TP all-reduces: their α–β term is then printed, not added. Taught in chapter 24."""
    if not hasattr(cfg, "model_config") or not hasattr(cfg, "tp"):
        raise checks.ArgumentTypeError(f"cfg must be a labkit.train.TrainConfig, got {type(cfg).__name__} "
                                       f"{cfg!r:.60}")
    n, rate = checks.count("nranks", nranks), checks.positive("flops_per_s", flops_per_s)
    if cfg.tp * cfg.pp != n or n == 1:
        raise ValueError(f"predict_mp_step prices tp·pp = N model-parallel ranks with dp = 1: tp={cfg.tp} × "
                         f"pp={cfg.pp} must equal nranks={n} > 1")
    if cfg.sequence_parallel:
        raise ValueError("sequence_parallel=True is not priced here (reduce-scatter + all-gather pairs): use False")
    mc, m, v = cfg.model_config, cfg.accum, cfg.virtual_stages
    tokens_mb = cfg.micro_batch * mc.seq_len
    if part_times is None:
        t_mb = [f * tokens_mb / rate for f in rank_flops_per_token(cfg)]      # each pp rank, one micro-batch
    else:
        from labkit import flops
        from labkit.perf.validate.stage_times import rank_time_shares

        whole = flops.hardware_flops_per_token(mc.shape(), recompute=cfg.recompute) * tokens_mb / rate
        t_mb = [x * whole for x in rank_time_shares(cfg, part_times)]
    if cores is not None and cfg.pp > 1 and cfg.pp_schedule in ("gpipe", "1f1b"):
        from labkit.perf.validate.pipeline_sim import play_schedule

        c = checks.positive("cores", cores)
        if n <= c:
            full = list(t_mb)
        elif core_flops_per_s is not None:                  # a core of its own: the rate measured at c ranks
            full = [t * rate / checks.positive("core_flops_per_s", core_flops_per_s) for t in t_mb]
        else:                                               # else N time-shared ranks ran at c/N of a core each
            full = [t * c / n for t in t_mb]
        compute = m * max(full)
        bubble = play_schedule(full, m, schedule=cfg.pp_schedule, cores=c, ranks_per_stage=cfg.tp).step_s - compute
    else:
        compute = m * max(t_mb)
        bubble = (sum(t_mb) - max(t_mb)) / v if cfg.pp > 1 else 0.0
    act = cfg.micro_batch * mc.seq_len * mc.d_model * 4
    pairs = 2 * max(hi - lo for lo, hi in _rank_blocks(cfg)) if cfg.tp > 1 else 0     # qkv→proj, fc→proj
    n_ar = 2 * pairs * m
    tp_s = n_ar * _ring(tp_all_reduce, "all_reduce", act, cfg.tp) if n_ar else 0.0
    if cfg.tp > 1 and cfg.vocab_parallel:       # the vocabulary-parallel ends, outside the blocks' cycle
        from labkit.train.pipeline import stage_indices

        held = [stage_indices(r, cfg.pp, v) for r in range(cfg.pp)]
        ends = [(0 in h, cfg.pp * v - 1 in h) for h in held]      # holds the embedding / the head
        tp_s += m * max(first * _ring(tp_all_reduce, "all_reduce", act, cfg.tp)
                        + last * (_ring(tp_all_reduce, "all_reduce", act, cfg.tp)
                                  + 3 * _ring(tp_all_reduce, "all_reduce", act // mc.d_model, cfg.tp))
                        for first, last in ends)
    tp_o = 0.0
    if pairs and tp_cycle is not None:
        from labkit.perf.validate.tp_cycle import TPCycle

        if not isinstance(tp_cycle, TPCycle):
            raise checks.ArgumentTypeError(f"tp_cycle must be a TPCycle (tp_block_cycle), got {type(tp_cycle).__name__}")
        tp_o = tp_cycle.overhead_s(pairs, m, act)
    n_send = 2 * v * m if cfg.pp > 1 else 0
    pp_s = 0.0
    if n_send:
        tied = mc.vocab_size * mc.d_model * 4 // (cfg.tp if cfg.tp > 1 and cfg.vocab_parallel else 1)   # this rank's rows
        pp_s = n_send * _ring(send_recv, "send_recv", act, 2) + _ring(pp_all_reduce, "all_reduce", tied, cfg.pp)
    return MPStepPrediction(kind="tpxpp" if cfg.tp > 1 and cfg.pp > 1 else ("tp" if cfg.tp > 1 else "pp"),
                            nranks=n, tp=cfg.tp, pp=cfg.pp, micro_batches=m, compute_s=compute, bubble_s=bubble,
                            tp_s=tp_s, pp_s=pp_s, n_tp_all_reduce=n_ar, n_pp_sends=n_send, act_bytes=act,
                            bubble_fraction=bubble / compute, flops_per_s=rate, tp_overhead_s=tp_o, n_tp_pairs=pairs,
                            tp_in_cycle=bool(pairs and tp_cycle is not None and tp_cycle.includes_all_reduces))


def _rank_blocks(cfg) -> list:
    """Per pp rank, (0, blocks it holds) — its share of the 4-per-block TP all-reduces."""
    from labkit.train.pipeline import split_layers, stage_indices

    spans = split_layers(cfg.model_config.n_layers, cfg.pp * cfg.virtual_stages)
    return [(0, sum(spans[k][1] - spans[k][0] for k in stage_indices(r, cfg.pp, cfg.virtual_stages)))
            for r in range(cfg.pp)]


@dataclass
class MPValidation:
    """Predicted vs measured TP/PP cells: ``table`` (medians over rounds, one row per kind × ranks, every term),
    ``rounds`` (each round's rows), the links of the last round and the assumptions. Taught in chapter 24."""

    table: object
    rounds: list
    links: dict
    target: float
    assumptions: list
    cycles: dict = field(default_factory=dict)        # {(tp, ranks): TPCycle} of the last round
    parts: object = None                              # PartTimes of the last round

    def format(self) -> str:
        cols = {"kind": "config", "ranks": "ranks", "model": "size", "pred_compute_ms": "compute",
                "pred_bubble_ms": "bubble", "pred_tp_ms": "TP all-red.", "pred_tpo_ms": "TP cycle",
                "pred_pp_ms": "PP sends",
                "pred_step_ms": "predicted ms", "meas_step_ms": "measured ms"}
        t = self.table[list(cols)].rename(columns=cols)
        t["config"] = [{"tp": "TP", "pp": "PP 1F1B", "tpxpp": "TPxPP"}[k] for k in self.table["kind"]]
        t["error"] = [f"{e:+.1%}" for e in self.table["error"]]
        if len({r["round"] for r in self.rounds}) > 1:
            t["spread"] = [f"{x:.0%}" for x in self.table["meas_spread"]]
            t["by round"] = ["/".join(f"{e:+.0%}" for e in errs) for errs in self.table["round_errors"]]
        t[f"within {self.target:.0%}?"] = ["yes" if ok else "NO" for ok in self.table["met"]]
        links = [f"  link on {n} ranks, {op}: alpha {ab.alpha_s * 1e6:.1f} us, beta {ab.beta_s_per_byte * 1e9:.3f} ns/B"
                 for n, d in sorted(self.links.items()) for op, ab in sorted(d.items())]
        links += [f"  {c.format()}" for _, c in sorted(self.cycles.items())]
        links += [f"  {self.parts.format()}"] if self.parts is not None else []
        counts = [f"  {r.kind} x{r.ranks}: {int(r.n_tp)} TP all-reduces ({int(r.n_pairs)} column/row pairs) + "
                  f"{int(r.n_pp)} PP sends of "
                  f"{r.act_bytes / 1e3:.0f} kB per rank and step, bubble {r.bubble_fraction:.3f} of compute, "
                  f"{r.rate_gflops:.1f} GFLOP/s per rank" for r in self.table.itertuples()]
        met = int(self.table["met"].sum())
        return "\n".join(["TP/PP cells: predicted terms vs measured (ms per optimizer step):",
                          t.to_string(index=False, float_format=lambda x: f"{x:.1f}"),
                          f"within {self.target:.0%}: {met} of {len(self.table)} cells",
                          *(["TP all-red.: the alpha-beta of the 4 all-reduces per block and micro-batch, shown beside the TP "
                             "cycle measured on the GPT's blocks, which holds them (not added)"]
                            if self.cycles and all(c.includes_all_reduces for c in self.cycles.values()) else []),
                          "terms:", *counts,
                          "calibration (last round):", *links, "assumptions:", *(f"  - {a}" for a in self.assumptions)])


def _cells(kinds, counts):
    return [(k, n) for n in counts for k in kinds if n > 1 and (k != "tpxpp" or n == 4)]


def validate_mp(model: str = "small", kinds=MP_KINDS, nranks=(2, 4), *, micro_batch: int = 4, accum: int = 4,
                steps: int = 7, warmup_steps: int = 2, target: float = 0.15, link_iters: int = 5, rounds: int = 1,
                repeats: int = 3, timeout_s: float = 900, progress=None) -> MPValidation:
    """Calibrate, predict and measure the TP, PP (1F1B) and TP×PP cells of ``model`` on each rank count: per round
    and count, α–β of gloo all-reduce and send/recv fitted on n ranks (one sweep launch), then one launch that
    trains the cells (``repeats`` interleaved, median run) and, in the same processes, the plain model
    independently (the rate n ranks keep: :func:`labkit.perf.validate.runs.measure_steps_then_rates`); each cell
    predicted by :func:`predict_mp_step` from those alone. Medians over ``rounds``. Taught in chapter 24."""
    import os

    import pandas as pd

    from labkit.model.config import SIZES
    from labkit.perf.validate import fit as _fit
    from labkit.perf.validate.runs import measure_steps_then_rates
    from labkit.perf.validate.stage_times import measure_part_times
    from labkit.perf.validate.tp_cycle import tp_block_cycle
    from labkit.train import TrainConfig

    say = progress or (lambda line: None)
    checks.one_of("model", model, SIZES)
    kinds = [checks.one_of("kinds", k, MP_KINDS) for k in kinds]
    counts = sorted({checks.count("nranks", n, at_least=2) for n in nranks})
    cells = _cells(kinds, counts)
    if not cells:
        raise ValueError(f"kinds={kinds} on nranks={counts} give no cell (tpxpp needs 4 ranks)")
    checks.count("steps", steps, at_least=warmup_steps + 1)
    target = checks.fraction("target", target, open_low=True)
    base = TrainConfig(model=model, micro_batch=checks.count("micro_batch", micro_batch),
                       accum=checks.count("accum", accum), steps=steps, warmup_steps=warmup_steps, dtype="fp32",
                       device="cpu", label=model)
    plain = base.replace(parallel="single", label=f"{model} concurrent calibration")   # the same m micro-batches
    rows, links, cycles, parts, rate_at = [], {}, {}, None, {}
    mbs = sorted({max(1, micro_batch // 2), micro_batch, 2 * micro_batch})    # bracket the cells' activations
    from labkit.launcher.parent import cores_available

    cores = cores_available()
    for r in range(checks.count("rounds", rounds)):
        say(f"calibrating: the GPT's parts (embeddings, blocks, tail) forward + backward on 1 rank (round {r + 1})")
        parts = measure_part_times(model, micro_batch, tps={mp_config(base, k, n).tp for k, n in cells} - {1},
                                   timeout_s=timeout_s)
        for n in counts:
            here = [(k, m) for k, m in cells if m == n]
            if not here:
                continue
            say(f"calibrating: gloo all_reduce and send_recv sweeps on {n} ranks (round {r + 1})")
            # p10 (the collective undisturbed) while each rank has a core; with more ranks than cores a rank set
            # aside by the scheduler is the normal case (a 262 kB ping-pong: 0.3 ms on 2 ranks, 3.5 ms on 4 on 2
            # cores), so the median
            links[n] = _fit.fit_gloo_links(n, ("all_reduce", "send_recv"), iters=link_iters,
                                           stat="median" if n > cores else "p10")
            for t in sorted({mp_config(base, k, n).tp for k, _ in here} - {1}):     # each round afresh, as the cell
                say(f"calibrating: TP cycle, 2 GPT blocks split in groups of {t} in {n} ranks, vs their local shards")
                cycles[(r, t, n)] = tp_block_cycle(n, model, mbs, tp=t, timeout_s=timeout_s)
            say(f"measuring: {', '.join(k for k, _ in here)} on {n} ranks, {repeats} interleaved repeats; then the "
                "same processes compute plain and independently (the rate at this concurrency)")
            recs, rate = measure_steps_then_rates([mp_config(base, k, n) for k, _ in here], [plain], n,
                                                  repeats=repeats, timeout_s=timeout_s)
            rate_at[(r, n)] = rate[0]
            for (k, _), rec in zip(here, recs, strict=True):
                cfg = mp_config(base, k, n)
                tp_link = links.get(cfg.tp, links[n])["all_reduce"]
                pp_link = links.get(cfg.pp, links[n])["all_reduce"]
                pr = predict_mp_step(cfg, n, flops_per_s=rate[0], tp_all_reduce=tp_link, pp_all_reduce=pp_link,
                                     send_recv=links[n]["send_recv"],
                                     tp_cycle=cycles.get((r, cfg.tp, n)), part_times=parts, cores=cores,
                                     core_flops_per_s=rate_at.get((r, cores)) if n > cores else None)
                st = rec.step_time
                rows.append({"model": model, "kind": k, "ranks": n, "round": r, "pred_compute_ms": pr.compute_s * 1e3,
                             "pred_bubble_ms": pr.bubble_s * 1e3, "pred_tp_ms": pr.tp_s * 1e3,
                             "pred_tpo_ms": pr.tp_overhead_s * 1e3, "n_pairs": pr.n_tp_pairs,
                             "pred_pp_ms": pr.pp_s * 1e3, "pred_step_ms": pr.step_s * 1e3,
                             "meas_step_ms": st.median * 1e3, "n_tp": pr.n_tp_all_reduce, "n_pp": pr.n_pp_sends,
                             "act_bytes": pr.act_bytes, "bubble_fraction": pr.bubble_fraction,
                             "rate_gflops": rate[0] / 1e9})
    df = pd.DataFrame(rows)
    keys = ["model", "kind", "ranks"]
    g = df.groupby(keys, sort=False)
    t = g[[c for c in df.columns if c not in (*keys, "round")]].median().reset_index()
    t["meas_spread"] = g["meas_step_ms"].agg(lambda x: x.max() / x.min() - 1).to_numpy()
    t["round_errors"] = [tuple(x) for x in (df["pred_step_ms"] / df["meas_step_ms"] - 1).groupby(
        [df[k] for k in keys], sort=False).agg(list)]
    t["error"] = t["pred_step_ms"] / t["meas_step_ms"] - 1
    t["met"] = t["error"].abs() <= target

    assumptions = [
        f"{model}: micro-batch {micro_batch} sequences, m = accum = {accum} micro-batches, fp32, 1 thread per rank, "
        "dp = 1; PP runs 1F1B (v = 1)",
        "compute: the whole model's micro-batch at the hardware FLOP/s one rank keeps while n plain ranks of the same model (same micro-batch and m, "
        "so the optimizer step and data work per step are shared alike) compute independently, "
        "measured in the same processes right after the cells (never a TP or PP run), divided between the ranks by "
        "the measured times of the GPT's parts on 1 rank (labkit.perf.validate.stage_times; a block's tp-way local shard "
        "measured as such, embeddings "
        "and tail whole on every TP rank); the slowest pipeline rank x m",
        "TP: 4 all-reduces of b*s*h*4 bytes per block and micro-batch (Shoeybi et al. 2019 s3), gloo all-reduce "
        "alpha-beta fitted on tp ranks (p10 of a 64 KiB-16 MiB sweep; for TPxPP the 2-rank fit, taken with 2 ranks "
        "in the world), printed, not added; TP cycle: per column/row pair (2 per block) m x (a + b x b*s*h*4), "
        "measured on 2 of the GPT's blocks split by the trainer's plan in groups of tp ranks among n (as the cell: "
        "TPxPP's two groups of 2 at once on 4), 4 micro-batches a run, minus their plain local shards run by all n "
        "ranks at once: the all-reduces, DTensor's work and the waits (labkit.perf.validate.tp_cycle.tp_block_cycle)",
        "PP: 2*v*m sends of b*s*h*4 bytes per rank (gloo send/recv alpha-beta fitted on n ranks: p10 of the sweep "
        "with a core per rank, its median when ranks outnumber cores), plus the tied "
        "embedding's gradient all-reduce (V*h*4 bytes) over the pp group; compute + bubble: the 1F1B schedule "
        f"played op by op on this machine's {cores} cores, every runnable rank at an equal share of them "
        "(labkit.perf.validate.pipeline_sim; with a core per rank it is the formula's (p-1)/(v*m) of compute for "
        "equal stages, Narayanan et al. 2021 s2.2); compute = the slowest rank's m micro-batches at a core's speed "
        "(when ranks outnumber cores: the rate measured with as many ranks as cores in this round), bubble = the "
        "rest of the played step",
        "not priced: the pipeline schedule's Python work (~1 ms per micro-batch and stage), AdamW's per-step "
        "DTensor updates (~1 ms per pair and step); no overlap of communication with compute",
        f"load average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}",
    ]
    return MPValidation(table=t, rounds=rows, links=links, target=target, assumptions=assumptions,
                        cycles={(t, n): c for (k, t, n), c in cycles.items() if k == r}, parts=parts)
