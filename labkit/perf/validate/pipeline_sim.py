"""A pipeline schedule's step time when its ranks share fewer cores than there are ranks (issue #24): the GPipe
or 1F1B schedule played out op by op, every runnable rank computing at an equal share of the cores.

The bubble formula — (p−1)/(v·m) of the compute for equal stages (Narayanan et al. 2021 §2.2) — assumes each
pipeline rank owns its device: a rank waiting for an activation costs the step time and gives nothing back. On a
CPU with fewer cores than ranks (4 gloo ranks on 2 cores) a waiting rank blocks in gloo and its core goes to a
rank that can compute, so the fill and drain cost less than the formula says, and the steady state, when every
rank computes, runs each rank at cores/ranks of a core. Neither the formula nor "every rank at the rate N busy
ranks keep" prices that; playing the schedule does::

    each rank's ops in its schedule's order (1F1B: p − r forwards, then backward/forward pairs, then the last
    backwards — torch.distributed.pipelining's Schedule1F1B; GPipe: every forward, then every backward);
    F(r, i) waits for F(r−1, i), B(r, i) for B(r+1, i); between two events every runnable rank progresses at
    min(1, C / (k · w)) of its full speed, k the runnable stages, each of w ranks (tp, or tp·dp: the ranks of
    a stage compute together), C the cores.

Events happen only when an op ends, so the play is exact for that sharing rule (processor sharing, the kernel's
fair scheduler in the limit of short slices). A rank's forward is a third of its forward + backward, the backward
two thirds (backward ≈ 2 × forward FLOPs: Kaplan et al. 2020 §2.1's 6N = 2N + 4N) — a convention; the play's
step time depends on it only through how the ops interleave.

Layer 2 in spirit (no launch, no torch): used by :mod:`labkit.perf.validate.model_parallel`. Taught in chapter 24
(the bubble, and why a pipeline on a shared CPU fills faster than the formula).
"""
from __future__ import annotations

from dataclasses import dataclass

from labkit import checks

__all__ = ["SCHEDULES", "PipelinePlay", "play_schedule", "rank_ops"]

SCHEDULES = ("gpipe", "1f1b")
BACKWARD_SHARE = 2 / 3          # of a micro-batch's forward + backward (6N = 2N forward + 4N backward)


def rank_ops(schedule: str, rank: int, stages: int, micro_batches: int) -> list:
    """The order of one pipeline rank's ops, ("F" | "B", micro-batch): GPipe every forward then every backward;
    1F1B ``min(m, p − r)`` forwards, then one backward and one forward in turn, then the remaining backwards
    (torch.distributed.pipelining's Schedule1F1B). Taught in chapter 24."""
    checks.one_of("schedule", schedule, SCHEDULES)
    p, m = checks.count("stages", stages), checks.count("micro_batches", micro_batches)
    r = checks.count("rank", rank, at_least=0)
    if r >= p:
        raise ValueError(f"rank={r} must be below stages={p}")
    if schedule == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(m, p - r)
    ops, f, b = [("F", i) for i in range(warm)], warm, 0
    while b < m:
        ops.append(("B", b))
        b += 1
        if f < m:
            ops.append(("F", f))
            f += 1
    return ops


@dataclass(frozen=True)
class PipelinePlay:
    """One played step: ``step_s`` (the last op's end), each stage's ``busy_s`` (its ops at full speed),
    ``cores`` and ``ranks_per_stage``. Taught in chapter 24."""

    step_s: float
    busy_s: tuple
    cores: float
    ranks_per_stage: int
    schedule: str
    micro_batches: int

    @property
    def utilisation(self) -> float:
        """Share of the cores' time spent computing: Σ busy · ranks per stage ÷ (step · min(cores, ranks))."""
        w = self.ranks_per_stage
        return sum(self.busy_s) * w / (self.step_s * min(self.cores, len(self.busy_s) * w))


def play_schedule(stage_s, micro_batches: int, *, schedule: str = "1f1b", cores: float | None = None,
                  ranks_per_stage: int = 1) -> PipelinePlay:
    """Play one optimizer step of a pipeline (module docstring): ``stage_s[r]`` the seconds of one micro-batch's
    forward + backward on pipeline stage r at full speed (a core of its own), ``micro_batches`` m, ``cores`` C
    (None: as many as ranks — the bubble formula's world), ``ranks_per_stage`` w (tp, or tp·dp). Taught in
    chapter 24."""
    ts = [checks.positive(f"stage_s[{i}]", t) for i, t in enumerate(stage_s)]
    p, m = len(ts), checks.count("micro_batches", micro_batches)
    if p < 2:
        raise ValueError(f"stage_s must hold at least 2 pipeline ranks, got {p}")
    w = checks.count("ranks_per_stage", ranks_per_stage)
    c = float(p * w) if cores is None else checks.positive("cores", cores)
    ops = [rank_ops(schedule, r, p, m) for r in range(p)]
    left = [(1 - BACKWARD_SHARE) * ts[r] if ops[r][0][0] == "F" else BACKWARD_SHARE * ts[r] for r in range(p)]
    nxt, done, now = [0] * p, set(), 0.0

    def ready(r):
        kind, i = ops[r][nxt[r]]
        if kind == "F":
            return r == 0 or ("F", r - 1, i) in done
        return r == p - 1 or ("B", r + 1, i) in done

    while any(nxt[r] < len(ops[r]) for r in range(p)):
        run = [r for r in range(p) if nxt[r] < len(ops[r]) and ready(r)]
        if not run:                                   # cannot happen for these schedules; a guard, not a path
            raise RuntimeError(f"pipeline play deadlocked at t={now:.6f}s: ops {nxt} of {[len(o) for o in ops]}")
        speed = min(1.0, c / (len(run) * w))
        dt = min(left[r] for r in run) / speed
        now += dt
        for r in run:
            left[r] -= dt * speed
        for r in run:
            if left[r] <= 1e-12 * ts[r]:
                kind, i = ops[r][nxt[r]]
                done.add((kind, r, i))
                nxt[r] += 1
                if nxt[r] < len(ops[r]):
                    left[r] = ts[r] * (BACKWARD_SHARE if ops[r][nxt[r]][0] == "B" else 1 - BACKWARD_SHARE)
    return PipelinePlay(step_s=now, busy_s=tuple(m * t for t in ts), cores=c, ranks_per_stage=w,
                        schedule=schedule, micro_batches=m)
