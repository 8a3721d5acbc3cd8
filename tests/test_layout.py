"""Layout properties of the package, checked on its source (no imports of it, no GPU):
imports flow one way (no cycles, imports inside functions included) and no source file
exceeds 900 lines."""

from __future__ import annotations

import ast
import os

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "oscar_kernels")
MAX_LINES = 900


def _modules() -> dict[str, str]:
    """``{dotted module name: path}`` of every ``.py`` file under ``oscar_kernels/``."""
    root = os.path.abspath(os.path.dirname(PACKAGE))
    out = {}
    for dirpath, _, files in os.walk(os.path.abspath(PACKAGE)):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                parts = os.path.relpath(path, root)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                out[".".join(parts)] = path
    return out


def _imports(name: str, path: str, modules: dict[str, str]) -> set[str]:
    """The package modules ``name`` imports anywhere in its file (top level, inside functions
    and ``TYPE_CHECKING`` blocks), resolved to the longest known module name."""
    is_pkg = os.path.basename(path) == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found = set()
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule pkg.sub; `from mod import name`
            # the module mod
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in modules]
            targets = subs + ([mod] if len(subs) < len(node.names) else [])
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (as a list of modules), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycles():
    """Imports flow one way: the graph of which module imports which (``from . import x``
    is an edge to the submodule ``x``; the implicit import of a parent package is not an
    edge) has no cycle."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_source_file_over_900_lines():
    too_long = {}
    for name, path in _modules().items():
        with open(path) as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            too_long[os.path.relpath(path, os.path.dirname(PACKAGE))] = n
    assert not too_long, f"files over {MAX_LINES} lines: {too_long}"
