"""The cross-rank critical path of each step: which rank set the pace, why, and what it cost the others.

HTA's critical path is one rank's (its ``critical_path_analysis``); stragglers (:mod:`labkit.trace.stragglers`)
say *who* is late at each collective. This module walks one step **across ranks**: a collective cannot finish
before its last rank arrives, so the step's end depends, through that collective, on whatever the last rank
was doing before it arrived. From the end of the step (the rank that finished last) the walk goes back:

1. on the current rank, back to the end of its latest collective that ended before the current time —
   that stretch is the rank's own work (compute, data loader, host code, idle);
2. through the collective: the part after its last rank arrived is the transfer itself (communication,
   or compute where the rank computed under it);
3. to the collective's last-arriving rank at its arrival time (a *cross-rank join*) — the others' time
   before it is waiting for a peer, which is off the path;
4. until the step's start on the rank the walk ends on.

Each stretch of the path is attributed to (rank, cause), causes in :data:`CAUSES`, by what that rank was
doing, in this priority: ``compute`` (GPU: compute kernels and memory copies; CPU: the main thread inside
an operator), ``data`` (inside the DataLoader's ``__next__``), ``comm`` (a collective in flight, not hidden
under compute), then ``host`` (GPU: the device idle until the host launched the next kernel; CPU: the
main thread outside any operator — Python, a sleep, a stall) and ``idle`` (GPU: the rest).

The **pace-setting rank** of a step is the one that held the others back longest at its collectives (else the
rank holding most of the path outside communication): by arriving last (the others' median wait for it) or by
*leaving* last — an all-reduce's ranks end together once the last one arrived (AMD-AGI/TraceLens#22), so a
later end is a transfer of its own: a slow link. Its **cause** is the one in which it exceeds the other ranks
most over the stretch that made it late: from the last arrival at the collective before the first one it
reached last (from then on they are in step) to its arrival — its transfer (``comm``), then its own work;
reaching none last, ``comm``. The others' time at those collectives before it arrived is what it cost them
(``waited_s``); :meth:`CriticalPath.lost_to_slowest` sums it by cause over the job.

A slow link in a real ring stretches every rank's transfer alike (each ring step waits for its slowest hop): the
spans then show long communication everywhere and name no rank — that takes per-link tests. What they do name
is a link that finishes one rank's part later than the others': ``TrainConfig(straggler_by="link")``.

Clocks: the ranks' timestamps are compared directly, as :mod:`labkit.trace.stragglers` and HTA do — true
for ranks on one host (one clock) and for hosts kept in step by PTP/NTP to well under a collective's span.
The n-th collective of a step is matched across ranks; a step whose ranks issued different numbers of
collectives is walked over the first ones they share (``StepPath.matched`` says how many).

Same function on CPU (gloo: the collectives are the ``gloo:*`` spans of its run-loop threads) and GPU
(NCCL kernels) traces. Taught in chapter 9 (the critical path of a job with one slow rank) and chapter 14.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from labkit import checks
from labkit.trace.breakdown import RankView
from labkit.trace.pacing import RankSeconds, _excess, _held, _job_holds, _lateness, _own_time, _pacer
from labkit.trace.stragglers import LATE_MARGIN, last_beyond_chance
from labkit.units import US

__all__ = ["critical_path", "critical_path_of", "critical_path_from", "CriticalPath", "StepPath", "CAUSES"]

#: what a stretch of the path is spent on (see the module docstring for the priority)
CAUSES = ("compute", "data", "comm", "host", "idle")
#: most steps whose ranks' own time (40 bytes a rank and step) is held at once (fewer where they pass a slab)
_OWN_STEPS = 256


@dataclass
class StepPath:
    """One step's critical path (seconds). Taught in chapter 9.

    ``by_rank``: per rank on the path, seconds per cause; ``segments``: (rank, start_s, end_s, cause) from the
    step's start (time 0 = the start on the rank the walk ended on), in time order; ``waited_s``: per other
    rank, seconds spent at collectives the pacer reached last, before it arrived; ``excess_s``: per cause,
    how much longer the pacer took than the median of the other ranks over the same stretches (``comm``: its
    transfer there; reaching none last, how much after the next rank it left); ``held_s``: per rank, seconds it held
    the others back (their median wait where it arrived last, plus how much later it left where it left last).
    """

    step: int
    duration_s: float
    pacer: int
    cause: str
    by_rank: dict[int, dict[str, float]]
    segments: list[tuple[int, float, float, str]]
    waited_s: dict[int, float] = field(default_factory=dict)
    excess_s: dict[str, float] = field(default_factory=dict)
    matched: int = 0
    margin: float = LATE_MARGIN["cpu"]
    held_s: dict[int, float] = field(default_factory=dict)

    @property
    def others_wait_s(self) -> float:
        """Median over the other ranks of their wait for the pacer (0 when it reached no collective last)."""
        return float(np.median(list(self.waited_s.values()))) if self.waited_s else 0.0

    @property
    def stands_out(self) -> bool:
        """Whether the pacer held the others back (``held_s``) for at least ``margin`` of the step (the
        stragglers module's :data:`~labkit.trace.stragglers.LATE_MARGIN` of the trace's kind) — otherwise the
        ranks were in step and which one the path ran through is chance."""
        return self.duration_s > 0 and self.held_s.get(self.pacer, 0.0) >= self.margin * self.duration_s

    @property
    def pacer_share(self) -> float:
        """Share of the step's path spent on the pacer."""
        return sum(self.by_rank.get(self.pacer, {}).values()) / self.duration_s if self.duration_s > 0 else 0.0

    def sentence(self) -> str:
        """The step in one sentence, e.g. "step 412 took 1.9 s; rank 37 set the pace; …"."""
        mine = self.by_rank.get(self.pacer, {})
        if not self.stands_out:
            return (f"step {self.step} took {_fmt(self.duration_s)}; no rank held the others back (they waited "
                    f"{_fmt(self.others_wait_s)} at most for the path's rank {self.pacer}, under "
                    f"{self.margin:.0%} of the step); its path is mostly "
                    f"{_CAUSE_WORDS[max(mine, key=mine.get)] if mine else 'idle'}")
        s = (f"step {self.step} took {_fmt(self.duration_s)}; rank {self.pacer} set the pace "
             f"({_fmt(sum(mine.values()))} of the path on it)")
        if self.cause in mine and self.cause != "comm":
            s += f"; of that, {_fmt(mine[self.cause])} was {_CAUSE_WORDS[self.cause]}"
            ex = self.excess_s.get(self.cause, 0.0)
            if ex > 0:
                s += f", {_fmt(ex)} more than the other ranks' median"
        elif self.cause == "comm" and self.excess_s.get("comm", 0.0) > 0:
            s += (f"; its collectives ended {_fmt(self.excess_s['comm'])} later than the other ranks' median "
                  "(its own transfer, after they had left: a slow link)")
        elif self.cause == "comm":
            s += "; the path is mostly communication (no rank arrived much later than the others)"
        if self.waited_s:
            k = len(self.waited_s)
            s += (f"; the other {k} rank{'s' if k > 1 else ''} waited {_fmt(self.others_wait_s)} (median) "
                  "at collectives for it")
        return s


