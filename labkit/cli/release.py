"""``labkit release LAB --out DIR``: write the learner version of a lab (see labkit.grading.labfmt)."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "release", help="write the learner version of a lab (solutions and hidden checks removed)",
        description="Write the learner version of LAB into DIR/<lab>/: solution regions replaced by "
                    "'...  # YOUR ANSWER HERE', hidden-check cells removed, cell ids kept, outputs cleared, "
                    "support files copied. Byte-identical on every re-run.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("lab", metavar="LAB", help="lab id from the course manifest (e.g. lab01_baseline), a lab "
                   "folder, or the instructor notebook's path")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the learner version into")
    p.set_defaults(func=handler)


def read_lab(lab):
    """:func:`labkit.grading.load_lab`, with a one-line ValueError naming the notebook for a folder without
    one, an empty or binary file, JSON that is no notebook, or a notebook nbformat cannot read."""
    import nbformat

    from labkit.cli._io import naming, read_json
    from labkit.grading.labfmt import find_lab, load_lab

    source = find_lab(lab)
    nb = read_json(source, "lab notebook", hint="a Jupyter notebook is an object with a 'cells' list")
    if not isinstance(nb.get("cells"), list):
        raise ValueError(f"lab notebook {source} has no 'cells' list: it is not a Jupyter notebook")
    with naming(source, "lab notebook", also=(nbformat.ValidationError, AttributeError)):
        return load_lab(source)


def handler(args) -> int:
    from labkit.grading import release

    lab = read_lab(args.lab)
    path = release(lab.source, args.out)
    print(f"released {lab.id}: {len(lab.questions)} questions, {lab.max_score:g} points -> {path}")
    return 0
