"""``labkit calibrate``: measure this machine's matmul peaks and copy bandwidth once and store them.

Every MFU afterwards divides by the same calibrated peak (``calibrated:…``) instead of a peak measured
in each process in a short time box (which swings with the machine's load). Stored per device, dtype
and thread count, with the conditions, in ``$LABKIT_CACHE_DIR`` (else ``~/.cache/labkit``).

Taught in chapter 4 (MFU's denominator).
"""
from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="measure and store this machine's peaks (MFU's denominator)",
                              description="Large matmul shapes, best of several rounds, per device, dtype and "
                                          "thread count; stored with the conditions they were measured under.")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 … (default: cuda if present, else cpu)")
    p.add_argument("--dtype", action="append", default=None, help="dtype to calibrate (repeatable; default fp32 "
                                                                   "and bf16)")
    p.add_argument("--threads", type=int, action="append", default=None,
                   help="CPU thread count (repeatable; default: this process's and 1, what each of 2 ranks gets)")
    p.add_argument("--rounds", type=int, default=3, help="sweeps per entry; the best is kept (default 3)")
    p.add_argument("--max-seconds", type=float, default=4.0, help="time box per sweep (default 4 s)")
    p.add_argument("--if-missing", action="store_true", help="keep entries whose conditions still hold")
    p.add_argument("--show", action="store_true", help="print the stored calibration and exit")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from labkit.hardware import calibration as cal

    path = cal.cache_dir() / cal.FILE
    if args.show:
        data = cal._load_all()
        print(json.dumps(data, indent=1) if args.json else
              (f"{path}: {len(data)} entries\n" + "\n".join(f"  {k}: {v['flops'] / 1e9:,.1f} GFLOP/s "
                                                            f"({v['date'][:10]})" for k, v in sorted(data.items()))
               if data else f"{path}: no calibration yet (run `labkit calibrate`)"))
        return 0
    try:
        entries = cal.calibrate(args.device, tuple(args.dtype or ("fp32", "bf16")), threads=args.threads,
                                rounds=args.rounds, max_seconds=args.max_seconds, missing_only=args.if_missing)
    except cal.UnstableCalibration as e:
        print(f"labkit calibrate: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([e.__dict__ for e in entries], indent=1, default=str))
        return 0
    fp32 = {e.conditions.get("threads"): e.flops for e in entries if e.dtype == "fp32"}
    for e in entries:
        agree = sum(r >= cal.STABLE_WITHIN * max(e.rounds) for r in e.rounds) if e.rounds else 0
        line = (f"{e.dtype:>5} {e.flops / 1e9:10,.1f} GFLOP/s  copy {e.bandwidth / 1e9:6.1f} GB/s  "
                f"[{e.describe()}; spread {cal.spread(e.rounds):.0%}, {agree} of {len(e.rounds)} rounds within "
                f"{1 - cal.STABLE_WITHIN:.0%} of the best]")
        base = fp32.get(e.conditions.get("threads"))
        if e.dtype != "fp32" and base:
            line += f"  = {e.flops / base:.2f}× fp32"
        print(line)
    print(f"stored in {path}")
    return 0
