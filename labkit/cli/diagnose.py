"""``labkit diagnose``: run a workload (or read a record/trace) and name the bottleneck.

Examples::

    labkit diagnose                               # default workload: labkit.train, DDP on 2 gloo ranks
    labkit diagnose --inject data                 # a known bottleneck, injected (labkit.diagnose.workloads)
    labkit diagnose --record run.json --trace traces/ --json
    labkit diagnose --trace traces/ --tokens-per-step 524288 --flops-per-token 7.5e8 --peak-tflops 989
    labkit diagnose --hang fr_dumps/                # which rank a hung job waits for (Flight Recorder dumps)

``--inject data|compute|comm|memory`` runs the reference trainer with that bottleneck injected
(:mod:`labkit.diagnose.workloads`, :mod:`labkit.train.inject`); without it the default workload is
:func:`labkit.train.run` with a profiler trace per rank.

``--hang DIR`` reads the ranks' PyTorch Flight Recorder dumps (torch's pickle or JSON, e.g. written by
``labkit.launch(..., flight_recorder=DIR)`` or ``labkit run --flight-recorder DIR``) and names the rank(s)
the job waits for, the collective (number, op, sizes, dtype, process group) and any mismatch between
ranks (:mod:`labkit.diagnose.hang`).

Taught in chapter 14 (systematic diagnosis) and chapter 27 (hang diagnosis).
"""
from __future__ import annotations

import tempfile
from contextlib import nullcontext


def register(subparsers) -> None:
    p = subparsers.add_parser("diagnose", help="name the bottleneck of a run (five families, with evidence)",
                              description="metrics → logs → topology → strategy: MFU and utilisation, "
                                          "exposed communication, data wait, memory, scheduling.")
    p.add_argument("--record", help="a saved RunRecord JSON (skip running a workload)")
    p.add_argument("--trace", help="a trace file or folder of the same run")
    p.add_argument("--hang", metavar="DIR", help="a folder of per-rank Flight Recorder dumps: which rank a hung "
                   "job waits for, in which collective (chapter 27)")
    p.add_argument("--world-size", type=int, default=None,
                   help="with --hang: the job's ranks, when the highest ranks may have left no dump")
    p.add_argument("--inject", choices=["data", "compute", "comm", "memory"],
                   help="run the tiny workload with this bottleneck injected")
    p.add_argument("--nprocs", type=int, default=2, help="ranks for the workload (default 2)")
    p.add_argument("--steps", type=int, default=6, help="steps of the workload (default 6)")
    p.add_argument("--out", help="folder for the traces and record (default: a temp folder)")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    from labkit.cli import _model_flops

    _model_flops.add(p)
    p.set_defaults(func=_run)


def read_record(path):
    """A RunRecord from a JSON file, or a ValueError naming the file: a folder, an empty or binary file,
    JSON that is not an object or has none of a run record's fields."""
    import dataclasses

    from labkit.cli._io import naming, read_json
    from labkit.record import RunRecord

    doc = read_json(path, "run record", hint="a run record is an object such as RunRecord.save writes")
    fields = [f.name for f in dataclasses.fields(RunRecord)]
    if not set(doc) & set(fields):
        raise ValueError(f"run record {path} has none of a run record's fields ({', '.join(fields[:6])}, …): "
                         f"it holds {sorted(doc)[:6]}")
    with naming(path, "run record"):
        return RunRecord.from_dict(doc)


def _hang(args) -> int:
    import json

    from labkit.diagnose.hang import diagnose_hang

    others = [f"--{o.replace('_', '-')}" for o in ("record", "trace", "inject", "out") if getattr(args, o)]
    if others:
        raise ValueError(f"--hang {args.hang} reads Flight Recorder dumps; it cannot be combined with {', '.join(others)}")
    if not args.hang.strip():
        raise ValueError("--hang '' is not valid: name the folder the ranks' Flight Recorder dumps are in")
    d = diagnose_hang(args.hang, world_size=args.world_size)
    print(json.dumps(d.to_dict(), indent=1, default=list) if args.json else d.explain())
    return 0


def _run(args) -> int:
    if args.hang is not None:
        return _hang(args)
    if args.world_size is not None:
        raise ValueError(f"--world-size {args.world_size} describes the job of --hang DIR; give --hang too")
    from labkit.cli._io import naming
    from labkit.diagnose import diagnose
    from labkit.record import RunRecord
    from labkit.trace import analyze

    if args.nprocs < 1 or args.steps < 1:
        raise ValueError(f"--nprocs={args.nprocs} and --steps={args.steps} must be >= 1")
    for opt in ("record", "trace", "out"):
        v = getattr(args, opt)
        if v is not None and not v.strip():
            raise ValueError(f"--{opt}={v!r} is not valid: name a file or folder (an empty path would "
                             + ("quietly run the default workload)" if opt != "out" else "write into the current folder)"))
    if args.record and args.inject:
        raise ValueError("--record reads a finished run; it cannot be combined with --inject")
    if args.trace and args.inject:
        raise ValueError(f"--trace {args.trace} reads a finished run's trace and --inject {args.inject} runs a new "
                         "workload (whose own trace would be diagnosed instead): give one of them")
    if args.out and (args.record or args.trace):
        raise ValueError("--out is where a workload run writes its traces; with --record/--trace nothing runs")
    from labkit.cli import _model_flops

    if _model_flops.given(args) and (not args.trace or args.inject):
        raise ValueError("--tokens-per-step/--flops-per-token/--model-config/--peak-tflops describe the run of "
                         "--trace (a foreign trace); they need --trace and no --inject")
    mfu_kw = _model_flops.resolve(args)
    trace_path = args.trace
    # a malformed record surfaces as an AttributeError deep inside (record.extra a list, say): its file
    # is named; a trace's errors name the trace
    about_record = naming(args.record, "run record", also=(AttributeError,)) if args.record else nullcontext()
    if args.record:
        record = read_record(args.record)
        with naming(args.record, "run record", also=(AttributeError,)):
            if trace_path is None and record.extra.get("trace_files"):
                from pathlib import Path

                files = record.extra["trace_files"]
                if not isinstance(files, list) or not all(isinstance(f, str) and f for f in files):
                    raise ValueError(f"run record {args.record}: extra['trace_files'] must be a list of paths, "
                                     f"got {str(files)[:80]}; pass --trace instead")
                parents = {str(Path(f).parent) for f in files}
                trace_path = parents.pop() if len(parents) == 1 else None
    elif args.trace and not args.inject:
        record = RunRecord(label="trace-only")
    else:
        out = args.out or tempfile.mkdtemp(prefix="labkit-diagnose-")
        if args.inject:
            from labkit.diagnose.workloads import run_workload, workload

            record = run_workload(workload(args.inject, steps=args.steps), out, nprocs=args.nprocs)
        else:
            from labkit.train import TrainConfig, run

            par = "ddp" if args.nprocs > 1 else "single"
            record = run(TrainConfig(parallel=par, steps=args.steps + 3, warmup_steps=3, profile_dir=out),
                         nprocs=args.nprocs)
        trace_path = out
    with naming(trace_path, "trace"):
        trace = analyze(trace_path) if trace_path else None
    with about_record:
        if trace is not None:
            trace.update_record(record, **mfu_kw)
        if not args.record and (args.inject or not args.trace):
            record.save(f"{trace_path}/record.json")      # with the trace's utilisation and wait shares
        d = diagnose(record, trace)
    print(d.to_json() if args.json else d.report())
    return 0
