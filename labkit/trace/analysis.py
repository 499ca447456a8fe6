"""Analyse torch.profiler traces: where each step's time goes, per rank, and who is late.

``analyze(path)`` reads one Chrome trace or a folder of per-rank traces (``.json``/``.json.gz``,
CPU-only or with GPU kernels, with or without ``distributedInfo``/``ProfilerStep``) and returns a
:class:`TraceAnalysis`: per rank and step, time in compute, communication (exposed vs hidden under
compute), memory copies and idle (host wait vs other), communication by collective type with bytes
and algorithmic bandwidth where the trace records message sizes, data-loader wait, top ops, and
stragglers (who arrives last at each collective, and how long the others wait for it;
:mod:`labkit.trace.stragglers`). The definitions of every bucket are in :mod:`labkit.trace.breakdown`;
HTA's own definitions (for a peer check) are in :mod:`labkit.trace.hta`. A folder of ranks is read streamed
(:mod:`labkit.trace.summary`): each rank is reduced to its summary in a worker, which writes the summary's
arrays to a private temporary folder (:mod:`labkit.trace.spill`, deleted on any exit); the parent moves them, one
rank at a time, into the job's tables, which are kept on disk (:mod:`labkit.trace.jobtables`,
:mod:`labkit.trace.ondisk`): ``step_breakdown`` (80 bytes per rank and step) and ``collectives`` (8 per rank and
collective) are read from their files the first time they are asked for, and the figures made from them
(``breakdown``, ``stragglers``, ``comm_by_type``) are made on the way in slabs. The parent never holds every rank's
summary's arrays, any rank's events, or a whole ranks × steps table it was not asked for: of each rank it holds
the summary's identity and op tables (~15 KB) and its ``breakdown`` row (``benchmarks/bench_trace_jobscale.py``:
0.05 MB a rank from 64 to 128 ranks, where stop 42's parent grew 1.29).

Algorithmic bandwidth is message bytes ÷ time (nccl-tests' ``algbw``,
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md); bytes come from
``record_param_comms``/NCCL-kernel args ``In msg nelems`` × size of ``dtype``.

Taught in chapter 9 (``chapters/part2_diagnosis/ch09_trace_analytics.ipynb``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from labkit import checks
from labkit.trace.breakdown import COLUMNS
from labkit.trace.ondisk import Lazy

__all__ = ["analyze", "analysis_of", "TraceAnalysis"]

_PARTS = ("compute", "comm_exposed", "memcpy", "idle_host_wait", "idle_other")


@dataclass
class TraceAnalysis:
    """Result of :func:`analyze` (all times in seconds).

    ``breakdown``: one row per rank, summed over the selected steps — ``compute``, ``comm_exposed``,
    ``comm_hidden``, ``memcpy``, ``idle_host_wait``, ``idle_other``, ``total``, ``data_wait`` and the
    same as ``*_share`` of ``total``. ``step_breakdown``: the same per (rank, step). ``overlap``: per
    rank, the fraction of communication hidden under compute (GPU: NCCL kernels under compute kernels;
    CPU: gloo-thread time while the main thread runs ops — see :mod:`labkit.trace.breakdown` for the
    definitions and the shared-cores caveat); NaN for a rank without communication. ``comm_by_type``:
    per collective type count, time (the spans as recorded), bytes and algbw. ``stragglers``: per rank, how often it arrived last at a collective,
    its mean lateness, its compute before the collective, whether that makes it a straggler (last
    more often than chance, see :func:`labkit.trace.stragglers.stragglers`) and ``peer_wait_s``, the time it sat in collectives
    waiting for the last arrival (:attr:`peer_wait_share`). ``collectives``: the aligned table.

    Taught in chapter 9.
    """

    kind: str
    paths: list[str]
    ranks: list[int]
    steps: list[int]
    breakdown: Any
    step_breakdown: Any = field(repr=False)     # a frame, or kept on disk until asked for (see _on_demand)
    overlap: dict[int, float]
    comm_by_type: Any
    stragglers: Any
    collectives: Any = field(repr=False)
    data_wait_s: float
    _ops: dict[str, Any] = field(default_factory=dict, repr=False)

    def __getstate__(self):
        """Pickled (or deep-copied) with its tables read in: the files stay with this process."""
        d = dict(self.__dict__)
        for k in _ON_DEMAND:
            if isinstance(d.get("_" + k), Lazy):
                d["_" + k] = d["_" + k].get()
        return d

    # ------------------------------------------------------------------ summaries
    def shares(self) -> dict[str, float]:
        """Shares of the step time averaged over ranks (time-weighted)."""
        b = self.breakdown
        tot = float(b["total"].sum())
        return {c: (float(b[c].sum()) / tot if tot else 0.0) for c in COLUMNS if c != "total"}

    @property
    def utilisation(self) -> float:
        """Fraction of the window the device (CPU: the main thread or gloo) was busy."""
        s = self.shares()
        return 1.0 - s["idle_host_wait"] - s["idle_other"]

    @property
    def comm_wait_share(self) -> float:
        return self.shares()["comm_exposed"]

    @property
    def data_wait_share(self) -> float:
        return self.shares()["data_wait"]

    @property
    def peer_wait_share(self) -> float:
        """Part of the exposed communication that is waiting for a late peer (time-weighted over ranks).

        At each aligned collective a rank that arrives before the last one waits ``last arrival − its
        arrival`` (at most the collective's duration) before any byte can move; that wait is load
        imbalance or jitter, not link speed. Counted as exposed in proportion to the rank's exposed
        share of communication (a wait under compute costs nothing). 0 with one rank.

        Taught in chapter 9 (stragglers) and chapter 14 (diagnosis).
        """
        s = self.stragglers
        tot = float(self.breakdown["total"].sum())
        if s is None or s.empty or "peer_wait_s" not in s or not tot:
            return 0.0
        exposed = 0.0
        for r, w in zip(s["rank"], s["peer_wait_s"], strict=True):
            ov = self.overlap.get(int(r), float("nan"))
            exposed += float(w) * (1.0 - ov if ov == ov else 1.0)
        return min(exposed / tot, self.comm_wait_share)

    def top_ops(self, n: int = 10, kind: str = "auto"):
        """The ``n`` op (CPU trace) or kernel (GPU trace) names with most total time, all ranks and
        selected steps together: count, total_s, mean_s, share of summed step time. CPU ``cpu_op``
        durations are inclusive (an op's children are counted in it too).

        Taught in chapter 9.
        """
        import pandas as pd

        checks.count("n", n)
        checks.one_of("kind", kind, ("auto", "kernel", "cpu_op"))
        if kind == "auto":
            kind = "kernel" if self.kind == "gpu" else "cpu_op"
        table = self._ops.get(kind)
        if table is None or table.empty:
            return pd.DataFrame(columns=["name", "count", "total_s", "mean_s", "share"])
        tot = float(self.breakdown["total"].sum())
        t = table.sort_values("total_s", ascending=False).head(n).reset_index(drop=True)
        t["share"] = t["total_s"] / tot if tot else 0.0
        return t

    def step_times(self):
        """Seconds per selected step, the slowest rank's (a synchronous step ends when the last rank
        does); one value for the whole window when the trace has no ``ProfilerStep``.

        Taught in chapter 14 (the baseline record).
        """
        per = self.step_breakdown.groupby("step")["total"].max()
        return [float(v) for v in per.to_numpy()]

    def update_record(self, record, *, tokens_per_step=None, flops_per_token=None, peak_flops=None,
                      n_devices=None, peak_source: str = "user"):
        """Fill ``utilisation``, ``comm_wait_share`` and ``data_wait_share`` of a RunRecord (in place;
        returns it) and note the trace in ``record.extra["trace"]``.

        A foreign trace has no FLOP count: give ``tokens_per_step`` (global, unpadded) and the record
        also gets the trace's ``step_time`` (:meth:`step_times`) and ``tokens_per_s``; add
        ``flops_per_token`` (model FLOPs, e.g. :func:`labkit.model.shapes.from_hf_config` then
        :func:`labkit.flops.model_flops_per_token`) and ``peak_flops`` (per device) and it gets ``mfu``
        (:func:`labkit.flops.mfu.mfu`; ``n_devices`` defaults to the ranks in the trace).

        Taught in chapter 14 (the baseline record).
        """
        from labkit.flops import mfu as M
        from labkit.record import RunRecord, Stat

        if not isinstance(record, RunRecord):
            raise TypeError(f"record must be a labkit.record.RunRecord, got {type(record).__name__}")
        if tokens_per_step is None and (flops_per_token is not None or peak_flops is not None):
            raise ValueError("tokens_per_step is needed with flops_per_token/peak_flops: MFU needs tokens/s, "
                             "and the trace gives only the step time")
        if (flops_per_token is None) != (peak_flops is None):
            raise ValueError(f"flops_per_token={flops_per_token!r}, peak_flops={peak_flops!r}: MFU needs both")
        if tokens_per_step is not None:
            tokens = checks.whole("tokens_per_step", tokens_per_step)
            n = len(self.ranks) if n_devices is None else checks.count("n_devices", n_devices)
            steps = self.step_times()
            stat = Stat.of(steps)
            tps = M.step_tokens_per_s(tokens, stat.mean)
            u = None
            if flops_per_token is not None:
                u = M.mfu(tokens_per_s=tps, flops_per_token=flops_per_token, n_devices=n, peak_flops=peak_flops)
            record.step_time, record.tokens_per_step, record.tokens_per_s, record.n_devices = stat, tokens, tps, n
            if u is not None:
                record.model_flops_per_token, record.peak_flops, record.peak_source = (
                    float(flops_per_token), float(peak_flops), peak_source)
                record.mfu = u
        record.utilisation = self.utilisation
        record.comm_wait_share = self.comm_wait_share
        record.data_wait_share = self.data_wait_share
        record.extra["trace"] = {"kind": self.kind, "paths": self.paths, "steps": self.steps,
                                 "shares": self.shares(), "overlap": self.overlap}
        return record

    def to_dict(self) -> dict:
        """JSON-ready dict of every table."""
        def recs(df):
            return [] if df is None else [{k: _py(v) for k, v in r.items()} for r in df.to_dict("records")]

        return {"kind": self.kind, "paths": self.paths, "ranks": self.ranks, "steps": self.steps,
                "shares": self.shares(), "utilisation": self.utilisation,
                "comm_wait_share": self.comm_wait_share, "data_wait_share": self.data_wait_share,
                "data_wait_s": self.data_wait_s, "overlap": {str(k): _py(v) for k, v in self.overlap.items()},
                "breakdown": recs(self.breakdown), "comm_by_type": recs(self.comm_by_type),
                "stragglers": recs(self.stragglers), "peer_wait_share": self.peer_wait_share,
                "top_ops": recs(self.top_ops(10))}

    def summary(self) -> str:
        """A short human-readable report."""
        lines = [f"{self.kind.upper()} trace, ranks {self.ranks}, "
                 f"{len(self.steps)} step(s) {self.steps if self.steps != [-1] else '(whole window)'}"]
        lines.append(f"{'rank':>4} {'step s':>9} " + " ".join(f"{p:>14}" for p in _PARTS) + f" {'overlap':>8}")
        for r in self.breakdown.itertuples():
            cells = " ".join(f"{getattr(r, p + '_share'):>14.1%}" for p in _PARTS)
            ov = self.overlap.get(r.rank, float("nan"))
            lines.append(f"{r.rank:>4} {r.total / max(len(self.steps), 1):>9.4f} {cells} "
                         f"{'n/a' if ov != ov else f'{ov:.1%}':>8}")
        s = self.shares()
        lines.append(f"utilisation {self.utilisation:.1%} | exposed comm {s['comm_exposed']:.1%} | "
                     f"data wait {s['data_wait']:.1%}")
        if self.comm_by_type is not None and not self.comm_by_type.empty:
            lines.append("communication by type:")
            for r in self.comm_by_type.itertuples():
                bw = f", algbw {r.algbw_GBps:.2f} GB/s" if r.algbw_GBps == r.algbw_GBps else ""
                lines.append(f"  {r.type:<14} n={r.count:<4} {r.total_s * 1e3:9.2f} ms{bw}")
        if self.stragglers is not None and not self.stragglers.empty:
            lines.append("stragglers (arrival at each collective, aligned across ranks):")
            for r in self.stragglers.itertuples():
                flag = "  <- straggler" if r.straggler else ""
                lines.append(f"  rank {r.rank}: last at {r.times_last}/{r.n_collectives}, mean late "
                             f"{r.mean_late_s * 1e3:.2f} ms, compute before {r.median_compute_before_s * 1e3:.2f} ms, "
                             f"waited for peers {r.peer_wait_s * 1e3:.2f} ms{flag}")
        top = self.top_ops(5)
        if not top.empty:
            lines.append("top " + ("kernels" if self.kind == "gpu" else "ops (inclusive)") + ":")
            for r in top.itertuples():
                lines.append(f"  {r.total_s * 1e3:9.2f} ms  {r.share:6.1%}  x{r.count:<5} {r.name[:70]}")
        return "\n".join(lines)

    def plot_breakdown(self, ax=None):
        """Stacked bar per rank of the step-time partition (matplotlib Axes)."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3))
        bottom = np.zeros(len(self.breakdown))
        x = [str(r) for r in self.breakdown["rank"]]
        for p in _PARTS:
            v = self.breakdown[p + "_share"].to_numpy()
            ax.bar(x, v, bottom=bottom, label=p.replace("_", " "))
            bottom += v
        ax.set_xlabel("rank")
        ax.set_ylabel("share of step time")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)   # off the bars
        ax.set_title(f"Where the step time goes ({self.kind.upper()} trace)")
        return ax


