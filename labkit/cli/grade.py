"""``labkit grade LAB SUBMISSIONS... --out DIR``: grade every submission of a lab (labkit.teaching.grading.batch);
``labkit grade-merge OUT SHARD...``: join the gradebooks of a sharded run (labkit.teaching.grading.gradebook)."""
from __future__ import annotations

import argparse
import ast
import json
import sys

EPILOG = """\
Each submission runs with papermill in its own folder (DIR/work/<student>), in a subprocess with a
notebook and a per-cell time limit and CPU-time / file-size (and optionally memory) rlimits; the lab's
hidden checks then run in a fresh process against the evidence the notebook recorded. Output:
DIR/gradebook.csv (student, lab, timestamp, score, max_score, one column per question, status,
source_copy, file, late, replaced, roster), DIR/feedback/<student>.json (the instructor's record),
DIR/feedback/<student>.md (for the learner; --feedback-values hide replaces the numbers their evidence
does not contain by [hidden]) and DIR/executed/<student>.ipynb. Every other file in the submission
folders is listed with why it is not graded (DIR/not-graded.txt); a notebook of another lab is graded
wrong-lab, naming the lab it is. Where Linux allows (root, or unprivileged user namespaces) each
submission runs caged (labkit.teaching.grading.isolation): its own PID namespace, the checkout, labkit, the lab,
DIR and the Python environment behind an overlay; one that writes, deletes or renames a file there, or
signals the grader, is graded `tampered` (named in its feedback) and changes nothing else. Every limit
must be finite and > 0; one above an inherited hard limit (ulimit -v, -f) is lowered to it, with a note.
A re-run skips submissions already
graded (same notebook bytes, same lab source) unless --force; students an interrupted --force run had
not finished are regraded.

Students: nbgrader's <student>/<lab>/<lab>.ipynb, Canvas and Moodle bulk-download names (a late Canvas
re-upload, name-1.ipynb, replaces the earlier file), mapped to --roster ids when given. Roster CSV
columns: student_id (required), name, login, canvas_id, moodle_id.

examples:
  labkit release lab01_baseline --out ~/course-release/
  labkit grade lab01_baseline submitted/ --out grades/ --workers 2 --param FAST=True
  labkit grade lab01_baseline canvas_export/ --roster roster.csv --out grades/
  labkit grade lab01_baseline subs/ --out grades/shard2 --shard 2/4     # on four machines, then:
  labkit grade-merge grades/gradebook.csv grades/shard1 grades/shard2 grades/shard3 grades/shard4
"""


def _param(text: str):
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"--param {text!r}: expected NAME=VALUE, e.g. FAST=True")
    import re

    if re.fullmatch(r"\d+-[0-9a-f]+", value):      # a ticket (labkit.teaching.tickets), never arithmetic: SEED=17-301122
        return name, value
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return name, value


LIMITS = {  # option -> (attribute, kind): every grading limit finite and > 0, checked by the option's name
    "--timeout": ("timeout", float), "--cell-timeout": ("cell_timeout", float), "--cpu-s": ("cpu_s", int),
    "--fsize-mb": ("fsize_mb", int), "--output-mb": ("output_mb", float),
    "--check-timeout": ("check_timeout", float), "--workers": ("workers", int)}


