"""``labkit comm``: benchmark collectives, model them, and parse nccl-tests / NCCL logs / topologies.

Examples::

    labkit comm bench --ops all_reduce all_gather --nprocs 2 --min-bytes 1K --max-bytes 4M --fit
    labkit comm parse all_reduce_perf.log          # auto-detects nccl-tests / NCCL_DEBUG=INFO / topo -m
    labkit comm model --op all_reduce --size 1.3G --nranks 4 --bw-gbs 22 --alpha-us 5
    labkit comm env job.sh                         # what each NCCL_/FI_/RDMAV_ variable really does

Taught in chapter 11 (communication diagnostics) and chapter 23.
"""
from __future__ import annotations

import json
import math
import re

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "B": 1}


def parse_size(text: str) -> int:
    """'4M' → 4·2^20 (nccl-tests' -b/-e convention: K/M/G are powers of 2); '1GB' → 1e9; '1GiB' → 2^30."""
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*", str(text))
    try:
        size = float(m.group(1)) * _UNITS[m.group(2).upper()] if m else math.nan
    except (ValueError, KeyError):                   # "1.2.3", an unknown unit
        size = math.nan
    if not math.isfinite(size):                      # 1e999 is no size either
        raise ValueError(f"size {text!r} is not valid; use bytes like 1024, 64K, 4M, 1G, 1GB, 1GiB")
    return int(size)


def register(subparsers) -> None:
    p = subparsers.add_parser("comm", help="collectives: benchmark, alpha-beta model, parse logs",
                              description="Communication diagnostics (chapter 11): busbw, alpha-beta, parsers.")
    sub = p.add_subparsers(dest="comm_command", metavar="ACTION")
    b = sub.add_parser("bench", help="live benchmark of collectives on N ranks (nccl-tests-style table)")
    b.add_argument("--ops", nargs="+", default=["all_reduce"],
                   help="all_reduce all_gather reduce_scatter broadcast reduce all_to_all send_recv")
    b.add_argument("--nprocs", type=int, default=2)
    b.add_argument("--min-bytes", default="1K")
    b.add_argument("--max-bytes", default="4M")
    b.add_argument("--factor", type=int, default=4)
    b.add_argument("--iters", type=int, default=10)
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    b.add_argument("--fit", action="store_true", help="fit alpha and beta of the ring model per op")
    b.add_argument("--json", action="store_true")
    b.set_defaults(func=run_bench)
    q = sub.add_parser("parse", help="parse nccl-tests output, an NCCL_DEBUG=INFO log or nvidia-smi topo -m")
    q.add_argument("file", help="text file ('-' for stdin)")
    q.add_argument("--format", default="auto", choices=["auto", "nccl-tests", "nccl-debug", "topology"])
    q.add_argument("--op", help="collective of a nccl-tests file when the text does not say")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=run_parse)
    m = sub.add_parser("model", help="predict a collective's time with the ring / tree / two-level model")
    m.add_argument("--op", default="all_reduce")
    m.add_argument("--size", required=True, help="bytes (nccl-tests S), e.g. 1.3GB, 64M")
    m.add_argument("--nranks", type=int, required=True)
    m.add_argument("--bw-gbs", type=float, required=True, help="per-rank link bandwidth, GB/s (1e9 B/s)")
    m.add_argument("--alpha-us", type=float, default=5.0, help="latency per step, microseconds")
    m.add_argument("--ranks-per-node", type=int, help="two-level model: ranks per node")
    m.add_argument("--inter-bw-gbs", type=float, help="two-level model: inter-node bandwidth per rank, GB/s")
    m.add_argument("--inter-alpha-us", type=float, default=20.0)
    m.set_defaults(func=run_model)
    e = sub.add_parser("env", help="what each NCCL / EFA environment variable of a job really does",
                       description="Check a job's NCCL, libfabric (EFA), aws-ofi-nccl and rdma-core variables: "
                                   "exists or not, who reads it, default, Debugging-only, a verdict and its source "
                                   "(chapter 23). Exit 1 when a variable is harmful or has no effect.")
    src = e.add_mutually_exclusive_group()
    src.add_argument("file", nargs="?", help="pasted settings (export X=Y, mpirun -x X=Y, an NCCL INFO log; "
                                             "'-' for stdin); default: this shell's environment")
    src.add_argument("--template", action="store_true", help="check the course source's NCCL/EFA template")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=run_env)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_bench(args) -> int:
    from labkit import comm

    sizes = comm.default_sizes(parse_size(args.min_bytes), parse_size(args.max_bytes), args.factor)
    res = comm.benchmark(args.ops, sizes, args.nprocs, iters=args.iters, warmup=args.warmup, backend=args.backend)
    fits = {}
    if args.fit:
        for op in res.table["op"].unique():
            df = res.for_op(op)
            if df["size"].nunique() >= 2:
                fits[op] = comm.fit_alpha_beta(df["size"], df["time_us"] * 1e-6, op, res.nranks)
    if args.json:
        print(json.dumps({"table": res.table.to_dict(orient="records"), "notes": res.notes,
                          "fits": {k: {"alpha_s": f.alpha_s, "beta_s_per_byte": f.beta_s_per_byte,
                                       "bandwidth": f.bandwidth} for k, f in fits.items()}}, indent=2))
        return 0
    res.print()
    for f in fits.values():
        print("# fit: " + f.summary())
    return 0


