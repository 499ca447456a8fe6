"""``labkit launch -n N module:function|script.py [args...]``: run a target on N ranks.

The command-line form of :func:`labkit.launch`: fresh processes, torch.distributed initialised for a
function target (a script initialises it itself, as under torchrun), ``[rank N]``-prefixed output,
every rank stopped when one fails or the timeout passes. Exit code: 0 on success, 1 when a rank failed
(its traceback is printed), 124 on timeout, 130 when interrupted.

Taught in chapter 5 (scaling: running N ranks).
"""
from __future__ import annotations

import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "launch", help="run module:function or script.py on N ranks (like torchrun, but safe)",
        description="Run a target on N fresh ranks with torch.distributed (gloo on CPU, NCCL with a GPU "
                    "per rank); stop every rank when one fails or time runs out.")
    p.add_argument("-n", "--nprocs", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--timeout", type=float, default=300, help="seconds before every rank is stopped")
    p.add_argument("--rank0-only", action="store_true", help="print only rank 0's output")
    p.add_argument("--log-dir", default=None, help="folder for per-rank logs")
    p.add_argument("--max-nprocs", type=int, default=None,
                   help="allow more ranks than the default cap, max(8, 4 x cores) on CPU (also: the "
                        "environment variable LABKIT_MAX_NPROCS)")
    p.add_argument("target", help="module:function or path/to/script.py")
    p.add_argument("args", nargs="*", help="arguments: strings passed to the function / the script's argv")
    p.set_defaults(func=handle)


def handle(args) -> int:
    import os
    from pathlib import Path

    from labkit.cli._io import read_text
    from labkit.launcher import LaunchError, launch

    t = args.target
    if t.endswith(".py") or os.sep in t or Path(t).exists():    # a script (the launcher's own rule)
        read_text(t, "script")          # a folder, an empty or a binary file: refused before any rank starts

    try:
        res = launch(args.target, args.nprocs, backend=args.backend, timeout_s=args.timeout,
                     args=tuple(args.args), rank0_only=args.rank0_only, log_dir=args.log_dir,
                     max_nprocs=args.max_nprocs)
    except LaunchError as e:
        print(f"labkit launch: {e}", file=sys.stderr)
        return 124 if e.timed_out else 1
    except KeyboardInterrupt:
        print("labkit launch: interrupted; all ranks stopped", file=sys.stderr)
        return 130
    print(res)
    return 0
