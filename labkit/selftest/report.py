"""The self-check's report: JSON (every figure) and a Markdown summary, written as a recorded artefact.

Both files share one stem, ``selftest-<device>-<UTC time>`` (``-2``, ``-3`` … when that stem is taken):
a report is never overwritten, so a folder of reports is a history that can be committed. Each file
is written to a temporary file in the same folder and then hard-linked to its final name, which fails
rather than replace an existing file — a reader sees either no file or the whole one.

Taught in chapter 14 (a run record that explains its number) and chapter 7 (timing).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

__all__ = ["to_markdown", "write_report", "check_out_dir", "default_out_dir", "MAX_STEMS"]

MAX_STEMS = 1000        # -2 … -999: beyond that the folder is not a history but a loop gone wrong
_MARK = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP"}


def default_out_dir() -> Path:
    """``build/selftest`` in the labkit checkout (or in the current folder outside one)."""
    from labkit.paths import repo_root

    try:
        return repo_root() / "build" / "selftest"
    except FileNotFoundError:
        return Path.cwd() / "build" / "selftest"


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e6 else f"{v:.4e}"
    if isinstance(v, int) and abs(v) >= 10**6:
        return f"{v:,}"
    return str(v)


def _key_figures(c: dict, n: int = 3) -> str:
    keys = {"meter_cuda_events": ("events_over_wall", "host_launch_share", "step_median_ms"),
            "matmul_peak": ("measured_tflops", "fraction_of_catalogue"),
            "nccl_collectives": ("nranks", "all_reduce_busbw_GBps"),
            "ddp_train": ("nranks", "step_median_ms", "loss_last"),
            "fsdp2_train": ("nranks", "step_median_ms", "loss_last"),
            "memory_model": ("measured_over_predicted",),
            "mfu_reference": ("mfu", "n_params", "tokens_per_s")}.get(c["name"])
    figs = c.get("figures") or {}
    pick = [k for k in (keys or figs) if k in figs][:n]
    return ", ".join(f"{k} {_fmt(figs[k])}" for k in pick)


def to_markdown(report: dict) -> str:
    """The report as Markdown: who recorded it where and when, versions, one row per check, details.

    Taught in chapter 14 (a record that explains its number)."""
    s = report["summary"]
    v = report.get("versions", {})
    lines = [f"# labkit GPU self-check: {report['device']}", "",
             f"Recorded by `{report['recorded_by']}` on **{report['device']}** "
             f"(× {report['n_devices']}) at {report['date']}"
             + (" with `--quick`" if report.get("quick") else "") + ".", "",
             f"**{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped** in "
             f"{report['wall_s']:.0f} s (total budget {report['total_budget_s']:.0f} s).", "",
             "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if k != "platform")
             + (f"; platform {v['platform']}" if "platform" in v else "") + ".", "",
             "| check | verdict | seconds / budget | chapters | key figures |",
             "| --- | --- | --- | --- | --- |"]
    for c in report["checks"]:
        lines.append(f"| `{c['name']}` | {_MARK.get(c['status'], c['status'])} | {c['seconds']:.1f} / "
                     f"{c['budget_s']:.0f} | {c['chapters']} | {_key_figures(c)} |")
    lines.append("")
    for c in report["checks"]:
        lines += [f"## `{c['name']}` — {c['title']}: {_MARK.get(c['status'], c['status'])}", ""]
        if c.get("reason"):
            lines += [f"{c['reason']}", ""]
        if c.get("error"):
            lines += ["```text", c["error"], "```", ""]
        figs = c.get("figures") or {}
        if figs:
            lines += [f"- {k}: {_fmt(val)}" for k, val in figs.items()] + [""]
    return "\n".join(lines)


def _slug(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()
    return s[:40] or "device"


def _stem(report: dict) -> str:
    date = re.sub(r"[^0-9T]", "", report["date"].split("+")[0])[:15]      # 20250101T120000
    return f"selftest-{_slug(report['device'])}-{date}Z" + ("-quick" if report.get("quick") else "")


def _write_new(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` atomically, only if ``path`` does not exist; False when it does."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".selftest-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)          # atomic, and never replaces an existing file
        except FileExistsError:
            return False
        return True
    finally:
        os.unlink(tmp)


def check_out_dir(out_dir) -> Path:
    """``out_dir`` as a Path, refused (ValueError naming it) when it exists and is not a folder."""
    p = Path(out_dir)
    if p.exists() and not p.is_dir():
        raise ValueError(f"--out {p} is a file, not a folder: give a folder for the report")
    return p


def write_report(report: dict, out_dir=None) -> tuple[Path, Path]:
    """Write ``report`` as ``<stem>.json`` and ``<stem>.md`` in ``out_dir`` (created if missing) and
    return both paths; an existing report is never overwritten (the stem gains ``-2``, ``-3`` …).

    Taught in chapter 14 (the run record)."""
    out = check_out_dir(default_out_dir() if out_dir is None else out_dir)
    out.mkdir(parents=True, exist_ok=True)
    body = json.dumps(report, indent=2, default=str) + "\n"
    md = to_markdown(report) + "\n"
    stem = _stem(report)
    for i in range(1, MAX_STEMS):
        name = stem if i == 1 else f"{stem}-{i}"
        js, mdp = out / f"{name}.json", out / f"{name}.md"
        if mdp.exists() or not _write_new(js, body):
            continue
        if _write_new(mdp, md):
            return js, mdp
        js.unlink()                         # the Markdown name was taken meanwhile: try the next stem
    raise ValueError(f"--out {out}: {MAX_STEMS - 1} reports named {stem}* already exist; use another folder")
