"""No import circles in the package: the graph of its modules' imports has no cycle.

Every import counts: module level, inside a function (a lazy import still runs), and under
``if TYPE_CHECKING:`` (a circle of types is still one unit split over files). Edges are the
modules named: ``from pkg import name`` goes to ``pkg.name`` when that is a module, else to
``pkg``; importing ``a.b.c`` does not add edges to the packages ``a`` and ``a.b`` that Python
runs first. Sources are read as the wheel installs them: ``kernels/`` is
``edge_llm.kernels`` and ``quant/`` is ``edge_llm.quant`` (pyproject.toml's package-dir).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"edge_llm": "edge_llm", "kernels": "edge_llm.kernels", "quant": "edge_llm.quant"}


def package_modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, whether it is a package's ``__init__``)."""
    mods: dict[str, tuple[Path, bool]] = {}
    for folder, package in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            if folder == "edge_llm" and rel[0] in ("kernels", "quant"):
                continue  # a checkout's links to the two top-level folders
            is_package = rel[-1] == "__init__"
            name = ".".join((package, *(rel[:-1] if is_package else rel)))
            mods[name] = (path, is_package)
    return mods


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def import_graph(mods: dict[str, tuple[Path, bool]]) -> dict[str, dict[str, int]]:
    """Module -> {imported package module: line of the first such import}."""
    graph: dict[str, dict[str, int]] = {}
    for module, (path, is_package) in mods.items():
        edges = graph.setdefault(module, {})
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node.level, node.module)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:  # a.b.name -> the module a.b
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges[target] = min(edges.get(target, node.lineno), node.lineno)
    return graph


def find_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (a, b, ..., a) through each strongly connected set of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sets: list[set[str]] = []

    def visit(v: str) -> None:  # the package is a few hundred modules: recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                sets.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, comp) for comp in sets]


def _cycle_in(graph: dict[str, dict[str, int]], comp: set[str]) -> list[str]:
    """The shortest cycle through the set's first module (breadth-first within the set)."""
    start = min(comp)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in comp and w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")


def describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = zip(cycle, cycle[1:], strict=False)  # each module and the one it imports
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in steps) + f" -> {cycle[-1]}"


def test_no_import_cycles():
    graph = import_graph(package_modules())
    assert len(graph) > 100 and "edge_llm.kernels" in graph and "edge_llm.quant" in graph
    cycles = find_cycles(graph)
    assert not cycles, "import circles:\n" + "\n".join(describe(graph, c) for c in cycles)


def test_the_walk_finds_a_cycle_and_names_its_lines():
    """The checker itself, on a graph with two circles (one through a lazy import)."""
    graph = {"p.a": {"p.b": 3}, "p.b": {"p.c": 5}, "p.c": {"p.a": 9, "p.d": 2},
             "p.d": {}, "p.e": {"p.f": 1}, "p.f": {"p.e": 7}}
    cycles = sorted(find_cycles(graph))
    assert cycles == [["p.a", "p.b", "p.c", "p.a"], ["p.e", "p.f", "p.e"]]
    assert describe(graph, cycles[1]) == "p.e (line 1) -> p.f (line 7) -> p.e"


def test_relative_imports_resolve_as_python_does(tmp_path):
    mods = {"edge_llm.engine": (tmp_path / "e.py", True),
            "edge_llm.engine.x": (tmp_path / "x.py", False),
            "edge_llm.engine.y": (tmp_path / "y.py", False),
            "edge_llm.config": (tmp_path / "c.py", False)}
    (tmp_path / "e.py").write_text("from . import x\n")
    (tmp_path / "x.py").write_text("def f():\n    from .y import thing\n"
                                   "    from ..config import Cfg\n")
    (tmp_path / "y.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    import edge_llm.engine.x\n")
    (tmp_path / "c.py").write_text("import os\n")
    graph = import_graph(mods)
    assert graph == {"edge_llm.engine": {"edge_llm.engine.x": 1},
                     "edge_llm.engine.x": {"edge_llm.engine.y": 2, "edge_llm.config": 3},
                     "edge_llm.engine.y": {"edge_llm.engine.x": 3},
                     "edge_llm.config": {}}
    assert find_cycles(graph) == [["edge_llm.engine.x", "edge_llm.engine.y",
                                   "edge_llm.engine.x"]]
