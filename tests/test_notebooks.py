"""Every ready notebook of the course runs top to bottom with the CPU parameters, once.

The manifest (labkit/course.toml) says which notebooks exist and how long each takes; the longest
run first so ``pytest -n 2`` finishes early. A notebook with cells marked ``# NBVAL_CHECK_OUTPUT`` is executed by
nbval (``pytest --nbval-lax`` on ``build/nbval/<path>``, the source with the CI parameters and its committed
outputs: every cell must run without error and each checked cell's output must match); any other notebook (the
index, the glossary) by papermill. A graded lab is executed by its grading test instead (tests/_executed.py:
``labkit grade`` runs the instructor source with the same parameters, the test asserts every code cell ran and
then its full marks), so each lab runs once in the suite.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from _executed import EXECUTED_BY_GRADING, assert_every_code_cell_ran, ci_params  # tests/_executed.py

from labkit import course
from labkit.paths import repo_root
from labkit.teaching import notebooks

ROOT = repo_root()
READY = sorted(course.notebooks(ready_only=True), key=lambda e: -e.cpu_s)


def test_manifest_matches_the_notebooks_on_disk():
    on_disk = {p.relative_to(ROOT).as_posix() for d in ("chapters", "labs") for p in (ROOT / d).rglob("*.ipynb")
               if ".ipynb_checkpoints" not in p.parts}
    ready = {e.path for e in course.notebooks(ready_only=True)}
    planned = {e.path for e in course.notebooks() if not e.ready}
    assert on_disk - ready - planned == set(), "notebooks missing from labkit/course.toml"
    assert ready - on_disk == set(), "manifest says ready but the file is missing"
    assert planned & on_disk == set(), "notebook exists but the manifest still says planned"


@pytest.mark.parametrize("entry", READY, ids=[e.id for e in READY])
def test_notebook_has_one_parameters_cell_and_no_stored_errors(entry):
    nb = json.loads((ROOT / entry.path).read_text())
    tagged = [c for c in nb["cells"] if "parameters" in (c.get("metadata", {}).get("tags") or [])]
    assert len(tagged) == 1, f"{entry.path}: needs exactly one cell tagged 'parameters'"
    src = "".join(tagged[0]["source"])
    for name in ("FAST", "SEED"):
        assert f"{name} =" in src, f"{entry.path}: parameters cell lacks {name}"
    errors = [o for c in nb["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{entry.path}: a stored output is an error"


def test_each_cpu_notebook_is_executed_here_or_by_its_grading_test():
    """The labs left out of the execution test below are ready CPU labs, each run by its grading test (the test
    file it names takes its labs from the same table and asserts every code cell ran) with the parameters this file
    would give it."""
    cpu = {e.id: e for e in READY if e.gpus == 0}
    assert set(EXECUTED_BY_GRADING) <= set(cpu), set(EXECUTED_BY_GRADING) - set(cpu)
    for lab, test_file in EXECUTED_BY_GRADING.items():
        assert cpu[lab].kind == "lab", lab
        text = (ROOT / test_file).read_text()
        assert "EXECUTED_BY_GRADING" in text and "assert_every_code_cell_ran(" in text, (lab, test_file)
        assert ci_params(lab) == {"FAST": True}, (lab, ci_params(lab))   # what the grading tests pass


@pytest.mark.notebook
@pytest.mark.parametrize("entry", [e for e in READY if e.gpus == 0 and e.id not in EXECUTED_BY_GRADING],
                         ids=lambda e: e.id)
def test_notebook_executes_with_cpu_parameters(entry, calibrated_peaks):
    src = ROOT / entry.path
    if notebooks.has_checked_outputs(src):         # one execution: nbval runs every cell and compares the checked
        copy = notebooks.prepare_nbval(src)
        cells = [c for c in json.loads(copy.read_text())["cells"] if c["cell_type"] == "code"]   # + parameters
        timeout = max(300.0, 3 * entry.cpu_s)        # per cell, as notebooks.run gives papermill
        t0 = time.perf_counter()
        r = subprocess.run(notebooks.nbval_command(copy, cell_timeout_s=timeout), cwd=ROOT, capture_output=True,
                           text=True, timeout=timeout + 120)
        seconds = time.perf_counter() - t0
        assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-2000:]
        last = r.stdout.strip().splitlines()[-1]     # "31 passed in 40.12s": one item per code cell, all passed
        summary = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", last)}
        skip = sum("NBVAL_SKIP" in "".join(c["source"]) for c in cells)   # nbval's own marker: not run
        want = {"passed": len(cells) - skip, **({"skipped": skip} if skip else {})}
        assert summary == want, (summary, len(cells), r.stdout[-3000:])
    else:
        out, seconds = notebooks.run(src)
        assert_every_code_cell_ran(out, what=entry.path)
    print(f"{entry.id}: {seconds:.1f} s (manifest says {entry.cpu_s:.0f} s)")


def _bootstrap_kernelspec() -> dict:
    """--name and --display-name of the `ipykernel install` line scripts/bootstrap.sh runs."""
    import re
    import shlex

    line = next(ln for ln in (ROOT / "scripts" / "bootstrap.sh").read_text().splitlines()
                if "ipykernel install" in ln and not ln.lstrip().startswith("#"))
    args = shlex.split(line.split("ipykernel install", 1)[1].split(">")[0])
    get = {a: args[i + 1] for i, a in enumerate(args[:-1]) if re.fullmatch(r"--(name|display-name)", a)}
    return {"name": get["--name"], "display_name": get["--display-name"]}


def test_kernelspec_constant_is_what_bootstrap_installs():
    want = _bootstrap_kernelspec()
    assert {k: notebooks.KERNELSPEC[k] for k in want} == want and notebooks.KERNELSPEC["language"] == "python"


_ALL = course.notebooks()


@pytest.mark.parametrize("entry", _ALL, ids=[e.id for e in _ALL])
def test_every_notebook_names_the_installed_kernel(entry):
    """A notebook whose kernelspec differs from the installed kernel's opens modified in JupyterLab (it rewrites
    the display name), so closing an untouched chapter asks "Save changes?"."""
    path = ROOT / entry.path
    if not path.is_file():
        pytest.skip(f"{entry.path} is planned, not on disk")
    ks = json.loads(path.read_text())["metadata"].get("kernelspec")
    assert ks == notebooks.KERNELSPEC, f"{entry.path}: kernelspec {ks} is not {notebooks.KERNELSPEC}"


MINI_LAB = "tests/adversarial/mini_lab/mini_lab.ipynb"
_NO_IRI = """
import sys

