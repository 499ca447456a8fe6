"""The course map: every notebook, what it needs and how long it takes (``labkit/course.toml``).

Used by the index notebook (its map of chapters and labs), by the test harness (which notebooks to
execute, longest first, with which parameters and time limit) and by the grader.

Taught in the course index (``chapters/index.ipynb``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import tomllib

MANIFEST = Path(__file__).with_name("course.toml")
_NEEDS = ("cpu", "gpu:")
_STATUS = ("ready", "planned")


@dataclass(frozen=True)
class Entry:
    """One notebook of the course (see the field notes at the top of ``course.toml``)."""

    id: str
    path: str
    title: str
    kind: str
    needs: str = "cpu"
    nprocs: int = 1
    cpu_s: float = 60.0
    gpu_s: float = 60.0
    status: str = "planned"
    title_zh: str = ""
    part: str = ""
    params: dict = field(default_factory=dict)

    @property
    def gpus(self) -> int:
        """GPUs the notebook needs (0 = runs on a CPU-only machine)."""
        return int(self.needs.split(":")[1]) if self.needs.startswith("gpu:") else 0

    @property
    def ready(self) -> bool:
        return self.status == "ready"


@lru_cache(maxsize=4)
def _load(path: str) -> tuple[dict, tuple[Entry, ...]]:
    data = tomllib.loads(Path(path).read_text())
    entries = []
    seen = set()
    for raw in data.get("notebook", []):
        e = Entry(**raw)
        if e.id in seen:
            raise ValueError(f"{path}: notebook id {e.id!r} appears twice")
        seen.add(e.id)
        if not e.needs.startswith(_NEEDS):
            raise ValueError(f"{path}: {e.id}: needs={e.needs!r}; valid: 'cpu' or 'gpu:N'")
        if e.status not in _STATUS:
            raise ValueError(f"{path}: {e.id}: status={e.status!r}; valid: {_STATUS}")
        entries.append(e)
    return data.get("parts", {}), tuple(entries)


def notebooks(*, kind: str | None = None, ready_only: bool = False, manifest: Path = MANIFEST) -> list[Entry]:
    """Entries of the manifest, in course order; ``kind`` is "chapter", "lab", "index" or "glossary"."""
    _, entries = _load(str(manifest))
    out = [e for e in entries if (kind is None or e.kind == kind) and (e.ready or not ready_only)]
    return out


def entry(notebook_id: str, *, manifest: Path = MANIFEST) -> Entry:
    """The manifest entry of one notebook by id (e.g. ``"ch04"``, ``"lab01_baseline"``)."""
    for e in notebooks(manifest=manifest):
        if e.id == notebook_id:
            return e
    known = ", ".join(e.id for e in notebooks(manifest=manifest))
    raise ValueError(f"no notebook with id {notebook_id!r}; known ids: {known}")


def parts(*, manifest: Path = MANIFEST) -> dict[str, dict]:
    """The four parts of the course: folder name -> number, title, Chinese title."""
    return dict(_load(str(manifest))[0])


def table(*, manifest: Path = MANIFEST):
    """The course map as a pandas DataFrame (one row per notebook)."""
    import pandas as pd

    p = parts(manifest=manifest)
    rows = []
    for e in notebooks(manifest=manifest):
        rows.append({
            "id": e.id, "part": p.get(e.part, {}).get("number", ""), "title": e.title,
            "title_zh": e.title_zh, "kind": e.kind,
            "hardware": "CPU laptop or GPU" if e.gpus == 0 else f"{e.gpus} GPU(s)",
            "ranks on CPU": e.nprocs, "CPU minutes": round(e.cpu_s / 60, 1),
            "GPU minutes": round(e.gpu_s / 60, 1), "status": e.status, "path": e.path,
        })
    return pd.DataFrame(rows)
