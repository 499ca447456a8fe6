"""Speedup, scaling efficiency, and where the missing speedup goes.

Definitions (N devices; t_1 and t_N the time of the same *global* work on 1 and on N devices):

- **strong scaling** — fixed global batch, split N ways: speedup S = t_1 / t_N, efficiency E = S / N.
- **weak scaling** — fixed *per-device* batch, global batch grows with N: a step should take as long
  as on one device, so E = t_1 / t_N (step times), or in throughput E = X_N / (N · X_1).
- Amdahl (1967): with a serial fraction s, S ≤ 1 / (s + (1-s)/N); Gustafson (1988) for weak
  scaling: S = N - s·(N-1).

A data-parallel step is compute, gradient communication and a serial remainder ("sync": the last
bucket, the optimizer step, barriers)::

    step ≈ max(compute, comm) + sync     when communication overlaps the backward pass
    step ≈ compute + comm + sync         when it cannot (no overlap)

(the DDP design: Li et al. 2020, "PyTorch Distributed", VLDB, §3.2.3 on bucketing and overlap).

Taught in chapter 5 (``chapters/part1_cognition/ch05_scaling_efficiency.ipynb``); chapter 19 (DDP) and
chapter 29 (more GPUs, slower training) reuse it.
"""
from __future__ import annotations

from labkit import checks
from labkit.perf.steptime import StepParts, decompose, step_time  # noqa: F401 - taught in chapter 5

__all__ = ["speedup", "strong_efficiency", "weak_efficiency", "throughput_efficiency", "step_time",
           "StepParts", "decompose", "amdahl_speedup", "gustafson_speedup", "scaling_table", "measure_scaling"]


def speedup(t1_s: float, tn_s: float) -> float:
    """S = t_1 / t_N for the same global work (strong scaling). Taught in chapter 5."""
    s = checks.positive("t1_s", t1_s) / checks.positive("tn_s", tn_s)
    return checks.finite_result("speedup", s, t1_s=t1_s, tn_s=tn_s)


def strong_efficiency(t1_s: float, tn_s: float, n: int) -> float:
    """E = t_1 / (N · t_N): 1.0 is linear speedup. Taught in chapter 5."""
    return speedup(t1_s, tn_s) / checks.count("n", n)


def weak_efficiency(t1_s: float, tn_s: float) -> float:
    """E = t_1 / t_N for steps of the same per-device work (weak scaling). Taught in chapter 5."""
    e = checks.positive("t1_s", t1_s) / checks.positive("tn_s", tn_s)
    return checks.finite_result("efficiency", e, t1_s=t1_s, tn_s=tn_s)


def throughput_efficiency(x1: float, xn: float, n: int) -> float:
    """E = X_N / (N · X_1) from global throughputs (tokens/s); valid for strong and weak scaling."""
    e = checks.positive("xn", xn) / (checks.count("n", n) * checks.positive("x1", x1))
    return checks.finite_result("efficiency", e, x1=x1, xn=xn, n=n)


def amdahl_speedup(serial_fraction: float, n: int) -> float:
    """Amdahl (1967): S = 1 / (s + (1 − s)/N), the strong-scaling ceiling. Taught in chapter 5."""
    s = checks.fraction("serial_fraction", serial_fraction)
    return 1.0 / (s + (1.0 - s) / checks.count("n", n))


def gustafson_speedup(serial_fraction: float, n: int) -> float:
    """Gustafson (1988): scaled speedup S = N − s·(N − 1), the weak-scaling view. Taught in chapter 5."""
    s = checks.fraction("serial_fraction", serial_fraction)
    n = checks.count("n", n)
    return n - s * (n - 1)


