"""Which test executes each lab, and what every execution of a course notebook must show.

A lab's instructor source is executed once in the suite: by its grading test, which runs it through ``labkit
grade`` with the CI parameters in a fresh folder and then runs the hidden checks on what it wrote
(tests/test_grading_labs.py, tests/test_lab07.py). tests/test_notebooks.py executes every other ready CPU notebook
and leaves these labs out; both assert :func:`assert_every_code_cell_ran` on the executed copy.
"""
from __future__ import annotations

import json
from pathlib import Path

from labkit import course
from labkit.teaching import notebooks

#: the labs whose grading test is a file of their own (lab07 also grades a doctored scaler log there)
OWN_TEST = {"lab07_memory_precision": "tests/test_lab07.py"}

#: lab id -> the test file whose grading test executes its instructor source with the CI parameters: every lab of
#: the manifest (labkit/course.toml), so a new lab is graded, and kept out of tests/test_notebooks.py, unasked
EXECUTED_BY_GRADING = {e.id: OWN_TEST.get(e.id, "tests/test_grading_labs.py")
                       for e in course.notebooks() if e.kind == "lab"}


def ci_params(notebook_id: str) -> dict:
    """The parameters tests/test_notebooks.py would execute the notebook with: the CI parameters
    (``notebooks.CI_PARAMS``) and the manifest's extra ``params`` (labkit/course.toml)."""
    return {**notebooks.CI_PARAMS, **course.entry(notebook_id).params}


def assert_every_code_cell_ran(executed: str | Path, *, what: str = "") -> None:
    """Every code cell with source in the executed notebook has an execution count and no cell's output is an
    error: the notebook ran top to bottom."""
    nb = json.loads(Path(executed).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code, f"{what or executed}: no code cell"
    missed = [i for i, c in enumerate(code) if "".join(c["source"]).strip() and not c.get("execution_count")]
    assert not missed, f"{what or executed}: code cells {missed} did not run"
    errors = [o.get("ename") for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{what or executed}: a cell raised {errors}"
