"""The class report: ``DIR/summary.md`` and ``DIR/summary.png`` of a graded lab, from its records alone.

``labkit grade`` writes both at the end of every run (:func:`write_summary`); they are rebuilt from
``DIR/gradebook.csv`` (who is graded, each question's points) and ``DIR/feedback/<student>.json`` (each
check's result, what ran, the families named), so ``python -m labkit.teaching.grading.summary DIR`` — or
:func:`write_summary` — remakes them after a merge, a regrade or an edit, without running anything.

What it says, per lab:

- per question: how many submissions earned full marks (pass rate), some of the points, none, and the mean;
- the failed checks ranked by how many submissions failed them, each with its most frequent messages
  (numbers written as ``#`` and quoted values as ``'…'``, so "q2: 0.31 is not …" and "q2: 0.27 is not …" count
  as one; a check that failed on another question's evidence said as its own question's, as in the feedback);
- the wrong bottleneck families named (lab02 q3, lab12 q1): the family an answer named (recorded by the
  grader from the answer's ``family`` key) when a check of that question about the family failed, and how often;
- submissions that timed out (the notebook's time limit, or a cell's) with, per question, whether its answer
  cell finished and the points it earned: the executor keeps going past a failing cell and the checks run on
  whatever evidence was recorded, so a notebook stopped in q3 keeps q1 and q2's points;
- identical submissions (same bytes: copied notebooks) and copies of the instructor's source;
- statuses (unreadable, wrong-lab, …) and the records not graded to the end (a grader error, labkit modified
  on disk during the run: not in the gradebook; regraded on the next run).

Nothing here decides a point: the scores are the gradebook's, the report counts them.

Taught in the instructor notes of the labs (``labs/README.md``, "The class report").
"""
from __future__ import annotations

import csv
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from labkit.record import atomic_write_text
from labkit.teaching.grading.feedback import row_messages
from labkit.teaching.grading.gradebook import FIXED_COLUMNS

__all__ = ["answer_facts", "load", "summarize", "render", "plot", "write_summary"]

_NUM = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?!\w)")
_QUOTED = re.compile(r"'[^'\n]{0,60}'")
_FAMILY_MSG = re.compile(r"'([^'\n]{1,60})' is not the family")


def load(out) -> tuple[list[str], list[dict], dict[str, dict]]:
    """The question ids, the gradebook rows of ``out`` and every feedback record (complete or not) by student."""
    out = Path(out)
    gb = out / "gradebook.csv"
    if not gb.is_file():
        raise FileNotFoundError(f"{gb} does not exist: give the --out folder of a labkit grade run")
    with open(gb, newline="") as f:
        reader = csv.DictReader(f)
        rows = [dict(r) for r in reader]
        header = list(reader.fieldnames or [])
    if header[:len(FIXED_COLUMNS)] != FIXED_COLUMNS or "status" not in header:
        raise ValueError(f"{gb} is not a labkit gradebook: its columns are {header[:8]}")
    qids = header[len(FIXED_COLUMNS):header.index("status")]
    records = {}
    for p in sorted((out / "feedback").glob("*.json")):
        try:
            fb = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(fb, dict) and fb.get("student"):
            records[str(fb["student"])] = fb
    return qids, rows, records


def answer_facts(lab, work_root, limit_bytes: int = 2**20) -> dict:
    """Question → ``{"family": …}`` for each recorded answer of ``lab`` under ``work_root`` that names a
    bottleneck family (``answer["family"]``: lab02 q3, lab12 q1). The grader keeps it in the feedback record so
    this report can name the wrong families without the work folders. Learner-written data: read with a size
    limit, truncated, never used for a point."""
    facts = {}
    for q in lab.questions:
        path = Path(work_root) / "evidence" / lab.id / f"{q.id}.json"
        try:
            if path.stat().st_size > limit_bytes:
                continue
            ans = json.loads(path.read_text()).get("answer")
        except (OSError, ValueError, AttributeError, RecursionError):
            continue
        if isinstance(ans, dict) and isinstance(ans.get("family"), str):
            facts[q.id] = {"family": ans["family"][:60]}
    return facts


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


