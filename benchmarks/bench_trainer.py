"""Reference trainer vs a bare hand-written loop: is labkit.train's instrumentation free?

Single process, CPU (or the GPU if present), same model (labkit.model.gpt.GPT, "bench" size: 4 layers,
d_model 768, seq 256 — matmuls dominate), same data windows, same optimizer (AdamW), same dtype
(bf16 autocast where the CPU runs bf16 fast, else fp32; the peak is a bf16 matmul measured in this run, so the fraction compares like
with like for the matmuls, while LayerNorm/softmax/GELU/optimizer run in fp32 — they count as model
work that earns no FLOPs, which is what MFU means).

Prints:
- tokens/s of the trainer and of the bare loop, and their ratio (goal ≥ 1.0 within noise): the runs are
  interleaved (trainer, bare, trainer, bare, ...) and medians of per-step times are compared;
- achieved FLOP/s (tokens/s × model FLOPs/token, PaLM App. B) as a fraction of the measured matmul peak
  (goal ≥ 50 %).

Usage: .venv/bin/python benchmarks/bench_trainer.py [--model bench] [--steps 10] [--rounds 3] [--dtype auto|fp32|bf16]
Timings on a shared machine are noisy: read the ratio, not the absolute numbers.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch


def bare_loop(cfg, steps: int) -> list[float]:
    """The loop a learner would write by hand: no meter, no wrappers, no phases."""
    from labkit import data
    from labkit.model.gpt import GPT

    torch.manual_seed(cfg.seed)
    mcfg = cfg.model_config
    model = GPT(mcfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    tokens = torch.from_numpy(data.load_tokens()[: 400_000].astype("int64"))
    T, B = mcfg.seq_len, cfg.micro_batch
    g = torch.Generator().manual_seed(cfg.seed)
    n_windows = (len(tokens) - 1) // T
    amp = (torch.autocast("cpu", dtype=torch.bfloat16) if cfg.dtype == "bf16" else contextlib.nullcontext())
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        idx = torch.randint(0, n_windows, (B,), generator=g) * T
        w = torch.stack([tokens[i:i + T + 1] for i in idx.tolist()])
        x, y = w[:, :-1], w[:, 1:]
        with amp:
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    from labkit import flops, hardware
    from labkit.train import TrainConfig, train

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bench")
    ap.add_argument("--steps", type=int, default=10)   # timed steps per loop (after --warmup): at 6 the ratio swung ±5 %
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"),
                    help="auto: bf16 where this CPU runs it fast, else fp32 (labkit.hardware.best_dtype)")
    a = ap.parse_args(argv)
    if a.dtype == "auto":
        a.dtype = hardware.best_dtype("cpu")
        print(f"dtype auto -> {a.dtype} ({hardware.capability('cpu', ('bf16',))['bf16']})")

    def peak_now():
        return hardware.measure_matmul_peak("cpu", a.dtype, max_seconds=1.5)

    peak = peak_now()
    cfg = TrainConfig(model=a.model, micro_batch=a.micro_batch, steps=a.steps + a.warmup, warmup_steps=a.warmup,
                      dtype=a.dtype, peak_flops=peak.flops, device="cpu", label="bench")
    mcfg = cfg.model_config
    fpt = flops.model_flops_per_token(mcfg.shape())
    tok_per_step = a.micro_batch * mcfg.seq_len
    print(f"model {a.model}: {flops.n_params(mcfg.shape()) / 1e6:.1f} M params, seq {mcfg.seq_len}, "
          f"batch {a.micro_batch}, {a.dtype}; model FLOPs/token {fpt / 1e6:.1f} M (PaLM App. B); "
          f"threads {torch.get_num_threads()}")
    print(f"measured matmul peak: {peak.flops / 1e9:.1f} GFLOP/s ({peak.describe() if hasattr(peak, 'describe') else peak.shape})")
    # Each round: peak, trainer, bare loop, peak again (the machine may be shared: the round's peak is
    # the better of the two measurements around it; the figures are medians over rounds).
    ratios, fractions, bare_fractions = [], [], []
    for r in range(a.rounds):
        p0 = peak.flops if r == 0 else peak_now().flops
        # alternate which loop goes first, so neither always gets the warmer (or busier) slot
        if r % 2:
            bare = statistics.median(bare_loop(cfg, a.steps + a.warmup)[a.warmup:])
            rec = train(cfg)
        else:
            rec = train(cfg)
            bare = statistics.median(bare_loop(cfg, a.steps + a.warmup)[a.warmup:])
        p = max(p0, peak_now().flops)
        ref_tps, bare_tps = tok_per_step / rec.step_time.median, tok_per_step / bare
        ratios.append(ref_tps / bare_tps)
        fractions.append(ref_tps * fpt / p)
        bare_fractions.append(bare_tps * fpt / p)
        print(f"round {r + 1}: peak {p / 1e9:.0f} GFLOP/s | trainer {rec.step_time.median * 1e3:.0f} ms/step "
              f"({ref_tps:,.0f} tok/s, {fractions[-1]:.1%} of peak) | bare {bare * 1e3:.0f} ms/step "
              f"({bare_tps:,.0f} tok/s, {bare_fractions[-1]:.1%}) | ratio {ratios[-1]:.3f}")
    print(f"tokens/s ratio trainer/bare (median of {a.rounds} rounds) = {statistics.median(ratios):.3f} "
          f"(goal ≥ 1.0 within noise; spread {min(ratios):.3f}–{max(ratios):.3f})")
    print(f"trainer achieved FLOP/s = {statistics.median(fractions):.1%} of the measured {a.dtype} matmul peak "
          f"(goal ≥ 50%); bare loop {statistics.median(bare_fractions):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
