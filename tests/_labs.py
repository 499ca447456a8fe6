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