def run_parse(args) -> int:
    from labkit import comm
    from labkit.cli._io import naming, read_text

    text = read_text(args.file, "input file")      # a folder, an empty or a binary file: one line naming it
    with naming("stdin" if args.file == "-" else args.file, "input file"):
        kind, out, table = _parse(args, comm, text)
    del text
    if args.json:
        _print_json(out)
        return 0
    print(f"{kind}: {out['summary']}")
    print(table)
    for e in out["errors"]:
        print(f"  bad line {e['line']}: {e['reason']}")
    return 0


def _parse(args, comm, text: str) -> tuple[str, dict, str]:
    """(format, the JSON-able result, the text table) of one input."""
    # ValueError (exit 2, one line) when the text is no known format or the parser finds nothing in it
    kind, r = comm.parse(text, args.format, op=args.op, source="stdin" if args.file == "-" else args.file)
    if kind == "nccl-tests":
        out = {"kind": kind, "summary": r.summary(), "avg_busbw": r.avg_busbw, "op": r.op, "nranks": r.nranks,
               "nranks_from": r.nranks_from, "format": r.format, "out_of_bounds": r.out_of_bounds,
               "out_of_bounds_status": r.out_of_bounds_status, "rows": r.rows.to_dict(orient="records")}
        table = r.rows.to_string(index=False)
    elif kind == "nccl-debug":
        out = {"kind": kind, "summary": r.summary(), "version": r.version, "nranks": r.nranks, "nnodes": r.nnodes,
               "network": r.network, "n_channels": r.n_channels, "transports": dict(r.transports), "env": r.env,
               "warnings": r.warnings, "records": r.iter_records()}
        table = "\n".join(f"  {k}: {v}" for k, v in out.items() if k not in ("kind", "summary", "records"))
    else:
        out = {"kind": kind, "summary": r.summary(), "devices": r.devices, "links": r.links,
               "cpu_affinity": r.cpu_affinity, "numa_affinity": r.numa_affinity}
        table = r.to_frame().to_string()
    out["errors"] = [{"line": n, "reason": why} for n, why, _ in r.errors]
    return kind, out, table


def _print_json(out: dict) -> None:
    """``out`` as indented JSON; a ``records`` iterator is written one record at a time (a million-line
    NCCL log's records never sit in memory as one string)."""
    import sys

    records = out.pop("records", None)
    head = json.dumps(out, indent=2, default=str)
    if records is None:
        print(head)
        return
    w = sys.stdout.write
    w(head[:-2] + ',\n  "records": [')
    for k, rec in enumerate(records):
        w(("," if k else "") + "\n    " + json.dumps(rec, default=str))
    w("\n  ]\n}\n")


def run_model(args) -> int:
    from labkit import checks, comm

    size = parse_size(args.size)
    a, beta = checks.nonneg("--alpha-us", args.alpha_us) * 1e-6, 1 / (checks.positive("--bw-gbs", args.bw_gbs) * 1e9)
    if args.inter_bw_gbs is not None:
        checks.positive("--inter-bw-gbs", args.inter_bw_gbs)
    checks.nonneg("--inter-alpha-us", args.inter_alpha_us)
    rows = [("ring", comm.ring_time(args.op, size, args.nranks, alpha=a, beta=beta))]
    if comm.canonical_op(args.op) in ("all_reduce", "broadcast", "reduce"):
        rows.append(("tree (pipelined)", comm.tree_time(args.op, size, args.nranks, alpha=a, beta=beta)))
    if args.ranks_per_node and args.inter_bw_gbs:
        rows.append(("two-level", comm.hierarchical_time(
            args.op, size, args.nranks, alpha=a, beta=beta, ranks_per_node=args.ranks_per_node,
            alpha_inter=args.inter_alpha_us * 1e-6, beta_inter=1 / (args.inter_bw_gbs * 1e9))))
    print(f"{comm.canonical_op(args.op)} of {size:,} B on {args.nranks} ranks "
          f"(busbw factor {comm.bus_factor(args.op, args.nranks):.3f}):")
    for name, t in rows:
        print(f"  {name:<18} {t * 1e3:10.3f} ms   algbw {comm.algbw(args.op, size, t) / 1e9:8.2f} GB/s   "
              f"busbw {comm.busbw(args.op, size, t, args.nranks) / 1e9:8.2f} GB/s")
    return 0


def run_env(args) -> int:
    from labkit.comm.env import check_env, report

    if args.template:
        findings = check_env(template=True)
    elif args.file:
        from labkit.cli._io import naming, read_text

        text = read_text(args.file, "settings file")
        with naming("stdin" if args.file == "-" else args.file, "settings file"):
            findings = check_env(text)
    else:
        findings = check_env()
    if args.json:
        print(json.dumps([f.to_dict() for f in findings], indent=2))
    else:
        print(report(findings))
    return 1 if any(f.verdict in ("harmful", "no effect") for f in findings) else 0
