"""A shared GPU cluster's job queue, simulated: where GPU-hours go besides training (chapter 27).

A training job's throughput is only half its cost: on a shared cluster it first *waits* for GPUs, may be
placed only on whole nodes, can be preempted or lose a node, and restarts from its last checkpoint. This
is a small, seeded, minute-stepped simulation of that queue (SYNTHETIC: the arrivals, sizes and failure
rates are parameters, not a recorded cluster's):

- a cluster of ``nodes`` × ``gpus_per_node`` GPUs; jobs arrive as a Poisson stream (``arrivals_per_h``),
  each asking for 1 … ``max_gpus`` GPUs (powers of two) for a log-normal number of hours;
- placement: a job of ≤ ``gpus_per_node`` GPUs needs them on one node (best fit); a larger job needs whole
  free nodes (gang scheduling) — so free GPUs scattered over nodes can be useless (*fragmentation*);
- policy ``"fifo"`` starts jobs strictly in arrival order (the head blocks the queue), ``"backfill"`` also
  starts later jobs that fit now (no reservation: large jobs can wait longer);
- each running job fails or is preempted with probability ``failures_per_job_h`` per hour; it loses the
  work since its last checkpoint (every ``checkpoint_every_min``) plus ``restart_min`` and rejoins the head
  of the queue with the rest of its work.

:func:`simulate` returns where the cluster's GPU-hours went: useful work, work lost to failures, idle while
the queue was empty, idle while jobs waited (fragmented or blocked), and each job's wait.

Taught in chapter 27 (multi-node, elastic and fault-tolerant training: the scheduling bottleneck).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from labkit import checks

POLICIES = ("fifo", "backfill")
#: The simulation's caps (each minute scans the queue, so the work grows with hours × queued jobs): 90 days
#: of minute steps, and 10,000 expected arrivals (chapter 27's run: 72 h × 6/h ≈ 430 jobs, in 0.03 s)
MAX_HOURS = 24 * 90
MAX_JOBS = 10_000


@dataclass
class Job:
    """One job of the stream: arrival (min), GPUs, work left (min), bookkeeping."""

    id: int
    arrival: int
    gpus: int
    work: int
    start: int | None = None
    end: int | None = None
    wait: int = 0
    since_ckpt: int = 0
    restarts: int = 0
    restart_left: int = 0
    placed: list = field(default_factory=list)


@dataclass
class ClusterResult:
    """Where the GPU-hours of a simulated cluster went (chapter 27). SYNTHETIC."""

    policy: str
    capacity_gpu_h: float
    useful_gpu_h: float
    lost_gpu_h: float
    idle_empty_gpu_h: float
    idle_waiting_gpu_h: float
    fragmented_gpu_h: float
    failures: int
    waits_h: dict
    jobs_done: int
    jobs_total: int

    @property
    def utilisation(self) -> float:
        """Useful GPU-hours ÷ capacity."""
        return self.useful_gpu_h / self.capacity_gpu_h

    def median_wait_h(self, gpus: int | None = None) -> float:
        """Median queue wait (hours) of finished jobs, of one size if ``gpus`` is given."""
        w = sorted(v for g, vs in self.waits_h.items() if gpus is None or g == gpus for v in vs)
        return w[len(w) // 2] if w else math.nan

    def table(self) -> list:
        """Rows (where the GPU-hours went, GPU-h, share of capacity) for a chapter's table."""
        rows = [("useful training", self.useful_gpu_h), ("lost to failures (recomputed)", self.lost_gpu_h),
                ("idle, queue empty", self.idle_empty_gpu_h), ("idle while jobs waited", self.idle_waiting_gpu_h)]
        return [(name, round(v, 1), round(v / self.capacity_gpu_h, 3)) for name, v in rows]


def jobs(seed: int, hours: float, arrivals_per_h: float, max_gpus: int, mean_job_h: float) -> list:
    """The seeded job stream (SYNTHETIC): Poisson arrivals, power-of-two sizes, log-normal durations.
    Taught in chapter 27."""
    seed = checks.count("seed", seed, at_least=0)
    hours = checks.number("hours", hours, low=0, low_open=True, high=MAX_HOURS)
    arrivals_per_h = checks.number("arrivals_per_h", arrivals_per_h, low=1e-6)     # below: no job in 10⁶ h
    checks.count("max_gpus", max_gpus)
    if max_gpus & (max_gpus - 1):
        raise ValueError(f"max_gpus={max_gpus} is not valid: use a power of two (jobs ask for 1, 2, 4 … GPUs)")
    mean_job_h = checks.number("mean_job_h", mean_job_h, low=1 / 60, high=MAX_HOURS)
    if hours * arrivals_per_h > MAX_JOBS:
        raise ValueError(f"hours={hours:g} × arrivals_per_h={arrivals_per_h:g} = {hours * arrivals_per_h:,.0f} "
                         f"expected jobs: the simulation takes at most {MAX_JOBS:,} (lower either)")
    rng = random.Random(seed)
    sizes = [2 ** k for k in range(int(math.log2(max_gpus)) + 1)]
    out, t = [], 0.0
    while True:
        t += rng.expovariate(arrivals_per_h / 60.0)
        if t >= hours * 60:
            return out
        hours_ = rng.lognormvariate(math.log(mean_job_h) - 0.5, 1.0)      # mean ≈ mean_job_h
        out.append(Job(len(out), int(t), rng.choice(sizes), max(1, int(hours_ * 60))))


