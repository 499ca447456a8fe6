"""The BERT-large case in miniature, live on data-parallel ranks (gloo on CPU, NCCL on GPUs).

One launch of ``nprocs`` ranks; each rank runs the case's step in small: a matmul workload for the compute,
an all-reduce of a gradient buffer for the communication (fp32, and 2-byte fp16 for the fix), a small update
for the sync — and the source's named overheads as host stalls in the case's proportions, scaled to this
machine's measured overlapped step (the case's 135 ms becomes the miniature's step; 20 ms of data, a 150 ms
checkpoint every 100 steps and 5 ms of logging keep their share of it, and so does the 38.5 ms nobody named).

The fixes are real mechanisms, not removed sleeps: the next batch is loaded by a background thread while the
step computes (prefetch, chapter 22), the checkpoint and the log line are written by a background thread
(asynchronous save, chapter 27); only the unexplained stall is simply gone — "found and removed".
Every before/after is an interleaved :func:`labkit.measure.ab.ab_compare` run inside the ranks (each arm one step;
the ranks call the arms in the same order, so their collectives match).

Taught in chapter 30 (the case review).
"""
from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from labkit import checks

__all__ = ["bert_miniature", "run_bert_miniature", "overhead_plan", "case_comparison"]


def overhead_plan(case, unit_ms: float, every: int = 4) -> dict:
    """The case's overheads in the miniature, ms: per-step data, logging and unexplained stalls, and a
    checkpoint stall every ``every`` steps that costs the source's checkpoint per step when amortised
    (150 ms / 100 steps → 1.5 units per step → ``1.5 × every`` units per save). ``unit_ms``: the miniature's
    milliseconds per case millisecond. Taught in chapter 30."""
    u = checks.positive("unit_ms", unit_ms)
    k = checks.count("every", every)
    return {"data": case.data_ms * u, "logging": case.logging_ms * u, "unexplained": max(case.unexplained_ms, 0.0) * u,
            "checkpoint_per_save": case.checkpoint_ms / case.checkpoint_every * k * u, "checkpoint_every": k}


def _median_s(fn, n: int) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def bert_miniature(case_fields: dict, *, size: int = 512, matmuls: int = 2, grad_numel: int = 2**20,
                   rounds: int = 6, calib: int = 5, seed: int = 0) -> dict:
    """Runs on every rank (``labkit.launch`` target): measures the miniature's parts, then A/Bs the job with
    the case's overheads against the fixed job, the overlapped against the unoverlapped step, and the fp16
    all-reduce against the fp32 one. Returns plain figures (seconds) and the :class:`labkit.measure.ab.ABResult` s.
    ``case_fields``: the case's data_ms, checkpoint_ms, checkpoint_every, logging_ms, unexplained_ms and
    step_ms (its overlapped step). Taught in chapter 30."""
    import torch
    import torch.distributed as dist

    from labkit.measure import ab

    c = SimpleNamespace(**{k: case_fields[k] for k in ("data_ms", "checkpoint_ms", "checkpoint_every",
                                                       "logging_ms", "unexplained_ms", "step_ms")})
    torch.manual_seed(seed)
    a, b = torch.randn(size, size), torch.randn(size, size)
    g32 = torch.randn(grad_numel)
    g16 = g32.to(torch.float16)
    w = torch.zeros(grad_numel)

    def compute():
        x = a
        for _ in range(matmuls):
            x = torch.mm(x, b) * (1.0 / size)
        return x

    def sync():                      # the serial remainder: the update after the last bucket
        w.add_(g32, alpha=-1e-6)

    def step_no_overlap():
        compute()
        dist.all_reduce(g32)
        g32.mul_(0.5)
        sync()

    def step_overlap():
        work = dist.all_reduce(g32, async_op=True)
        compute()
        work.wait()
        g32.mul_(0.5)
        sync()

    for _ in range(2):               # warm the allocator and the gloo pairs
        step_no_overlap()
        step_overlap()
    parts = {"compute": _median_s(compute, calib), "all-reduce fp32": _median_s(lambda: dist.all_reduce(g32), calib),
             "all-reduce fp16": _median_s(lambda: dist.all_reduce(g16), calib), "sync": _median_s(sync, calib)}
    dist.barrier()
    base = torch.tensor([_median_s(step_overlap, calib)])
    dist.all_reduce(base)            # every rank scales the stalls alike (the mean of the ranks' medians)
    step0 = float(base) / dist.get_world_size()
    unit = step0 * 1e3 / c.step_ms  # miniature ms per case ms
    plan = overhead_plan(c, unit)
    pool = ThreadPoolExecutor(max_workers=2)
    state = {"job": 0, "fixed": 0, "next": None}

    def stall(ms):
        time.sleep(ms / 1e3)

    def step_job():                  # the measured job: every overhead in the step, in series
        state["job"] += 1
        stall(plan["data"])          # the loader, on the main thread
        step_overlap()
        stall(plan["logging"])
        stall(plan["unexplained"])
        if state["job"] % plan["checkpoint_every"] == 0:
            stall(plan["checkpoint_per_save"])

    def step_fixed():                # prefetching loader, background checkpoint and log, the unexplained gone
        state["fixed"] += 1
        if state["next"] is not None:
            state["next"].result()   # the batch loaded while the previous step computed
        state["next"] = pool.submit(stall, plan["data"])
        step_overlap()
        pool.submit(stall, plan["logging"])
        if state["fixed"] % plan["checkpoint_every"] == 0:
            pool.submit(stall, plan["checkpoint_per_save"])

    fix = ab.ab_compare(step_job, step_fixed, rounds=rounds, warmup=1, seed=seed,
                        labels=("job with the overheads", "fixed"))
    if state["next"] is not None:
        state["next"].result()
    overlap = ab.ab_compare(step_no_overlap, step_overlap, rounds=rounds, warmup=1, seed=seed,
                            labels=("no overlap", "overlapped"))
    half = ab.ab_compare(lambda: dist.all_reduce(g32), lambda: dist.all_reduce(g16), rounds=rounds, warmup=1,
                         seed=seed, labels=("fp32 gradients", "fp16 gradients"))
    pool.shutdown(wait=True)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "parts_s": parts, "step0_s": step0,
            "unit": unit, "plan_ms": plan, "grad_bytes": g32.numel() * 4, "fix": fix, "overlap": overlap,
            "half": half}


