"""The diagnosis rules, one per family, and :func:`diagnose`, which runs them and gives the verdict.

Each rule is ``rule(record, trace, thresholds) -> Finding | None``: it reads the
:class:`~labkit.record.RunRecord` (and the :class:`~labkit.trace.TraceAnalysis` of the same run, or
None) and returns its family's finding, or None when no figure crossed its threshold. Trace figures
win over the record's where both exist. The scheduling family has two rules: ranks waiting for a late
peer at the collectives (:func:`peer_wait`) and a device or thread waiting for the host
(:func:`scheduling`).

The verdict's order (waits before math; jitter competes on its score) is explained in
:mod:`labkit.diagnose`.

Taught in chapter 14 (systematic diagnosis) and chapter 2 (the method: metrics first).
"""
from __future__ import annotations

from typing import Any

from labkit.checks import ArgumentTypeError, count, positive
from labkit.diagnose.verdict import Diagnosis, Finding, Thresholds

__all__ = ["diagnose", "compute", "communication", "peer_wait", "data", "memory", "scheduling", "RULES",
           "ORDER"]

# the order findings are listed in (the seed's: metrics, then the waits, then memory and scheduling)
ORDER = ("compute", "communication", "data", "memory", "scheduling")


# ----------------------------------------------------------------------------- shared figures
# the free-form config/device entries the rules compute with: checked before any rule reads them
_CONFIG_COUNTS = ("micro_batch", "micro_batch_requested", "seq_len", "seq_len_used")
_CONFIG_SIZES = ("memory_budget_bytes",)


def _check_config(record) -> None:
    """The config/device numbers the rules use (None = unknown): ints >= 1 and sizes > 0, named."""
    cfg, dev = record.config, record.device
    for key in _CONFIG_COUNTS:
        if cfg.get(key) is not None:
            count(f"record.config[{key!r}]", cfg[key])
    for key in _CONFIG_SIZES:
        if cfg.get(key) is not None:
            positive(f"record.config[{key!r}]", cfg[key])
    if dev.get("memory_bytes") is not None:
        positive("record.device['memory_bytes']", dev["memory_bytes"])
    if cfg.get("num_workers") is not None:
        count("record.config['num_workers']", cfg["num_workers"], at_least=0)
    if cfg.get("checkpoint") is not None:      # a bool or a chapter-21 policy ("every:2", "attention")
        from labkit.model.config import checkpoint_policy

        try:
            checkpoint_policy(cfg["checkpoint"])
        except ValueError as e:
            raise ValueError(f"record.config['checkpoint']: {e}") from None



def _checkpointed(value) -> bool:
    """Whether a record's ``checkpoint`` (a bool or a chapter-21 policy) recomputes anything."""
    from labkit.model.config import checkpoint_policy

    return value is not None and checkpoint_policy(value) != "none"


def _exposure(record, trace) -> tuple[float | None, float | None, float | None]:
    """(exposed communication share, data-wait share, utilisation): the trace's where there is one."""
    shares = trace.shares() if trace is not None else {}
    comm = shares.get("comm_exposed", record.comm_wait_share)
    data = shares.get("data_wait", record.data_wait_share)
    util = trace.utilisation if trace is not None else record.utilisation
    return comm, data, util


def _busy(comm: float | None, data: float | None) -> float:
    """Share of the step that is neither exposed communication nor a data wait."""
    return max(1.0 - (comm or 0.0) - (data or 0.0), 1e-9)


def _peer(trace) -> float:
    """Share of the step that ranks spend waiting for a late peer inside the collectives."""
    return trace.peer_wait_share if trace is not None else 0.0


def figures(record, trace, th: Thresholds) -> dict[str, Any]:
    """The figures a diagnosis reads (``Diagnosis.figures``). Taught in chapter 14."""
    comm, data, util = _exposure(record, trace)
    figs = {"mfu": record.mfu, "hfu": record.hfu, "utilisation": util, "comm_exposed_share": comm,
            "data_wait_share": data, "step_time_s": record.step_time.median if record.step_time else None,
            "tokens_per_s": record.tokens_per_s, "peak_source": record.peak_source}
    if record.mfu is not None:
        figs["busy_time_mfu"] = min(record.mfu / _busy(comm, data), 1.0)
        if record.mfu > _busy(comm, data):
            figs["note_busy_time_mfu"] = ("MFU exceeds the share of the step not spent waiting: the wait shares "
                                          "overlap device work (host-side timing?); busy-time MFU capped at 100 %")
    elif util is not None and util < 1 - th.comm_exposed:
        figs["note"] = "no MFU in the record (no FLOP count or peak); utilisation used instead"
    peer = _peer(trace)
    if peer:
        figs["peer_wait_share"] = peer
    return figs


