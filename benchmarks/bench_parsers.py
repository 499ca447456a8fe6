"""Time every text parser in labkit on hostile single lines (issue #13): linear or quadratic?

    .venv/bin/python benchmarks/bench_parsers.py [--sizes 10000 80000 10000000] [--timeout 20]

Each case (parser × payload × line length) runs in its own process, killed after ``--timeout`` seconds
(a backtracking regular expression cannot be interrupted from inside Python); a payload that timed out
is not tried at larger sizes. Payloads: a run of letters, digits, dashes, ``a_`` pairs, ``[`` brackets,
an NCCL ``Channel 00 :`` line of digits ending in ``x``, an NCCL env-setting line padded with spaces,
and as many empty lines as characters. Prints one row per case: seconds, or ``>T`` / ``skipped``.
What a parser returns or raises is not checked here (``tests/test_parsers_hostile.py`` does that).
Taught in chapter 11 (communication diagnostics).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PAYLOADS = {
    "letters": lambda n: "x" * n,
    "digits": lambda n: "1" * n,
    "dashes": lambda n: "-" * n,
    "a_pairs": lambda n: "a_" * (n // 2),
    "brackets": lambda n: "[" * n,
    "nccl-ring": lambda n: "h:1:2 [0] NCCL INFO Channel 00 : " + "1" * n + "x",
    "nccl-env": lambda n: "h:1:2 [0] NCCL INFO NCCL_X set by environment to " + " " * n + "x",
    "newlines": lambda n: "\n" * n,
}


def _parsers():
    import importlib

    from labkit.comm import nccl_log, nccl_tests, pasted, topology
    from labkit.nsys import stats
    from labkit.telemetry import numa, smi
    tload = importlib.import_module("labkit.trace.load")    # the face's ``load`` is the function

    def trace(text):
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "t.json"
            p.write_text(text)
            return tload.load(p)

    return {"nccl_tests": nccl_tests.parse_nccl_tests, "nccl_debug": nccl_log.parse_nccl_debug,
            "topology": topology.parse_topology, "detect_format": pasted.detect_format,
            "comm.parse": importlib.import_module("labkit.comm.parse").parse, "nsys_stats": stats.parse_stats_csv,
            "query_gpu": smi.parse_query_gpu, "smi_dmon": smi.parse_smi_dmon,
            "dcgmi_dmon": smi.parse_dcgmi_dmon, "cpulist": numa.parse_cpulist, "lscpu": numa.parse_lscpu,
            "trace_load": trace}


def _one(parser: str, payload: str, n: int) -> None:
    fn = _parsers()[parser]
    text = PAYLOADS[payload](n)
    t = time.perf_counter()
    try:
        fn(text)
        how = "returned"
    except ValueError as e:
        how = f"ValueError: {str(e)[:60]}"
    except Exception as e:   # noqa: BLE001 - reported, the point of the benchmark
        how = f"{type(e).__name__}: {str(e)[:60]}"
    print(f"{time.perf_counter() - t:.4f}\t{how}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 80_000, 10_000_000])
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--parsers", nargs="*")
    ap.add_argument("--payloads", nargs="*")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        _one(args.one[0], args.one[1], int(args.one[2]))
        return 0
    parsers = args.parsers or list(_parsers())
    payloads = args.payloads or list(PAYLOADS)
    print("parser\tpayload\tchars\tseconds\toutcome")
    for p in parsers:
        for k in payloads:
            slow = False
            for n in args.sizes:
                if slow:
                    print(f"{p}\t{k}\t{n}\tskipped\t(timed out at a smaller size)", flush=True)
                    continue
                try:
                    r = subprocess.run([sys.executable, __file__, "--one", p, k, str(n)], capture_output=True,
                                       text=True, timeout=args.timeout)
                    out = r.stdout.strip() or f"?\t{r.stderr.strip().splitlines()[-1:]}"
                except subprocess.TimeoutExpired:
                    out, slow = f">{args.timeout:g}\tkilled", True
                print(f"{p}\t{k}\t{n}\t{out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
