"""Batch grading: every submission of a lab, each in its own folder and process tree, with one command.

``labkit grade LAB SUBMISSIONS... --out DIR`` (see :mod:`labkit.cli.grade`) calls :func:`grade`, which for
each submission

1. copies the notebook and the lab's support files into ``DIR/work/<student>/`` (a fresh folder);
2. executes it with papermill (:mod:`~labkit.teaching.grading.executor`) under :class:`~labkit.teaching.grading.sandbox.Limits`,
   caged where Linux allows (:mod:`~labkit.teaching.grading.isolation`), in parallel workers;
3. runs the lab's hidden checks in another fresh process (:mod:`labkit.teaching.grading.checker`) against the
   evidence the notebook recorded — never against anything the kernel printed;
4. writes ``DIR/feedback/<student>.json`` (score per question, each check's message, what ran, what
   failed, cell structure by id, whether it is the instructor's own copy) atomically, the learner's
   ``DIR/feedback/<student>.md`` (:mod:`labkit.teaching.grading.feedback`), and rebuilds ``DIR/gradebook.csv``
   from all of them (:mod:`labkit.teaching.grading.gradebook`).

Every other file found in the submission folders is listed, with why it is not graded, in
``DIR/not-graded.txt`` (and by ``labkit grade``); a notebook of another lab (its metadata or its
cells say which, :func:`~labkit.teaching.grading.labfmt.other_lab`) is not run and is graded ``wrong-lab``,
naming the lab it is.

Students come from the file names (nbgrader, Canvas, Moodle) and an optional roster; a late
re-upload replaces the earlier one (:mod:`labkit.teaching.grading.students`). ``shard=(i, N)`` grades every
N-th student only, for spreading a class over machines (see ``labs/README.md``).

A re-run skips submissions whose feedback is complete for the same notebook bytes and lab source
(``force=True`` regrades), so a batch killed midway resumes, and the gradebook, being rebuilt from the
per-student files, never holds a duplicate row. Before a forced run grades anything it lists its
students in ``DIR/.pending-<lab>.json`` and strikes each one off once graded: a re-run after a forced
run was interrupted regrades whoever is still listed, with or without ``force``.

Taught in the instructor notes of the labs (``labkit grade --help``).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from labkit.record import atomic_write_text
from labkit.teaching.grading import feedback, sandbox, summary
from labkit.teaching.grading.evidence import sha256_file
from labkit.teaching.grading.gradebook import FIXED_COLUMNS, read_pending, write_gradebook
from labkit.teaching.grading.gradebook import write_pending as _write_pending
from labkit.teaching.grading.isolation import ENTER_FAILED, Cage, isolation, scratch_dir
from labkit.teaching.grading.labfmt import Lab, learner_notebook, load_lab, other_lab, source_copy
from labkit.teaching.grading.students import Roster, Student, parse_shard, resolve, shard_of, student_of

GRADER_VERSION = 1
__all__ = ["GradeConfig", "GradeResult", "FIXED_COLUMNS", "collect", "collect_all", "grade", "grade_one", "student_of",
           "write_gradebook"]


@dataclass(frozen=True)
class GradeConfig:
    """How to grade: limits, parallelism, parameters injected into every submission."""

    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    workers: int = 1
    params: dict = field(default_factory=dict)
    force: bool = False
    check_s: float = 120.0             # per hidden check
    protect: tuple = ()                # files/folders a submission must not modify (default: labkit itself)
    progress: bool = True
    kernel_name: str = "python3"
    roster: str | None = None          # a roster CSV (labkit.teaching.grading.students.Roster)
    shard: tuple | str | None = None   # (i, N) or "i/N": grade every N-th student from the i-th
    feedback_values: str = "hide"      # "show" / "hide" correct values in the learner's Markdown
    key: str | None = field(default=None, repr=False)   # the instructor's key: hidden checks verify tickets with it

    def __post_init__(self):
        feedback.check_values(self.feedback_values)
        if self.shard is not None:
            i, n = parse_shard(self.shard if isinstance(self.shard, str) else "/".join(map(str, self.shard)))
            object.__setattr__(self, "shard", (i, n))
        if not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers={self.workers!r}; must be an integer >= 1")
        if not isinstance(self.params, dict):
            raise TypeError(f"params must be a dict of notebook parameters, got {type(self.params).__name__}")
        if type(self.check_s) not in (int, float) or not 0 < self.check_s < float("inf"):
            raise ValueError(f"check_s={self.check_s!r}; must be a finite number > 0")


@dataclass
class GradeResult:
    gradebook: Path
    rows: list[dict]
    graded: list[str]
    skipped: list[str]
    failed: list[str]     # grader-side failures (never a student's fault); regraded on the next run
    unmatched: list[str] = field(default_factory=list)   # graded, but not in the roster
    missing: list[str] = field(default_factory=list)     # in the roster, no submission
    replaced: dict = field(default_factory=dict)         # student -> earlier uploads their latest replaced
    passed_over: list = field(default_factory=list)      # (file, why) for every file found and not graded
    summary: Path | None = None                          # the class report, out/summary.md


# ---------------------------------------------------------------- submissions
def collect(paths) -> list[Path]:
    """Notebooks named by ``paths`` (files, or folders searched recursively)."""
    return collect_all(paths)[0]


def collect_all(paths) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Notebooks named by ``paths`` and every other file found in their folders, with why it is not graded."""
    out, passed = [], []
    for p in map(Path, paths):
        if p.is_file():
            if p.suffix != ".ipynb":
                raise ValueError(f"submission {p} is not a .ipynb notebook")
            out.append(p.resolve())
        elif p.is_dir():
            for q in sorted(x for x in p.rglob("*") if x.is_file()):
                if ".ipynb_checkpoints" in q.parts:
                    passed.append((q.resolve(), "in .ipynb_checkpoints: Jupyter's autosave copy, not a submission"))
                elif q.suffix != ".ipynb":
                    passed.append((q.resolve(), f"not a notebook ({q.suffix or 'no extension'}); only .ipynb "
                                                "files are graded"))
                else:
                    out.append(q.resolve())
        else:
            raise FileNotFoundError(f"submission {p} does not exist")
    if not out:
        raise ValueError(f"no .ipynb submissions found in {[str(p) for p in paths]}")
    return list(dict.fromkeys(out)), passed