def run_bert_miniature(case=None, *, nprocs: int = 2, rounds: int = 6, timeout_s: float = 300, **kw) -> dict:
    """Launch :func:`bert_miniature` on ``nprocs`` ranks with the fields of ``case`` (default
    :func:`labkit.teaching.cases.bert_large`); returns rank 0's figures plus ``"ranks"`` and ``"wall_s"``.
    Taught in chapter 30."""
    from labkit.launcher import launch
    from labkit.teaching.cases.bert import BertLargeCase, bert_large

    c = bert_large() if case is None else case
    if not isinstance(c, BertLargeCase):
        raise checks.ArgumentTypeError(f"case must be a labkit.teaching.cases.BertLargeCase, got {type(c).__name__}")
    n = checks.count("nprocs", nprocs, at_least=2)
    r = checks.count("rounds", rounds, at_least=3)
    fields = {"data_ms": c.data_ms, "checkpoint_ms": c.checkpoint_ms, "checkpoint_every": c.checkpoint_every,
              "logging_ms": c.logging_ms, "unexplained_ms": c.unexplained_ms, "step_ms": c.step_ms(True)}
    res = launch(bert_miniature, n, timeout_s=timeout_s, args=(fields,), kwargs={"rounds": r, **kw},
                 stream=False, env={"OMP_NUM_THREADS": "1"})
    out = dict(res.value)
    out.update(ranks=len(res.ranks), wall_s=res.wall_s)
    return out


