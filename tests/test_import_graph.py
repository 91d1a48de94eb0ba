"""No import circles inside ``edge_llm.quant`` and ``edge_llm.kernels`` (a file is one
responsibility; a class split over two files that import each other is one file), read
statically from the sources: imports at module level and inside functions alike."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _graph(package: str) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports (relative or as edge_llm.<package>)."""
    files = {p.stem: p for p in (ROOT / package).glob("*.py") if p.stem != "__init__"}
    graph = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 1:
                mod = node.module
            elif node.module and node.module.startswith(f"edge_llm.{package}"):
                mod = node.module[len(f"edge_llm.{package}"):].lstrip(".")
            else:
                continue
            targets = [mod.split(".")[0]] if mod else [a.name for a in node.names]
            deps.update(t for t in targets if t in files and t != name)
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order), or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        for dep in sorted(graph[node]):
            if dep in path:
                return path[path.index(dep):] + [dep]
            if dep not in done:
                found = visit(dep, path + [dep])
                if found:
                    return found
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            found = visit(start, [start])
            if found:
                return found
    return None


@pytest.mark.parametrize("package", ["quant", "kernels"])
def test_no_import_circles(package):
    graph = _graph(package)
    assert graph["linear" if package == "quant" else "w4a16"], "no imports found: wrong root"
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
