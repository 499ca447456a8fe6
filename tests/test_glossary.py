"""datasets/glossary.csv: complete rows, unique terms, and chapters that exist in the manifest."""
import pandas as pd

from labkit import course, paths


def test_glossary_terms_point_at_real_chapters():
    terms = pd.read_csv(paths.dataset("glossary.csv"))
    assert len(terms) >= 50
    assert list(terms.columns) == ["term_en", "term_zh", "definition", "chapter"]
    assert not terms.isna().any().any()
    assert terms["term_en"].is_unique and terms["term_zh"].is_unique
    ids = {e.id for e in course.notebooks()}
    unknown = sorted(set(terms["chapter"]) - ids)
    assert not unknown, f"glossary cites chapters not in labkit/course.toml: {unknown}"
    # every Chinese term carries at least one CJK character
    assert terms["term_zh"].map(lambda s: any("\u4e00" <= ch <= "\u9fff" for ch in s)).all()


def test_stored_glossary_links_only_to_notebooks_that_exist():
    import json
    import re

    nb_path = paths.repo_root() / "chapters" / "glossary.ipynb"
    nb = json.loads(nb_path.read_text())
    text = "".join("".join(o.get("data", {}).get("text/markdown", "")) + "".join(o.get("text", ""))
                   for c in nb["cells"] for o in c.get("outputs", []))
    targets = re.findall(r"\]\(([^)\s]+\.ipynb)\)", text)
    assert targets, "the stored glossary shows no chapter links"
    missing = sorted({t for t in targets if not (nb_path.parent / t).is_file()})
    assert not missing, f"glossary links to notebooks that do not exist: {missing}"
