"""Figures never depend on a CJK font (issue #27): where none is installed, matplotlib draws Chinese text as
boxes, so no figure text — titles, axis labels, legends, annotations — holds a CJK character; the Chinese
names stay in the Markdown and printed text around the figures. The hub image installs a CJK font anyway
(hub/Dockerfile, tests/test_hub_recipe.py), for the learner's own figures."""
from __future__ import annotations

import json
import re

from labkit.paths import repo_root

ROOT = repo_root()
CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef]")
DRAWS = re.compile(r"\b(set_title|suptitle|set_xlabel|set_ylabel|title|xlabel|ylabel|text|annotate|legend|"
                   r"set_xticklabels|set_yticklabels)\s*\(|\blabel\s*=")


def _code():
    for p in sorted(ROOT.glob("labkit/**/*.py")):
        yield str(p.relative_to(ROOT)), p.read_text()
    for p in sorted([*ROOT.glob("chapters/**/*.ipynb"), *ROOT.glob("labs/**/*.ipynb")]):
        for i, c in enumerate(json.loads(p.read_text())["cells"]):
            if c["cell_type"] == "code":
                yield f"{p.relative_to(ROOT)} cell {i}", "".join(c["source"])


def test_no_figure_text_needs_a_cjk_font():
    found = [f"{where}: {ln.strip()[:100]}" for where, text in _code() for ln in text.splitlines()
             if DRAWS.search(ln) and CJK.search(ln)]
    assert not found, "figure text with CJK characters (boxes without a CJK font):\n" + "\n".join(found)


def test_the_check_sees_cjk_figure_text():
    assert DRAWS.search('ax.set_title("吞吐量")') and CJK.search('ax.set_title("吞吐量")')
