"""The house's budgets, checked over the source tree with ``ast`` (issue 21, DESIGN.md).

- no module over 600 lines;
- no function over 60 lines, unless a ``# long: why`` comment on its ``def`` line (or the
  line above) says why it reads better whole;
- no import cycle between modules of core/ and gui/ (function-level imports count too:
  a cycle hidden in a function is still a cycle);
- at most 40 function-level imports, each with a comment saying why it is not at the top
  (an optional dependency, start-up time);
- no module imports another module's ``_private`` names.
"""
from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "gui")
# the benchmarks and tools are code a newcomer reads too: the size budgets hold there as well
SIZED = (*PACKAGES, "bench", "tools")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
MAX_FUNCTION_IMPORTS = 40


def _sources(packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` and main.py."""
    out = {"main": ROOT / "main.py"}
    for pkg in packages:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


SOURCES = _sources(PACKAGES)
SIZED_SOURCES = _sources(SIZED)


@functools.cache
def trees() -> dict[str, ast.AST]:
    """Every sized module's syntax tree, parsed when a test first asks (not while every
    xdist worker collects the suite: ~1 s each)."""
    return {name: ast.parse(path.read_text(), str(path)) for name, path in SIZED_SOURCES.items()}


@functools.cache
def source_lines() -> dict[str, list[str]]:
    return {name: path.read_text().splitlines() for name, path in SIZED_SOURCES.items()}


def _rel(name: str) -> str:
    return str(SIZED_SOURCES[name].relative_to(ROOT))


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def _function_imports(tree: ast.AST):
    """Import statements inside function bodies (each once, however deeply nested)."""
    seen = set()
    for fn in _functions(tree):
        for node in ast.walk(fn):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in seen:
                seen.add(id(node))
                yield node


def _absolute(name: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    pkg = name.split(".")
    is_pkg = SOURCES[name].name == "__init__.py"
    base = pkg if is_pkg else pkg[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported_modules(name: str) -> set[str]:
    """The project modules ``name`` imports (anywhere in it), resolved to files we have."""
    out = set()
    for node in ast.walk(trees()[name]):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _absolute(name, node)
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in SOURCES:
                t = t.rpartition(".")[0]
            if t and t != name and t.split(".")[0] in PACKAGES:
                out.add(t)
    return out


def test_no_module_is_over_600_lines():
    over = {_rel(n): len(lines) for n, lines in source_lines().items() if len(lines) > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_is_over_60_lines_without_saying_why():
    over = []
    for name, tree in trees().items():
        lines = source_lines()[name]
        for fn in _functions(tree):
            first = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
            length = fn.end_lineno - first + 1
            if length <= MAX_FUNCTION_LINES:
                continue
            said = any("# long:" in lines[i - 1] for i in (first - 1, first, fn.lineno) if i >= 1)
            if not said:
                over.append(f"{_rel(name)}:{fn.lineno} {fn.name} ({length} lines)")
    assert not over, "functions over 60 lines without a '# long: why' comment:\n" + "\n".join(over)


def test_function_level_imports_are_few_and_say_why():
    found, silent = [], []
    for name, tree in ((n, trees()[n]) for n in SOURCES):
        lines = source_lines()[name]
        for node in _function_imports(tree):
            where = f"{_rel(name)}:{node.lineno}"
            found.append(where)
            # the reason stands on the import's line or above it; a block of imports one
            # after another shares the comment above its first line
            i = node.lineno - 1
            while i > 0 and "#" not in lines[i] and (
                    lines[i - 1].strip().startswith(("import ", "from ")) or not lines[i - 1].strip()):
                i -= 1
            if "#" not in lines[node.lineno - 1] and "#" not in lines[i] and not (
                    i > 0 and lines[i - 1].strip().startswith("#")):
                silent.append(where)
    assert len(found) <= MAX_FUNCTION_IMPORTS, f"{len(found)} function-level imports: {found}"
    assert not silent, f"function-level imports without a reason: {silent}"


def test_no_module_imports_another_modules_private_names():
    bad = []
    for name, tree in ((n, trees()[n]) for n in SOURCES):
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                mod = _absolute(name, node)
                if mod.split(".")[0] not in PACKAGES or mod == name:
                    continue
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{_rel(name)}:{node.lineno} imports {mod}.{a.name}")
    assert not bad, "\n".join(bad)


def test_there_is_no_import_cycle():
    graph = {name: _imported_modules(name) for name in SOURCES}
    # Tarjan's strongly connected components: any component of two or more is a cycle.
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("module", ["core.engine.events", "core.engine.settings", "core.engine.constraint"])
def test_the_event_vocabulary_imports_no_torch(module):
    """Checked in a fresh interpreter: what a request and its events are must not need torch."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
