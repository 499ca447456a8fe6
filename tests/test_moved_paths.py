"""Every module path labkit 0.3 had still imports, with a DeprecationWarning naming its new home (until
labkit 0.4: ``labkit/_compat.py``), and nothing of the course itself — tests, benchmarks, scripts,
notebooks — uses an old path (ARCHITECTURE.md, issue #36)."""
from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
import sys
import warnings
from pathlib import Path

import pytest

from labkit import _compat

ROOT = Path(__file__).resolve().parents[1]


def _old_paths() -> dict[str, str]:
    """{old: new} for every module path that moved: each MOVED entry, and each file of a moved package."""
    out = dict(_compat.MOVED)
    for old, new in _compat.MOVED.items():
        package = importlib.import_module(f"labkit.{new}")
        if hasattr(package, "__path__"):
            for info in pkgutil.walk_packages(package.__path__, ""):
                out[f"{old}.{info.name}"] = f"{new}.{info.name}"
    return out


OLD = _old_paths()


def test_the_walk_sees_the_files_of_a_moved_package():
    """The walk is not just the table: a moved package's files are walked too (0.3's labkit.cases.bert)."""
    assert OLD["cases.bert"] == "teaching.cases.bert" and OLD["perf_validate.fit"] == "perf.validate.fit"
    assert len(OLD) > len(_compat.MOVED) + 20


@pytest.mark.parametrize("old", sorted(OLD))
def test_an_old_path_imports_the_new_module_and_names_it(old):
    new = OLD[old]
    for name in [m for m in sys.modules if m == f"labkit.{old}" or m.startswith(f"labkit.{old}.")]:
        sys.modules.pop(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = importlib.import_module(f"labkit.{old}")
    assert mod is importlib.import_module(f"labkit.{new}")
    assert mod.__name__ == f"labkit.{new}"          # the new home keeps its own name (pickles agree)
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert any(f"labkit.{new}" in s and "0.4" in s for s in said), said


@pytest.mark.parametrize("old", sorted(m for m in _compat.MOVED if "." not in m))
def test_an_old_top_level_attribute_still_resolves(old):
    """``import labkit; labkit.regress.compare`` — the attribute path a notebook of 0.3 used."""
    import labkit

    vars(labkit).pop(old, None)     # importing labkit.<old> once sets the attribute; the first access warns
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mod = getattr(labkit, old)
    assert mod is importlib.import_module(f"labkit.{_compat.MOVED[old]}")
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)


