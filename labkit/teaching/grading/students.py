"""Who submitted what: student ids from file names and a roster, late resubmissions, shards.

Where a submission's student comes from (:func:`origin_of`), first match wins:

==========  ======================================================================================
Canvas      "Download submissions" names each file ``<sortable name>_[LATE_]<user id>_<attachment
            id>_<file name>``; a student's second upload of the same file name gets ``-1``, the
            third ``-2`` (``bergana_LATE_12345_678901_lab01_baseline-1.ipynb``). The sortable name may
            hold underscores (``doe_jane_12345_678_lab01_baseline.ipynb`` -> doe_jane, user 12345).
Moodle      "Download all submissions" names each file ``<Full Name>_<participant id>_
            assignsubmission_file_<file name>``, or, with "Download submissions in folders", puts
            the file into a folder of that name (``Ana Berg_1234_assignsubmission_file/lab01.ipynb``).
file        anything else: ``alice.ipynb`` -> alice; nbgrader's ``<student>/<lab>/<lab>.ipynb`` ->
            the student folder.
==========  ======================================================================================

Without a roster the student id is the Canvas sortable name, the Moodle full name (spaces as
``_``) or the file-derived name. With a roster (:class:`Roster`, a CSV) the id is the roster's
``student_id``; a submission the roster does not know keeps its derived id and is marked
``not in roster`` (listed by ``labkit grade``, never dropped).

Several files of one student (:func:`resolve`): when they are uploads of one LMS account (same Canvas
user id or Moodle participant id), the latest wins — highest ``-N`` suffix, then newest mtime — and
the replaced files are noted; any other clash is an error naming both files.

Sharding (:func:`shard_of`): ``--shard i/N`` keeps the i-th of every N students in sorted id order.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path

from labkit import checks

_SAFE = re.compile(r"[^A-Za-z0-9_.\-]+")
# the sortable name is letters (``bergana``) or words joined by ``_`` (``doe_jane``, ``o-brien_sean``): the
# first ``_<digits>_<digits>_`` after it is the user id and attachment id (names hold no digits)
CANVAS = re.compile(r"^(?P<name>[^\W\d_](?:[^\W\d]|[-'])*?)_(?P<late>LATE_)?(?P<uid>\d+)_(?P<att>\d+)_(?P<file>.+?)"
                    r"(?:-(?P<n>\d+))?$")
MOODLE = re.compile(r"^(?P<name>.+?)_(?P<uid>\d+)_assignsubmission_file(?:_(?P<file>.*))?$")
ROSTER_COLUMNS = ("student_id", "name", "login", "canvas_id", "moodle_id")


def safe_id(text: str) -> str:
    """``text`` as a file-safe id: runs of characters other than letters, digits, ``_.-`` become ``_``."""
    return _SAFE.sub("_", text).strip("._") or "unnamed"


def _norm(text: str) -> str:
    return "".join(ch for ch in str(text).lower() if ch.isalnum())


@dataclass(frozen=True)
class Origin:
    """What a submission's path says about its author."""

    source: str            # "canvas" | "moodle" | "file"
    key: str               # Canvas user id, Moodle participant id, or the name taken from the path
    name: str              # the learner's name as the LMS wrote it (or the path-derived name)
    attempt: int = 0       # Canvas's -1, -2 ... suffix of a re-uploaded file
    late: bool = False     # Canvas's LATE_ marker


def student_of(path: Path, lab_id: str) -> str:
    """``alice.ipynb`` -> alice; nbgrader layout ``<student>/<lab>/<lab>.ipynb`` -> the student folder."""
    path = Path(path)
    name = path.stem
    if name == lab_id:
        for part in reversed(path.parent.parts):
            if part != lab_id:
                name = part
                break
    return safe_id(name)


def origin_of(path: Path, lab_id: str) -> Origin:
    """Parse ``path`` as a Canvas or Moodle export name, else as a plain / nbgrader path (module docstring)."""
    path = Path(path)
    m = CANVAS.match(path.stem)
    if m:
        return Origin("canvas", m["uid"], m["name"], int(m["n"] or 0), bool(m["late"]))
    for text in (path.stem, path.parent.name):
        m = MOODLE.match(text)
        if m:
            return Origin("moodle", m["uid"], m["name"])
    name = student_of(path, lab_id)
    return Origin("file", name, name)


@dataclass
class Student:
    """One student of a batch: the file graded, and how it was attributed."""

    id: str
    path: Path
    origin: Origin
    in_roster: bool | None = None            # None: no roster given
    replaced: list[Path] = field(default_factory=list)

    def info(self) -> dict:
        """What the feedback and gradebook record about the attribution."""
        return {"file": self.path.name, "source": self.origin.source, "lms_id": self.origin.key,
                "late": self.origin.late, "replaced": [p.name for p in self.replaced],
                "roster": "" if self.in_roster is None else ("matched" if self.in_roster else "not in roster")}