from labkit.teaching.notebooks import skip_iri_grammar

skip_iri_grammar()
import jsonschema, nbformat, papermill  # noqa: E401,F401 - what the grader's executor and nbval import

nb = nbformat.read(sys.argv[1], as_version=4)
nbformat.validate(nb)
nb.cells[0]["cell_type"] = "no such type"
try:
    nbformat.validate(nb)
except nbformat.ValidationError:
    print("refused")
print(sorted(k for k, v in sys.modules.items() if k.startswith("rfc3987_syntax") and v is not None))
"""


def test_a_process_without_the_iri_grammar_still_validates_notebooks():
    """skip_iri_grammar (the grader's executor, ``python -m labkit``, the nbval run's first plugin) leaves the one
    package that compiles a grammar at import out of the process: notebooks are still validated (a broken one is
    refused), and the nbval command loads the plugin before nbval (``-p`` before the installed plugins)."""
    r = subprocess.run([sys.executable, "-c", _NO_IRI, str(ROOT / MINI_LAB)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:2] == ["refused", "[]"], r.stdout
    cmd = notebooks.nbval_command(ROOT / MINI_LAB)
    assert cmd[cmd.index("labkit.teaching.nbval_startup") - 1] == "-p" and cmd.index("-p") < cmd.index("--nbval-lax")
