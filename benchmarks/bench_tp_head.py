"""TP2 against DP2 at lab 10's q3 settings, before and after the vocabulary-parallel head (issue #33).

Lab 10 q3 compares DP2 (``parallel="ddp"``, 4 sequences per rank) with TP2 (``tp=2``, both ranks the same 8
sequences) on the same global batch. Until the head was split, each TP rank computed the tied head and the loss
for all 8 sequences — 2·B·T·d·V forward FLOPs, V / (V + 12·d·L + 2·T·L) of the forward's matmul FLOPs (the
per-token forward: 24·d² per block, 4·T·d of attention scores per block at full length, 2·d·V for the head;
Kaplan et al. 2020, table 1): 55 % for the tiny GPT (V = 4096, d = 128, L = 2, T = 64) — duplicated work that made
TP2 slower whatever its all-reduces cost. This script measures, on 2 gloo ranks of this machine:

1. the three arms — DP2, TP2 with the head whole on every rank (``vocab_parallel=False``, the older plan) and TP2
   with the vocabulary-parallel head and loss (``vocab_parallel=True``, the default) — interleaved in one launch
   of the ranks, round after round in rotating order; each run's median step time (after ``warmup_steps``), then
   per arm the median over rounds, and DP2's tokens/s ÷ each TP2's;
2. ``--trace-rounds`` profiled runs of each arm (the last 3 steps), interleaved, read by
   :func:`labkit.trace.analyze` (medians over the runs): per step, the main
   thread's compute, the exposed communication (gloo spans while the main thread is not computing: TP's
   blocking all-reduces are almost all exposed) and the idle rest, and the gloo all-reduce count;
3. optionally (``--ab``) lab 10's own A/B (:func:`labkit.measure.ab.ab_train`, ``same_ranks=True``, ``max_rounds``) of
   DP2 against each TP2, with its verdict.

Usage: .venv/bin/python benchmarks/bench_tp_head.py [--model tiny] [--steps 8] [--rounds 6] [--trace-rounds 3]
       [--seed 0] [--ab] [--json out.json]
Timings on a shared 2-core machine are noisy: read the ratios and the trace's split, not the absolute numbers.

Measured 2026-12-06 (``--rounds 8 --steps 8 --trace-rounds 3 --ab``; the 2-core CPU machine shared, load average
17-20 — every figure is inflated by the scheduler, each all-reduce waits for the peer rank to get a core):

======================  ===========  =============  ==============  ===============  ===========  =========
arm                     step median  DP2 tok/s ÷    trace: compute  exposed comm     all-reduces  lab10 A/B
                        (8 rounds)   this arm's     (ms per step)   (ms per step)    per step     DP2 ÷ TP2
======================  ===========  =============  ==============  ===============  ===========  =========
DP2                     303 ms       1.00           166             72               1            —
TP2, head whole         527 ms       1.74           258             143              8            1.89 slower (4 rounds)
TP2, vocab-parallel     447 ms       1.47           154             233              13           1.41 slower (16 rounds)
======================  ===========  =============  ==============  ===============  ===========  =========

The split takes TP2's compute from 1.55× DP2's to 0.93× (the duplicated head was the difference); what is left
of "TP2 slower than DP2" is exposed communication: 13 blocking all-reduces a step (Megatron's 8 + the vocabulary
ends' 5) against DP2's one bucket. An earlier pass at the same settings (6 rounds, one profiled run per arm,
load ≈ 22) gave compute 206 / 190 / 121 ms and exposed comm 44 / 117 / 107 ms for the same three arms.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def arms(model: str, steps: int, seed: int) -> dict:
    from labkit.train import TrainConfig

    live = dict(model=model, steps=steps, warmup_steps=1, seed=seed, device="cpu")   # lab 10's LIVE
    dp2 = TrainConfig(parallel="ddp", micro_batch=4, label="DP2", **live)
    tp2 = dp2.replace(parallel="single", tp=2, micro_batch=8, label="TP2")
    return {"DP2": dp2, "TP2 head whole": tp2.replace(vocab_parallel=False, label="TP2-whole"),
            "TP2 vocab-parallel": tp2}


def head_share(cfg) -> float:
    """The head's share of the forward's matmul FLOPs per token: 2dV / (24d²L + 4TdL + 2dV)."""
    m = cfg.model_config
    d, L, T, V = m.d_model, m.n_layers, m.seq_len, m.vocab_size
    return 2 * d * V / (24 * d * d * L + 4 * T * d * L + 2 * d * V)


def interleaved(cfgs: dict, rounds: int) -> dict:
    """Every arm once per round, the order rotating, all in one launch of 2 ranks; per arm the runs' medians."""
    from labkit.train import run_many

    names = list(cfgs)
    order = [names[(r + k) % len(names)] for r in range(rounds) for k in range(len(names))]
    recs = run_many([cfgs[n] for n in order], 2, timeout_s=900)
    out = {n: [] for n in names}
    for n, rec in zip(order, recs, strict=True):
        out[n].append(rec.step_time.median)
    return out