# ----------------------------------------------------------------------------- 1. compute
def compute(record, trace, th: Thresholds) -> Finding | None:
    """Low MFU, and low MFU of the busy time too: the math itself is inefficient. Taught in chapter 14."""
    if record.mfu is None:
        return None
    comm, data, _ = _exposure(record, trace)
    busy = _busy(comm, data)
    busy_mfu = min(record.mfu / busy, 1.0)          # > 1 only when the wait shares overlap device work
    if not (record.mfu < th.mfu_low and busy_mfu < th.mfu_low):
        return None
    cfg = record.config or {}
    score = busy * (1.0 - busy_mfu / th.mfu_low)
    ev = {"mfu": record.mfu, "busy_time_mfu": busy_mfu, "peak_source": record.peak_source}
    mb = cfg.get("micro_batch")
    seq = cfg.get("seq_len_used") or cfg.get("seq_len")
    if mb:
        ev["micro_batch"] = mb
    if mb and seq:
        ev["tokens_per_micro_batch"] = mb * seq
    if trace is not None:
        ev.update(_op_granularity(trace))
    return Finding(
        "compute", th.severity(score), score, "low MFU while busy: the math itself is inefficient", ev,
        {"mfu_low": th.mfu_low},
        ["raise the micro-batch (more tokens per GEMM) — MFU should climb toward the 30–50 % band; "
         "use accumulation to keep the global batch",
         "use bf16 (autocast) where the hardware has it — up to 2× on tensor cores / AVX512-BF16",
         "fuse small ops (torch.compile) to cut per-op overhead; check the top ops are GEMMs"])


# ----------------------------------------------------------------------------- 2. communication
def communication(record, trace, th: Thresholds) -> Finding | None:
    """Exposed communication above ``comm_exposed``; scored by the part that moves bytes. Chapter 14."""
    # the exposed time splits into waiting for a late peer (imbalance: a scheduling finding) and
    # moving bytes (what overlap, buckets and volume cuts can win)
    comm, _, _ = _exposure(record, trace)
    if not (comm is not None and comm > th.comm_exposed):
        return None
    peer = _peer(trace)
    strag = _straggler(trace)
    transfer = max(comm - peer, 0.0)
    ev = {"comm_exposed_share": comm}
    if peer:
        ev["peer_wait_share"] = peer
        ev["transfer_share"] = transfer
    if trace is not None:
        ov = [v for v in trace.overlap.values() if v == v]
        if ov:
            ev["overlap_fraction"] = sum(ov) / len(ov)
        if trace.comm_by_type is not None and not trace.comm_by_type.empty:
            top = trace.comm_by_type.iloc[0]
            ev["largest_collective"] = f"{top['type']} x{int(top['count'])}, {top['total_s'] * 1e3:.1f} ms"
            if top["algbw_GBps"] == top["algbw_GBps"]:
                ev["algbw_GBps"] = float(top["algbw_GBps"])
    ev.update(strag)
    note = ""
    if strag or peer >= th.min_score:
        who = (f"rank {strag['straggler_rank']} arrives last at most collectives: " if strag else "") + \
            f"{peer:.0%} of the step is ranks waiting for a late peer inside the collectives"
        note = who + ("; see the scheduling finding" if peer > th.peer_wait else "") + \
            f"; communication fixes win at most the {transfer:.0%} that moves bytes"
    advice = ["overlap communication with backward (DDP buckets fire during backward; FSDP prefetch)",
              _unit_advice((record.config or {}).get("parallel")),
              "cut volume: bf16 gradients/reduce dtype, gradient accumulation (sync once per step), "
              "or a sharding strategy with less traffic — expect the exposed share to fall toward the hidden part"]
    if strag and peer <= th.peer_wait:       # too small for a finding of its own: say it here
        advice.append(f"balance the work of rank {strag['straggler_rank']} (it arrives last): the "
                      f"{peer:.0%} the others wait for it goes")
    return Finding("communication", th.severity(transfer), transfer, "exposed communication", ev,
                   {"comm_exposed": th.comm_exposed}, advice, note)


