"""Adaptive accumulation on live ranks (chapter 25): a slow link that comes and goes.

Two gloo ranks train the tiny GPT with DDP twice, on the same sample stream, with the same injected slow link
(``inject="comm"``: an extra padded all-reduce per step, switched on for steps a ≤ i < b by ``inject_steps``):

- **adaptive**: ``accum="adaptive"`` with the source's rule (window 10, cap 8, hysteresis 2) — the controller
  reads each step's forward + backward and comm seconds from the meter and chooses the next accumulation;
- **fixed**: ``accum=1`` for as many micro-batches as the adaptive run consumed (equal tokens).

Prints each run's accumulation per step, its seconds per step, and the two loss curves at equal tokens
(the loss of the step that ends at each token count both runs reach). Counts (does accumulation rise under the
slow link and fall after it?) are robust on a loaded machine; seconds are not — read them as a rough picture.

Usage: .venv/bin/python benchmarks/bench_adaptive_accum.py [--steps 50] [--on 10 30] [--pad-mb 384]
       [--window 10] [--cap 8] [--hysteresis 2] [--micro-batch 4]
"""
from __future__ import annotations

import argparse
import statistics


def main(argv=None) -> int:
    from labkit.train import TrainConfig, run_many

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--on", type=int, nargs=2, default=(10, 30), metavar=("A", "B"))
    ap.add_argument("--pad-mb", type=float, default=384.0)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--cap", type=int, default=8)
    ap.add_argument("--hysteresis", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=1200)
    a = ap.parse_args(argv)
    base = TrainConfig(model="tiny", parallel="ddp", micro_batch=a.micro_batch, steps=a.steps, warmup_steps=1,
                       inject="comm", comm_pad_mb=a.pad_mb, inject_steps=tuple(a.on), peak_flops=1e12)
    ada_cfg = base.replace(accum="adaptive", accum_window=a.window, accum_cap=a.cap, accum_hysteresis=a.hysteresis,
                           label="adaptive")
    (ada,) = run_many([ada_cfg], 2, timeout_s=a.timeout)
    ks = ada.extra["accum_per_step"]
    # the fixed run: accum 1 for as many micro-batches; its slow link is on for the same micro-batches
    start, stop = sum(ks[:a.on[0]]), sum(ks[:a.on[1]])
    (fixed,) = run_many([base.replace(steps=sum(ks), inject_steps=(start, stop), label="fixed accum=1")], 2,
                        timeout_s=a.timeout)
    print(f"slow link: +{a.pad_mb:g} MB all-reduce per step on steps {a.on[0]}..{a.on[1] - 1} (adaptive run), "
          f"micro-batches {start}..{stop - 1} (fixed run)")
    print("adaptive accumulation per step:", " ".join(map(str, ks)))
    on, off = ks[a.on[0]:a.on[1]], ks[a.on[1]:]
    print(f"  max during the slow link: {max(on)}   last: {ks[-1]}   (before it: {max(ks[:a.on[0]])})")
    for rec in (ada, fixed):
        st = rec.step_time
        print(f"{rec.label:>16}: {rec.step_time.n} measured steps, step {st.median * 1e3:.0f} ms (p10 "
              f"{st.p10 * 1e3:.0f}, p90 {st.p90 * 1e3:.0f}), {rec.tokens_per_s:,.0f} tok/s over the real tokens, "
              f"wall {rec.extra['wall_s']:.1f} s")
    mb_tokens = a.micro_batch * 2 * base.model_config.seq_len          # one micro-batch on both ranks
    ends = [sum(ks[:i + 1]) for i in range(len(ks))]           # micro-batches done at the end of each step
    print(" micro-batches  tokens   loss adaptive  loss fixed")
    for i, m in enumerate(ends):
        if i % max(1, len(ends) // 12) == 0 or i == len(ends) - 1:
            tok = f"{m * mb_tokens:>7}"
            print(f"{m:>13}  {tok}  {ada.loss[i]:>13.3f}  {statistics.fmean(fixed.loss[m - ks[i]:m]):>10.3f}")
    print("(the fixed column averages its per-micro-batch losses over the same micro-batches as the adaptive step)")
    rose, fell = max(on) >= 1 + a.hysteresis, bool(off) and off[-1] < max(on)
    print(f"accumulation rose under the slow link: {rose}; fell after it: {fell}")
    return 0 if (rose and fell) else 1


if __name__ == "__main__":
    raise SystemExit(main())