# ---------------------------------------------------------------- one submission
def _structure(lab: Lab, nb) -> dict:
    """Cells of the submission matched to the learner version by id (deleted, duplicated, reordered)."""
    expected = [c.metadata["labkit"]["id"] for c in learner_notebook(lab).cells
                if isinstance(c.get("metadata", {}).get("labkit"), dict)]
    seen = [c.metadata.get("labkit", {}).get("id") for c in nb.cells
            if isinstance(c.get("metadata", {}).get("labkit"), dict)]
    known = [i for i in seen if i in expected]
    order = [i for i in dict.fromkeys(known)]
    return {
        "missing": [i for i in expected if i not in seen],
        "duplicated": sorted({i for i in known if known.count(i) > 1}),
        "reordered": order != [i for i in expected if i in order],
        "unknown_ids": sorted({str(i) for i in seen if i not in expected}),
        "cells": len(nb.cells), "expected_cells": len(learner_notebook(lab).cells),
    }


def _run(cmd, *, cwd, env, limits: sandbox.Limits, timeout: float, log: Path, death=signal.SIGTERM) -> tuple[int | None, bool]:
    with open(log, "wb") as logf:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=logf,
                                stderr=subprocess.STDOUT, preexec_fn=limits.preexec(death), start_new_session=True)
        try:
            rc, why = sandbox.wait_within(proc, timeout=timeout, cpu_s=limits.cpu_s)
            if why:
                logf.write(f"\nlabkit grader: stopped: {why}\n".encode())
            return rc, why is not None
        finally:
            if proc.poll() is None:  # interrupted (KeyboardInterrupt in the grader): leave nothing behind
                sandbox.kill_tree(proc.pid)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _timestamp(path: Path) -> str:
    ts = dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)
    return ts.isoformat(timespec="seconds")


