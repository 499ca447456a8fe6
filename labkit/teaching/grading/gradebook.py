"""The gradebook: one CSV row per student, rebuilt from the per-student feedback files; merging shards.

Columns: ``student, lab, timestamp, score, max_score``, one column per question (its score), then
(``timestamp`` is when that row was graded, UTC — each row its own; the submission file's mtime is in the
feedback JSON as ``submitted_mtime``)

==============  ==================================================================================
status          graded / unreadable / wrong-lab (another lab's notebook) / ... (see :mod:`labkit.teaching.grading.batch`)
source_copy     ``identical``: the submission's code cells are the instructor source's; ``solutions``:
                it holds solution or hidden-check regions of the instructor source; empty otherwise
file            the file graded
late            ``yes`` when the LMS marked the upload late (Canvas ``LATE_``)
replaced        earlier uploads of the same student this file replaced (``;``-separated)
roster          ``matched`` / ``not in roster`` when a roster was given; empty otherwise
==============  ==================================================================================

:func:`merge` joins the gradebooks of a sharded run (``labkit grade --shard i/N``) into one, refusing
shards of different labs or columns and a student graded in two shards.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from labkit.record import atomic_write_text

FIXED_COLUMNS = ["student", "lab", "timestamp", "score", "max_score"]
EXTRA_COLUMNS = ["status", "source_copy", "file", "late", "replaced", "roster"]


def columns(lab) -> list[str]:
    """The gradebook header of ``lab``."""
    return FIXED_COLUMNS + [q.id for q in lab.questions] + EXTRA_COLUMNS


def row_of(lab, fb: dict) -> dict:
    """The gradebook row of one complete feedback dict."""
    row = {k: fb.get(k) for k in FIXED_COLUMNS}
    row["timestamp"] = fb.get("graded_at") or fb.get("timestamp")    # when this row was graded (UTC)
    for q in lab.questions:
        row[q.id] = (fb.get("questions") or {}).get(q.id, {}).get("score", 0.0)
    sub = fb.get("submitted_as") or {}
    row.update(status=fb.get("status"), source_copy=fb.get("source_copy") or "",
               file=sub.get("file") or Path(str(fb.get("submission", ""))).name,
               late="yes" if sub.get("late") else "", replaced=";".join(sub.get("replaced") or []),
               roster=sub.get("roster") or "")
    return row


def _csv(header: list[str], rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=header, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def write_gradebook(lab, out: Path) -> tuple[Path, list[dict]]:
    """Rebuild ``out/gradebook.csv`` from every complete feedback file of ``lab`` (one row per student)."""
    out = Path(out)
    rows = []
    for p in sorted((out / "feedback").glob("*.json")):
        try:
            fb = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(fb, dict) or fb.get("lab") != lab.id or not fb.get("complete"):
            continue
        rows.append(row_of(lab, fb))
    path = out / "gradebook.csv"
    atomic_write_text(path, _csv(columns(lab), rows))
    return path, rows


def _read(path: Path) -> tuple[list[str], list[dict]]:
    path = Path(path)
    if path.is_dir():
        path = path / "gradebook.csv"
    if not path.is_file():
        raise FileNotFoundError(f"gradebook {path} does not exist (give a gradebook.csv or the --out folder "
                                "of a shard)")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        if header[:len(FIXED_COLUMNS)] != FIXED_COLUMNS:
            raise ValueError(f"{path} is not a labkit gradebook: its columns start {header[:5]}, "
                             f"expected {FIXED_COLUMNS}")
        return header, [dict(r) for r in reader]


def merge(out, gradebooks, *, overwrite: bool = False) -> tuple[Path, list[dict]]:
    """Write ``out`` (a CSV) holding the rows of every gradebook in ``gradebooks`` (CSV files or shard
    ``--out`` folders), sorted by student; ValueError on mixed labs or columns, or a student in two."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (--overwrite) to replace it")
    if not gradebooks:
        raise ValueError("merge needs at least one gradebook")
    header, rows, where, labs = None, [], {}, set()
    for gb in gradebooks:
        h, rs = _read(gb)
        if header is None:
            header = h
        elif h != header:
            raise ValueError(f"{gb}: columns {h} differ from {gradebooks[0]}'s {header}; merge shards of one lab "
                             "graded by one labkit version")
        for r in rs:
            if r["student"] in where:
                raise ValueError(f"student {r['student']!r} is in two gradebooks: {where[r['student']]} and {gb}")
            where[r["student"]] = gb
            labs.add(r["lab"])
            rows.append(r)
    if len(labs) > 1:
        raise ValueError(f"the gradebooks grade different labs: {sorted(labs)}; merge one lab at a time")
    rows.sort(key=lambda r: r["student"])
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, _csv(header, rows))
    return out, rows


# ---------------------------------------------------------------- a forced run's students still to regrade
def _pending_path(out: Path, lab) -> Path:
    return out / f".pending-{lab.id}.json"


def read_pending(out: Path, lab) -> set[str]:
    """Students a forced run of ``lab`` was asked to regrade and had not finished (``grades/.pending-<lab>.json``:
    :mod:`labkit.teaching.grading.batch` resumes them)."""
    try:
        doc = json.loads(_pending_path(out, lab).read_text())
    except (OSError, json.JSONDecodeError):
        return set()
    return set(doc.get("students", [])) if isinstance(doc, dict) else set()


def write_pending(out: Path, lab, students) -> None:
    """Record (or, with none left, remove) the students a forced run still has to regrade."""
    path = _pending_path(out, lab)
    if students:
        atomic_write_text(path, json.dumps({"lab": lab.id, "students": sorted(students)}, indent=1))
    else:
        path.unlink(missing_ok=True)
