"""Can labkit.measure.ab.ab_compare be trusted? (goal: A vs A → no difference in ≥ 95 % of runs; a 10 % slowdown
→ "slower" in ≥ 95 % of runs)

The work is a CPU matmul loop (torch, one thread): A does ``--iters`` iterations, the slow B does 10 %
more (``--iters`` × 1.1, e.g. 11 vs 10) — the same work, so the slowdown is real and exactly 10 %.
``--runs`` independent A/B runs of A vs A and of A vs slow B, each ``--rounds`` rounds (default
:data:`labkit.measure.ab.DEFAULT_ROUNDS`), every call timed by ab_compare with perf_counter (wall time, on
whatever load the machine has). Prints both rates, the verdicts, the median resolution and wall time.

    .venv/bin/python benchmarks/bench_ab.py [--runs 20] [--rounds 300] [--iters 10] [--size 128] [--clock cpu|wall]

Taught in chapter 28 (regression testing).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")     # one thread: no BLAS threads spinning against the machine's load

import argparse  # noqa: E402
import collections  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from labkit.measure.ab import DEFAULT_ROUNDS, NO_DIFFERENCE, ab_compare  # noqa: E402


def make_work(size: int, iters: int):
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    m = torch.randn(size, size, generator=g) / size ** 0.5

    def work():
        x = m
        for _ in range(iters):
            x = torch.tanh(x @ m)
        return None          # ab_compare times the call
    return work


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    ap.add_argument("--iters", type=int, default=10, help="matmuls per call of A (B does 10 %% more)")
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu",
                    help="wall: perf_counter; cpu: process CPU seconds (default: this CPU loop on a shared machine)")
    args = ap.parse_args(argv)
    slow_iters = round(args.iters * 1.1)
    if slow_iters * 10 != args.iters * 11:
        ap.error(f"--iters {args.iters}: B must do exactly 10 % more work; use a multiple of 10")
    a = make_work(args.size, args.iters)
    a_same = make_work(args.size, args.iters)          # A vs A: a second, identical callable
    b_slow = make_work(args.size, slow_iters)
    t0 = time.perf_counter()
    out = {}
    for name, b, want in (("A vs A", a_same, "no difference"), ("A vs B (+10 % work)", b_slow, "slower")):
        verdicts, res, walls = [], [], []
        for i in range(args.runs):
            r = ab_compare(a, b, rounds=args.rounds, seed=i, clock=args.clock)
            verdicts.append(r.verdict)
            res.append(r.resolution)
            walls.append(r.wall_s)
            print(f"  {name} run {i + 1:2d}: {r.verdict:<32} B/A {r.ratio:.3f} CI [{r.ci[0]:.3f}, {r.ci[1]:.3f}]"
                  f" resolution ±{r.resolution:.1%}  A median {statistics.median(r.a) * 1e3:.2f} ms", flush=True)
        if want == "slower":
            hits = sum(v == "slower" for v in verdicts)
        else:
            hits = sum(v in ("unchanged", NO_DIFFERENCE) for v in verdicts)
        out[name] = (want, hits, collections.Counter(verdicts), statistics.median(res), sum(walls))
    wall = time.perf_counter() - t0
    print(f"\nab_compare: {args.runs} runs each, {args.rounds} rounds of A B A' (rotated) per run, "
          f"{args.iters} vs {slow_iters} matmuls {args.size}×{args.size} per call, 1 thread, {args.clock} clock")
    for name, (want, hits, counts, res, w) in out.items():
        print(f"  {name:<22} '{want}' in {hits}/{args.runs} = {hits / args.runs:.0%} "
              f"(verdicts {dict(counts)}); median resolution ±{res:.1%}; {w:.0f} s")
    print(f"  total wall {wall:.0f} s")
    ok = all(hits / args.runs >= 0.95 for _, hits, *_ in out.values())
    print("  acceptance (≥ 95 % each):", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
