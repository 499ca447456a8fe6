"""Build a mixed class of lab02 submissions, to grade once and read the class report (issue #33, item 5).

    python scripts/lab02_class.py CLASS_DIR            # writes CLASS_DIR/<student>.ipynb (refuses a non-empty folder)
    labkit grade lab02_profiler CLASS_DIR --out GRADES --workers 1 --param FAST=True --cell-timeout 120
    # then read GRADES/summary.md and GRADES/summary.png

The class (21 notebooks), each a learner's notebook as it would be handed in (solution code without the
instructor's markers, no hidden checks):

- ``honest_s<seed>`` (9): the instructor's answers on seeds 0-8, so the faults differ from learner to learner;
- ``wrongfam_s<seed>`` (4): honest runs whose q3 names a family other than their fault's;
- ``untouched_<i>`` (3): the released notebook, nothing answered;
- ``timeout_q2``, ``timeout_q3`` (2): honest until an endless loop in the q2 / q3 answer cell (the cell's
  time limit stops it): q1's points (and q2's) must still be earned;
- ``copy_of_honest_s1``, ``copy_of_honest_s2`` (2): byte-identical copies of two honest notebooks;
- ``copied_numbers`` (1): an honest run whose q2 figures are typed in from someone else's run.

The fault of each seed is read with ``labkit.teaching.faults._fault_of`` (private: the instructor's side, as the
grader reads it), to build a wrong answer.
"""
from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

LAB = "lab02_profiler"
_MARKER = re.compile(r"^\s*### (BEGIN|END) SOLUTION\s*$")


def _id(cell) -> str | None:
    return (cell.get("metadata", {}).get("labkit") or {}).get("id")


def honest(seed: int):
    """The learner notebook with every answer cell filled in from the instructor source, markers removed."""
    from labkit.teaching.grading import learner_notebook, load_lab

    lab = load_lab(LAB)
    inst = {_id(c): c for c in lab.notebook().cells if _id(c)}
    nb = learner_notebook(lab)
    for i, c in enumerate(nb.cells):
        if (c.get("metadata", {}).get("labkit") or {}).get("kind") == "answer":
            c = copy.deepcopy(inst[_id(c)])
            c.source = "\n".join(ln for ln in c.source.splitlines() if not _MARKER.match(ln))
            nb.cells[i] = c
    _set_seed(nb, seed)
    return nb


def _set_seed(nb, seed: int) -> None:
    params = next(c for c in nb.cells if c.cell_type == "code" and re.search(r"^SEED = ", c.source, re.M))
    params.source = re.sub(r"^SEED = .*$", f"SEED = {seed}", params.source, flags=re.M)


def _cell(nb, cid: str):
    return next(c for c in nb.cells if _id(c) == cid)


def build(dest: Path) -> list[Path]:
    import nbformat

    from labkit.diagnose import FAMILIES
    from labkit.teaching.faults import _fault_of  # the instructor's side: seed -> fault
    from labkit.teaching.grading import learner_notebook, load_lab

    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise SystemExit(f"{dest} is not empty; give a new folder (nothing is overwritten)")
    books = {}
    for s in range(9):
        books[f"honest_s{s}"] = honest(s)
    for s in range(9, 13):
        nb = honest(s)
        others = [f for f in FAMILIES if f != _fault_of(s)[0].family]
        wrong = others[s % len(others)]
        _cell(nb, "q3").source += f"\nanswer_q3 = dict(answer_q3, family={wrong!r})   # a wrong family\n" \
                                  'book.submit("q3", answer=answer_q3)'
        books[f"wrongfam_s{s}"] = nb
    for i in range(3):
        nb = learner_notebook(load_lab(LAB))
        _set_seed(nb, 20 + i)
        books[f"untouched_{i}"] = nb
    for q, s in (("q2", 13), ("q3", 14)):
        nb = honest(s)
        _cell(nb, q).source = "while True:   # never finishes\n    pass\n" + _cell(nb, q).source
        books[f"timeout_{q}"] = nb
    nb = honest(15)
    _cell(nb, "q2").source += (
        '\nanswer_q2 = dict(answer_q2, unphased_share=0.0412, data_wait_share=0.3127, comm_exposed_share=0.0875)'
        '   # typed in from a friend\'s run\nbook.submit("q2", answer=answer_q2)')
    books["copied_numbers"] = nb
    written = []
    for name, nb in books.items():
        path = dest / f"{name}.ipynb"
        nbformat.write(nb, path)
        written.append(path)
    for src in ("honest_s1", "honest_s2"):
        path = dest / f"copy_of_{src}.ipynb"
        path.write_bytes((dest / f"{src}.ipynb").read_bytes())
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.splitlines()[2].strip(), file=sys.stderr)
        return 2
    paths = build(Path(argv[0]))
    print(f"{len(paths)} submissions of {LAB} in {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