def _unit_advice(parallel) -> str:
    """How to size the unit of communication: ``bucket_cap_mb`` is DDP's knob; FSDP has no gradient buckets,
    its unit is the ``fully_shard`` (FSDP1: wrap) unit (PyTorch DDP and FSDP2 API docs). Chapter 14."""
    if parallel == "ddp":
        return "right-size DDP's buckets (bucket_cap_mb): one huge bucket cannot overlap, tiny ones are latency-bound"
    if parallel in ("fsdp", "fsdp1"):
        return ("right-size FSDP's units (fully_shard per transformer block; FSDP has no bucket_cap_mb): "
                "reshard_after_forward=False skips the backward all-gather at the cost of memory")
    return ("right-size the unit of communication: DDP's buckets (bucket_cap_mb; one huge bucket cannot overlap, "
            "tiny ones are latency-bound), FSDP's fully_shard units (FSDP has no bucket_cap_mb)")


def peer_wait(record, trace, th: Thresholds) -> Finding | None:
    """Scheduling: ranks wait for a late peer (a straggler) or for each other (jitter) at the
    collectives, above ``peer_wait`` of the step. Taught in chapter 14 (and chapter 9, stragglers)."""
    peer = _peer(trace)
    if not peer > th.peer_wait:
        return None
    strag = _straggler(trace)
    ev = {"peer_wait_share": peer, **strag}
    if strag:
        title = f"ranks wait for rank {strag['straggler_rank']} at the collectives (a straggler)"
        first = (f"balance the work of rank {strag['straggler_rank']} (it arrives last; its compute before "
                 "each collective is longer) — check its device clocks/thermals, host load and its share of "
                 f"the data: up to {peer:.0%} of the step comes back")
    else:
        title = "ranks wait for each other at the collectives (jitter: no single rank is late)"
        first = ("make the ranks' work equal and steady: equal tokens per rank (pack sequences), no other "
                 "jobs or host work on the nodes, pinned CPU affinity — the wait shrinks with the step-time "
                 "spread")
    return Finding(
        "scheduling", th.severity(peer), peer, title, ev, {"peer_wait": th.peer_wait},
        [first, "compare the ranks' step times (labkit.trace stragglers table): a slow node is replaced, "
                "uneven data is rebalanced"])


# ----------------------------------------------------------------------------- 3. data
def data(record, trace, th: Thresholds) -> Finding | None:
    """The step waits for the data loader above ``data_wait`` (high above ``data_wait_high``). Chapter 14."""
    _, wait, _ = _exposure(record, trace)
    if not (wait is not None and wait > th.data_wait):
        return None
    cfg = record.config or {}
    ev = {"data_wait_share": wait}
    if trace is not None:
        ev["data_wait_s_per_rank"] = trace.data_wait_s
    if record.phases.get("data") is not None:
        ev["data_phase_median_s"] = record.phases["data"].median
    nw = cfg.get("num_workers")
    if nw is not None:
        ev["num_workers"] = nw
    return Finding(
        "data", "high" if wait > th.data_wait_high else th.severity(wait), wait,
        "the step waits for the data loader", ev,
        {"data_wait": th.data_wait, "data_wait_high": th.data_wait_high},
        ["use DataLoader workers (num_workers ≥ 2) with prefetch_factor and pin_memory on GPU — "
         f"expect up to {wait:.0%} off the step time",
         "move decoding/augmentation offline or to the GPU; store pre-tokenised data (memmap)",
         "check the loader alone (iterate it without the model) to confirm its rate"])


