"""``labkit trace``: analyse torch.profiler Chrome traces, or write SYNTHETIC GPU ones.

Examples::

    labkit trace analyze build/work/traces/            # a folder of per-rank traces
    labkit trace analyze rank0.pt.trace.json.gz --json --steps 3 4
    labkit trace analyze traces/ --tokens-per-step 524288 --model-config gpt2/config.json --seq-len 1024 \
                         --peak-tflops 989       # MFU of a foreign trace
    labkit trace analyze --example hta-2-of-128       # a real GPU trace shipped with the course
    labkit trace hta --example hta-ddp-rank0-of-2     # HTA's definitions on another real one
    labkit trace synth out/ --ranks 2 --straggler-rank 1 --straggler-us 700
    labkit trace critical-path traces/ --plot path.png   # who set each step's pace, why, what it cost

Taught in chapter 9 (profiler traces).
"""
from __future__ import annotations

import json
from argparse import RawDescriptionHelpFormatter

# traces shipped in datasets/traces/ (see its README), by a name that says what they are
EXAMPLES = {
    "hta-2-of-128": (("traces", "hta", "trace_filter"),
                     "REAL GPU trace: ranks 0 and 1 of a 128-rank NCCL job, 2 steps (HTA test data, MIT)"),
    "hta-ddp-rank0-of-2": (("traces", "hta", "nccl_parser_config"),
                           "REAL GPU trace: rank 0 of a 2-rank DDP job on an A100, 3 steps (HTA test data, MIT)"),
    "hta-single-gpu": (("traces", "hta", "ns_resolution_trace"),
                       "REAL GPU trace: a 1-rank job on a V100, 5 steps (HTA test data, MIT)"),
    "cpu-gloo-ddp": (("traces", "cpu_gloo_ddp_tiny"), "recorded CPU trace: 2 gloo ranks, DDP, tiny GPT"),
    "synthetic-straggler": (("traces", "synthetic_gpu_ddp_straggler"),
                            "SYNTHETIC GPU-style trace: 2 ranks, rank 1 a straggler (known answers)"),
    "synthetic-launch-bound": (("traces", "synthetic_gpu_launch_bound"),
                               "SYNTHETIC GPU-style trace: 1 rank waiting on kernel launches (known answers)"),
}


def _examples_help() -> str:
    return "shipped traces for --example:\n" + "\n".join(f"  {k:24s}{v[1]}" for k, v in EXAMPLES.items())


def _add_path(parser) -> None:
    parser.add_argument("path", nargs="?", help="a trace file or a folder of per-rank trace files")
    parser.add_argument("--example", choices=sorted(EXAMPLES), metavar="NAME",
                        help="analyse a trace shipped with the course instead of PATH (names below)")


def _path(args) -> str:
    """PATH, or the shipped trace that --example names; exactly one of them."""
    if (args.path is None) == (args.example is None):
        given = "both given" if args.path is not None else "neither given"
        raise ValueError(f"give a trace PATH or --example NAME ({given}); example names: "
                         f"{', '.join(sorted(EXAMPLES))}")
    if args.path is not None:
        return args.path
    from labkit.paths import dataset

    return str(dataset(*EXAMPLES[args.example][0]))


def _add_limits(parser) -> None:
    parser.add_argument("--max-mb", type=float, help="refuse a rank's trace that inflates past this many MB "
                        "(default 2048, or LABKIT_TRACE_MAX_MB)")
    parser.add_argument("--max-events", type=int, help="refuse a rank's trace with more events than this "
                        "(default 20,000,000, or LABKIT_TRACE_MAX_EVENTS)")
    parser.add_argument("--workers", type=int, help="processes reading the ranks' traces (default: the cores "
                        "this process may use, or LABKIT_TRACE_WORKERS)")


def _limits(args) -> dict:
    return {"max_mb": args.max_mb, "max_events": args.max_events, "workers": args.workers}