def _pattern(qid: str, check: dict, qids) -> str:
    """A failed check's message as a pattern: said as ``qid``'s (:func:`~labkit.teaching.grading.feedback.row_messages`),
    numbers as ``#``, quoted values as ``'…'`` — so one check's failures group by what went wrong."""
    text = (row_messages(qid, [dict(check, passed=False)], "message", questions=qids) or ["check failed"])[0]
    return _QUOTED.sub("'…'", _NUM.sub("#", text))[:200]


def _stopped(fb: dict) -> str:
    """What stopped the notebook, in words: the notebook's time limit (and in which cell), or a cell's."""
    ex = fb.get("execution") or {}
    cells = ex.get("cells") or []
    if ex.get("deadline_hit"):
        said = str(ex.get("stopped") or "")
        where = next((c for c in cells if c.get("stopped")), None)
        return ((said if "time limit" in said else "notebook time limit reached")
                + (f" during cell {where.get('id') or where.get('index')}" if where else ""))
    cell = next((c for c in cells if c.get("timed_out")), None)
    if cell:
        return f"cell {cell.get('id') or cell.get('index')} hit the cell time limit"
    return str(ex.get("stopped") or "a cell timed out")


def _finished(cells: list[dict]) -> bool:
    return bool(cells) and all(c.get("executed") and not c.get("error") and not c.get("timed_out")
                               and not c.get("stopped") for c in cells)


def timed_out(fb: dict) -> bool:
    """Whether the notebook of ``fb`` was stopped by its time limit or a cell's."""
    ex = fb.get("execution") or {}
    return bool(ex.get("deadline_hit") or ex.get("cells_timed_out") or "time limit" in str(ex.get("stopped") or ""))


def wrong_families(fb: dict) -> dict[str, str]:
    """Question → the family its answer named, for each question whose family check failed."""
    out = {}
    for qid, q in (fb.get("questions") or {}).items():
        failed = [str(c.get("message", "")) for c in q.get("checks", []) if not c.get("passed")]
        named = ((fb.get("answers") or {}).get(qid) or {}).get("family")
        if named and any("family" in m and (repr(named) in m or f'"{named}"' in m) for m in failed):
            out[qid] = named                        # the check that refused the family names it
            continue
        for m in failed:                            # records written before answers were kept
            hit = _FAMILY_MSG.search(m)
            if hit:
                out[qid] = hit.group(1)
                break
    return out