# ----------------------------------------------------------------------------- 4. memory
def memory(record, trace, th: Thresholds) -> Finding | None:
    """Memory nearly full, or a memory budget that forced a small micro-batch or recomputation.

    Record figures only (``trace`` is not read). Taught in chapter 14 (and chapter 13, memory).
    """
    cfg = record.config or {}
    ev: dict[str, Any] = {}
    score = 0.0
    advice = []
    cap = (record.device or {}).get("memory_bytes") or cfg.get("memory_budget_bytes")
    if record.peak_memory_bytes and cap:
        frac = record.peak_memory_bytes / cap
        ev["peak_memory_fraction"] = frac
        if frac >= th.memory_near:
            score = max(score, th.min_score)
            advice.append("memory is nearly full: shard optimizer state/gradients (ZeRO/FSDP) to free room "
                          "before growing the micro-batch")
    requested = cfg.get("micro_batch_requested")
    forced_mb = requested is not None and cfg.get("micro_batch") is not None and cfg["micro_batch"] < requested
    recompute = _checkpointed(cfg.get("checkpoint")) or (record.hfu is not None and record.mfu is not None
                                                and record.hfu > record.mfu * th.recompute_hfu_ratio)
    if cfg.get("memory_budget_bytes") and (forced_mb or recompute):
        ev["forced_by_memory_budget"] = True
        ev["memory_budget_bytes"] = cfg["memory_budget_bytes"]
        if forced_mb:
            ev["micro_batch"] = f"{cfg['micro_batch']} (wanted {requested})"
    if recompute and record.hfu and record.mfu and record.hfu > record.mfu:   # (HFU < MFU: hand-edited)
        cost = 1.0 - record.mfu / record.hfu       # share of executed FLOPs that are recomputation
        ev["recompute_share_of_flops"] = cost
        ev["hfu_minus_mfu"] = record.hfu - record.mfu
        score += cost * (1.0 - (record.comm_wait_share or 0.0) - (record.data_wait_share or 0.0))
        advice.append("activation recomputation re-runs the forward (≈ +33 % FLOPs for full recompute): use "
                      "selective recompute or free memory elsewhere and turn it off")
    if ev.get("forced_by_memory_budget"):
        score = max(score, th.min_score)
        advice.insert(0, "the memory budget forced a small micro-batch/recomputation: free memory (FSDP/ZeRO "
                         "sharding, bf16 params, fused loss, offload) so the micro-batch can grow — expect MFU to "
                         "return toward the unconstrained run's")
    if not advice:
        return None
    return Finding("memory", th.severity(score), score, "memory limits the configuration", ev,
                   {"memory_near": th.memory_near}, advice)


# ----------------------------------------------------------------------------- 5. scheduling
def scheduling(record, trace, th: Thresholds) -> Finding | None:
    """The device waits for the host to launch work (GPU trace), or the compute thread sits in no op
    (CPU trace). Needs a trace. Taught in chapter 14 (and chapter 17, launch overhead)."""
    if trace is None:
        return None
    s = trace.shares()
    if trace.kind == "gpu":
        hw = s["idle_host_wait"] - min(s["data_wait"], s["idle_host_wait"])   # data waits are the data family
        if hw <= th.host_wait:
            return None
        ev = {"device_idle_waiting_for_host_share": hw, "utilisation": trace.utilisation}
        top = trace.top_ops(50, kind="kernel")
        if not top.empty:
            med = float((top["total_s"] / top["count"]).median() * 1e6)
            ev["median_kernel_us_top50"] = med
        return Finding("scheduling", th.severity(hw), hw, "the device waits for the host to launch work", ev,
                       {"host_wait": th.host_wait, "tiny_kernel_us": th.tiny_kernel_us},
                       ["capture the step in CUDA graphs or torch.compile(mode='reduce-overhead') — removes "
                        "launch gaps", "fuse tiny kernels (torch.compile), avoid host syncs (.item(), "
                        "printing, CPU-side control flow) inside the step",
                        "expect the host-wait share to fall toward zero"])
    gap = s["idle_other"]
    if gap <= th.host_gap:
        return None
    return Finding("scheduling", th.severity(gap), gap, "the compute thread sits in no op (Python, sleeps, waits)",
                   {"idle_outside_ops_share": gap}, {"host_gap": th.host_gap},
                   ["profile the Python between ops (py-spy / torch.profiler with_stack) and remove host work "
                    "from the step loop; torch.compile cuts dispatch overhead"])


# every rule, in the order their findings are gathered (the two scheduling rules keep this order)
RULES = (compute, communication, peer_wait, data, memory, scheduling)