def scaling_table(throughput: dict[int, float], *, mode: str = "strong"):
    """Speedup and efficiency from measured global throughputs ``{n_devices: tokens/s}``.

    ``mode="strong"``: same global batch at every N; ``"weak"``: same per-device batch. Both use
    E = X_N / (N · X_1); speedup = X_N / X_1. Needs an entry for N = 1. Taught in chapter 5.
    """
    import pandas as pd

    checks.one_of("mode", mode, ("strong", "weak"))
    if not hasattr(throughput, "items"):
        raise checks.ArgumentTypeError(f"throughput must be a dict {{n_devices: tokens/s}}, got "
                                       f"{type(throughput).__name__} {throughput!r:.60}")
    table = {}
    for n, x in throughput.items():
        n = checks.count(f"throughput key {n!r} (a device count)", n)
        table[n] = checks.positive(f"throughput[{n}]", x)
    if 1 not in table:
        raise ValueError(f"throughput needs the 1-device baseline (key 1); got keys {sorted(table)}")
    x1 = table[1]
    rows = []
    for n in sorted(table):
        xn = table[n]
        rows.append({"devices": n, "mode": mode, "tokens/s": xn,
                     "speedup": checks.finite_result("speedup", xn / x1, throughput=throughput),
                     "ideal": float(n), "efficiency": throughput_efficiency(x1, xn, n)})
    return pd.DataFrame(rows)


def measure_scaling(base, nprocs=(1, 2), *, mode: str = "strong", threads_per_rank: int | None = 1,
                    timeout_s: float = 300):
    """Train ``base`` (a ``labkit.train.TrainConfig``) on each rank count and tabulate speedup and efficiency.

    ``mode="strong"``: the global batch stays ``base.micro_batch`` sequences, split over the ranks (each
    N must divide it); ``"weak"``: every rank keeps ``base.micro_batch``. One rank trains with
    ``parallel="single"``, more with ``base.parallel`` ("ddp" when base says "single"). Ranks start through
    ``labkit.launch`` (gloo on CPU, NCCL with one GPU per rank). On CPU ``threads_per_rank`` pins
    ``OMP_NUM_THREADS`` so that one rank = one core stands in for one device (None: the launcher's
    cores ÷ ranks). Returns (table, {N: RunRecord}); the table is :func:`scaling_table` plus step times.
    Taught in chapter 5.
    """
    from labkit.launcher.parent import launch

    checks.one_of("mode", mode, ("strong", "weak"))
    if threads_per_rank is not None:
        threads_per_rank = checks.count("threads_per_rank", threads_per_rank)
    checks.positive("timeout_s", timeout_s)
    if isinstance(nprocs, (str, bytes)) or not hasattr(nprocs, "__iter__"):
        raise checks.ArgumentTypeError(f"nprocs must be a list of rank counts, e.g. (1, 2), got "
                                       f"{type(nprocs).__name__} {nprocs!r}")
    counts = sorted({checks.count("nprocs", n) for n in nprocs})
    if 1 not in counts:
        raise ValueError(f"nprocs must include 1 (the baseline), got {list(nprocs)}")
    bad = [n for n in counts if mode == "strong" and base.micro_batch % n]
    if bad:
        raise ValueError(f"strong scaling splits micro_batch={base.micro_batch} over N ranks, but it is not "
                         f"divisible by N={bad}: choose a micro_batch divisible by every N in {counts}")
    records = {}
    for n in counts:
        mb = base.micro_batch // n if mode == "strong" else base.micro_batch
        par = "single" if n == 1 else ("ddp" if base.parallel == "single" else base.parallel)
        cfg = base.replace(micro_batch=mb, parallel=par, label=f"{mode} N={n}")
        env = {"OMP_NUM_THREADS": str(threads_per_rank)} if threads_per_rank else None
        res = launch("labkit.train:train", n, args=(cfg,), env=env, timeout_s=timeout_s, stream=False)
        records[n] = res.value
    table = scaling_table({n: r.tokens_per_s for n, r in records.items()}, mode=mode)
    table["step (ms)"] = [records[n].step_time.median * 1e3 for n in table["devices"]]
    table["step spread"] = [records[n].step_time.spread for n in table["devices"]]
    # tokens per step (micro-batch × ranks × sequence length), not sequences: the column says so
    table["global batch (tokens)"] = [records[n].tokens_per_step for n in table["devices"]]
    return table, records