@pytest.mark.parametrize("module,name", sorted((m, n) for m, names in _compat.MOVED_NAMES.items() for n in names))
def test_a_name_that_moved_between_files_still_imports(module, name):
    new = _compat.MOVED_NAMES[module][name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = getattr(importlib.import_module(f"labkit.{module}"), name)
    assert got is getattr(importlib.import_module(f"labkit.{new}"), name)
    assert any(f"labkit.{new}.{name}" in str(w.message) for w in caught)


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_reader'"):
        importlib.import_module("labkit.trace.load").no_such_reader  # noqa: B018


def _sources() -> list[tuple[str, str]]:
    """(where, code) for every test, benchmark and script, and every notebook cell (code and markdown)."""
    out = []
    for folder in ("tests", "benchmarks", "scripts"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            if p.name != Path(__file__).name:
                out.append((str(p.relative_to(ROOT)), p.read_text()))
    for p in sorted([*(ROOT / "chapters").rglob("*.ipynb"), *(ROOT / "labs").rglob("*.ipynb")]):
        for i, cell in enumerate(json.loads(p.read_text())["cells"]):
            src = cell["source"]
            out.append((f"{p.relative_to(ROOT)} cell {i}", "".join(src) if isinstance(src, list) else src))
    return out


def _old_uses(code: str) -> set[str]:
    """Old paths a piece of code names: ``labkit.<old>`` dotted, or ``from labkit import <old>``."""
    keys = sorted(_compat.MOVED, key=len, reverse=True)
    tops = [m for m in keys if "." not in m]
    found = set(re.findall(r"(?<![\w.])labkit\.(" + "|".join(map(re.escape, keys)) + r")(?![\w])", code))
    for m in re.finditer(r"^\s*from labkit import \(?([^)\n]*)", code, re.M):
        found |= {n.split(" as ")[0].strip() for n in m.group(1).split(",")} & set(tops)
    for module, names in _compat.MOVED_NAMES.items():
        for m in re.finditer(rf"from labkit\.{re.escape(module)} import \(?([^)]*?)\)?$", code, re.M):
            found |= {f"{module}.{n.split(' as ')[0].strip()}" for n in m.group(1).split(",")} & {
                f"{module}.{n}" for n in names}
    return found


def test_the_scan_sees_an_old_path():
    """The scan can fail: each way of naming an old path is found."""
    assert _old_uses("from labkit import units, regress as r\n") == {"regress"}
    assert _old_uses("import labkit.diagnose.hang_workloads\n") == {"diagnose.hang_workloads"}
    assert _old_uses("x = labkit.tune_accum.measure()\nimport labkit.perf_validate.fit\n") == {"tune_accum",
                                                                                              "perf_validate"}
    assert _old_uses("from labkit.trace.load import load, read_rank\n") == {"trace.load.read_rank"}
    assert not _old_uses("from labkit.measure import regress\nlabkit.tuning.accumulation.x\n")


def test_no_test_benchmark_script_or_notebook_uses_an_old_path():
    used = {where: sorted(found) for where, code in _sources() if (found := _old_uses(code))}
    assert not used, f"old module paths in use (use the new homes of labkit/_compat.py): {used}"


def test_the_layer_table_names_no_old_module():
    """ARCHITECTURE.md's ```layers block speaks of today's modules only."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    names = re.search(r"```layers\n(.*?)```", text, re.S).group(1).split()
    stale = [n for n in names if n.rstrip(":") in _compat.MOVED]
    assert not stale, stale


def test_no_file_stays_at_an_old_path():
    """The old paths are answered by the finder, not by files left behind (a file would shadow nothing but
    would count as a module of the top level)."""
    left = [m for m in _compat.MOVED if (ROOT / "labkit" / Path(*m.split("."))).with_suffix(".py").exists()
            or (ROOT / "labkit" / Path(*m.split(".")) / "__init__.py").exists()]
    assert not left, left


def test_the_top_level_is_a_handful_of_files_and_packages():
    """Issue #36: at most 12 single-file modules at the top of labkit/, and no prefix family (x.py beside x_*.py)."""
    files = sorted(p.stem for p in (ROOT / "labkit").glob("*.py"))
    assert len(files) <= 12, files
    for folder in [ROOT / "labkit", *(p.parent for p in (ROOT / "labkit").rglob("__init__.py"))]:
        stems = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
        family = sorted(f"{a} + {b}" for a in stems for b in stems if b.startswith(a + "_") and not a.startswith("_"))
        assert not family, f"{folder.relative_to(ROOT)}: {family}"


def test_every_face_lists_its_names():
    """Each package's face (``__init__``) says its public API in ``__all__`` and each name resolves."""
    missing = []
    for init in sorted((ROOT / "labkit").rglob("__init__.py")):
        if init.parent.name in ("cli", "labkit"):      # the CLI's commands register; labkit's face is lazy
            continue
        tree = ast.parse(init.read_text())
        has_all = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
                      for n in tree.body)
        if not has_all:
            missing.append(str(init.relative_to(ROOT)))
    assert not missing, f"faces without __all__: {missing}"
    for pkg in ("model", "kernels", "measure", "data", "tuning", "teaching"):
        face = importlib.import_module(f"labkit.{pkg}")
        for name in face.__all__:
            assert getattr(face, name) is not None, f"labkit.{pkg}.{name}"