def check_limits(args) -> None:
    """One ValueError naming the option for a limit that is NaN, infinite, zero or negative (``--memory-mb``
    may be 0: off)."""
    import math

    for opt, (attr, kind) in {**LIMITS, "--memory-mb": ("memory_mb", int)}.items():
        v = getattr(args, attr)
        if v is None or (opt == "--memory-mb" and v == 0):
            continue
        if not math.isfinite(v) or v <= 0:
            what = "a whole number" if kind is int else "a finite number"
            extra = " (0 turns it off)" if opt == "--memory-mb" else ""
            raise ValueError(f"{opt} {v}: must be {what} > 0{extra}")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "grade", help="grade submissions of a lab into a gradebook",
        description="Grade SUBMISSIONS (notebooks, or folders searched for *.ipynb) of LAB.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lab", metavar="LAB", help="lab id, lab folder or instructor notebook")
    p.add_argument("submissions", metavar="SUBMISSION", nargs="+", help="submitted notebooks or folders")
    p.add_argument("--out", required=True, metavar="DIR", help="where the gradebook and feedback go")
    p.add_argument("--workers", type=int, default=1, help="submissions graded in parallel (default 1)")
    p.add_argument("--force", action="store_true", help="regrade submissions already graded")
    p.add_argument("--param", type=_param, action="append", default=[], metavar="NAME=VALUE",
                   help="parameter injected into every submission (repeatable), e.g. FAST=True")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per notebook (default 600)")
    p.add_argument("--cell-timeout", type=float, default=120.0, help="seconds per cell (default 120)")
    p.add_argument("--cpu-s", type=int, default=1200, help="RLIMIT_CPU seconds per process (default 1200)")
    p.add_argument("--fsize-mb", type=int, default=512, help="RLIMIT_FSIZE: largest file, MiB (default 512)")
    p.add_argument("--memory-mb", type=int, default=None,
                   help="RLIMIT_AS per process, MiB (default 8192 without NVIDIA devices, off with them: "
                        "CUDA reserves huge virtual ranges); 0 turns it off")
    p.add_argument("--output-mb", type=float, default=4.0, help="cell output kept per notebook, MiB (default 4)")
    p.add_argument("--check-timeout", type=float, default=120.0, help="seconds per hidden check (default 120)")
    p.add_argument("--roster", metavar="CSV", help="class list: student_id, name, login, canvas_id, moodle_id")
    p.add_argument("--feedback-values", choices=["show", "hide"], default="hide",
                   help="whether the learner's feedback .md shows the values the checks expected (default hide)")
    p.add_argument("--key-file", metavar="FILE", help="the instructor's key (labs 2, 8, 9 and 12: the hidden checks "
                   "accept only tickets it issued, see labkit release --key-file); kept out of every submission")
    p.add_argument("--shard", metavar="i/N", help="grade only the i-th of every N students (sorted by id)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=handler)
    m = subparsers.add_parser(
        "grade-merge", help="merge the gradebooks of a sharded labkit grade run",
        description="Write OUT (a CSV) with the rows of every shard's gradebook, sorted by student; refuses "
                    "shards of different labs or columns and a student graded twice.")
    m.add_argument("merged", metavar="OUT", help="merged gradebook to write (.csv)")
    m.add_argument("gradebooks", metavar="SHARD", nargs="+", help="a shard's gradebook.csv or its --out folder")
    m.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    m.set_defaults(func=merge_handler)


def handler(args) -> int:
    from labkit.cli.release import read_lab, resolve_lab
    from labkit.teaching.grading import Limits
    from labkit.teaching.grading.batch import GradeConfig, grade

    check_limits(args)
    mem = {} if args.memory_mb is None else {"memory_mb": args.memory_mb or None}
    limits = Limits(notebook_s=args.timeout, cell_s=args.cell_timeout, cpu_s=args.cpu_s,
                    fsize_mb=args.fsize_mb, output_mb=args.output_mb, **mem)
    cfg = GradeConfig(limits=limits, workers=args.workers, params=dict(args.param), force=args.force,
                      check_s=args.check_timeout, progress=not args.no_progress, roster=args.roster,
                      shard=args.shard, feedback_values=args.feedback_values, key=_key(args.key_file))
    from labkit.teaching.grading.isolation import isolation

    res = grade(read_lab(resolve_lab(args.lab)), args.submissions, args.out, cfg)
    # said once the batch has run (a refused lab, folder or option stays a one-line error)
    for note in [*limits.within_inherited()[1], isolation()[1]]:
        print(f"labkit grade: {note}", file=sys.stderr)
    for row in res.rows:
        marks = " ".join(x for x in (row["source_copy"] and f"source:{row['source_copy']}",
                                     row["late"] and "late", row["roster"] == "not in roster" and "NOT IN ROSTER") if x)
        print(f"{row['student']:<24} {row['score']:>6g} / {row['max_score']:g}  {row['status']}  {marks}".rstrip())
    for n, old in res.replaced.items():
        print(f"{n}: latest upload graded; replaced {', '.join(old)}")
    if res.unmatched:
        print(f"not in the roster ({len(res.unmatched)}; graded under the id from the file name): "
              f"{', '.join(res.unmatched)}")
    if res.missing:
        print(f"in the roster, no submission ({len(res.missing)}): {', '.join(res.missing)}")
    for row in res.rows:
        if row["status"] == "tampered":     # what it did, from its feedback (the instructor's record)
            fb = json.loads((res.gradebook.parent / "feedback" / f"{row['student']}.json").read_text())
            print(f"{row['student']}: tampered, graded 0: {'; '.join(fb.get('tampered', []))}")
        if row["status"] == "wrong-lab":
            print(f"{row['student']}: {row['file']} is not {row['lab']} (see its feedback): not graded")
    if res.passed_over:
        print(f"not graded ({len(res.passed_over)} file(s), listed in {res.gradebook.parent / 'not-graded.txt'}):")
        for path, why in res.passed_over:
            print(f"  {path}: {why}")
    print(f"graded {len(res.graded)}, skipped (already graded) {len(res.skipped)}, grader errors "
          f"{len(res.failed)} -> {res.gradebook}")
    return 1 if res.failed else 0


def _key(path):
    if path is None:
        return None
    from labkit.teaching.tickets import read_key

    return read_key(path)


def merge_handler(args) -> int:
    from labkit.teaching.grading.gradebook import merge

    path, rows = merge(args.merged, args.gradebooks, overwrite=args.overwrite)
    print(f"merged {len(rows)} students from {len(args.gradebooks)} gradebooks -> {path}")
    return 0