def summarize(out) -> dict:
    """The class report of ``out`` as data (what :func:`render` and :func:`plot` show)."""
    qids, rows, records = load(out)
    labs = sorted({r.get("lab") for r in rows if r.get("lab")})
    if len(labs) > 1:
        raise ValueError(f"{out}: the gradebook mixes labs {labs}; grade one lab per --out folder")
    graded = [records.get(r["student"], {}) for r in rows]
    maxes = {q: max((_float(((fb.get("questions") or {}).get(q) or {}).get("max_score")) for fb in graded),
                    default=0.0) for q in qids}
    n = len(rows)
    questions = []
    for q in qids:
        pts = [_float(r.get(q)) for r in rows]
        full = sum(1 for p in pts if maxes[q] and p >= maxes[q] - 1e-9)
        zero = sum(1 for p in pts if p <= 1e-9)
        questions.append({"id": q, "max": maxes[q], "full": full, "some": n - full - zero, "none": zero,
                          "pass_rate": full / n if n else 0.0, "mean": sum(pts) / n if n else 0.0})
    checks: dict[str, dict] = {}
    families: dict[str, dict] = defaultdict(lambda: {"count": 0, "students": [], "questions": set()})
    timeouts, copies = [], defaultdict(list)
    for r, fb in zip(rows, graded, strict=True):
        st = r["student"]
        if fb.get("submission_sha256"):
            copies[fb["submission_sha256"]].append(st)
        if r.get("status") != "graded":
            continue
        for qid, q in (fb.get("questions") or {}).items():
            for c in q.get("checks", []):
                e = checks.setdefault(c.get("id", "?"), {"id": c.get("id", "?"), "question": qid, "failed": 0,
                                                          "ran": 0, "messages": Counter()})
                e["ran"] += 1
                if not c.get("passed"):
                    e["failed"] += 1
                    e["messages"][_pattern(qid, c, qids)] += 1
        for qid, fam in wrong_families(fb).items():
            families[fam]["count"] += 1
            families[fam]["students"].append(st)
            families[fam]["questions"].add(qid)
        if timed_out(fb):
            per_q = {}
            for qid, q in (fb.get("questions") or {}).items():
                per_q[qid] = {"finished": _finished(q.get("answer_cells") or []), "score": _float(q.get("score")),
                              "max": _float(q.get("max_score"))}
            timeouts.append({"student": st, "score": _float(r.get("score")), "max": _float(r.get("max_score")),
                             "stopped": _stopped(fb),
                             "questions": per_q,
                             "finished_points": sum(v["score"] for v in per_q.values() if v["finished"])})
    ranked = sorted((c for c in checks.values() if c["failed"]), key=lambda c: (-c["failed"], c["question"], c["id"]))
    for c in ranked:
        c["messages"] = c["messages"].most_common()
    scores = [_float(r.get("score")) for r in rows]
    return {
        "lab": labs[0] if labs else None, "n": n, "max_score": _float(rows[0].get("max_score")) if rows else 0.0,
        "mean": sum(scores) / n if n else 0.0, "median": sorted(scores)[n // 2] if n else 0.0,
        "scores": scores, "status": dict(Counter(r.get("status") for r in rows)),
        "graded_from": min((r["timestamp"] for r in rows if r.get("timestamp")), default=None),
        "graded_to": max((r["timestamp"] for r in rows if r.get("timestamp")), default=None),
        "questions": questions, "failed_checks": ranked,
        "families": sorted(({"family": f, "count": v["count"], "students": sorted(v["students"]),
                             "questions": sorted(v["questions"])} for f, v in families.items()),
                           key=lambda x: (-x["count"], x["family"])),
        "timed_out": sorted(timeouts, key=lambda t: t["student"]),
        "identical": sorted(sorted(v) for v in copies.values() if len(v) > 1),
        "source_copies": sorted(r["student"] for r in rows if r.get("source_copy")),
        "incomplete": sorted(f"{s} ({fb.get('status')})" for s, fb in records.items() if not fb.get("complete")
                             and fb.get("lab") in (None, *labs) and s not in {r["student"] for r in rows}),
    }


def _md(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _names(names, limit: int = 8) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _section(title: str, head: list[str], rows: list[list], empty: str | None = None) -> list[str]:
    """A ``## title`` section of the report: a Markdown table of ``rows`` under ``head``, or ``empty`` (if
    given) when there are none."""
    lines = ["", f"## {title}", ""]
    if not rows and empty is not None:
        return lines + [empty]
    return lines + ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(str(x) for x in r) + " |" for r in rows]


def render(s: dict, figure: str | None = "summary.png") -> str:
    """The Markdown of a :func:`summarize` result."""
    n = s["n"]
    lines = [f"# {s['lab']}: class report", ""]
    if not n:
        return "\n".join(lines + ["No graded submission in the gradebook yet.", ""])
    lines += [f"{n} submissions, graded {s['graded_from']} – {s['graded_to']} (UTC). Score: mean "
              f"{s['mean']:.2f}, median {s['median']:g} of {s['max_score']:g}. Status: "
              + ", ".join(f"{k} {v}" for k, v in sorted(s["status"].items(), key=lambda kv: str(kv[0]))) + "."]
    if figure:
        lines += ["", f"![pass rates and failed checks]({figure})"]
    lines += _section("Questions", ["question", "points", "full marks (pass rate)", "some", "none", "mean points"],
                      [[q["id"], f"{q['max']:g}", f"{q['full']} ({q['pass_rate']:.0%})", q["some"], q["none"],
                        f"{q['mean']:.2f}"] for q in s["questions"]])

    def why(c):
        said = "; ".join(f"{m} ({k}×)" for m, k in c["messages"][:3])
        return said + (f"; {len(c['messages']) - 3} other message(s)" if len(c["messages"]) > 3 else "")

    lines += _section("Failed checks, most failed first",
                      ["check", "question", "failed", "why, most frequent first (numbers as #, quoted values as '…')"],
                      [[_md(c["id"]), c["question"], f"{c['failed']} of {c['ran']}", _md(why(c))]
                       for c in s["failed_checks"]], "Every check passed in every graded submission.")
    lines += _section("Wrong bottleneck families named", ["family named", "times", "question", "students"],
                      [[_md(f["family"]), f["count"], ", ".join(f["questions"]), _md(_names(f["students"]))]
                       for f in s["families"]], "None (no answer named a family its check refused).")
    lines += _section("Timed out (points from the cells that finished)",
                      ["student", "score", "finished questions (points)", "unfinished", "stopped"],
                      [[_md(t["student"]), f"{t['score']:g} / {t['max']:g}",
                        ", ".join(f"{q} ({v['score']:g}/{v['max']:g})" for q, v in t["questions"].items()
                                  if v["finished"]) or "—",
                        ", ".join(q for q, v in t["questions"].items() if not v["finished"]) or "—",
                        _md(t["stopped"])] for t in s["timed_out"]], "None.")
    lines += ["", "## Copies", ""]
    lines += [f"- identical notebooks: {_md(_names(g))}" for g in s["identical"]] or ["- no two notebooks identical"]
    if s["source_copies"]:
        lines.append(f"- the instructor's source or its solutions: {_md(_names(s['source_copies']))}")
    if s["incomplete"]:
        lines += ["", "Not graded to the end (not in the gradebook; the next run regrades them): "
                      f"{_md(_names(s['incomplete']))}"]
    return "\n".join(lines) + "\n"


def plot(s: dict, path) -> Path:
    """``path`` (PNG): per-question pass rate and mean share of points; the failed checks ranked."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=[1, 1.3])
    qs = s["questions"]
    x = range(len(qs))
    ax.bar([i - 0.2 for i in x], [100 * q["pass_rate"] for q in qs], 0.4, label="full marks (pass rate)")
    ax.bar([i + 0.2 for i in x], [100 * q["mean"] / q["max"] if q["max"] else 0 for q in qs], 0.4,
           label="mean points, % of max")
    ax.set_xticks(list(x), [q["id"] for q in qs])
    ax.set_ylim(0, 105)
    ax.set_ylabel("% of submissions / of points")
    ax.set_title(f"{s['lab']}: {s['n']} submissions, mean {s['mean']:.2f} / {s['max_score']:g}")
    ax.legend(loc="lower left", fontsize=8)
    top = s["failed_checks"][:10][::-1]
    bx.barh(range(len(top)), [c["failed"] for c in top], color="tab:red")
    bx.set_yticks(list(range(len(top))), [f"{c['id']} ({c['question']})" for c in top], fontsize=8)
    bx.set_xlabel("submissions that failed it")
    bx.set_title("failed checks, most failed on top" if top else "no check failed")
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=100)
    tmp.replace(path)
    return path


def write_summary(out, lab=None, figure: bool = True) -> Path:
    """Write ``out/summary.md`` (and ``out/summary.png`` unless ``figure=False``) from the gradebook and the
    feedback records of ``out``; returns the Markdown's path. ``lab`` (a Lab or id), if given, must be the
    gradebook's lab."""
    out = Path(out)
    s = summarize(out)
    want = getattr(lab, "id", lab)
    if want is not None and s["lab"] is not None and s["lab"] != want:
        raise ValueError(f"{out}/gradebook.csv grades {s['lab']}, not {want}")
    if s["lab"] is None and want is not None:
        s["lab"] = want
    png = None
    if figure and s["n"]:
        png = plot(s, out / "summary.png").name
    path = out / "summary.md"
    atomic_write_text(path, render(s, png))
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m labkit.teaching.grading.summary DIR   (the --out folder of labkit grade)", file=sys.stderr)
        return 2
    try:
        path = write_summary(argv[0])
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
