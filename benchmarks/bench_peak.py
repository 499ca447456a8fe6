"""Achievable matmul peak and the MFU of a GPT training step on this device (GPU or CPU).

1. the datasheet peak (labkit.hardware catalogue) when the GPU is catalogued;
2. a time-boxed matmul shape sweep (MAMF-finder style) and a copy-bandwidth measurement;
3. a GPT training step (labkit.model.gpt.GPT) timed with labkit.measure.meter (CUDA events on GPU), its FLOPs
   per token from the formula *and* counted exactly with FlopCounterMode, then MFU against both the
   catalogue peak and the measured peak.

    .venv/bin/python benchmarks/bench_peak.py [--size small] [--steps 20] [--batch 8] [--max-seconds 20]
    .venv/bin/python benchmarks/bench_peak.py --json out.json

Taught in chapter 6 (roofline) and chapter 4 (MFU and HFU).
"""
from __future__ import annotations

import argparse
import contextlib
import json

import torch

from labkit import flops, hardware
from labkit.flops import mfu
from labkit.measure.meter import Meter
from labkit.model.gpt import GPT, gpt_config


def _fl(x: float) -> str:
    """FLOP/s with a unit that suits CPUs and GPUs alike."""
    return f"{x / 1e12:,.2f} TFLOP/s" if x >= 1e12 else f"{x / 1e9:,.1f} GFLOP/s"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default=None, help="bf16 on GPU, fp32 on CPU by default")
    p.add_argument("--size", default=None, help="labkit.model.gpt size (default: 'medium' on GPU, 'tiny' on CPU)")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--max-seconds", type=float, default=None, help="time box of the matmul sweep")
    p.add_argument("--json", default=None, help="write the results to this JSON file")
    args = p.parse_args(argv)

    dev = hardware.resolve_device(args.device)
    gpu = dev.type == "cuda"
    dtype = hardware.normalize_dtype(args.dtype or ("bf16" if gpu else "fp32"))
    size = args.size or ("medium" if gpu else "tiny")
    batch = args.batch or (16 if gpu else 4)
    steps = args.steps or (30 if gpu else 8)
    out: dict = {"device": str(dev), "dtype": dtype}

    if gpu:
        out["device_name"] = torch.cuda.get_device_name(dev)
        try:
            spec = hardware.lookup(out["device_name"])
            out["catalogue"] = {"name": spec.name, "peak": spec.peak(dtype), "memory_bw": spec.memory_bw,
                                "source": spec.source}
        except ValueError as e:
            out["catalogue_error"] = str(e)
    m = hardware.measure_matmul_peak(dev, dtype, max_seconds=args.max_seconds or (20.0 if gpu else 2.0))
    bw = hardware.measure_memory_bandwidth(dev)
    out["matmul"] = {"best_flops": m.flops, "best_shape": m.shape,
                     "sweep": [[list(s), f] for s, f in m.table], "seconds": m.seconds}
    out["copy_bandwidth"] = bw
    print(f"device {out.get('device_name', 'cpu')} ({dev}), dtype {dtype}")
    if "catalogue" in out:
        c = out["catalogue"]
        print(f"catalogue {c['name']}: {_fl(c['peak'])}, {c['memory_bw'] / 1e9:,.0f} GB/s")
    for s, f in m.table:
        print(f"  matmul {s[0]}x{s[2]}@{s[2]}x{s[1]}: {_fl(f)}")
    print(f"best measured matmul: {_fl(m.flops)} at {m.shape}"
          + (f" = {m.flops / out['catalogue']['peak']:.1%} of datasheet" if "catalogue" in out else ""))
    print(f"copy bandwidth: {bw / 1e9:,.1f} GB/s"
          + (f" = {bw / out['catalogue']['memory_bw']:.1%} of datasheet" if "catalogue" in out else ""))

    # ---- a GPT step
    torch.manual_seed(0)
    cfg = gpt_config(size)
    model = GPT(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=gpu)
    shape = cfg.shape()
    idx = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), device=dev)
    tokens = batch * cfg.seq_len
    amp = (torch.autocast(device_type=dev.type, dtype=torch.bfloat16) if dtype == "bf16"
           else contextlib.nullcontext())
    fpt = flops.model_flops_per_token(shape, method="palm")
    with amp:
        exact = flops.count_flops(model, (idx, idx))
    model.zero_grad(set_to_none=True)
    peak_cat = out.get("catalogue", {}).get("peak")
    meter = Meter(device=dev, warmup_steps=3, tokens_per_step=tokens, flops_per_token=fpt,
                  peak_flops=peak_cat or m.flops,
                  peak_source=f"catalogue:{out['catalogue']['name']}" if peak_cat else f"measured:{m.describe()}",
                  dtype=dtype, label=f"gpt-{size}")
    for _ in range(steps + 3):
        with meter.step():
            with meter.phase("forward"), amp:
                _, loss = model(idx, idx)
            with meter.phase("backward"):
                loss.backward()
            with meter.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
    s = meter.summary()
    tps = s["tokens_per_s"]
    out["gpt"] = {"size": size, "batch": batch, "seq_len": cfg.seq_len, "n_params": flops.n_params(shape),
                  "flops_per_token_formula": fpt, "flops_per_token_counted": exact.total / tokens,
                  "step_time_median": s["step_time"].median, "tokens_per_s": tps,
                  "mfu_vs_catalogue": s["mfu"] if peak_cat else None,
                  "mfu_vs_measured_matmul": mfu.mfu(tokens_per_s=tps, flops_per_token=fpt, n_devices=1,
                                                    peak_flops=m.flops) if tps * fpt < m.flops else None}
    g = out["gpt"]
    print(f"GPT {size} ({g['n_params'] / 1e6:.1f}M params, batch {batch}x{cfg.seq_len}): "
          f"FLOPs/token formula {fpt / 1e6:.2f}M (palm), counted {g['flops_per_token_counted'] / 1e6:.2f}M "
          f"(FlopCounterMode, matmul+SDPA only)")
    print(meter.log_line())
    if g["mfu_vs_measured_matmul"] is not None:
        print(f"MFU against the measured matmul peak: {g['mfu_vs_measured_matmul']:.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