class Roster:
    """A class list (CSV with a header). Columns: ``student_id`` (required, the id in the gradebook),
    ``name`` (full name), ``login`` (user name / Canvas sortable name), ``canvas_id`` (Canvas user id),
    ``moodle_id`` (Moodle participant id); all but ``student_id`` optional, empty cells allowed."""

    def __init__(self, rows: list[dict], source: str = "roster"):
        self.rows = rows
        self.source = source
        self.ids = [r["student_id"] for r in rows]
        self._by: dict[tuple[str, str], str] = {}
        for r in rows:
            keys = [("canvas", r.get("canvas_id", "")), ("moodle", r.get("moodle_id", "")),
                    ("id", _norm(r["student_id"])), ("login", _norm(r.get("login", "")))]
            words = str(r.get("name", "")).replace(",", " ").split()
            if words:
                keys += [("name", _norm("".join(words))), ("name", _norm("".join(reversed(words))))]
            for kind, value in keys:
                if not value:
                    continue
                other = self._by.setdefault((kind, value), r["student_id"])
                if other not in (r["student_id"], None):
                    if kind != "name":
                        raise ValueError(f"{source}: {kind} {value!r} belongs to two students "
                                         f"({other!r} and {r['student_id']!r}); each must be unique")
                    self._by[(kind, value)] = None    # two students of one name: match them by id only

    @classmethod
    def load(cls, path) -> Roster:
        """Read a roster CSV; ValueError names the file, the row and what is wrong."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"roster {path} does not exist (a CSV with columns {', '.join(ROSTER_COLUMNS)})")
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in (reader.fieldnames or [])]
            for h in header:
                checks.one_of(f"roster {path.name} column", h, ROSTER_COLUMNS)
            if "student_id" not in header:
                raise ValueError(f"roster {path}: no student_id column (columns found: {header}; "
                                 f"valid: {list(ROSTER_COLUMNS)})")
            rows, seen = [], set()
            for i, raw in enumerate(reader, start=2):
                r = {k.strip(): (v or "").strip() for k, v in raw.items() if k}
                sid = r["student_id"]
                if not sid or safe_id(sid) != sid:
                    raise ValueError(f"roster {path} line {i}: student_id={sid!r}; use letters, digits, '_', '.', '-'")
                if sid in seen:
                    raise ValueError(f"roster {path} line {i}: student_id {sid!r} appears twice")
                seen.add(sid)
                rows.append(r)
        if not rows:
            raise ValueError(f"roster {path} lists no students")
        return cls(rows, str(path))

    def find(self, origin: Origin) -> str | None:
        """The roster student_id of ``origin``, or None when the roster does not know it."""
        tries = {"canvas": [("canvas", origin.key), ("login", _norm(origin.name)), ("name", _norm(origin.name))],
                 "moodle": [("moodle", origin.key), ("name", _norm(origin.name)), ("login", _norm(origin.name))],
                 "file": [("id", _norm(origin.key)), ("login", _norm(origin.key)), ("name", _norm(origin.key))]}
        for key in tries[origin.source]:
            if key[1] and self._by.get(key):
                return self._by[key]
        return None


def resolve(paths, lab_id: str, roster: Roster | None = None) -> dict[str, Student]:
    """Map submissions to students (module docstring): {student id: Student}, sorted by id."""
    out: dict[str, Student] = {}
    for p in paths:
        o = origin_of(p, lab_id)
        sid = roster.find(o) if roster else None
        st = Student(sid or safe_id(o.name), Path(p), o, None if roster is None else sid is not None)
        old = out.get(st.id)
        if old is None:
            out[st.id] = st
            continue
        same_account = old.origin.source == o.source != "file" and old.origin.key == o.key
        if not same_account:
            raise ValueError(f"two submissions map to student {st.id!r}: {old.path} and {p}; rename one "
                             "(or remove the one that should not be graded)")
        newer, older = sorted([old, st], key=lambda s: (s.origin.attempt, s.path.stat().st_mtime, s.path.name))[::-1]
        newer.replaced = sorted(set(old.replaced + st.replaced + [older.path]))
        out[st.id] = newer
    return dict(sorted(out.items()))


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/N"`` -> (i, N) with 1 <= i <= N; ValueError naming the value otherwise."""
    i, sep, n = str(text).partition("/")
    try:
        i_, n_ = int(i), int(n)
    except ValueError:
        i_ = n_ = 0
    if not sep or n_ < 1 or not 1 <= i_ <= n_:
        raise ValueError(f"shard={text!r} is not valid: use i/N with 1 <= i <= N, e.g. 1/4")
    return i_, n_


def shard_of(ids, shard: tuple[int, int] | None) -> list[str]:
    """The students of shard ``(i, N)``: every N-th id of the sorted ids, starting at the i-th."""
    ids = sorted(ids)
    if shard is None:
        return ids
    i, n = shard
    return ids[i - 1::n]
