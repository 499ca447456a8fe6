"""A lab folder written from (source, metadata.labkit) pairs: the one toy-lab builder of the grading tests
(tests/test_grading.py's format checks, tests/test_grading_sandbox.py's instructor folder)."""
from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook


def write_lab(d: Path, cells, name: str | None = None) -> Path:
    """Write ``d/<name>.ipynb`` (``name`` defaults to the folder's name) with one code cell per ``(source,
    meta)`` pair, cell ids ``c0, c1, …``, ``meta`` (if any) as the cell's ``metadata.labkit``; returns ``d``."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    nb = new_notebook()
    for i, (src, meta) in enumerate(cells):
        c = new_code_cell(src)
        c.id = f"c{i}"
        if meta:
            c.metadata["labkit"] = meta
        nb.cells.append(c)
    nbformat.write(nb, d / f"{name or d.name}.ipynb")
    return d


#: every lab of the manifest, and the test that grades its instructor source in full with the CI parameters
#: (FAST=True): that grading executes every cell of the source (the hidden-check cells included), so
#: tests/test_notebooks.py does not execute the labs a second time under papermill (it checks this table
#: against the manifest)
GRADED_IN_FULL = {lab: "tests/test_grading_labs.py" for lab in (
    "lab01_baseline", "lab02_profiler", "lab03_batch_accum", "lab04_attention", "lab05_ddp", "lab06_fsdp",
    "lab08_data_pipeline", "lab09_collectives", "lab10_planner", "lab11_regression", "lab12_capstone")}
GRADED_IN_FULL["lab07_memory_precision"] = "tests/test_lab07.py"


def assert_every_cell_ran(out: Path, student: str, lab) -> None:
    """The grader's record of ``student``'s execution in the ``labkit grade`` folder ``out`` (the instructor
    source): every non-empty code cell executed, none raised, none timed out, nothing stopped the notebook —
    what a papermill run of the lab would prove."""
    import json

    ex = json.loads((Path(out) / "feedback" / f"{student}.json").read_text())["execution"]
    assert ex["kernel_started"] and not ex["kernel_died"] and not ex["stopped"] and not ex["error"], ex
    executed = nbformat.read(Path(out) / "executed" / f"{student}.ipynb", as_version=4).cells   # + parameters
    code = {i for i, c in enumerate(executed) if c.cell_type == "code" and c.source.strip()}
    source = [c for c in lab.notebook().cells if c.cell_type == "code" and c.source.strip()]
    assert len(code) >= len(source), f"the executed copy has {len(code)} code cells, the source {len(source)}"
    ran = {c["index"]: c for c in ex["cells"]}
    assert code <= set(ran), f"cells {sorted(code - set(ran))} not reached"
    bad = {i: ran[i] for i in sorted(code) if not ran[i]["executed"] or ran[i]["error"] or ran[i]["timed_out"]}
    assert not bad, bad