def grade_one(lab: Lab, sub: Path, student: str, out: Path, cfg: GradeConfig) -> dict:
    """Grade one submission; returns its feedback dict (also written to ``out/feedback/<student>.json``)."""
    import nbformat

    t0 = time.perf_counter()
    lim = cfg.limits
    fb = {"student": student, "lab": lab.id, "timestamp": _now(), "submitted_mtime": _timestamp(sub),
          "submission": str(sub),
          "submission_sha256": sha256_file(sub), "lab_sha256": lab.sha256, "grader_version": GRADER_VERSION,
          "params": cfg.params, "max_score": lab.max_score, "score": 0.0, "status": "graded", "notes": []}
    private = out / ".grader" / student
    work = out / "work" / student
    for d in (private, work):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    executed = out / "executed" / f"{student}.ipynb"
    executed.parent.mkdir(parents=True, exist_ok=True)
    executed.unlink(missing_ok=True)
    try:
        nb = nbformat.read(sub, as_version=4)
    except Exception as e:  # noqa: BLE001 - any unreadable file is graded as such
        fb.update(status="unreadable", structure=None, execution=None, questions=_zero(lab, "notebook unreadable"),
                  complete=True)
        fb["notes"].append(f"the submission is not a readable notebook: {type(e).__name__}: {str(e)[:300]}")
        return fb
    fb["structure"] = _structure(lab, nb)
    other = other_lab(lab, nb)
    if other:
        fb.update(status="wrong-lab", execution=None, complete=True, submitted_lab=other,
                  questions=_zero(lab, f"not graded: this notebook is {other}, not {lab.id}"))
        fb["notes"].append(f"this notebook is the lab {other} (its cells are {other}'s), not {lab.id}: "
                           f"submit your {lab.id} notebook")
        return fb
    fb["source_copy"] = source_copy(lab, nb)
    if fb["source_copy"]:
        fb["notes"].append("this is the instructor's source (identical)" if fb["source_copy"] == "identical"
                           else "this notebook holds the instructor's solution or hidden-check regions")
    for f in lab.support_files():
        target = work / f.relative_to(lab.dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
    src = work / f"{lab.id}.ipynb"
    nbformat.write(nb, src)
    protect = [Path(p) for p in (cfg.protect or sandbox.default_protected())] + [lab.dir]
    before = sandbox.file_hashes(protect)
    env = sandbox.env_for_submission(work / "work")
    (run_dir := private / "run").mkdir()        # the executor's only writable folder besides the work folder
    lim, notes = lim.within_inherited()
    fb["notes"] += notes
    prefix, fb["isolation"] = isolation()
    spec = {"input": str(src), "output": str(run_dir / "executed.ipynb"), "status": str(run_dir / "status.json"),
            "cwd": str(work), "parameters": cfg.params, "cell_s": lim.cell_s, "notebook_s": lim.notebook_s,
            "output_bytes": int(lim.output_mb * 2**20), "kernel_name": cfg.kernel_name,
            "grader_pid": None if prefix else os.getpid(), "caged": bool(prefix)}
    (private / "spec.json").write_text(json.dumps(spec))
    cmd = sandbox.python_cmd() + ["-m", "labkit.teaching.grading.executor", str(private / "spec.json")]
    cage = Cage(sandbox.cage_roots(lab.dir, out, cfg.protect), [work, run_dir], scratch_dir()) if prefix else None
    t1 = time.perf_counter()
    try:
        rc, killed = _run(cage.command(prefix, cmd, work) if cage else cmd, cwd=work, env=env, limits=lim,
                          timeout=lim.notebook_s + 60, log=private / "executor.log",
                          death=signal.SIGKILL if cage else signal.SIGTERM)    # unshare(1) ignores SIGTERM
    finally:
        touched = cage.finish() if cage else []
    if rc == ENTER_FAILED and not (run_dir / "status.json").exists():
        raise RuntimeError(f"the submission's cage could not be built: see {private / 'executor.log'}")
    fb["execute_s"] = round(time.perf_counter() - t1, 2)
    try:
        report = json.loads((run_dir / "status.json").read_text())
    except (OSError, json.JSONDecodeError):
        report = {"cells": [], "error": f"executor ended without a report (exit {rc}{', killed' if killed else ''})"}
    report["executor_exit"] = rc
    fb["execution"] = _summarise(report)
    if (got := run_dir / "executed.ipynb").is_file() and not got.is_symlink():
        shutil.copyfile(got, executed)
    status, what, note = sandbox.tamper_verdict(cage is not None, touched,
                                                sandbox.changed(before, sandbox.file_hashes(protect)), report)
    if status:
        fb.update(status=status, complete=status == "tampered", tampered=what,
                  questions=_zero(lab, f"not graded: {status}"))
        fb["notes"].append(note)
        return fb
    t1 = time.perf_counter()
    results = _checks(lab, work / "work", private, cfg, submitted=sub)
    fb["checks_s"] = round(time.perf_counter() - t1, 2)
    fb["questions"] = _score(lab, results, report)
    fb["answers"] = summary.answer_facts(lab, work / "work")   # the families named, for the class report
    fb["score"] = round(sum(q["score"] for q in fb["questions"].values()), 6)
    st = fb["structure"]
    if st["missing"]:
        fb["notes"].append(f"cells deleted (by id): {', '.join(st['missing'])}")
    if st["reordered"]:
        fb["notes"].append("graded cells were reordered; they are matched by id, so this alone costs nothing")
    if st["duplicated"]:
        fb["notes"].append(f"cells duplicated (by id): {', '.join(st['duplicated'])}")
    ex = fb["execution"]
    if ex.get("stopped"):
        fb["notes"].append(f"execution stopped: {ex['stopped']}")
    if ex.get("output_dropped_bytes"):
        fb["notes"].append(f"{ex['output_dropped_bytes']:,} bytes of output over the limit were dropped")
    fb["seconds"] = round(time.perf_counter() - t0, 2)
    fb["complete"] = True
    return fb


def _summarise(report: dict) -> dict:
    cells = report.get("cells", [])
    return {
        "kernel_started": report.get("kernel_started"), "kernel_died": report.get("kernel_died"),
        "deadline_hit": report.get("deadline_hit"), "stopped": report.get("stopped"), "error": report.get("error"),
        "cells_executed": sum(1 for c in cells if c.get("executed") and c.get("type") == "code"),
        "cells_failed": sum(1 for c in cells if c.get("error")),
        "cells_timed_out": sum(1 for c in cells if c.get("timed_out")),
        "output_dropped_bytes": report.get("output_dropped_bytes", 0),
        "orphans_killed": report.get("orphans_killed", 0), "wall_s": report.get("wall_s"),
        "executor_exit": report.get("executor_exit"),
        "cells": cells,
    }


def _checks(lab: Lab, work_root: Path, private: Path, cfg: GradeConfig, submitted: Path | None = None) -> list[dict]:
    spec = {"lab": lab.id, "work_root": str(work_root), "params": cfg.params, "check_s": cfg.check_s,
            "submitted": str(submitted) if submitted else None,
            "result": str(private / "checks.json"),
            "checks": [{"id": c.id, "question": c.question, "weight": c.weight, "source": c.source}
                       for c in lab.checks]}
    (private / "checks_spec.json").write_text(json.dumps(spec))
    env = sandbox.env_for_submission(work_root)
    env.pop("LABKIT_GRADING_KEY", None)
    if cfg.key:                  # the checker's environment only: never the spec file, never the submission's kernel
        env["LABKIT_GRADING_KEY"] = cfg.key
    rc, killed = _run(sandbox.python_cmd() + ["-m", "labkit.teaching.grading.checker", str(private / "checks_spec.json")],
                      cwd=private, env=env, limits=cfg.limits,
                      timeout=cfg.check_s * len(lab.checks) + 60, log=private / "checker.log")
    try:
        return json.loads((private / "checks.json").read_text())
    except (OSError, json.JSONDecodeError):
        msg = f"the hidden-check process ended without results (exit {rc}{', killed' if killed else ''})"
        return [{"id": c.id, "question": c.question, "weight": c.weight, "passed": False, "message": msg}
                for c in lab.checks]


def _zero(lab: Lab, why: str) -> dict:
    return {q.id: {"score": 0.0, "max_score": q.points, "checks": [], "answer_cells": [], "feedback": why}
            for q in lab.questions}


def _score(lab: Lab, results: list[dict], report: dict) -> dict:
    by_q: dict[str, list[dict]] = {}
    for r in results:
        by_q.setdefault(r["question"], []).append(r)
    out = {}
    for q in lab.questions:
        rs = by_q.get(q.id, [])
        total = sum(r["weight"] for r in rs) or 1.0
        got = sum(r["weight"] for r in rs if r.get("passed"))
        cells = [c for c in report.get("cells", []) if c.get("id") == q.id]
        msgs = feedback.row_messages(q.id, rs, "message", questions=[x.id for x in lab.questions])
        mine = feedback.row_messages(q.id, rs, "learner_message", questions=[x.id for x in lab.questions])
        out[q.id] = {"score": round(q.points * got / total, 6), "max_score": q.points, "checks": rs,
                     "answer_cells": cells,
                     "feedback": msgs[0] if msgs else "all checks passed",
                     "learner_feedback": mine[0] if mine else "all checks passed"}
    return out


# ---------------------------------------------------------------- the batch
def _complete(path: Path, sha: str, lab: Lab) -> bool:
    try:
        fb = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (fb.get("complete") is True and fb.get("submission_sha256") == sha and fb.get("lab_sha256") == lab.sha256
            and fb.get("grader_version") == GRADER_VERSION)


def _save(out: Path, fb: dict, cfg: GradeConfig) -> None:
    atomic_write_text(out / "feedback" / f"{fb['student']}.json", json.dumps(fb, indent=1, default=str))
    if fb.get("complete"):
        feedback.write(out, fb, cfg.feedback_values)


def _refresh(out: Path, st: Student, cfg: GradeConfig) -> None:
    """A skipped student's feedback: record how the file is attributed now, rewrite the Markdown."""
    path = out / "feedback" / f"{st.id}.json"
    fb = json.loads(path.read_text())
    if fb.get("submitted_as") != st.info():
        fb["submitted_as"] = st.info()
        atomic_write_text(path, json.dumps(fb, indent=1, default=str))
    feedback.write(out, fb, cfg.feedback_values)


def grade(lab, submissions, out, config: GradeConfig | None = None) -> GradeResult:
    """Grade every submission of ``lab`` into ``out`` (see the module docstring); never stops on a submission."""
    cfg = config or GradeConfig()
    parsed = lab if isinstance(lab, Lab) else load_lab(lab)
    out = Path(out).absolute()   # the executors run in each student's work folder: a relative path would miss
    if out.exists() and not out.is_dir():   # checked first: a bad --out is named before any submission
        raise NotADirectoryError(f"--out {out} is a file; give a folder for the gradebook and feedback")
    roster = Roster.load(cfg.roster) if cfg.roster else None
    notebooks, passed_over = collect_all(submissions)
    students = resolve(notebooks, parsed.id, roster)
    (out / "feedback").mkdir(parents=True, exist_ok=True)
    _write_passed_over(out, passed_over)
    mine = shard_of(students, cfg.shard)
    pending = read_pending(out, parsed)
    todo, skipped = [], []
    for n in mine:
        st = students[n]
        if cfg.force or n in pending or not _complete(out / "feedback" / f"{n}.json", sha256_file(st.path), parsed):
            todo.append(n)
        else:
            skipped.append(n)
            _refresh(out, st, cfg)
    if cfg.force:
        pending |= set(todo)
        _write_pending(out, parsed, pending)
    lock = threading.Lock()
    graded, failed = [], []
    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc=f"grading {parsed.id}", unit="nb", disable=not cfg.progress, file=sys.stderr)

    def one(n):
        try:
            fb = grade_one(parsed, students[n].path, n, out, cfg)
        except Exception as e:  # noqa: BLE001 - a grader-side failure is reported, the batch goes on
            fb = {"student": n, "lab": parsed.id, "complete": False, "status": "grader-error",
                  "notes": [f"{type(e).__name__}: {e}"]}
        fb["submitted_as"] = students[n].info()
        fb["graded_at"] = fb["timestamp"] = _now()     # this row's own grading time (the gradebook's timestamp)
        with lock:
            _save(out, fb, cfg)
            (graded if fb.get("complete") else failed).append(n)
            if fb.get("complete") and n in pending:
                pending.discard(n)
                _write_pending(out, parsed, pending)
            write_gradebook(parsed, out)
            bar.set_postfix_str(f"{n}: {fb.get('score', 0)}/{parsed.max_score:g} {fb.get('status')}")
            bar.update(1)

    try:
        with ThreadPoolExecutor(max_workers=cfg.workers) as pool:
            for fut in as_completed([pool.submit(one, n) for n in todo]):
                fut.result()
    finally:
        bar.close()
    path, rows = write_gradebook(parsed, out)
    report = summary.write_summary(out, parsed)   # summary.md + summary.png, rebuilt from the feedback records
    unmatched = [n for n in mine if students[n].in_roster is False]
    missing = sorted(set(roster.ids) - set(students)) if roster else []
    replaced = {n: [p.name for p in students[n].replaced] for n in mine if students[n].replaced}
    return GradeResult(path, rows, sorted(graded), sorted(skipped), sorted(failed), unmatched, missing, replaced,
                       passed_over, report)


def _write_passed_over(out: Path, passed_over) -> None:
    """``out/not-graded.txt``: every file of the submission folders that was not graded, and why."""
    path = out / "not-graded.txt"
    if passed_over:
        atomic_write_text(path, "".join(f"{p}\t{why}\n" for p, why in passed_over))
    else:
        path.unlink(missing_ok=True)
