"""Run the course notebooks the way the test suite does: papermill, CPU parameters, own folder.

Command line (used by ``make refresh`` and by course authors)::

    python -m labkit.teaching.notebooks run PATH...      # execute with FAST=True into build/executed/
    python -m labkit.teaching.notebooks refresh PATH...  # execute, then store the outputs in the source —
                                                # refused when a claim does not hold (labkit.measure.claims)
    python -m labkit.teaching.notebooks check PATH...    # execute once under nbval-lax: compare checked cells

Executed copies go to ``build/executed/<path>``; a source notebook is only ever written by
``refresh``, which replaces cell *outputs* and nothing else (cells are matched by their ids).

Every notebook has one cell tagged ``parameters`` with the course vocabulary (DEVICE, NPROCS,
MODEL_SIZE, STEPS, SEQ_LEN, SEED, FAST, TIMEOUT_S); papermill injects the values below after it.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from labkit.checks import refuse_special
from labkit.paths import repo_root
from labkit.record import atomic_write_text

#: what the harness injects on a CPU-only machine (CI): small sizes, same code paths
CI_PARAMS = {"FAST": True}
KERNEL = "python3"
#: The kernelspec every notebook names: what scripts/bootstrap.sh installs (``ipykernel install --name python3
#: --display-name "Python 3 (ipykernel)"``). Any other display name makes JupyterLab rewrite it on open, so an
#: untouched notebook asks "Save changes?" on close (tests/test_notebooks.py checks every notebook).
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": KERNEL}


def _rel(path: str | os.PathLike) -> Path:
    p = Path(path).resolve()
    try:
        return p.relative_to(repo_root())
    except ValueError as e:
        raise ValueError(f"{path} is not inside the labkit checkout {repo_root()}") from e


def _entry_for(rel: Path):
    from labkit import course

    for e in course.notebooks():
        if e.path == rel.as_posix():
            return e
    return None


def _params_for(rel: Path, extra: dict | None) -> dict:
    e = _entry_for(rel)
    params = dict(CI_PARAMS)
    if e is not None:
        params.update(e.params)
    params.update(extra or {})
    return params


def run(path: str | os.PathLike, *, params: dict | None = None, out: str | os.PathLike | None = None,
        cell_timeout_s: float | None = None, log: bool = False) -> tuple[Path, float]:
    """Execute one notebook with the CI parameters; return (executed copy, seconds).

    The kernel's working directory is the notebook's own folder. Raises papermill's
    ``PapermillExecutionError`` (with the failing cell and traceback) when a cell fails.
    """
    import papermill as pm

    src = Path(path).resolve()
    if not src.is_file():
        raise FileNotFoundError(f"no notebook at {path}")
    rel = _rel(src)
    out = Path(out) if out else repo_root() / "build" / "executed" / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    e = _entry_for(rel)
    if cell_timeout_s is None:
        cell_timeout_s = max(300.0, 3 * (e.cpu_s if e else 90))
    t0 = time.perf_counter()
    pm.execute_notebook(
        str(src), str(out), parameters=_params_for(rel, params), kernel_name=KERNEL, language="python",
        cwd=str(src.parent), progress_bar=False, log_output=log, execution_timeout=cell_timeout_s,
    )
    return out, time.perf_counter() - t0


def has_checked_outputs(path: str | os.PathLike) -> bool:
    """Whether a code cell of the notebook opens with ``# NBVAL_CHECK_OUTPUT`` (what ``--nbval-lax`` compares):
    the test suite executes such a notebook under nbval (:func:`nbval_command`), any other under papermill."""
    refuse_special("notebook", path)
    nb = json.loads(Path(path).read_text())
    return any(c.get("cell_type") == "code" and "".join(c.get("source", "")).lstrip().startswith(
        "# NBVAL_CHECK_OUTPUT") for c in nb.get("cells", []))


def prepare_nbval(path: str | os.PathLike, *, params: dict | None = None) -> Path:
    """Write ``build/nbval/<path>``: the source with the CI parameters injected and its stored outputs.

    :func:`nbval_command` then executes it and compares the cells marked ``# NBVAL_CHECK_OUTPUT`` against the
    outputs committed in the source.
    """
    import nbformat
    from papermill.execute import prepare_notebook_metadata
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    src = Path(path).resolve()
    rel = _rel(src)
    nb = load_notebook_node(str(src))  # papermill's reader adds the metadata it expects
    prepared = prepare_notebook_metadata(copy.deepcopy(nb), str(src), str(src))
    prepared = parameterize_notebook(prepared, _params_for(rel, params), kernel_name=KERNEL,
                                     language="python")
    # papermill drops outputs of nothing, but be explicit: keep every committed output
    by_id = {c.get("id"): c for c in nb.cells}
    for c in prepared.cells:
        if c.get("id") in by_id and c.cell_type == "code":
            c.outputs = by_id[c["id"]].get("outputs", [])
    out = repo_root() / "build" / "nbval" / rel
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(prepared, out)
    return out


class RefreshRefused(RuntimeError):
    """The executed outputs do not show their lessons; the source notebook was left as it was."""


#: a peak measured inside the process (no calibration): MFU then swings with the machine's load
UNCALIBRATED = "(not calibrated"
#: the start of an absolute path on someone's machine (a stored output must not show one)
_HOME_LIKE = re.compile(r"(?<![\w.~])/(?:home|root|Users|work|tmp|private|mnt|srv|scratch)/")


def output_problems(nb) -> list[str]:
    """Why an executed notebook's outputs must not be stored (empty when they may be).

    A claim (:mod:`labkit.measure.claims`) that is inconclusive or contradicted, or disagrees with its own
    numbers; an MFU divided by an in-process peak instead of the calibrated one (``labkit calibrate``);
    output hygiene: profiler ``USDT:`` log lines, an absolute path of the recording machine, a bare
    ``True``/``False`` left as a cell's result.
    """
    from labkit.measure import claims

    problems = [f"cell {cid}: {c.text()}" for cid, c in claims.stored_claims(nb) if c.status != "holds"]
    problems += [f"cell {cid}: stored status {c.status!r} but its numbers give {claims.rejudge(c)!r}"
                 for cid, c in claims.stored_claims(nb) if claims.rejudge(c) != c.status]
    roots = {str(repo_root()), str(Path.home())}
    for cell in nb["cells"]:
        cid = cell.get("id", "?")
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            text = "".join(out.get("text", "")) + "".join((out.get("data") or {}).get("text/plain", ""))
            if UNCALIBRATED in text:
                problems.append(f"cell {cid}: a peak measured in-process, not calibrated — "
                                "run `labkit calibrate` on an idle machine first")
            if "USDT:" in text:
                problems.append(f"cell {cid}: profiler log lines (USDT:) in the output — set KINETO_LOG_LEVEL=6")
            if any(r in text for r in roots if len(r) > 1) or _HOME_LIKE.search(text):
                problems.append(f"cell {cid}: an absolute path of this machine in the output")
            if out.get("output_type") == "execute_result" and text in ("True", "False"):
                problems.append(f"cell {cid}: a bare {text} as the cell's result — assign it to a name")
    return problems


def refresh(path: str | os.PathLike, *, params: dict | None = None) -> float:
    """Execute with the CI parameters and store the outputs in the source notebook (outputs only).

    Refuses (:class:`RefreshRefused`, source untouched) when :func:`output_problems` finds any: a
    committed output always shows the lesson its cell claims, against the calibrated peak.
    """
    import nbformat

    src = Path(path).resolve()
    executed, seconds = run(src, params=params)
    ran = nbformat.read(executed, as_version=4)
    problems = output_problems(ran)
    if problems:
        raise RefreshRefused(f"{path}: outputs not stored (the executed copy is {executed}):\n  "
                             + "\n  ".join(problems))
    outputs = {c.get("id"): c for c in ran.cells if c.cell_type == "code"}
    nb = nbformat.read(src, as_version=4)
    if "language_info" in ran.metadata:   # what the kernel reports: JupyterLab then opens the notebook unmodified
        nb.metadata["language_info"] = ran.metadata["language_info"]
    nb.metadata["kernelspec"] = dict(KERNELSPEC)   # the installed kernel's spec, for the same reason
    for c in nb.cells:
        if c.cell_type == "code" and c.get("id") in outputs:
            c.outputs = outputs[c["id"]].get("outputs", [])
            c.execution_count = outputs[c["id"]].get("execution_count")
    for c in nb.cells:  # papermill's per-cell metadata is noise in a source notebook
        c.metadata.pop("papermill", None)
        c.metadata.pop("execution", None)
    nb.metadata.pop("papermill", None)
    atomic_write_text(src, nbformat.writes(nb) + "\n")
    return seconds


def skip_iri_grammar() -> None:
    """Run before nbformat is first imported in a process of labkit's own (the grader's executor, one per
    submission; ``python -m labkit``): nbformat imports jsonschema, which checks the "iri" formats with
    rfc3987-syntax where that is installed (jupyter-events pulls it in), and rfc3987-syntax compiles its Lark
    grammar at import, ≈ 1.4 s of CPU in every such process. Neither nbformat (it validates with no format
    checker) nor papermill checks a format, so the process goes without that one package; a process that
    imported it already keeps it (the nbval run of :func:`nbval_command` runs it through the plugin
    :mod:`labkit.teaching.nbval_startup`). Course tooling behind ``labkit grade`` and ``make test``, taught in no
    chapter."""
    sys.modules.setdefault("rfc3987_syntax", None)      # None: its import raises ImportError, which jsonschema skips


def nbval_command(copy_path: str | os.PathLike, *, cell_timeout_s: float | None = None) -> list[str]:
    """The ``pytest --nbval-lax`` command that executes a :func:`prepare_nbval` copy once, failing on any cell's
    error and on a ``# NBVAL_CHECK_OUTPUT`` cell whose output differs from the committed one (after
    ``tests/nbval_sanitize.cfg``); run it from the repository root. ``cell_timeout_s`` defaults to nbval's own.
    The test suite runs it for each notebook with checked cells (``tests/test_notebooks.py``): course tooling
    behind the README's ``make test``, taught in no chapter."""
    copy_path = Path(copy_path)
    if copy_path.suffix != ".ipynb" or not copy_path.is_file():
        raise ValueError(f"copy_path {str(copy_path)!r} is not a notebook file: give what prepare_nbval returned")
    if cell_timeout_s is not None and not (isinstance(cell_timeout_s, (int, float)) and 0 < cell_timeout_s < 1e6):
        raise ValueError(f"cell_timeout_s {cell_timeout_s!r} is not a number of seconds > 0 (or None)")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-p", "labkit.teaching.nbval_startup", "--nbval-lax",           # skip_iri_grammar, before nbval loads
           "--nbval-sanitize-with", str(repo_root() / "tests" / "nbval_sanitize.cfg"),
           "--nbval-kernel-name", KERNEL]
    if cell_timeout_s is not None:
        cmd += ["--nbval-cell-timeout", f"{cell_timeout_s:g}"]
    return cmd + [str(copy_path)]