def register(subparsers) -> None:
    p = subparsers.add_parser("trace", help="analyse profiler traces (breakdown, overlap, stragglers)",
                              description="Read torch.profiler Chrome traces (.json/.json.gz, CPU or GPU).")
    sub = p.add_subparsers(dest="trace_command", metavar="ACTION")
    a = sub.add_parser("analyze", help="per-rank breakdown: compute, exposed/hidden comm, memcpy, idle, data wait",
                       epilog=_examples_help(), formatter_class=RawDescriptionHelpFormatter)
    _add_path(a)
    a.add_argument("--steps", type=int, nargs="+", help="ProfilerStep numbers to keep (default: all)")
    a.add_argument("--json", action="store_true", help="print JSON instead of the text summary")
    a.add_argument("--allow-mixed", action="store_true",
                   help="analyse a folder whose files look like different runs (refused by default)")
    _add_limits(a)
    from labkit.cli import _model_flops

    _model_flops.add(a)
    a.set_defaults(func=_analyze)
    h = sub.add_parser("hta", help="temporal breakdown and comm/compute overlap in HTA 0.5.0's definitions",
                       epilog=_examples_help(), formatter_class=RawDescriptionHelpFormatter)
    _add_path(h)
    h.add_argument("--json", action="store_true")
    _add_limits(h)
    h.set_defaults(func=_hta)
    c = sub.add_parser("critical-path", help="each step's cross-rank critical path: the pace-setting rank, "
                       "its cause, the others' wait", epilog=_examples_help(), formatter_class=RawDescriptionHelpFormatter)
    _add_path(c)
    c.add_argument("--steps", type=int, nargs="+", help="ProfilerStep numbers to keep (default: all)")
    c.add_argument("--json", action="store_true", help="print JSON (one row per step, the verdict) instead of text")
    c.add_argument("--plot", metavar="PNG", help="also draw the ranks x steps heat map with the path to this file")
    c.add_argument("--allow-mixed", action="store_true",
                   help="analyse a folder whose files look like different runs (refused by default)")
    _add_limits(c)
    c.set_defaults(func=_critical_path)
    s = sub.add_parser("synth", help="write SYNTHETIC GPU-style traces with known answers")
    s.add_argument("out", help="output folder")
    s.add_argument("--ranks", type=int, default=2)
    s.add_argument("--steps", type=int, default=4)
    s.add_argument("--straggler-rank", type=int)
    s.add_argument("--straggler-us", type=float, default=0.0)
    s.add_argument("--data-wait", action="store_true", help="host sits in the DataLoader during host-wait gaps")
    s.add_argument("--nccl-names", default="current", help="current | v2_17 | legacy | rccl")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_synth)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _analyze(args) -> int:
    from labkit.cli import _model_flops
    from labkit.cli._io import naming
    from labkit.record import RunRecord
    from labkit.trace.analysis import analyze

    mfu_kw = _model_flops.resolve(args)           # a bad --model-config is named before the trace is read
    path = _path(args)
    with naming(path, "trace"):
        res = analyze(path, steps=args.steps, allow_mixed=args.allow_mixed, **_limits(args))
    record = res.update_record(RunRecord(label="trace"), **mfu_kw) if mfu_kw else None
    if args.json:
        doc = res.to_dict()
        if record is not None:
            doc["record"] = record.to_dict()
        print(json.dumps(doc, indent=2))
    else:
        print("\n".join([res.summary(), *(_model_flops.lines(record) if record is not None else [])]))
    return 0


def _critical_path(args) -> int:
    from labkit.cli._io import naming
    from labkit.trace.critical_path import critical_path

    path = _path(args)
    if args.plot is not None and not str(args.plot).lower().endswith(".png"):
        raise ValueError(f"--plot {args.plot!r}: give a file name ending in .png")
    with naming(path, "trace"):
        cp = critical_path(path, steps=args.steps, allow_mixed=args.allow_mixed, **_limits(args))
    if args.plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        ax = cp.plot()
        ax.figure.savefig(args.plot, dpi=120, bbox_inches="tight")
    if args.json:
        rank, cause = cp.verdict()
        print(json.dumps({"steps": cp.table().to_dict("records"), "verdict": {"rank": rank, "cause": cause},
                          "lost_to_slowest_s": cp.lost_to_slowest()}, indent=2, default=float))
    else:
        print(cp.table().to_string(index=False))
        print(cp.summary())
    return 0


def _hta(args) -> int:
    from labkit.cli._io import naming
    from labkit.trace.hta import hta_comm_comp_overlap, hta_temporal_breakdown

    path = _path(args)
    with naming(path, "trace"):
        tb = hta_temporal_breakdown(path, **_limits(args))
        ov = hta_comm_comp_overlap(path, **_limits(args))
    if args.json:
        print(json.dumps({"temporal_breakdown": tb.to_dict("records"),
                          "comm_comp_overlap": ov.to_dict("records")}, indent=2, default=str))
    else:
        print(tb.to_string(index=False))
        print(ov.to_string(index=False))
    return 0


def _synth(args) -> int:
    from labkit.trace.synthetic import SyntheticSpec, synthesize_traces

    spec = SyntheticSpec(world_size=args.ranks, steps=args.steps, straggler_rank=args.straggler_rank,
                         straggler_us=args.straggler_us, data_wait=args.data_wait, nccl_names=args.nccl_names,
                         seed=args.seed)
    for p in synthesize_traces(spec, args.out):
        print(p)
    return 0
