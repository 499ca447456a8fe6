"""``labkit memory``: per-rank memory estimate (model states, activations, buffers) in GB and GiB.

Examples::

    labkit memory --params 7.5e9 --ranks 64 --strategy all          # ZeRO paper Figure 1
    labkit memory --model llama3-8b --ranks 8 --strategy fsdp_full --micro-batch 1 --recompute selective
    labkit memory --model llama3-8b --strategy fsdp --ranks 8 --micro-batch 1 --seq-len 8192 --attention flash

Without ``--attention`` the activations are Korthikanti et al. 2022's published accounting (16-bit,
dropout masks, the s×s scores stored); ``--attention`` names the implementation that runs (chapter 16) and
counts what it keeps: the scores for naive/math, none for a fused kernel (sdpa, flash, efficient, cudnn).

Taught in chapter 13 (memory anatomy), chapter 16 (attention kernels), chapter 20 (FSDP / ZeRO) and
chapter 21 (checkpointing).
"""
from __future__ import annotations

import json


def register(subparsers) -> None:
    p = subparsers.add_parser("memory", help="per-rank memory estimate for a model / strategy / ranks",
                              description="Model states (ZeRO paper accounting), activations (Korthikanti "
                                          "et al. 2022) and communication buffers, per rank, in GB and GiB.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a labkit.flops preset (gpt2-124m, llama3-8b, ...) or a labkit.model.gpt size")
    src.add_argument("--params", type=float, help="parameter count Psi (model states only)")
    p.add_argument("--strategy", default="all", help="ddp, zero1, zero2, zero3, fsdp_full, fsdp_grad_op, "
                   "fsdp_no_shard, fsdp_hybrid, or 'all' (default)")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--shard-size", type=int, help="fsdp_hybrid: ranks per shard group (a node)")
    p.add_argument("--precision", default="bf16_mixed", choices=["fp32", "bf16_mixed", "bf16_autocast"])
    p.add_argument("--optimizer", default="adam", choices=["adam", "adamw", "sgd_momentum", "sgd"])
    p.add_argument("--micro-batch", type=int, help="add activations for this micro-batch (needs --model)")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--attention", choices=["naive", "math", "sdpa", "flash", "efficient", "cudnn"],
                   help="the attention that runs: naive/math store the s x s scores, fused kernels do not "
                        "(default: Korthikanti's published accounting, scores stored)")
    p.add_argument("--dropout", action="store_true", help="with --attention: count dropout masks")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _shape(name: str):
    from labkit import flops

    try:
        return flops.preset(name)
    except (ValueError, KeyError):
        from labkit.model.gpt import gpt_config

        return gpt_config(name).shape()


def compute(args) -> list[dict]:
    from labkit import checks, flops
    from labkit import memory as M

    shape = _shape(args.model) if args.model else None
    if args.seq_len and shape is not None:
        import dataclasses

        shape = dataclasses.replace(shape, seq_len=args.seq_len)
    n = flops.n_params(shape) if shape is not None else int(checks.positive("--params", args.params))
    if args.micro_batch and shape is None:
        raise ValueError("--micro-batch needs --model (activations depend on the shape)")
    strategies = list(M.STRATEGIES) if args.strategy == "all" else [args.strategy]
    attention = getattr(args, "attention", None)
    extra = {} if attention is None else {"attention": attention, "dropout": bool(getattr(args, "dropout", False)),
                                          "dtype_bytes": 4 if args.precision == "fp32" else 2}
    acts = (M.activation_bytes(shape, args.micro_batch, recompute=args.recompute, tp=args.tp,
                               sequence_parallel=args.tp > 1, **extra) if args.micro_batch else 0)
    rows = []
    for s in strategies:
        b = M.model_state_bytes(n, strategy=s, n_ranks=args.ranks, precision=args.precision,
                                optimizer=args.optimizer, shard_size=args.shard_size)
        rows.append({"strategy": b.strategy, "n_params": n, "ranks": args.ranks, "params": b.params,
                     "grads": b.grads, "optimizer": b.optimizer, "model_states": b.model_states,
                     "activations": acts, "attention": attention or "korthikanti (scores stored)",
                     "total": b.model_states + acts})
    return rows


def run(args) -> int:
    from labkit.memory import GB, GiB

    rows = compute(args)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    r0 = rows[0]
    print(f"per-rank memory, {r0['n_params']:,} params, {args.ranks} rank(s), {args.precision}, {args.optimizer} "
          "(GB = 1e9 B, GiB = 2^30 B)")
    print(f"{'strategy':<15}{'params':>10}{'grads':>10}{'optim':>10}{'states GB':>11}{'states GiB':>12}"
          f"{'activ. GiB':>12}{'total GiB':>11}")
    for r in rows:
        print(f"{r['strategy']:<15}{r['params'] / GB:>10.2f}{r['grads'] / GB:>10.2f}{r['optimizer'] / GB:>10.2f}"
              f"{r['model_states'] / GB:>11.2f}{r['model_states'] / GiB:>12.2f}{r['activations'] / GiB:>12.2f}"
              f"{r['total'] / GiB:>11.2f}")
    print("(params/grads/optim columns in GB; activations from Korthikanti et al. 2022 when --micro-batch is given; "
          f"attention: {r0['attention']})")
    return 0