def check(path: str | os.PathLike) -> int:
    """Prepare the nbval copy (:func:`prepare_nbval`) and run nbval-lax on it (:func:`nbval_command`): one
    execution; returns pytest's exit code."""
    return subprocess.call(nbval_command(prepare_nbval(path)), cwd=repo_root())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.teaching.notebooks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["run", "refresh", "check"])
    ap.add_argument("paths", nargs="+")
    ap.add_argument("-p", "--param", action="append", default=[], metavar="NAME=JSON",
                    help="extra parameter, value as JSON (e.g. -p STEPS=5)")
    a = ap.parse_args(argv)
    params = {}
    for kv in a.param:
        name, _, value = kv.partition("=")
        try:
            params[name] = json.loads(value)
        except json.JSONDecodeError:
            params[name] = value
    rc = 0
    for p in a.paths:
        if a.action == "run":
            out, s = run(p, params=params)
            print(f"{p}: ran in {s:.1f} s -> {out}")
        elif a.action == "refresh":
            try:
                s = refresh(p, params=params)
            except RefreshRefused as e:
                print(e, file=sys.stderr)
                rc = 1
                continue
            print(f"{p}: refreshed outputs ({s:.1f} s)")
        else:
            rc |= check(p)
    return rc


if __name__ == "__main__":
    sys.exit(main())