# ----------------------------------------------------------------------------- the verdict
def diagnose(record, trace=None, *, thresholds: Thresholds | None = None) -> Diagnosis:
    """Diagnose a run from its record (and its trace analysis when present).

    Trace figures win over the record's where both exist (the trace measures exposure directly:
    communication under compute is not a wait). Returns a :class:`~labkit.diagnose.verdict.Diagnosis`.

    Taught in chapter 14 (systematic diagnosis) and chapter 2 (metrics first).
    """
    from labkit.record import RunRecord

    if not isinstance(record, RunRecord):
        raise ArgumentTypeError(f"record must be a labkit.record.RunRecord, got {type(record).__name__}")
    if trace is not None and not hasattr(trace, "shares"):
        raise ArgumentTypeError(f"trace must be a labkit.trace.TraceAnalysis or None, got {type(trace).__name__}")
    if thresholds is not None and not isinstance(thresholds, Thresholds):
        raise ArgumentTypeError(f"thresholds must be a labkit.diagnose.Thresholds or None, got "
                                f"{type(thresholds).__name__}")
    record.validate()        # fields edited after construction are checked too: the rules rely on the ranges
    _check_config(record)
    th = thresholds or Thresholds()
    found = [(rule, rule(record, trace, th)) for rule in RULES]
    by_rule = dict(found)
    _blame_memory(by_rule[compute], by_rule[memory], th)
    findings = [f for _, f in found if f is not None and (f.score >= th.min_score or f.note)]
    findings.sort(key=lambda f: ORDER.index(f.family))
    live = [f for f in findings if f.score >= th.min_score]
    comm, data_share, _ = _exposure(record, trace)
    if not live:
        verdict, primary = ("no clear bottleneck: every figure is within its threshold (MFU "
                            f"{_pct(record.mfu)}, exposed comm {_pct(comm)}, data wait {_pct(data_share)})"), None
    else:
        # jitter (ranks waiting for each other with no single late rank) has no one change that
        # removes it: it competes on its score like compute, without the precedence of a wait
        waits = [f for f in live if f.family != "compute" and f.score >= th.severity_medium and not _is_jitter(f)]
        top = max(waits or live, key=lambda f: f.score)
        primary = top.family
        verdict = (f"{primary}-bound: {top.title} (≈{top.score:.0%} of step time at stake). "
                   f"First change: {top.advice[0]}")
    return Diagnosis(findings=findings, verdict=verdict, primary=primary, figures=figures(record, trace, th))


def _blame_memory(comp: Finding | None, mem: Finding | None, th: Thresholds) -> None:
    """A memory budget that forced the small micro-batch makes memory the root cause of the low MFU:
    the compute finding's time at stake moves to the memory finding."""
    if comp is None or mem is None or not mem.evidence.get("forced_by_memory_budget"):
        return
    comp.note = "a consequence of the memory finding: the memory budget forced the small micro-batch"
    mem.score = min(1.0, mem.score + comp.score)
    mem.severity = th.severity(mem.score)
    comp.score = 0.0
    comp.severity = "low"


def _is_jitter(f: Finding) -> bool:
    """A peer-wait finding that names no straggler."""
    return f.family == "scheduling" and "peer_wait_share" in f.evidence and "straggler_rank" not in f.evidence


def _pct(v) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def _op_granularity(trace) -> dict:
    """Evidence of per-op overhead: how long the typical top op/kernel runs."""
    top = trace.top_ops(20)
    if top.empty:
        return {}
    mean_us = float((top["total_s"] / top["count"]).median() * 1e6)
    return {"median_mean_op_us_top20": mean_us, "ops_in_trace_top20": int(top["count"].sum())}


def _straggler(trace) -> dict:
    if trace is None or trace.stragglers is None or trace.stragglers.empty:
        return {}
    s = trace.stragglers
    hit = s[s["straggler"]]
    if hit.empty:
        return {}
    r = hit.iloc[0]
    out = {"straggler_rank": int(r["rank"]), "straggler_last_at": f"{int(r['times_last'])}/{int(r['n_collectives'])}",
           "straggler_mean_late_s": float(r["mean_late_s"])}
    cb = trace.comm_by_type
    if cb is not None and not cb.empty:
        out["collective_mean_s"] = float(cb["total_s"].sum() / cb["count"].sum())
    return out