_CAUSE_WORDS = {"compute": "compute", "data": "waiting on the data loader", "host": "host code outside any op",
                "idle": "idle", "comm": "communication (a slow link: its collectives end after the others')"}


def _fmt(s: float) -> str:
    return f"{s:.3g} s" if s >= 1 else f"{s * 1e3:.3g} ms"


@dataclass
class CriticalPath:
    """Result of :func:`critical_path`: one :class:`StepPath` per step. Taught in chapter 9."""

    kind: str
    ranks: list[int]
    steps: list[StepPath]
    n_collectives: int = 0
    times_last: dict[int, int] = field(default_factory=dict)

    def table(self):
        """One row per step: duration, pacer, cause, the pacer's share of the path, the others' median wait."""
        import pandas as pd

        rows = [{"step": p.step, "duration_s": p.duration_s, "pacer": p.pacer, "cause": p.cause,
                 "pacer_share": p.pacer_share,
                 "others_wait_s": p.others_wait_s, "stands_out": p.stands_out,
                 "matched_collectives": p.matched} for p in self.steps]
        return pd.DataFrame(rows)

    def lost_to_slowest(self) -> dict[str, float]:
        """Seconds the other ranks spent waiting for each step's pacer (median over them), summed over the
        job by the pacer's cause — over the steps where the pacer stood out (:attr:`StepPath.stands_out`).
        Taught in chapter 9."""
        out = dict.fromkeys(CAUSES, 0.0)
        for p in self.steps:
            if p.stands_out:
                out[p.cause] += p.others_wait_s
        return out

    def verdict(self) -> tuple[int | None, str | None]:
        """(rank, cause) of the job's slowest rank: the rank that held the others back longest over all
        steps, if that is at least the margin (:attr:`StepPath.margin`) of the job's time and it held them
        (arrived or left last) at more collectives than chance would make it (the stragglers table's test);
        its cause is the one of the steps it set the pace of, weighted by how long it held the others (its
        largest path cause if it set none). (None, None) when no rank held the others back. The test needs
        collectives: over 3 (one all-reduce a step, the trainer's default 3 profiled steps) only a rank that
        held the others at all 3 passes (p = 1/64), so one step in which a loaded machine delays another rank
        past the slow one hides it, and three unlucky steps running make one; where ranks share loaded cores,
        profile 8 or more (5 of 8 passes, p = 0.027: ``benchmarks/bench_critical_path.py``). Taught in chapter 9."""
        if not self.steps:
            return None, None
        held: dict[int, float] = {}
        for p in self.steps:
            for r, h in p.held_s.items():
                held[r] = held.get(r, 0.0) + h
        total = sum(p.duration_s for p in self.steps)
        if not held or max(held.values()) < self.steps[0].margin * total:
            return None, None
        rank = max(held, key=held.get)
        # a slow rank holds the others again and again; ranks time-sliced on shared cores take turns. The
        # stragglers table's test: at more than half the collectives, more often than chance (binomial, < 1/8)
        n, k = self.n_collectives, self.times_last.get(rank, 0)
        if not last_beyond_chance(n, k, len(self.ranks)):
            return None, None
        causes: dict[str, float] = {}
        for p in self.steps:
            if p.pacer == rank:
                causes[p.cause] = causes.get(p.cause, 0.0) + p.held_s.get(rank, 0.0)
        if not causes:
            mine = {c: sum(p.by_rank.get(rank, {}).get(c, 0.0) for p in self.steps) for c in CAUSES}
            return rank, max(mine, key=mine.get)
        return rank, max(causes, key=causes.get)

    def pacers(self) -> dict[int, int]:
        """How many steps each rank set the pace of."""
        out: dict[int, int] = {}
        for p in self.steps:
            out[p.pacer] = out.get(p.pacer, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> str:
        """The slowest step in a sentence, who set the pace how often, and the time lost to it by cause."""
        if not self.steps:
            return "no steps to walk"
        worst = max(self.steps, key=lambda p: p.duration_s)
        lost = {c: v for c, v in self.lost_to_slowest().items() if v > 0}
        rank, cause = self.verdict()
        lines = [worst.sentence() + ".",
                 (f"verdict: rank {rank} held the others back longest, by {_CAUSE_WORDS[cause]}" if rank is not None
                  else "verdict: no rank held the others back"),
                 "pace set by rank (steps): " + ", ".join(f"{r}: {n}" for r, n in self.pacers().items()),
                 "time the others lost waiting for the pacer, by its cause: "
                 + (", ".join(f"{c} {_fmt(v)}" for c, v in lost.items()) if lost else "none")]
        return "\n".join(lines)

    def plot(self, ax=None):
        """Ranks × steps heat map of the seconds each rank holds on each step's path; the path's pacer
        marked per step and joined by a line. Taught in chapter 9."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(self.steps) + 2), max(2.5, 0.35 * len(self.ranks) + 1)))
        idx = {r: i for i, r in enumerate(self.ranks)}
        m = np.zeros((len(self.ranks), len(self.steps)))
        for k, p in enumerate(self.steps):
            for r, parts in p.by_rank.items():
                m[idx[r], k] = sum(parts.values()) * 1e3
        im = ax.imshow(m, aspect="auto", cmap="viridis", origin="lower")
        ax.plot(range(len(self.steps)), [idx[p.pacer] for p in self.steps], "w-o", lw=1.2, ms=5,
                label="pace-setting rank")
        ax.set_xticks(range(len(self.steps)), [str(p.step) for p in self.steps])
        ax.set_yticks(range(len(self.ranks)), [str(r) for r in self.ranks])
        ax.set_xlabel("step")
        ax.set_ylabel("rank")
        ax.set_title("critical path: ms of each step spent on each rank")
        ax.figure.colorbar(im, ax=ax, label="ms on the path")
        ax.legend(loc="upper right", fontsize=8)
        return ax


def critical_path(path, *, steps=None, allow_mixed: bool = False, max_mb=None, max_events=None,
                  workers=None) -> CriticalPath:
    """The cross-rank critical path of every step of a folder of per-rank traces (or one trace file).

    Arguments as :func:`labkit.trace.analyze`. ValueError when fewer steps than selected are shared by
    every rank. Streamed: each rank is reduced in a worker to its interval index and summary arrays, written to a
    private temporary folder (deleted on any exit) and read back one rank at a time (:mod:`labkit.trace.spill`).
    The matrices the walk and the pacing rules read (arrival, end and proven end of every rank's collectives;
    each rank's step starts) are written a rank at a time to files (:class:`labkit.trace.ondisk.Matrix`) and
    read back a column slab (≤ :data:`labkit.trace.ondisk.SLAB_BYTES`) or a rank's row at a time; the result's
    ``held_s``/``waited_s`` (:class:`labkit.trace.pacing.RankSeconds`) are rows of a file that goes with the
    last step holding them. The parent holds a few numbers per collective and per step whatever the rank count,
    a few per rank (its summary's identity, its first step's start, its last's end), and each rank's own time by
    cause (:func:`labkit.trace.pacing._own_time`) for a chunk of steps whose steps × ranks × causes fit a slab.
    The same results, to the bit, as holding them all. Taught in chapter 9.
    """
    from labkit.paths import scratch
    from labkit.trace.summary import summarize_ranks

    if steps is not None:
        if isinstance(steps, (str, bytes, dict)) or not hasattr(steps, "__iter__"):
            raise checks.ArgumentTypeError(f"steps={steps!r} must be None or an iterable of step numbers")
        steps = {checks.count(f"steps[{i}]", s, at_least=0) for i, s in enumerate(steps)}
    with scratch("labkit-critical-path-") as tmp:      # private (0700), gone on any exit (after a kill: labkit.paths)
        sums = summarize_ranks(path, steps=steps, allow_mixed=allow_mixed, max_mb=max_mb, max_events=max_events,
                               workers=workers, index_dir=tmp, fields="path", arrays_dir=tmp)
        return _path_of(sums, folder=tmp)


def critical_path_of(views: list[RankView], *, steps=None) -> CriticalPath:
    """:func:`critical_path` on already classified ranks (:class:`labkit.trace.breakdown.RankView`), in memory.

    Taught in chapter 9."""
    from labkit.trace.summary import summarize

    if not views:
        raise ValueError("critical_path: no ranks to walk")
    return critical_path_from([summarize(v, steps) for v in views])


def critical_path_from(summaries) -> CriticalPath:
    """:func:`critical_path` from per-rank summaries (:class:`labkit.trace.summary.RankSummary`, each with its
    interval index in memory or on disk); the steps are those the summaries were made over.

    Taught in chapter 9."""
    return _path_of(summaries)


def _path_of(summaries, folder=None) -> CriticalPath:
    """:func:`critical_path_from` on summaries in memory or spilled (:mod:`labkit.trace.spill`): three passes, one
    rank's arrays at a time: the shared steps, each step's matched collectives, the matrices row by row (files in
    :func:`~labkit.trace.ondisk.working_dir` of ``folder``, ``critical_path``'s scratch folder)."""
    from labkit.trace.ondisk import Matrix, working_dir
    from labkit.trace.spill import _colls_by_step, _steps_of, rank
    from labkit.trace.summary import check_summaries

    check_summaries("critical_path_from", summaries)
    ranks = [s.rank for s in summaries]
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"critical_path: rank numbers repeat across the traces ({sorted(ranks)}); give one trace per rank")
    # a collective belongs to the step of the last window starting at or before it; a repeated step id, its last
    shared_arr = None
    for sm in summaries:
        ids = _steps_of(rank(sm, ("wins",)))[0]
        shared_arr = ids if shared_arr is None else np.intersect1d(shared_arr, ids)
    shared = [int(s) for s in shared_arr]
    if not shared:
        raise ValueError("critical_path: no step is in every rank's trace (steps per rank: "
                         f"{ {sm.rank: _steps_of(rank(sm, ('wins',)))[0].tolist() for sm in summaries} })")
    kind = "gpu" if any(sm.kind == "gpu" for sm in summaries) else "cpu"
    # the n-th collective of a step matched across ranks (the first ones they share where counts differ)
    per = None
    for sm in summaries:
        got = _colls_by_step(rank(sm, ("wins", "coll_start")), shared_arr)[2]
        per = got if per is None else np.minimum(per, got)
    per_step = dict(zip(shared, per.tolist(), strict=True))
    coll_step = np.repeat(shared_arr, per).astype(int)
    R, n = len(ranks), len(coll_step)
    offs = np.cumsum(per) - per
    first, end = {}, {}
    with working_dir(folder, "critical-path-matrices") as tmp:      # the job's matrices, a row (a rank) at a time
        A, E = Matrix(tmp / "arrive.f64", R, n), Matrix(tmp / "end.f64", R, n)
        X = E             # proven ends (CPU: the cut span); E itself while they equal the ends (GPU): no copy
        bounds = Matrix(tmp / "step_starts.f64", R, len(shared))
        for i, sm in enumerate(summaries):
            f = rank(sm, ("wins", "coll_start", "coll_dur", "coll_end"))
            ids, last, b = _steps_of(f)
            order, lo, _ = _colls_by_step(f, shared_arr)
            seq = order[np.arange(n) + np.repeat(lo - offs, per)]
            a = np.asarray(f.coll_start[seq], dtype=np.float64)
            e = np.add(a, f.coll_dur[seq], dtype=np.float64)
            A.write(i, a)
            E.write(i, e)
            x = f.coll_end[seq]
            if X is E and not np.array_equal(x, e):
                X = Matrix(tmp / "proven_end.f64", R, n)        # rows before i equal E's
                for q in range(i):
                    X.write(q, E.read(q, q + 1)[0])
            if X is not E:
                X.write(i, x)
            pos = last[np.searchsorted(ids, shared_arr)]
            bounds.write(i, b[pos, 0])
            first[sm.rank], end[sm.rank] = b[pos[0], 0], b[pos[-1], 1]
            del f, a, e, x
        smap = {sm.rank: sm for sm in summaries}
        return _job_path(shared, ranks, lambda r: smap[r].class_index(), kind, A, E, X, coll_step, bounds, first,
                         end, per_step)


def _job_path(shared, ranks, index_of, kind, A, E, X, coll_step, bounds, first, end, per_step) -> CriticalPath:
    """Walk the whole profiled span once (a rank's lateness is often caused at the end of its previous
    step: a stall after the optimizer delays the next step's first collective), then cut the path into
    steps at each rank's own step boundaries. ``A``, ``E``, ``X`` (ranks × collectives) and ``bounds`` (ranks ×
    steps) are :class:`labkit.trace.ondisk.Matrix` files, read a column slab or a row at a time."""
    from labkit.trace import ondisk
    from labkit.trace.pacing import RankStore
    from labkit.trace.summary import _classify_all

    n, R = len(coll_step), len(ranks)
    L, last, hold = _job_holds(A, X)                    # X: each rank's proven end of each collective
    Ec = ondisk.Slabs(E)
    d0 = np.array([first[r] for r in ranks])
    d1 = np.array([end[r] for r in ranks])
    i = int(d1.argmax())
    t = float(d1[i])
    j = n - 1
    raw: list[tuple[int, float, float]] = []            # (rank index, t0, t1) stretches, latest first
    while True:
        while j >= 0 and Ec.at(i, j) > t:
            j -= 1
        if j < 0 or Ec.at(i, j) <= d0[i]:
            raw.append((i, float(d0[i]), t))
            break
        eij = Ec.at(i, j)
        raw.append((i, float(eij), t))                   # the rank's own work after the collective
        raw.append((i, float(min(L[j], eij)), float(eij)))   # the transfer after the last arrival
        i, t = int(last[j]), float(min(L[j], eij))
        j -= 1
    del Ec
    # cut every stretch at its rank's step boundaries, then classify the pieces (rank by rank)
    cut: list[tuple[int, int, float, float]] = []
    rows: dict[int, np.ndarray] = {}                    # the latest ranks' step starts read
    for ri, a, b in reversed(raw):
        if b <= a:
            continue
        bd = rows.pop(ri, None)
        if bd is None:
            bd = bounds.read(ri, ri + 1)[0]
            if len(rows) >= 8:
                del rows[next(iter(rows))]
        rows[ri] = bd
        cuts = [a] + [float(x) for x in bd if a < x < b] + [b]
        for x, y in zip(cuts[:-1], cuts[1:], strict=True):
            cut.append((max(int(np.searchsorted(bd, x, side="right")) - 1, 0), ri, x, y))
    del rows
    pieces: dict[int, list] = {sid: [] for sid in shared}
    for (k, ri, _, _), parts in zip(cut, _classify_all([(ranks[ri], x, y) for _, ri, x, y in cut], index_of),
                                    strict=True):
        for cause, (s, e) in parts:
            pieces[shared[k]].append((ranks[ri], s, e, cause))
    walked = []
    keys = (tuple(ranks), {r: q for q, r in enumerate(ranks)})     # shared by every step's RankSeconds
    store, Ac = RankStore(len(shared), R), ondisk.Slabs(A)        # held_s, waited_s: a row per step on disk
    for k, sid in enumerate(shared):
        ps = pieces[sid]
        by_rank: dict[int, dict[str, float]] = {}
        for r, s, e, cause in ps:
            by_rank.setdefault(r, dict.fromkeys(CAUSES, 0.0))[cause] += (e - s) * US
        duration = sum(sum(p.values()) for p in by_rank.values())
        held = _held(np.flatnonzero(coll_step == sid), ranks, hold)
        pacer = _pacer(held, by_rank, ranks)
        waited, j, left = _lateness(ranks.index(pacer), np.flatnonzero(coll_step == sid), ranks, Ac.column, L, last,
                                    hold)
        walked.append((sid, ps, by_rank, duration, RankSeconds.on_disk(held, *keys, store, "held_s", k), pacer,
                       RankSeconds.on_disk(waited, *keys, store, "waited_s", k), j, left))
    steps = []
    # the ranks' own time, a chunk of steps at a time (each rank's index read once a chunk), the chunk's
    # steps × ranks × causes within a slab
    chunk = max(1, min(_OWN_STEPS, ondisk.SLAB_BYTES // (8 * 5 * R)))
    Xc = ondisk.Slabs(X)
    for k, (sid, ps, by_rank, duration, held, pacer, waited, j, left) in enumerate(walked):
        if k % chunk == 0:
            cols = [None if w[7] is None else
                    (Ac.column(w[7]).copy(), Xc.column(w[7] - 1).copy() if w[7] > 0 else None)
                    for w in walked[k:k + chunk]]
            own = _own_time(walked[k:k + chunk], ranks, index_of, cols, L, d0)
            del cols
        excess = _excess(ranks.index(pacer), own[k % chunk]) if j is not None else left
        t0 = min((p[1] for p in ps), default=0.0)
        if excess and max(excess.values()) > 0:
            cause = max(excess, key=excess.get)
        else:                               # nobody arrived late: the largest part of the pacer's path
            mine = by_rank.get(pacer, {})
            cause = max(mine, key=mine.get) if mine else "idle"
        segs = sorted(((r, (s - t0) * US, (e - t0) * US, c) for r, s, e, c in ps), key=lambda x: x[1])
        steps.append(StepPath(step=int(sid), duration_s=duration, pacer=pacer, cause=cause, by_rank=by_rank,
                              segments=segs, waited_s=waited, excess_s=excess, matched=per_step[sid],
                              margin=LATE_MARGIN[kind], held_s=held))
    who = np.where(hold[1] >= hold[3], hold[0], hold[2])     # who held the others most at each collective
    lastc = {r: int(((who == i) & (np.maximum(hold[1], hold[3]) > 0)).sum()) for i, r in enumerate(ranks)}
    return CriticalPath(kind=kind, ranks=sorted(ranks), steps=steps, n_collectives=n, times_last=lastc)
