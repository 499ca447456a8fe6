"""Every chapter follows chapters/TEMPLATE.md: header, parameters, prediction, questions, exercise, own-job box,
summary naming the labkit functions it calls, and a last cell that proves the work happened."""
from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("part*/ch*.ipynb"))
PARTS = {"part1_cognition": "Part I · Cognition", "part2_diagnosis": "Part II · Diagnosis",
         "part3_tuning": "Part III · Tuning", "part4_case_review": "Part IV · Scale-out and case reviews"}
ORDER = ["## Check yourself", "## Exercise (open)", "## On your own job", "## Summary"]


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def src(cell: dict) -> str:
    return "".join(cell["source"])


def labkit_names(code: str) -> set[str]:
    """Dotted names a code block reaches in labkit: `labkit.a.b`, and `m.f` after `from labkit import m`."""
    imported = {}
    for m in re.finditer(r"^from labkit(?:\.([\w.]+))? import ([^\n(]+)", code, re.M):
        base = "labkit" + (f".{m.group(1)}" if m.group(1) else "")
        for item in m.group(2).split(","):
            real, _, alias = (x.strip() for x in item.partition(" as "))
            if real:
                imported[alias or real] = f"{base}.{real}"
    found = {m.group(0).rstrip(".") for m in re.finditer(r"\blabkit(?:\.\w+)+", code)}
    for alias, full in imported.items():
        found.add(full)
        found |= {full + m.group(1) for m in re.finditer(rf"(?<![\w.]){re.escape(alias)}((?:\.\w+)+)", code)}
    return found


def _get(dotted: str):
    """The object a dotted name names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def resolves(dotted: str) -> bool:
    try:
        _get(dotted)
    except (ImportError, AttributeError):
        return False
    return True


def test_the_chapters_are_found():
    assert len(CHAPTERS) >= 14


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem[:4])
def test_header_and_parameters(path):
    cs = cells(path)
    head = src(cs[0])
    assert re.match(r"# Chapter \d+ — .+ \(.+\)\n", head), f"{path.name}: heading 'Chapter N — Title (中文)'"
    assert f"**{PARTS[path.parent.name]}.**" in head, f"{path.name}: the part line"
    assert "papermill" in head and "**You will learn to**" in head and re.search(r"^1\. ", head, re.M)
    assert "parameters" in cs[1].get("metadata", {}).get("tags", []), f"{path.name}: cell 2 is the parameters cell"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem[:4])
def test_sections_in_template_order(path):
    heads = [line for c in cells(path) if c["cell_type"] == "markdown"
             for line in src(c).splitlines() if line.startswith("## ")]
    pos = []
    for want in ORDER:
        hits = [i for i, h in enumerate(heads) if h.startswith(want)]
        assert hits, f"{path.name}: no {want!r} section"
        pos.append(hits[0])
    assert pos == sorted(pos), f"{path.name}: sections out of order {ORDER}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem[:4])
def test_a_prediction_is_asked_then_revealed(path):
    code = [src(c) for c in cells(path) if c["cell_type"] == "code"]
    asked = [i for i, s in enumerate(code) if "quiz.Prediction(" in s]
    revealed = [i for i, s in enumerate(code) if ".reveal(" in s]
    assert asked and revealed and min(asked) < max(revealed), f"{path.name}: predict, then measure"
    assert any(re.search(r"^my_prediction\w* = None", s, re.M) for s in code), f"{path.name}: learner's guess cell"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem[:4])
def test_own_job_box_names_real_labkit(path):
    box = next(src(c) for c in cells(path) if src(c).startswith("## On your own job"))
    blocks = re.findall(r"```python\n(.*?)```", box, re.S)
    assert blocks, f"{path.name}: the own-job box shows code"
    for block in blocks:
        ast.parse(block)
        names = labkit_names(block)
        assert names, f"{path.name}: the own-job code uses labkit"
        missing = sorted(n for n in names if not resolves(n))
        assert not missing, f"{path.name}: own-job code names {missing}, which labkit does not have"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem[:4])
def test_summary_names_the_functions_the_chapter_calls(path):
    cs = cells(path)
    summary = next(src(c) for c in cs if src(c).startswith("## Summary"))
    assert "**labkit functions used:**" in summary, f"{path.name}: summary lists labkit functions"
    listed = summary.split("**labkit functions used:**", 1)[1]
    code = "\n".join(src(c) for c in cs if c["cell_type"] == "code")
    called = {n for n in labkit_names(code) if resolves(n) and _is_labkit_callable(_get(n))}
    unlisted = sorted(n for n in called
                      if not re.search(rf"`[^`]*\b{re.escape(n.rsplit('.', 1)[-1])}\b[^`]*`", listed))
    assert not unlisted, f"{path.name}: calls {unlisted} but its summary does not name them"
    assert "assert " in src(cs[-1]) and "print(" in src(cs[-1]), f"{path.name}: last cell proves the work"


def _is_labkit_callable(obj) -> bool:
    """A function or class that labkit defines (not an exception, not a builtin method of a labkit constant)."""
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return False
    return callable(obj) and (getattr(obj, "__module__", None) or "").startswith("labkit")


def test_labkit_names_reads_imports_and_aliases():
    code = "from labkit.teaching import quiz, viz as v\nimport labkit\nquiz.check(q, 1)\nv.new_axes()\nlabkit.flops.preset('x')\n"
    assert labkit_names(code) >= {"labkit.teaching.quiz.check", "labkit.teaching.viz.new_axes", "labkit.flops.preset"}
    assert resolves("labkit.teaching.quiz.check") and not resolves("labkit.teaching.quiz.no_such_thing")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem[:4])
def test_every_chapter_stores_a_figure_and_no_error(path):
    """Issue #34: a picture in every chapter — at least one stored PNG or SVG output — and no stored error."""
    outs = [o for c in cells(path) if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outs if o.get("output_type") == "error"], f"{path.name}: a stored error"
    assert any({"image/png", "image/svg+xml"} & set(o.get("data", {})) for o in outs), \
        f"{path.name}: no stored figure (image/png or image/svg+xml): draw the chapter's idea from labkit's numbers"
