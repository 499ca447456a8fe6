"""``labkit release LAB --out DIR``: write the learner version of a lab (see labkit.teaching.grading.labfmt);
``labkit release --course DIR [--from TREE]``: make or update a learner's working copy of the whole course
(see labkit.teaching.grading.course_copy)."""
from __future__ import annotations

import argparse
from pathlib import Path

EPILOG = """\
examples:
  labkit release lab01_baseline --out ~/course-release/     # one lab, for an LMS or a course repository
  labkit release --course my-course                          # what `make course` runs: your working copy
  labkit release --course-tree /opt/labkit/course            # the released course tree alone (hub image)
  labkit release --course ~/labkit --from /opt/labkit/course # a learner's copy from a released tree (hub)
  labkit release lab12_capstone --out ~/course-release/ --key-file course.key --tickets ~/lab12-tickets.csv

--key-file with --tickets (labs 2, 8, 9 and 12): write one ticket per seat (seat,seed,ticket; --seats, default 40) to a
new CSV outside --out; give each learner theirs for SEED, and grade with the same --key-file. The key and the
tickets never enter the released lab.

--course never overwrites a file you edited: the course's new version goes beside it as NAME.update.ipynb.
"""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "release", help="write the learner version of a lab, or a learner's copy of the course",
        description="Write the learner version of LAB into DIR/<lab>/: solution regions replaced by "
                    "'...  # YOUR ANSWER HERE', hidden-check cells removed, cell ids kept, outputs cleared, "
                    "support files copied, files world-readable. Byte-identical on every re-run. With "
                    "--course: make or update a learner's working copy of the course (chapters and the "
                    "released labs).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lab", metavar="LAB", nargs="?", help="lab id from the course manifest (e.g. lab01_baseline), "
                   "a lab folder, or the instructor notebook's path")
    p.add_argument("--out", metavar="DIR", help="folder to write the learner version of LAB into (keep it "
                   "outside the repository, or in its ignored build/)")
    p.add_argument("--key-file", metavar="FILE", help="with LAB and --tickets: the instructor's key (one line, "
                   "≥ 16 characters) the tickets are tagged with")
    p.add_argument("--tickets", metavar="CSV", help="with --key-file: new file for the tickets (outside --out)")
    p.add_argument("--seats", type=int, default=40, help="with --tickets: how many tickets (default 40)")
    p.add_argument("--course", metavar="DIR", help="make or update the working copy DIR of the whole course")
    p.add_argument("--course-tree", metavar="DIR", help="write the released course tree (chapters + released "
                   "labs) into DIR")
    p.add_argument("--from", dest="tree", metavar="TREE", help="with --course: update from this released course "
                   "tree instead of releasing this checkout's sources")
    p.set_defaults(func=handler)


def resolve_lab(lab: str) -> str:
    """A course lab id names the course's lab first: a ``lab01_baseline/`` folder in the current folder
    does not take over ``labkit grade lab01_baseline`` (give ``./lab01_baseline`` for that folder)."""
    from labkit import course
    from labkit.paths import repo_root

    for e in course.notebooks(kind="lab"):
        if e.id == str(lab) and (repo_root() / e.path).is_file():
            return str(repo_root() / e.path)
    return lab


def read_lab(lab):
    """:func:`labkit.teaching.grading.load_lab`, with a one-line ValueError naming the notebook for a folder without
    one, an empty or binary file, JSON that is no notebook, or a notebook nbformat cannot read."""
    import nbformat

    from labkit.cli._io import naming, read_json
    from labkit.teaching.grading.labfmt import find_lab, load_lab

    source = find_lab(lab)
    nb = read_json(source, "lab notebook", hint="a Jupyter notebook is an object with a 'cells' list")
    if not isinstance(nb.get("cells"), list):
        raise ValueError(f"lab notebook {source} has no 'cells' list: it is not a Jupyter notebook")
    with naming(source, "lab notebook", also=(nbformat.ValidationError, AttributeError)):
        return load_lab(source)


def handler(args) -> int:
    modes = [m for m in ("lab", "course", "course_tree") if getattr(args, m)]
    if len(modes) != 1:
        raise ValueError("labkit release: give exactly one of LAB (with --out), --course DIR or --course-tree DIR")
    if (args.key_file or args.tickets) and not args.lab:
        raise ValueError("labkit release: --key-file and --tickets go with LAB --out DIR (labs 2, 8, 9 and 12)")
    if args.tree and not args.course:
        raise ValueError("labkit release: --from TREE goes with --course DIR")
    import tempfile

    from labkit.teaching.grading import course_copy as cc

    if args.course_tree:
        cc.refuse_instructor_target(args.course_tree, option="--course-tree")
        with tempfile.TemporaryDirectory(prefix="labkit-release-") as tmp:
            cc.install_release(cc.release_course(Path(tmp) / "tree"), args.course_tree)
        print(f"released course tree -> {args.course_tree}")
        return 0
    if args.course:
        from labkit import course

        cc.refuse_instructor_target(args.course, option="--course")
        if args.tree:
            cc.refuse_checkout(args.tree)
        print("\n".join(cc.working_copy(args.course, tree=args.tree).lines()))
        counts = {k: (len(course.notebooks(kind=k)), len(course.notebooks(kind=k, ready_only=True)))
                  for k in ("chapter", "lab")}
        print("the course (labkit/course.toml): " + ", ".join(f"{n} {k}s, {r} ready" for k, (n, r) in counts.items()))
        return 0
    if not args.out:
        raise ValueError("labkit release LAB: --out DIR is required (where the learner version goes)")
    from labkit.teaching.grading import release

    if bool(args.key_file) != bool(args.tickets):
        raise ValueError("labkit release: --key-file and --tickets go together (the key tags the tickets it writes)")
    lab = read_lab(resolve_lab(args.lab))
    cc.refuse_instructor_target(Path(args.out) / lab.id, option="--out", extra=[lab.dir])
    if args.key_file:
        from labkit.teaching import tickets

        key = tickets.read_key(args.key_file)
        out = tickets.write_tickets(key, tickets.keyed_lab(lab.id), args.seats, args.tickets, release_dir=args.out)
        print(f"{args.seats} tickets -> {out} (yours, not the learners': give each learner one for SEED)")
    with tempfile.TemporaryDirectory(prefix="labkit-release-") as tmp:
        release(lab.source, tmp)
        cc.install_release(tmp, args.out)
    path = Path(args.out) / lab.id / f"{lab.id}.ipynb"
    print(f"released {lab.id}: {len(lab.questions)} questions, {lab.max_score:g} points -> {path}")
    return 0
