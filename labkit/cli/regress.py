"""``labkit regress``: save a performance baseline and check a new run against it (noise-aware).

Samples are repeated measurements (e.g. per-step seconds): a JSON list, a RunRecord JSON with
``extra["step_times"]``, or a text file with one number per line.

Examples::

    labkit regress save main-step --samples baseline_times.json --store build/baselines
    labkit regress check main-step --samples new_times.json --store build/baselines   # exit 1 if slower
    labkit regress monitor history.json --baseline-runs 40 --candidate-runs 10   # one figure per run; exit 1 if slower

Taught in chapter 28 (performance regression testing).
"""
from __future__ import annotations

import json


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
    m = sub.add_parser("monitor", help="judge the newest runs of a series against the runs before; exit 1 when slower",
                       description="Series-level monitor (labkit.measure.series): the newest --candidate-runs "
                                   "per-run figures against the --baseline-runs before them; 'slower' needs the "
                                   "change to exceed --min-effect and --z standard errors of the run-to-run noise.")
    m.add_argument("history", help="per-run figures, oldest first: JSON list, {'samples': [...]}, or one per line")
    m.add_argument("--baseline-runs", type=int, required=True, help="runs in the baseline window (>= 3)")
    m.add_argument("--candidate-runs", type=int, required=True, help="newest runs judged (>= 1)")
    m.add_argument("--min-effect", type=float, default=0.02, help="practical threshold (default 0.02)")
    m.add_argument("--z", type=float, default=3.0, help="standard errors the change must exceed (default 3)")
    m.add_argument("--higher-is-better", action="store_true", help="figures are rates (tokens/s), not times")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=_monitor)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def read_samples(path) -> list[float]:
    """Numbers from a JSON list, a JSON object with "samples", a RunRecord JSON (extra.step_times) or a
    text file (one number per line). Every problem — a folder, an empty or binary file, JSON of another
    shape, a value that is not a finite number > 0, fewer than 3 values — is a ValueError naming the file,
    so that what :mod:`labkit.measure.regress` raises afterwards is about the baseline store."""
    import math

    from labkit.cli._io import naming, read_text
    from labkit.measure.regress import record_samples
    from labkit.record import RunRecord

    what = "--samples file"
    text = read_text(path, what)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = text.split()                      # one number per line
    except (ValueError, RecursionError) as e:   # a 4300+ digit integer, absurd nesting
        raise ValueError(f"{what} {path}: not a list of numbers ({str(e)[:80] or 'nested too deeply'})") from None
    if isinstance(doc, dict):
        with naming(path, what, also=(AttributeError,)):
            doc = doc["samples"] if "samples" in doc else record_samples(RunRecord.from_dict(doc))
    if not isinstance(doc, list):
        raise ValueError(f"{what} {path}: expected a list of numbers, an object with 'samples' or a run record")
    from labkit.measure.regress import MAX_SAMPLES

    if len(doc) > MAX_SAMPLES:
        raise ValueError(f"{what} {path} holds {len(doc):,} values, more than the {MAX_SAMPLES:,} a baseline keeps "
                         "(repeated measurements of one metric: a few to a few thousand)")
    values = []
    for i, x in enumerate(doc):
        try:
            v = float("nan") if isinstance(x, (bool, dict, list)) or x is None else float(x)
        except (TypeError, ValueError):
            v = float("nan")
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{what} {path}: value {i + 1} ({str(x)[:30]!r}) is not a finite number > 0 "
                             "(per-step times or rates)")
        values.append(v)
    if len(values) < 3:
        raise ValueError(f"{what} {path} holds {len(values)} number(s); a baseline needs at least 3 repeated "
                         "measurements")
    return values


def _store(args):
    from labkit.cli._io import naming
    from labkit.measure.regress import BaselineStore
    from labkit.paths import work_dir

    path = args.store or work_dir("baselines")
    with naming(path, "baseline store"):
        return BaselineStore(path)


def _save(args) -> int:
    import sys

    from labkit.cli._io import naming

    samples = read_samples(args.samples)
    store = _store(args)
    try:
        with naming(store.path, "baseline store"):
            f = store.save(args.name, samples, higher_is_better=args.higher_is_better, overwrite=args.overwrite)
    except FileExistsError as e:
        print(f"labkit regress: error: {e} (use --overwrite)", file=sys.stderr)
        return 2
    print(f"saved baseline {args.name!r} to {f}")
    return 0


def _check(args) -> int:
    from labkit import checks
    from labkit.cli._io import naming

    kw = {"min_effect": checks.nonneg("--min-effect", args.min_effect)}
    samples = read_samples(args.samples)
    store = _store(args)
    if args.higher_is_better:
        kw["higher_is_better"] = True     # otherwise the stored baseline's own setting is used
    with naming(store.path / f"{args.name}.json", "baseline file"):    # the store keeps <name>.json
        v = store.check(args.name, samples, **kw)
    print(json.dumps(v.to_dict(), indent=2) if args.json else v.report())
    return 1 if v.verdict == "slower" else 0


def _monitor(args) -> int:
    """Exit 1 when the newest runs are slower (the CI job fails), 0 otherwise; the report on stdout."""
    from labkit.measure.series import SeriesMonitor

    mon = SeriesMonitor(baseline_runs=args.baseline_runs, candidate_runs=args.candidate_runs,
                        min_effect=args.min_effect, z=args.z, higher_is_better=args.higher_is_better)
    v = mon.check(read_samples(args.history))
    print(json.dumps(v.to_dict(), indent=2) if args.json else v.report())
    return 1 if v.verdict == "slower" else 0
