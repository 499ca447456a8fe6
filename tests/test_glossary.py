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