def case_comparison(mini: dict, case=None) -> dict:
    """Whether a miniature run (:func:`run_bert_miniature`'s result) reproduces the case's ratio between the
    job with the overheads and the fixed job, from the run's own figures (ms, rank 0):

    - ``case_ratio``: the case's measured ÷ overlapped step (200/135 = 1.48×); ``measured`` and ``ci``: the
      A/B's job ÷ fixed median ratio and its bootstrap interval (inverted from ``fix.ratio``);
    - ``floor_ms``: the calibrated overlapped step the stalls were scaled to; ``fixed_ms`` / ``job_ms``: the
      A/B's medians; ``stalls_ms``: the injected stalls per step (data + logging + unexplained + the
      checkpoint amortised); ``own_ratio``: (fixed + stalls) ÷ fixed — what the stalls give on the step the
      fixed job actually ran;
    - ``reproduces``: the case's ratio inside ``ci``; ``floor_drift``: fixed ÷ floor − 1, and whether it exceeds the
      A/B's resolution (``drifted``); ``text``: the verdict in words, with the reason when it does not reproduce.

    The stalls are fixed in ms at the calibration while the compute is not: when the fixed job's step runs
    below (or above) the calibrated floor, the same stalls are a larger (smaller) share and the ratio moves
    off the case's. Taught in chapter 30."""
    from labkit.teaching.cases.bert import BertLargeCase, bert_large

    c = bert_large() if case is None else case
    if not isinstance(c, BertLargeCase):
        raise checks.ArgumentTypeError(f"case must be a labkit.teaching.cases.BertLargeCase, got {type(c).__name__}")
    need = ("fix", "step0_s", "plan_ms")
    if not isinstance(mini, dict) or any(k not in mini for k in need):
        raise ValueError(f"mini must be run_bert_miniature()'s result (a dict with keys {list(need)}), got "
                         f"{type(mini).__name__} {mini!r:.60}")
    fix, plan = mini["fix"], mini["plan_ms"]
    job_ms, fixed_ms = statistics.median(fix.a) * 1e3, statistics.median(fix.b) * 1e3
    floor_ms = mini["step0_s"] * 1e3
    stalls = plan["data"] + plan["logging"] + plan["unexplained"] + plan["checkpoint_per_save"] / plan["checkpoint_every"]
    case_ratio = c.measured_step_ms / c.step_ms(True)
    measured, ci = 1 / fix.ratio, (1 / fix.ci[1], 1 / fix.ci[0])
    own = (fixed_ms + stalls) / fixed_ms
    drift = fixed_ms / floor_ms - 1
    drifted = abs(drift) > fix.resolution
    inside = ci[0] <= case_ratio <= ci[1]
    head = (f"case {c.measured_step_ms:g}/{c.step_ms(True):g} = {case_ratio:.2f}×; measured job/fixed "
            f"{job_ms:.1f}/{fixed_ms:.1f} ms = {measured:.2f}×, 95% CI [{ci[0]:.2f}, {ci[1]:.2f}]. ")
    floor = (f"The fixed step ran {fixed_ms:.1f} ms against the calibrated floor of {floor_ms:.1f} ms "
             f"({drift:+.0%}; the A/B resolves ±{fix.resolution:.0%}); the stalls, fixed at {stalls:.1f} ms per "
             f"step, give ({fixed_ms:.1f} + {stalls:.1f})/{fixed_ms:.1f} = {own:.2f}× on the step the fixed job ran. ")
    if inside and not drifted:
        verdict = (f"REPRODUCES at this resolution: {case_ratio:.2f}× lies inside the interval — which is "
                   f"{ci[1] / ci[0]:.1f}× wide, so the run cannot tell {case_ratio:.2f}× from {measured:.2f}×; only "
                   "the direction is a claim.")
    elif inside:
        verdict = (f"INSIDE THE NOISE ONLY: {case_ratio:.2f}× lies inside the interval, but the fixed step left "
                   "its floor by more than the resolution — the compute ran at another speed than at the "
                   "calibration, so the stalls are another share of the step than the case's; only the "
                   "direction is a claim.")
    else:
        why = ("the fixed step ran " + ("below" if drift < 0 else "above") + " its calibrated floor, so the "
               "same stalls are " + ("a larger" if drift < 0 else "a smaller") + " share of it"
               if drifted else "the job's stalls did not cost their planned time (sleep overshoot or contention)")
        verdict = (f"DOES NOT REPRODUCE the case's ratio: {case_ratio:.2f}× lies outside the interval; {why}. "
                   "The direction holds; the size is this machine's, not the case's.")
    return {"case_ratio": case_ratio, "measured": measured, "ci": ci, "job_ms": job_ms, "fixed_ms": fixed_ms,
            "floor_ms": floor_ms, "stalls_ms": stalls, "own_ratio": own, "floor_drift": drift,
            "drifted": drifted, "reproduces": inside and not drifted, "text": head + floor + verdict}
