"""``labkit tune``: sweep training knobs on N ranks and recommend; or find the largest micro-batch.

Examples::

    labkit tune --parallel ddp --grid bucket_cap_mb=1,25 --nprocs 2 --steps 6
    labkit tune --fsdp1 --grid sharding_strategy=FULL_SHARD,SHARD_GRAD_OP --grid limit_all_gathers=true,false
    labkit tune --largest-micro-batch --model small --budget-gib 0.5

Taught in chapter 15 (micro-batch and accumulation), chapter 19 (DDP) and chapter 20 (FSDP).
"""
from __future__ import annotations


def _value(text: str):
    t = text.strip()
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(t)
        except ValueError:
            pass
    return t


def parse_grid(items: list[str]) -> dict:
    """``["bucket_cap_mb=1,25", "micro_batch:accum=8:1,4:2"]`` → a grid dict (tuple keys for ':')."""
    grid = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--grid {item!r} must look like knob=v1,v2 (or a:b=1:2,3:4 for pairs)")
        key, vals = item.split("=", 1)
        if ":" in key:
            k = tuple(key.split(":"))
            grid[k] = [tuple(_value(x) for x in v.split(":")) for v in vals.split(",")]
        else:
            grid[key.strip()] = [_value(v) for v in vals.split(",")]
    return grid


def register(subparsers) -> None:
    p = subparsers.add_parser("tune", help="sweep DDP/FSDP knobs and recommend; largest micro-batch",
                              description="Grid sweep of training knobs on N ranks (chapters 15, 19, 20).")
    p.add_argument("--grid", action="append", default=[], help="knob=v1,v2 (repeatable); pairs: a:b=1:2,3:4")
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--parallel", default="ddp", choices=["single", "ddp", "fsdp", "fsdp1"],
                   help="fsdp = FSDP2 fully_shard; fsdp1 = FullyShardedDataParallel (its knobs: sharding_strategy, …)")
    p.add_argument("--fsdp1", action="store_true", help="same as --parallel fsdp1")
    p.add_argument("--peak-tflops", type=float, help="peak per device (skips the live matmul measurement)")
    p.add_argument("--largest-micro-batch", action="store_true")
    p.add_argument("--budget-gib", type=float, help="memory budget per rank, GiB")
    p.add_argument("--method", default="model", choices=["model", "measure"])
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from labkit.tuning import sweep as tune

    peak = args.peak_tflops * 1e12 if args.peak_tflops else None
    from labkit.train import TrainConfig

    base = TrainConfig(model=args.model, steps=args.steps, warmup_steps=args.warmup_steps,
                       micro_batch=args.micro_batch, parallel="fsdp1" if args.fsdp1 else args.parallel,
                       peak_flops=peak)
    if args.largest_micro_batch:
        budget = args.budget_gib * 2**30 if args.budget_gib else None
        mb = tune.largest_micro_batch(base, memory_budget_bytes=budget, nprocs=args.nprocs, method=args.method)
        pred = tune.predicted_bytes(base, max(mb, 1), args.nprocs)
        print(f"largest micro-batch for {args.model} ({args.method}, budget {args.budget_gib} GiB): {mb} "
              f"(predicted {pred / 2**30:.3f} GiB per rank at that size)")
        return 0
    grid = parse_grid(args.grid)
    if not grid:
        raise ValueError("give at least one --grid knob=v1,v2 (or --largest-micro-batch)")
    res = tune.sweep(base, grid, nprocs=args.nprocs, progress=not args.no_progress)
    print(res.format())
    return 0
