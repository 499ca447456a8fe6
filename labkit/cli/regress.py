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
    """Numbers from a JSON list, a RunRecord JSON (extra.step_times) or a text file (one per line)."""
    from labkit.record import RunRecord
    from labkit.regress import record_samples

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--samples file {p} does not exist")
    text = p.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        try:
            return [float(x) for x in text.split()]
        except ValueError as e:
            raise ValueError(f"--samples file {p} is neither JSON nor one number per line ({e})") from e
    if isinstance(doc, list):
        return [float(x) for x in doc]
    if isinstance(doc, dict):
        if "samples" in doc:
            return [float(x) for x in doc["samples"]]
        return record_samples(RunRecord.from_dict(doc))
    raise ValueError(f"--samples file {p}: expected a list of numbers or a run record")


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
