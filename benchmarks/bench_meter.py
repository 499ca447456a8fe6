"""How much does labkit.measure.meter.Meter cost inside a training loop? (goal: ratio <= 1.01 on CPU)

Runs the same small MLP training step bare and instrumented (one ``meter.step()`` + 4 phases),
``--steps`` steps of each per repeat, interleaved in ``--chunk``-step slices (order alternating) so
both see the same machine load, ``--repeats`` repeats, and
prints the median instrumented/bare time ratio and the per-step overhead. Then a microbenchmark of
the meter's own cost: an empty step with 4 empty phases, against an empty loop.

    .venv/bin/python benchmarks/bench_meter.py [--steps 200] [--repeats 7] [--width 256]

Taught in chapter 7 (timing).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from labkit.measure.meter import Meter


def make_step(width: int, batch: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, width)
    y = torch.randn(batch, width)
    return model, opt, x, y


def bare_chunk(model, opt, x, y, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        xb, yb = x, y
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def metered_chunk(meter, model, opt, x, y, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        with meter.step():
            with meter.phase("data"):
                xb, yb = x, y
            with meter.phase("forward"):
                loss = torch.nn.functional.mse_loss(model(xb), yb)
            with meter.phase("backward"):
                loss.backward()
            with meter.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def one_repeat(model, opt, x, y, steps: int, chunk: int, flip: bool) -> tuple[float, float]:
    """``steps`` bare and ``steps`` metered steps, interleaved in chunks so both see the same load."""
    meter = Meter(device="cpu", warmup_steps=0, tokens_per_step=x.shape[0])
    bare = metered = 0.0
    for i in range(0, steps, chunk):
        n = min(chunk, steps - i)
        if (i // chunk + flip) % 2 == 0:
            bare += bare_chunk(model, opt, x, y, n)
            metered += metered_chunk(meter, model, opt, x, y, n)
        else:
            metered += metered_chunk(meter, model, opt, x, y, n)
            bare += bare_chunk(model, opt, x, y, n)
    assert meter.n_steps == steps
    meter.summary()
    return bare, metered


def micro(steps: int) -> tuple[float, float]:
    """Seconds per step of an empty metered step (4 phases) and of an empty loop iteration."""
    meter = Meter(device="cpu", warmup_steps=0, max_pending=1 << 30)
    t0 = time.perf_counter()
    for _ in range(steps):
        with meter.step():
            with meter.phase("data"):
                pass
            with meter.phase("forward"):
                pass
            with meter.phase("backward"):
                pass
            with meter.phase("optimizer"):
                pass
    metered = (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    for _ in range(steps):
        pass
    empty = (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    meter.summary()
    resolve = (time.perf_counter() - t0) / steps
    return metered - empty, resolve


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--chunk", type=int, default=10, help="steps per interleaved bare/metered chunk")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: OpenMP spin-waits make 2-thread timings erratic on a "
                        "shared 2-core machine)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, opt, x, y = make_step(args.width, args.batch)
    bare_chunk(model, opt, x, y, 20)                    # warm-up
    ratios, bare_times, overheads = [], [], []
    for r in range(args.repeats):
        b, m = one_repeat(model, opt, x, y, args.steps, args.chunk, flip=bool(r % 2))
        ratios.append(m / b)
        bare_times.append(b / args.steps)
        overheads.append((m - b) / args.steps)
    print(f"training step (MLP {args.width}->{4 * args.width}->{args.width}, batch {args.batch}, CPU): "
          f"bare median {statistics.median(bare_times) * 1e3:.3f} ms/step over {args.steps} steps x {args.repeats}")
    print(f"instrumented/bare ratio: median {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f}); goal <= 1.01")
    print(f"per-step overhead in the loop: median {statistics.median(overheads) * 1e6:+.1f} us")
    cost, resolve = micro(20000)
    print(f"meter's own cost (empty step + 4 phases, recording): {cost * 1e6:.2f} us/step; "
          f"resolving at summary(): {resolve * 1e6:.2f} us/step")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
