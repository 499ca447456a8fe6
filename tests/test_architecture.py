"""The layout ARCHITECTURE.md documents holds: no module imports upward across the layers, no import
cycles, no file over 450 lines, one training loop (the old module names: tests/test_moved_paths.py)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "labkit"
MAX_LINES = 450


def _layers() -> dict[str, int]:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "ARCHITECTURE.md must hold the ```layers block the test reads"
    out = {}
    for line in block.group(1).strip().splitlines():
        level, names = line.split(":", 1)
        for name in names.split():
            out[name] = int(level)
    return out


LAYERS = _layers()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    """Layer of ``labkit.x.y``: the longest documented prefix of ``x.y`` (the bare package is ``labkit``)."""
    rel = module.split(".", 1)[1] if "." in module else "labkit"
    parts = rel.split(".")
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in LAYERS:
            return LAYERS[key]
    raise AssertionError(f"{module} is in no layer of ARCHITECTURE.md: add it to the ```layers block")


def _imports(path: Path, module: str) -> set[str]:
    """Every labkit module ``path`` imports, at the top or inside functions (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "labkit")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.rsplit(".", node.level - 1)[0] if node.level > 1 else pkg
                src = f"{base}.{node.module}" if node.module else base
            else:
                src = node.module or ""
            if src.split(".")[0] != "labkit":
                continue
            for a in node.names:          # `from labkit import trace` imports the module labkit.trace
                sub = f"{src}.{a.name}"
                found.add(sub if _is_module(sub) else src)
    found.discard(module)
    return found


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PKG.rglob("*.py")):
        mod = _module_name(path)
        graph[mod] = {m for m in _imports(path, mod) if _is_module(m)}
    return graph


GRAPH = _graph()


def test_every_module_is_in_a_layer_and_imports_only_downward():
    upward = []
    for mod, deps in GRAPH.items():
        for dep in deps:
            if _layer(dep) > _layer(mod):
                upward.append(f"{mod} (layer {_layer(mod)}) imports {dep} (layer {_layer(dep)})")
    assert not upward, "imports against the layers of ARCHITECTURE.md:\n" + "\n".join(sorted(upward))


def test_no_import_cycles():
    """Package faces (``__init__``) import their files, so a file that imports its own face is a cycle."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(GRAPH.get(m, ())):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    # a face importing a parent package's face is how Python imports packages, not a cycle of ours
    cycles = [c for c in cycles if not _only_parents(c)]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _only_parents(cycle: str) -> bool:
    mods = cycle.split(" -> ")
    return all(b.startswith(a + ".") or a.startswith(b + ".") for a, b in zip(mods, mods[1:], strict=False))


def test_the_checker_sees_an_upward_import(tmp_path):
    """The layer check can fail: an estimator importing the trainer is caught."""
    fake = tmp_path / "labkit" / "flops.py"
    fake.parent.mkdir()
    fake.write_text("def f():\n    from labkit.train import run\n")
    deps = _imports(fake, "labkit.flops")
    assert "labkit.train" in deps and _layer("labkit.train") > _layer("labkit.flops")


def test_no_file_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines (split them by concept): {long}"


def _is_training_loop(path: Path) -> bool:
    """A file whose code (not its docstrings) calls ``.backward()`` and an optimizer's ``.step()``."""
    calls = [(n.func.attr, ast.unparse(n.func.value)) for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    return any(a == "backward" for a, _ in calls) and any(a == "step" and "opt" in v for a, v in calls)


def test_one_training_loop():
    """Exactly one training loop in labkit (backward + optimizer step): labkit/train/loop.py."""
    loops = sorted(str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if _is_training_loop(p))
    assert loops == ["labkit/train/loop.py"], loops


def test_the_loop_finder_sees_a_second_loop(tmp_path):
    """The one-loop check can fail: a hand-written loop elsewhere is found."""
    f = tmp_path / "mine.py"
    f.write_text("def fit(model, opt, xs):\n    for x in xs:\n        model(x).sum().backward()\n        opt.step()\n")
    assert _is_training_loop(f)
