"""Workload tickets: a lab's hidden fault drawn from a learner's seed with the instructor's key (labs 2, 8, 9 and 12).

A lab whose answer is a hidden fault (lab 12's bottleneck, lab 8's slow loader, lab 9's hung rank) draws it from what the learner's
parameters cell holds. A bare number (``SEED = 3``) is a *practice* workload: anyone can reproduce its draw, so a
grader given a key refuses it. A **ticket** (``SEED = "3-5e0c1a9b77d2"``) is a seed and a tag, the tag an
HMAC-SHA256 of the lab and the seed under the instructor's key (RFC 2104; Python's :mod:`hmac`): the course
holds no key and no seed → fault table, a learner cannot mint a ticket of another seed, and only the grader,
given the key (``labkit grade --key-file``), can check that a submission ran the ticket its student was given.
The key goes to ``labkit release LAB --key-file KEY --tickets FILE`` (which writes the tickets, outside the
released folder) and to ``labkit grade``; never into a released notebook.

The learner's own process must inject its own fault, so it can always read it by inspecting labkit's code —
which is why every graded point rests on the learner's recorded runs (re-derived by the grader), not on
secrecy: a family named without the trace that shows it, or a fix without its A/B, earns nothing.

Taught in lab 12 (and lab 8): the instructor's notes in ``labs/README.md``.
"""
from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

__all__ = ["KEYED_LABS", "keyed_lab", "issue", "parse", "verify", "read_key", "write_tickets"]

KEYED_LABS = ("lab02_profiler", "lab08_data_pipeline", "lab09_collectives", "lab12_capstone")      # labs whose hidden fault a ticket draws
# what a practice seed's draw hashes (lab 12's kept from before tickets: seed 0, the course's CI seed, stays the slow
# loader and the stored outputs stay true)
_PRACTICE = {"lab12_capstone": "labkit-capstone", "lab08_data_pipeline": "labkit-lab08", "lab02_profiler": "labkit-mystery-run",
             "lab09_collectives": "labkit-lab09-hang"}
TAG_HEX = 12                                                # 48 bits of HMAC: not guessable by trying
_TICKET = re.compile(rf"^(\d{{1,9}})-([0-9a-f]{{{TAG_HEX}}})$")


def keyed_lab(lab: str) -> str:
    """``lab`` if a ticket draws its hidden fault (:data:`KEYED_LABS`); else a ValueError naming them. Taught in lab 12."""
    if lab not in KEYED_LABS:
        raise ValueError(f"lab={lab!r} draws no hidden fault from a key; the labs that do: {list(KEYED_LABS)}")
    return lab


def _tag(key: str, lab: str, seed: int) -> str:
    return hmac.new(key.encode(), f"{lab}:{seed}".encode(), hashlib.sha256).hexdigest()[:TAG_HEX]


def issue(key: str, lab: str, seed: int) -> str:
    """The ticket of ``seed`` in ``lab`` under the instructor's ``key`` (``"SEED-TAG"``). Taught in lab 12."""
    if not isinstance(key, str) or len(key) < 16:
        raise ValueError("key must be a string of at least 16 characters (the instructor's secret)")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 10**9:
        raise ValueError(f"seed={seed!r}; must be an integer in [0, 10**9)")
    return f"{seed}-{_tag(key, keyed_lab(lab), seed)}"


def parse(ticket) -> tuple[int, str | None]:
    """(seed, tag) of a ticket ``"SEED-TAG"``, or (seed, None) of a practice seed (a bare integer ≥ 0).
    Taught in lab 12."""
    if isinstance(ticket, int) and not isinstance(ticket, bool):
        if ticket < 0:
            raise ValueError(f"seed={ticket!r}; must be >= 0, or a ticket 'SEED-TAG' from your instructor")
        return ticket, None
    m = _TICKET.match(ticket) if isinstance(ticket, str) else None
    if not m:
        raise ValueError(f"seed={ticket!r} is neither a practice seed (an integer >= 0) nor a ticket "
                         f"'SEED-TAG' (digits, '-', {TAG_HEX} hex digits) from your instructor")
    return int(m.group(1)), m.group(2)


def verify(key: str, lab: str, ticket) -> int:
    """The seed of ``ticket`` if ``key`` issued it for ``lab``; else a ValueError saying why (a practice seed, or
    a tag this key did not make). The grader's check. Taught in lab 12."""
    seed, tag = parse(ticket)
    if tag is None:
        raise ValueError(f"{ticket!r} is a practice seed: this course is graded on the tickets your instructor "
                         "issued ('SEED-TAG')")
    if not hmac.compare_digest(tag, _tag(key, keyed_lab(lab), seed)):
        raise ValueError(f"ticket {ticket!r} was not issued by this course's key for {lab}")
    return seed


def digest(lab: str, ticket) -> int:
    """64 bits that ``ticket`` (or a practice seed) draws in ``lab``: SHA-256 of the lab and the ticket (the tag
    carries the key's secret, so without the key no table of seeds can be made)."""
    seed, tag = parse(ticket)
    text = f"{_PRACTICE[keyed_lab(lab)]}:{seed}" if tag is None else f"{lab}:{seed}-{tag}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def draw(lab: str, ticket, n: int) -> int:
    """Index in ``range(n)`` that ``ticket`` (or a practice seed) draws in ``lab`` (:func:`digest` mod ``n``)."""
    return digest(lab, ticket) % n


def read_key(path) -> str:
    """The instructor's key from ``path``: its text, stripped; at least 16 characters, one line. Taught in lab 12."""
    p = Path(path)
    try:
        key = p.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"key file {p}: cannot be read as text ({e.__class__.__name__})") from None
    if len(key) < 16 or "\n" in key:
        raise ValueError(f"key file {p}: must hold one line of at least 16 characters (e.g. `python -c \"import "
                         "secrets; print(secrets.token_hex(16))\" > course.key`)")
    return key


def write_tickets(key: str, lab: str, seats: int, path, *, release_dir=None) -> Path:
    """Write ``seat,seed,ticket`` rows for seeds ``0..seats-1`` of ``lab`` to the CSV ``path`` (new file only,
    never inside ``release_dir``: a ticket is what a learner's parameters cell holds, the table is the
    instructor's). Taught in lab 12."""
    if isinstance(seats, bool) or not isinstance(seats, int) or not 1 <= seats <= 100_000:
        raise ValueError(f"seats={seats!r}; must be an integer in [1, 100000]")
    out = Path(path).resolve()
    if release_dir is not None and out.is_relative_to(Path(release_dir).resolve()):
        raise ValueError(f"tickets file {out} is inside the released folder {release_dir}: keep it out of what "
                         "learners get")
    if out.exists():
        raise ValueError(f"tickets file {out} exists: it is not overwritten (name a new file)")
    rows = ["seat,seed,ticket"] + [f"{i + 1},{i},{issue(key, lab, i)}" for i in range(seats)]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "x") as f:
        f.write("\n".join(rows) + "\n")
    return out
