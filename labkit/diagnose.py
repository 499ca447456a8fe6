"""Name the bottleneck of a training run: metrics → logs → topology → strategy.

:func:`diagnose` reads a :class:`~labkit.record.RunRecord` (and, when there is one, a
:class:`~labkit.trace.TraceAnalysis` of the same run) and walks the seed's order: MFU and utilisation
first, then exposed communication, then data loading, memory and scheduling. Each finding belongs to
one of five families — ``compute``, ``communication``, ``memory``, ``data``, ``scheduling`` — and
carries its evidence (the figures and the thresholds they crossed), a severity, and concrete advice
(what to change and what to expect). The *verdict* names the family whose finding puts the most step
time at stake (``score``: the estimated fraction of step time the bottleneck costs), or says
"no clear bottleneck".

Thresholds (:class:`Thresholds`) and why:

- ``mfu_low = 0.30``: tuned dense-transformer training reaches 40–55 % MFU (PaLM 540B 46.2 %,
  Chowdhery et al. 2022, Table 3; Megatron-LM 175B ≈ 52 %, Korthikanti et al. 2022, Table 5);
  below 30 % a run is untuned. Compute is blamed only when the MFU *of the busy time*
  (MFU ÷ (1 − exposed comm − data wait)) is low too — otherwise the time is lost elsewhere.
- ``comm_exposed = 0.15``: communication not hidden under compute above 15 % of the step is the
  point where overlap, bucketing or a different sharding strategy pays (Ch. 19–21).
- ``data_wait = 0.05`` (medium) / ``0.10`` (high): the loader should be invisible; a few percent is
  normal jitter, above 5 % more workers/prefetch or a faster format pays off directly.
- ``memory_near = 0.90`` of capacity: no room to grow the micro-batch; a memory budget that forced
  activation recomputation or a smaller micro-batch makes memory the root cause of the lost MFU.
- ``host_wait = 0.10`` of the step with short kernels (median < ``tiny_kernel_us = 10`` µs, about
  twice CUDA's ≈ 5 µs launch latency — NVIDIA, "CUDA C++ Best Practices Guide", §"Kernel launch"):
  the device waits for the host → scheduling (CUDA graphs, torch.compile, fewer larger kernels);
  on CPU traces, time between ops in no op at all above ``host_gap = 0.25``.
- ``peer_wait = 0.10``: exposed communication is split into *waiting for a late peer* (every rank
  but the last to arrive at a collective sits in it until the last one comes; :attr:`TraceAnalysis.
  peer_wait_share`) and *moving bytes*. Only the second is a communication problem (its score is
  the transfer share); the wait is load imbalance or jitter — a scheduling finding once it passes a
  tenth of the step, the same bar as a loader wait that should be invisible. A rank that is last
  more often than chance (``labkit.trace``: binomial test) is named as the straggler.

Severity from the score: high ≥ 0.25, medium ≥ 0.10, low otherwise; a finding below
``min_score = 0.05`` is not reported.

The verdict follows the seed's order: waits before math. When a communication, data, memory or
scheduling finding is at least medium, the largest of them is the primary bottleneck even if the
compute finding's score is larger — the MFU of the busy time can only be judged once the waits are
gone, and removing a wait needs no change to the model. Compute is primary when nothing else is.
Ranks waiting for each other with no single late rank (jitter) are the exception: no one change
removes that wait, so it competes on its score like compute.

Taught in chapter 14 (systematic diagnosis) and chapter 2 (the method: metrics first).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

FAMILIES = ("compute", "communication", "memory", "data", "scheduling")


@dataclass(frozen=True)
class Thresholds:
    """Where a figure becomes a finding (see the module docstring for the reasoning).

    Taught in chapter 14.
    """

    mfu_low: float = 0.30
    comm_exposed: float = 0.15
    data_wait: float = 0.05
    data_wait_high: float = 0.10
    memory_near: float = 0.90
    host_wait: float = 0.10
    host_gap: float = 0.25
    tiny_kernel_us: float = 10.0
    peer_wait: float = 0.10
    min_score: float = 0.05


@dataclass
class Finding:
    """One diagnosed problem. ``score``: estimated fraction of step time at stake.

    Taught in chapter 14.
    """

    family: str
    severity: str
    score: float
    title: str
    evidence: dict[str, Any]
    thresholds: dict[str, float]
    advice: list[str]
    note: str = ""

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family={self.family!r} is not valid; choose one of {FAMILIES}")


def _severity(score: float) -> str:
    return "high" if score >= 0.25 else "medium" if score >= 0.10 else "low"


@dataclass
class Diagnosis:
    """Findings in the diagnosis order (compute, communication, data, memory, scheduling) and a verdict.

    Taught in chapter 14.
    """

    findings: list[Finding]
    verdict: str
    primary: str | None
    figures: dict[str, Any] = field(default_factory=dict)

    def report(self) -> str:
        """A readable report: the figures read, then each finding with evidence and advice."""
        lines = ["Diagnosis (metrics → logs → topology → strategy)", ""]
        lines.append("Figures: " + ", ".join(f"{k} {_fmt(v)}" for k, v in self.figures.items() if v is not None))
        lines.append("")
        if not self.findings:
            lines.append("No finding crossed its threshold.")
        for i, f in enumerate(self.findings, 1):
            mark = "  <== primary" if f.family == self.primary else ""
            lines.append(f"{i}. [{f.family}] {f.title} — severity {f.severity}, "
                         f"≈{f.score:.0%} of step time at stake{mark}")
            for k, v in f.evidence.items():
                lines.append(f"     evidence  {k} = {_fmt(v)}")
            for k, v in f.thresholds.items():
                lines.append(f"     threshold {k} = {_fmt(v)}")
            if f.note:
                lines.append(f"     note      {f.note}")
            for a in f.advice:
                lines.append(f"     advice    {a}")
        lines.append("")
        lines.append(f"Verdict: {self.verdict}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "primary": self.primary, "figures": self.figures,
                "findings": [asdict(f) for f in self.findings]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)


def _fmt(v) -> str:
    if isinstance(v, float):
        if 0 < abs(v) < 1e-3 or abs(v) >= 1e5:
            return f"{v:.3g}"
        return f"{v:.3f}"
    return str(v)


def diagnose(record, trace=None, *, thresholds: Thresholds | None = None) -> Diagnosis:
    """Diagnose a run from its record (and its trace analysis when present).

    Trace figures win over the record's where both exist (the trace measures exposure directly:
    communication under compute is not a wait). Returns a :class:`Diagnosis`.

    Taught in chapter 14 (systematic diagnosis) and chapter 2 (metrics first).
    """
    from labkit.record import RunRecord

    if not isinstance(record, RunRecord):
        raise TypeError(f"record must be a labkit.record.RunRecord, got {type(record).__name__}")
    if trace is not None and not hasattr(trace, "shares"):
        raise TypeError(f"trace must be a labkit.trace.TraceAnalysis or None, got {type(trace).__name__}")
    th = thresholds or Thresholds()
    shares = trace.shares() if trace is not None else {}
    comm = shares.get("comm_exposed", record.comm_wait_share)
    data = shares.get("data_wait", record.data_wait_share)
    util = trace.utilisation if trace is not None else record.utilisation
    cfg = record.config or {}
    figs = {"mfu": record.mfu, "hfu": record.hfu, "utilisation": util, "comm_exposed_share": comm,
            "data_wait_share": data, "step_time_s": record.step_time.median if record.step_time else None,
            "tokens_per_s": record.tokens_per_s, "peak_source": record.peak_source}
    findings: list[Finding] = []
    comm_v, data_v = comm or 0.0, data or 0.0
    busy = max(1.0 - comm_v - data_v, 1e-9)

    # 1. compute: MFU and utilisation ---------------------------------------------------------
    compute = None
    if record.mfu is not None:
        busy_mfu = record.mfu / busy
        figs["busy_time_mfu"] = busy_mfu
        if record.mfu < th.mfu_low and busy_mfu < th.mfu_low:
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
            compute = Finding(
                "compute", _severity(score), score, "low MFU while busy: the math itself is inefficient", ev,
                {"mfu_low": th.mfu_low},
                ["raise the micro-batch (more tokens per GEMM) — MFU should climb toward the 30–50 % band; "
                 "use accumulation to keep the global batch",
                 "use bf16 (autocast) where the hardware has it — up to 2× on tensor cores / AVX512-BF16",
                 "fuse small ops (torch.compile) to cut per-op overhead; check the top ops are GEMMs"])
    elif util is not None and util < 1 - th.comm_exposed:
        figs["note"] = "no MFU in the record (no FLOP count or peak); utilisation used instead"

    # 2. communication ------------------------------------------------------------------------
    # the exposed time splits into waiting for a late peer (imbalance: a scheduling finding) and
    # moving bytes (what overlap, buckets and volume cuts can win)
    peer = trace.peer_wait_share if trace is not None else 0.0
    strag = _straggler(trace)
    if peer:
        figs["peer_wait_share"] = peer
    if comm is not None and comm > th.comm_exposed:
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
                  "right-size buckets (bucket_cap_mb): one huge bucket cannot overlap, tiny ones are latency-bound",
                  "cut volume: bf16 gradients/reduce dtype, gradient accumulation (sync once per step), "
                  "or a sharding strategy with less traffic — expect the exposed share to fall toward the hidden part"]
        if strag and peer <= th.peer_wait:       # too small for a finding of its own: say it here
            advice.append(f"balance the work of rank {strag['straggler_rank']} (it arrives last): the "
                          f"{peer:.0%} the others wait for it goes")
        findings.append(Finding("communication", _severity(transfer), transfer, "exposed communication", ev,
                                {"comm_exposed": th.comm_exposed}, advice, note))
    if peer > th.peer_wait:
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
        findings.append(Finding(
            "scheduling", _severity(peer), peer, title, ev, {"peer_wait": th.peer_wait},
            [first, "compare the ranks' step times (labkit.trace stragglers table): a slow node is replaced, "
                    "uneven data is rebalanced"]))

    # 3. data ----------------------------------------------------------------------------------
    if data is not None and data > th.data_wait:
        ev = {"data_wait_share": data}
        if trace is not None:
            ev["data_wait_s_per_rank"] = trace.data_wait_s
        if record.phases.get("data") is not None:
            ev["data_phase_median_s"] = record.phases["data"].median
        nw = cfg.get("num_workers")
        if nw is not None:
            ev["num_workers"] = nw
        findings.append(Finding(
            "data", "high" if data > th.data_wait_high else _severity(data), data,
            "the step waits for the data loader", ev,
            {"data_wait": th.data_wait, "data_wait_high": th.data_wait_high},
            ["use DataLoader workers (num_workers ≥ 2) with prefetch_factor and pin_memory on GPU — "
             f"expect up to {data:.0%} off the step time",
             "move decoding/augmentation offline or to the GPU; store pre-tokenised data (memmap)",
             "check the loader alone (iterate it without the model) to confirm its rate"]))

    # 4. memory --------------------------------------------------------------------------------
    mem = _memory_finding(record, th, compute)
    if mem is not None:
        findings.append(mem)
        if compute is not None and mem.evidence.get("forced_by_memory_budget"):
            compute.note = "a consequence of the memory finding: the memory budget forced the small micro-batch"
            mem.score = min(1.0, mem.score + compute.score)
            mem.severity = _severity(mem.score)
            compute.score = 0.0
            compute.severity = "low"

    # 5. scheduling ----------------------------------------------------------------------------
    if trace is not None:
        sch = _scheduling_finding(trace, th)
        if sch is not None:
            findings.append(sch)

    if compute is not None:
        findings.insert(0, compute)
    findings = [f for f in findings if f.score >= th.min_score or f.note]
    order = {f: i for i, f in enumerate(("compute", "communication", "data", "memory", "scheduling"))}
    findings.sort(key=lambda f: order[f.family])
    live = [f for f in findings if f.score >= th.min_score]
    if not live:
        verdict, primary = ("no clear bottleneck: every figure is within its threshold "
                            f"(MFU {_pct(record.mfu)}, exposed comm {_pct(comm)}, data wait {_pct(data)})"), None
    else:
        # jitter (ranks waiting for each other with no single late rank) has no one change that
        # removes it: it competes on its score like compute, without the precedence of a wait
        waits = [f for f in live if f.family != "compute" and f.score >= 0.10 and not _is_jitter(f)]
        top = max(waits or live, key=lambda f: f.score)
        primary = top.family
        verdict = (f"{primary}-bound: {top.title} (≈{top.score:.0%} of step time at stake). "
                   f"First change: {top.advice[0]}")
    return Diagnosis(findings=findings, verdict=verdict, primary=primary, figures=figs)


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


def _memory_finding(record, th: Thresholds, compute) -> Finding | None:
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
    recompute = bool(cfg.get("checkpoint")) or (record.hfu is not None and record.mfu is not None
                                                and record.hfu > record.mfu * 1.02)
    if cfg.get("memory_budget_bytes") and (forced_mb or recompute):
        ev["forced_by_memory_budget"] = True
        ev["memory_budget_bytes"] = cfg["memory_budget_bytes"]
        if forced_mb:
            ev["micro_batch"] = f"{cfg['micro_batch']} (wanted {requested})"
    if recompute and record.hfu and record.mfu:
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
    return Finding("memory", _severity(score), score, "memory limits the configuration", ev,
                   {"memory_near": th.memory_near}, advice)


def _scheduling_finding(trace, th: Thresholds) -> Finding | None:
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
        return Finding("scheduling", _severity(hw), hw, "the device waits for the host to launch work", ev,
                       {"host_wait": th.host_wait, "tiny_kernel_us": th.tiny_kernel_us},
                       ["capture the step in CUDA graphs or torch.compile(mode='reduce-overhead') — removes "
                        "launch gaps", "fuse tiny kernels (torch.compile), avoid host syncs (.item(), "
                        "printing, CPU-side control flow) inside the step",
                        "expect the host-wait share to fall toward zero"])
    gap = s["idle_other"]
    if gap <= th.host_gap:
        return None
    return Finding("scheduling", _severity(gap), gap, "the compute thread sits in no op (Python, sleeps, waits)",
                   {"idle_outside_ops_share": gap}, {"host_gap": th.host_gap},
                   ["profile the Python between ops (py-spy / torch.profiler with_stack) and remove host work "
                    "from the step loop; torch.compile cuts dispatch overhead"])