_ON_DEMAND = ("step_breakdown", "collectives")


def _on_demand(name: str) -> property:
    """``TraceAnalysis.<name>``: the table, read from its file (:class:`labkit.trace.ondisk.Lazy`) the first time
    it is asked for at job size; any frame may be set."""
    key = "_" + name

    def get(self):
        v = self.__dict__[key]
        return v.get() if isinstance(v, Lazy) else v

    def put(self, v):
        self.__dict__[key] = v

    return property(get, put, doc=f"The ``{name}`` table (read from disk on first use). Chapter 9.")


for _name in _ON_DEMAND:
    setattr(TraceAnalysis, _name, _on_demand(_name))


def _py(v):
    if isinstance(v, (np.floating, float)):
        return None if v != v else float(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def analyze(path, *, steps=None, allow_mixed: bool = False, max_mb=None, max_events=None,
            workers=None) -> TraceAnalysis:
    """Analyse a trace file or a folder of per-rank trace files.

    ``steps``: None for every ``ProfilerStep`` in the trace (the whole window when there is none),
    or an iterable of step numbers (ints >= 0) to keep. ``allow_mixed``: analyse a folder whose files
    look like different runs (:func:`labkit.trace.runs.check_one_run`) instead of refusing it. Raises
    ValueError naming the file (and the event and field) for corrupt, truncated or invalid traces
    (non-finite times, wrong field types), for an empty ``path``, for a folder mixing runs, and when
    the selected steps are not in the trace. ``max_mb``/``max_events``: the per-file limits of
    :func:`labkit.trace.fastload.limits` (a bigger file is refused while it is read); ``workers``: the
    processes reading the ranks' files (:func:`labkit.trace.runs.read_ranks`).

    Taught in chapter 9.
    """

    if steps is not None:
        if isinstance(steps, (str, bytes, dict)) or not hasattr(steps, "__iter__"):
            raise checks.ArgumentTypeError(f"steps={steps!r} must be None or an iterable of step numbers")
        steps = {checks.count(f"steps[{i}]", s, at_least=0) for i, s in enumerate(steps)}
    from labkit.paths import scratch
    from labkit.trace.summary import summarize_ranks

    with scratch("labkit-analyze-") as tmp:      # private (0700), gone on any exit (after a kill: labkit.paths)
        sums = summarize_ranks(path, steps=steps, allow_mixed=allow_mixed, max_mb=max_mb, max_events=max_events,
                               workers=workers, fields="analysis", arrays_dir=tmp)
        return _analysis(sums, steps, folder=tmp)


def analysis_of(summaries, *, steps=None) -> TraceAnalysis:
    """:func:`analyze` from per-rank summaries (:func:`labkit.trace.summary.summarize` of each rank's
    :class:`~labkit.trace.breakdown.RankView` in memory, or :func:`labkit.trace.summary.summarize_ranks`,
    streamed), in rank order; ``steps`` only names the selection in an error. Taught in chapter 9.
    """
    return _analysis(summaries, steps)


def _analysis(summaries, steps=None, folder=None) -> TraceAnalysis:
    """:func:`analysis_of` on summaries in memory or spilled to disk (:mod:`labkit.trace.spill`), read back one
    rank at a time into the job's tables on disk (:mod:`labkit.trace.jobtables`); ``folder``: a scratch folder for
    working files (``analyze``'s)."""
    from labkit.trace import jobtables
    from labkit.trace.summary import check_summaries

    check_summaries("analysis_of", summaries)
    kinds = {s.kind for s in summaries}
    kind = "gpu" if "gpu" in kinds else "cpu"
    step_df, agg, all_steps, stragglers, aligned = jobtables.job_tables(summaries, steps)
    for c in COLUMNS:
        if c != "total":
            agg[c + "_share"] = np.where(agg["total"] > 0, agg[c] / agg["total"], 0.0)
    comm_tot = agg["comm_exposed"] + agg["comm_hidden"]
    overlap = {int(r): (float(h / t) if t > 0 else float("nan"))
               for r, h, t in zip(agg["rank"], agg["comm_hidden"], comm_tot, strict=True)}
    ops = {"kernel": _merge_ops([s.ops_kernel for s in summaries]),
           "cpu_op": _merge_ops([s.ops_cpu for s in summaries])}
    comm_by_type = jobtables.comm_by_type(summaries, folder)
    data_wait = float(agg["data_wait"].mean())
    return TraceAnalysis(kind=kind, paths=[str(s.path) for s in summaries], ranks=[s.rank for s in summaries],
                         steps=all_steps, breakdown=agg, step_breakdown=step_df, overlap=overlap,
                         comm_by_type=comm_by_type, stragglers=stragglers, collectives=aligned,
                         data_wait_s=data_wait, _ops=ops)


def _merge_ops(tables):
    import pandas as pd

    tables = [t for t in tables if t is not None and not t.empty]
    if not tables:
        return pd.DataFrame(columns=["name", "count", "total_s", "mean_s"])
    t = pd.concat(tables).groupby("name", as_index=False).sum()
    t["mean_s"] = t["total_s"] / t["count"]
    return t
