"""``labkit predict`` and ``labkit plan``: the performance model and the layout planner from the shell.

Examples::

    labkit predict --model llama3-70b --cluster dgx-a100 --global-batch 1024 --seq-len 4096 \\
        --dp 2 --tp 8 --pp 4 --strategy zero1 --recompute selective
    labkit plan --model llama3-70b --cluster a100-25gbe --global-batch 1024 --seq-len 4096 --top 5

Models are :func:`labkit.flops.preset` names, clusters :data:`labkit.perf.CLUSTERS` names. A bad value
(an unknown preset, a layout that does not divide, more GPUs than the cluster has) is one error line
naming the value and what is valid, exit code 2.

Taught in chapter 24 (choosing a parallel layout), lab10 (planner) and chapter 29 (case review).
"""
from __future__ import annotations

import json


def _common(p) -> None:
    p.add_argument("--model", required=True, help="a labkit.flops preset name (llama3-70b, gpt3-175b, ...)")
    p.add_argument("--cluster", required=True, help="a cluster preset: dgx-a100, dgx-h100, a100-25gbe, v100-nvlink-4")
    p.add_argument("--nodes", type=int, help="number of nodes (default: the preset's)")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step, all ranks")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the model's)")
    p.add_argument("--achievable", type=float, default=0.5,
                   help="fraction of the dense peak the matmuls reach (default 0.5, an assumption)")
    p.add_argument("--dtype", default="bf16", help="bf16, fp16 or fp32 (default bf16)")
    p.add_argument("--method", default="palm", help="FLOP convention: palm, 6N or megatron (default palm)")
    p.add_argument("--json", action="store_true", help="print JSON")


def register(subparsers) -> None:
    p = subparsers.add_parser("predict", help="predict step time, memory, tokens/s and MFU of a parallel layout",
                              description="Compute, pipeline bubble, TP/PP/CP/EP and DP communication (α–β "
                                          "models), memory per GPU, aggregate and per-GPU tokens/s, MFU, and the "
                                          "assumptions behind them.")
    _common(p)
    for k, d in (("dp", 1), ("tp", 1), ("pp", 1), ("cp", 1), ("ep", 1)):
        p.add_argument(f"--{k}", type=int, default=d, help=f"{k.upper()} degree (default {d})")
    p.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (default 1)")
    p.add_argument("--accum", type=int, help="micro-batches per DP rank per step (default: from the global batch)")
    p.add_argument("--strategy", default="ddp", help="ddp, zero1, zero2, zero3 or fsdp (default ddp)")
    p.add_argument("--schedule", default="1f1b", help="gpipe, 1f1b or interleaved (default 1f1b)")
    p.add_argument("--virtual-stages", type=int, default=1, help="model chunks per stage, interleaved only")
    p.add_argument("--recompute", default="none", help="none, selective or full (default none)")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism with TP")
    p.add_argument("--no-flash-attention", action="store_true", help="store the s×s attention scores")
    p.add_argument("--sync-ms", type=float, default=0.0, help="serial milliseconds per step (optimizer, barriers)")
    p.set_defaults(func=run_predict)
    q = subparsers.add_parser("plan", help="rank the parallel layouts of a model on a cluster",
                              description="Enumerate dp × tp × pp × cp (and ep for a MoE model), micro-batch, DP "
                                          "strategy and recompute; keep "
                                          "those that fit in memory; rank by predicted tokens/s; explain the winner.")
    _common(q)
    q.add_argument("--gpus", type=int, help="GPUs to use (default: all of the cluster)")
    q.add_argument("--top", type=int, default=10, help="rows to show (default 10)")
    q.add_argument("--allow-cross-node-tp", action="store_true", help="also try TP groups larger than a node")
    q.add_argument("--strategies", default="ddp,zero1,zero2,zero3,fsdp", help="comma-separated DP strategies")
    q.add_argument("--memory-fraction", type=float, default=0.9,
                   help="share of a GPU's memory a layout may use (default 0.9)")
    q.add_argument("--cps", default="1", help="comma-separated CP degrees tried where they divide, e.g. 1,2,4,8 for long "
                                              "sequences (default 1: CP's model omits costs that matter at short ones)")
    q.add_argument("--eps", default="1,2,4,8", help="comma-separated EP degrees tried on a MoE model (default 1,2,4,8)")
    q.add_argument("--pps", help="comma-separated PP degrees tried (default: every one that splits the layers "
                                 "within 25 %% of even, uneven stages included)")
    q.set_defaults(func=run_plan)


def _cluster(args):
    from labkit.perf import cluster

    return cluster(args.cluster, nodes=args.nodes)


def _model(name):
    from labkit import checks, flops

    return flops.preset(checks.one_of("--model", name, flops.presets()))


def run_predict(args) -> int:
    from labkit.perf import Layout, predict

    lay = Layout(dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, strategy=args.strategy,
                 micro_batch=args.micro_batch, accum=args.accum, schedule=args.schedule,
                 virtual_stages=args.virtual_stages, recompute=args.recompute, dtype=args.dtype,
                 sequence_parallel=args.sequence_parallel, flash_attention=not args.no_flash_attention)
    pr = predict(_model(args.model), lay, _cluster(args), global_batch=args.global_batch, seq_len=args.seq_len,
                 achievable=args.achievable, method=args.method, sync_s=_sync(args.sync_ms))
    print(json.dumps(pr.as_dict(), indent=1) if args.json else pr.table())
    return 0


def _sync(ms):
    from labkit import checks

    return checks.nonneg("--sync-ms", ms) / 1e3


def _degrees(flag: str, text: str) -> tuple:
    from labkit import checks

    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items or not all(t.isdigit() for t in items):
        raise ValueError(f"{flag}={text!r} is not valid: give comma-separated positive integers, e.g. '1,2,4'")
    return tuple(checks.count(f"{flag} item", int(t)) for t in items)


def run_plan(args) -> int:
    from labkit import checks
    from labkit.perf import plan

    top = checks.count("--top", args.top)
    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    if not strategies:
        raise ValueError(f"--strategies={args.strategies!r} is empty: give e.g. 'ddp,zero1'")
    res = plan(_model(args.model), _cluster(args), global_batch=args.global_batch, seq_len=args.seq_len,
               achievable=args.achievable, method=args.method, dtype=args.dtype, strategies=strategies,
               allow_cross_node_tp=args.allow_cross_node_tp, memory_fraction=args.memory_fraction, n_gpus=args.gpus,
               context_parallel=_degrees("--cps", args.cps), expert_parallel=_degrees("--eps", args.eps),
               pipeline_parallel=_degrees("--pps", args.pps) if args.pps is not None else None)
    table = res.table(top)
    if args.json:
        print(json.dumps({"model": res.model, "cluster": res.cluster.name, "global_batch": res.global_batch,
                          "seq_len": res.seq_len, "feasible": len(res.predictions), "rejected": len(res.rejected),
                          "layouts": table.to_dict(orient="records"),
                          "best": res.best.as_dict() if res.predictions else None,
                          "explain": res.explain()}, indent=1))
        return 0
    print(f"{res.model} on {res.cluster.describe()}; global batch {res.global_batch} × {res.seq_len} tokens")
    print(table.to_string(index=False, float_format=lambda x: f"{x:,.4g}") if len(table) else "(no feasible layout)")
    print(res.explain())
    return 0
