"""``labkit selftest --gpu``: run every GPU-only path of labkit once and write a report to commit.

On a GPU machine it runs the checks of :mod:`labkit.selftest` (CUDA-event meter, matmul peak vs the
catalogue, NCCL collectives, DDP and FSDP2 training, memory model vs ``max_memory_allocated``, MFU of the
~1B reference GPT) in under 8 minutes and writes ``<stem>.json`` and ``<stem>.md`` under ``--out``
(default ``build/selftest/``), never overwriting an earlier report. Without a CUDA GPU it refuses with
exit code 2 and says why; ``--dry-run`` lists the checks and their budgets on any machine.

Exit codes: 0 every check passed or was skipped, 1 a check failed, 2 no GPU or a bad argument.

Taught in chapter 4 (MFU), chapter 7 (timing), chapter 11 (communication), chapter 13 (memory),
chapter 19 (DDP) and chapter 20 (FSDP).
"""
from __future__ import annotations

import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "selftest", help="run every GPU-only path once (--gpu) and write a report to commit",
        description="On a GPU machine: run the CUDA-event meter, the matmul peak vs the catalogue, NCCL "
                    "collectives, DDP and FSDP2 training, the memory model vs max_memory_allocated and the "
                    "MFU of the ~1B reference GPT, each in a time budget (under 8 minutes on one H200), and "
                    "write a JSON + Markdown report. Without a CUDA GPU it refuses (exit 2).")
    p.add_argument("--gpu", action="store_true", help="the GPU self-check (the only one: CPU paths are the test suite)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="folder for the report (default build/selftest/ in the checkout); never overwritten")
    p.add_argument("--quick", action="store_true",
                   help="smaller sizes and budgets (about half the time; MFU of the 'medium' GPT, not ~1B)")
    p.add_argument("--dry-run", action="store_true", help="list the checks and their budgets; run nothing (any machine)")
    p.add_argument("--only", metavar="NAMES", default=None, help="comma-separated check names to run (default: all)")
    p.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                   help="total time budget; a check that would pass it is skipped (default 480)")
    p.set_defaults(func=run)


def _selected(args):
    from labkit.selftest.gpu import CHECKS, check_by_name

    if args.only is None:
        return CHECKS
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--only {args.only!r} names no check; choose from {[c.name for c in CHECKS]}")
    return check_by_name(names)


def _progress(res) -> None:
    mark = {"passed": "pass", "failed": "FAIL", "skipped": "skip"}[res.status]
    why = f"  {res.reason}" if res.reason else ""
    err = f"  {res.error.splitlines()[0][:300]}" if res.error else ""
    print(f"[{mark}] {res.name:<18} {res.seconds:6.1f} s / {res.budget_s:.0f} s{why}{err}", flush=True)


def run(args) -> int:
    from labkit import checks
    from labkit.selftest.report import check_out_dir, write_report
    from labkit.selftest.runner import TOTAL_BUDGET_S, run_checks

    if not args.gpu:
        raise ValueError("say --gpu: `labkit selftest --gpu` runs the GPU-only paths on a GPU machine "
                         "(`--gpu --dry-run` lists them anywhere)")
    selected = _selected(args)
    budget = TOTAL_BUDGET_S if args.budget is None else checks.positive("--budget", args.budget)
    if args.out is not None:
        check_out_dir(args.out)              # before minutes of checks, not after
    if args.dry_run:
        total = 0.0
        print(f"labkit selftest --gpu{' --quick' if args.quick else ''}: {len(selected)} checks, "
              f"total budget {budget:.0f} s (dry run: nothing runs)")
        for c in selected:
            b = c.budget(args.quick)
            total += b
            print(f"  {c.name:<18} {b:5.0f} s  ch. {c.chapters:<6} {c.title}")
        print(f"  {'sum of budgets':<18} {total:5.0f} s")
        return 0
    from labkit.selftest.backend import CudaBackend

    backend = CudaBackend()
    why = backend.unavailable()
    if why:
        raise ValueError(f"{why}. `labkit selftest --gpu` runs only on a GPU machine; "
                         "`labkit selftest --gpu --dry-run` lists its checks here")
    report = run_checks(backend, checks_to_run=selected, quick=args.quick, total_budget_s=budget,
                        progress=_progress)
    js, md = write_report(report, args.out)
    s = report["summary"]
    print(f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped in {report['wall_s']:.0f} s "
          f"on {report['device']}")
    print(f"report: {md}\n        {js}")
    sys.stdout.flush()
    return 1 if s["failed"] else 0