def _place(free: list, g: int, gpn: int):
    """Node indices (with GPUs each) for a job of ``g`` GPUs, or None: best fit on one node, or whole nodes."""
    if g <= gpn:
        fits = [i for i, f in enumerate(free) if f >= g]
        return [(min(fits, key=lambda i: free[i]), g)] if fits else None
    need = g // gpn
    whole = [i for i, f in enumerate(free) if f == gpn]
    return [(i, gpn) for i in whole[:need]] if len(whole) >= need else None


def simulate(*, nodes: int = 16, gpus_per_node: int = 8, hours: float = 72, arrivals_per_h: float = 6.0,
             max_gpus: int = 32, mean_job_h: float = 3.0, policy: str = "fifo", failures_per_job_h: float = 0.02,
             checkpoint_every_min: int = 60, restart_min: int = 10, seed: int = 0) -> ClusterResult:
    """Run the queue for ``hours`` (minute steps) and account every GPU-minute; see the module docstring.
    Taught in chapter 27."""
    checks.count("nodes", nodes, at_most=100_000)
    checks.count("gpus_per_node", gpus_per_node, at_most=1024)
    checks.number("hours", hours, low=0, low_open=True, high=MAX_HOURS)
    checks.number("arrivals_per_h", arrivals_per_h, low=1e-6)
    checks.count("max_gpus", max_gpus)
    seed = checks.count("seed", seed, at_least=0)
    if max_gpus & (max_gpus - 1) or max_gpus > nodes * gpus_per_node:
        raise ValueError(f"max_gpus={max_gpus} is not valid: use a power of two ≤ the cluster's "
                         f"{nodes * gpus_per_node} GPUs")
    if max_gpus > gpus_per_node and max_gpus % gpus_per_node:
        raise ValueError(f"max_gpus={max_gpus} is not valid: a multi-node job needs whole nodes of {gpus_per_node}")
    checks.positive("mean_job_h", mean_job_h)
    checks.one_of("policy", policy, POLICIES)
    checks.nonneg("failures_per_job_h", failures_per_job_h)
    checks.count("checkpoint_every_min", checkpoint_every_min)
    checks.count("restart_min", restart_min, at_least=0)
    stream = jobs(seed, hours, arrivals_per_h, max_gpus, mean_job_h)
    rng = random.Random(seed + 1)
    free = [gpus_per_node] * nodes
    queue, running, done = [], [], []
    acc = dict(useful=0, lost=0, idle_empty=0, idle_waiting=0, fragmented=0)
    failures, nxt, p_fail = 0, 0, failures_per_job_h / 60.0
    for t in range(int(hours * 60)):
        while nxt < len(stream) and stream[nxt].arrival <= t:
            queue.append(stream[nxt])
            nxt += 1
        room, most = sum(free), max(free)
        for job in list(queue):                           # start what fits, in the policy's order
            if not room:
                break
            fits_now = job.gpus <= room and (job.gpus > gpus_per_node or job.gpus <= most)
            where = _place(free, job.gpus, gpus_per_node) if fits_now else None
            if where is None:
                if policy == "fifo":
                    break
                continue
            for i, g in where:
                free[i] -= g
            room, most = sum(free), max(free)
            job.placed = where
            if job.start is None:
                job.start = t
                job.wait = t - job.arrival
            queue.remove(job)
            running.append(job)
        busy = 0
        for job in list(running):                         # a minute of work (or of restart), or a failure
            if rng.random() < p_fail:
                failures += 1
                acc["lost"] += job.since_ckpt * job.gpus   # counted as useful when run: recomputed now
                acc["useful"] -= job.since_ckpt * job.gpus
                job.work += job.since_ckpt
                job.since_ckpt, job.restart_left, job.restarts = 0, restart_min, job.restarts + 1
                for i, g in job.placed:
                    free[i] += g
                running.remove(job)
                queue.insert(0, job)
                continue
            busy += job.gpus
            if job.restart_left:                          # re-launch, re-rendezvous, reload the checkpoint
                job.restart_left -= 1
                acc["lost"] += job.gpus
                continue
            job.work -= 1
            acc["useful"] += job.gpus
            job.since_ckpt = 0 if job.since_ckpt + 1 >= checkpoint_every_min else job.since_ckpt + 1
            if job.work <= 0:
                job.end = t
                for i, g in job.placed:
                    free[i] += g
                running.remove(job)
                done.append(job)
        idle = nodes * gpus_per_node - busy
        if queue:
            acc["idle_waiting"] += idle
            if sum(free) >= queue[0].gpus:                # enough free GPUs in total, but not placeable
                acc["fragmented"] += idle
        else:
            acc["idle_empty"] += idle
    waits: dict = {}
    for j in done:
        waits.setdefault(j.gpus, []).append(j.wait / 60)
    h = {k: v / 60 for k, v in acc.items()}
    return ClusterResult(policy, nodes * gpus_per_node * int(hours * 60) / 60, h["useful"], h["lost"],
                         h["idle_empty"], h["idle_waiting"], h["fragmented"], failures, waits, len(done),
                         len(stream))
