"""``labkit regress``: save a performance baseline and check a new run against it (noise-aware).

Samples are repeated measurements (e.g. per-step seconds): a JSON list, a RunRecord JSON with
``extra["step_times"]``, or a text file with one number per line.

Examples::

    labkit regress save main-step --samples baseline_times.json --store build/baselines
    labkit regress check main-step --samples new_times.json --store build/baselines   # exit 1 if slower

Taught in chapter 28 (performance regression testing).
"""
from __future__ import annotations

import json
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("regress", help="save a timing baseline / check a run against it",
                              description="Bootstrap CI of the median ratio + a practical threshold.")
    sub = p.add_subparsers(dest="regress_command", metavar="ACTION")
    for name, helptext in (("save", "store samples as a named baseline"),
                           ("check", "compare samples with a named baseline; exit 1 when slower")):
        a = sub.add_parser(name, help=helptext)
        a.add_argument("name", help="baseline name (letters, digits, _ - .)")
        a.add_argument("--samples", required=True, help="JSON list, RunRecord JSON, or one number per line")
        a.add_argument("--store", default=None, help="baseline folder (default: labkit work dir 'baselines')")
        a.add_argument("--higher-is-better", action="store_true", help="samples are rates (tokens/s), not times")
        if name == "save":
            a.add_argument("--overwrite", action="store_true", help="replace an existing baseline")
            a.set_defaults(func=_save)
        else:
            a.add_argument("--min-effect", type=float, default=0.03, help="practical threshold (default 0.03)")
            a.add_argument("--json", action="store_true")
            a.set_defaults(func=_check)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def read_samples(path) -> list[float]:
    """Numbers from a JSON list, a RunRecord JSON (extra.step_times) or a text file (one per line):
    finite and positive; an error names the file and the bad entry. Taught in chapter 28."""
    from labkit.checks import ArgumentTypeError
    from labkit.record import RunRecord, _values
    from labkit.regress import record_samples

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--samples file {p} does not exist")
    try:
        text = p.read_text()
    except UnicodeDecodeError as e:
        raise ValueError(f"--samples file {p} is not text ({e.reason})") from None
    try:
        try:
            doc = json.loads(text)
        except RecursionError:
            raise ValueError("JSON nested too deeply to be a list of numbers") from None
        except json.JSONDecodeError:
            words = text.split()
            for i, w in enumerate(words):
                try:
                    float(w)
                except ValueError:
                    raise ValueError(f"line entry {i} {w[:40]!r} is not a number (the file is neither JSON nor "
                                     "one number per line)") from None
            doc = [float(w) for w in words]
        if isinstance(doc, dict):
            doc = doc["samples"] if "samples" in doc else record_samples(RunRecord.from_dict(doc))
        if not isinstance(doc, list):
            raise ArgumentTypeError(f"expected a list of numbers or a run record, got {type(doc).__name__}")
        return _values("samples", doc, low_open=True).tolist()
    except ArgumentTypeError as e:
        raise ArgumentTypeError(f"--samples file {p}: {e}") from None
    except ValueError as e:
        raise ValueError(f"--samples file {p}: {e}") from None


def _store(args):
    from labkit.paths import work_dir
    from labkit.regress import BaselineStore

    return BaselineStore(args.store or work_dir("baselines"))


def _save(args) -> int:
    import sys

    try:
        f = _store(args).save(args.name, read_samples(args.samples), higher_is_better=args.higher_is_better,
                              overwrite=args.overwrite)
    except FileExistsError as e:
        print(f"labkit regress: error: {e} (use --overwrite)", file=sys.stderr)
        return 2
    print(f"saved baseline {args.name!r} to {f}")
    return 0


def _check(args) -> int:
    store = _store(args)
    kw = {"min_effect": args.min_effect}
    if args.higher_is_better:
        kw["higher_is_better"] = True     # otherwise the stored baseline's own setting is used
    v = store.check(args.name, read_samples(args.samples), **kw)
    print(json.dumps(v.to_dict(), indent=2) if args.json else v.report())
    return 1 if v.verdict == "slower" else 0