def traced(cfgs: dict, folder: Path, rounds: int) -> dict:
    """``rounds`` profiled runs per arm (the last 3 steps each), interleaved in rotating order in one launch; per
    arm the median over runs of each per-step figure (rank mean): compute, exposed and hidden comm, idle,
    all-reduces."""
    from labkit.perf.validate.layouts import trace_collectives
    from labkit.trace import analyze
    from labkit.train import run_many

    names = list(cfgs)
    order = [names[(r + k) % len(names)] for r in range(rounds) for k in range(len(names))]
    prof = [cfgs[n].replace(profile_dir=str(folder / f"{i}-{cfgs[n].label}"), profile_steps=3)
            for i, n in enumerate(order)]
    run_many(prof, 2, timeout_s=900)
    rows = {n: [] for n in names}
    for n, c in zip(order, prof, strict=True):
        b = analyze(c.profile_dir).breakdown
        k = 3 * len(b)                                   # 3 steps on each rank: per rank-step means
        row = {col: float(b[col].sum()) / k for col in ("total", "compute", "comm_exposed", "comm_hidden")}
        row["idle"] = row["total"] - row["compute"] - row["comm_exposed"]
        row["all_reduces_per_step"] = trace_collectives(c.profile_dir)[0]["all_reduce"] / 3
        rows[n].append(row)
    return {n: {col: statistics.median(r[col] for r in rs) for col in rs[0]} for n, rs in rows.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace-rounds", type=int, default=3, help="profiled runs per arm")
    ap.add_argument("--ab", action="store_true", help="also lab 10's A/B of DP2 against each TP2")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    if a.rounds < 2 or a.steps < 4 or a.trace_rounds < 1:
        ap.error(f"--rounds={a.rounds}, --steps={a.steps}, --trace-rounds={a.trace_rounds}: use at least 2 rounds, "
                 "4 steps and 1 profiled run")
    cfgs = arms(a.model, a.steps, a.seed)
    tokens = cfgs["DP2"].micro_batch * 2 * cfgs["DP2"].model_config.seq_len
    print(f"model {a.model}: the head is {head_share(cfgs['DP2']):.0%} of the forward's matmul FLOPs; "
          f"{tokens} tokens per step in every arm; {a.rounds} interleaved rounds of {a.steps} steps")
    times = interleaved(cfgs, a.rounds)
    med = {n: statistics.median(v) for n, v in times.items()}
    for n, v in times.items():
        print(f"  {n:20s} step median {med[n] * 1e3:7.1f} ms  (runs: {', '.join(f'{x * 1e3:.0f}' for x in v)})  "
              f"DP2 tokens/s / this = {med[n] / med['DP2']:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        tr = traced(cfgs, Path(tmp), a.trace_rounds)
    print(f"  per step, rank mean, median of {a.trace_rounds} profiled runs (ms):  total  compute  comm exposed  comm hidden  idle  all-reduces")
    for n, r in tr.items():
        print(f"  {n:20s} {r['total'] * 1e3:12.1f} {r['compute'] * 1e3:8.1f} {r['comm_exposed'] * 1e3:13.1f} "
              f"{r['comm_hidden'] * 1e3:12.1f} {r['idle'] * 1e3:5.1f} {r['all_reduces_per_step']:12.0f}")
    result = {"model": a.model, "steps": a.steps, "rounds": a.rounds, "trace_rounds": a.trace_rounds,
              "head_share": head_share(cfgs["DP2"]),
              "step_s": times, "median_step_s": med, "trace": tr}
    if a.ab:
        from labkit.measure import ab

        result["ab"] = {}
        for n in ("TP2 head whole", "TP2 vocab-parallel"):
            res = ab.ab_train(cfgs["DP2"], cfgs[n], nprocs=2, rounds=4, warmup=1, metric="throughput",
                              same_ranks=True, timeout_s=900, max_rounds=32)
            print(f"  A/B DP2 vs {n}: DP2 tokens/s / TP2's = {1 / res.ratio:.2f}, verdict {res.verdict!r} "
                  f"({res.rounds} rounds)")
            result["ab"][n] = {"slowdown": 1 / res.ratio, "verdict": res.verdict, "rounds": res.rounds}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
