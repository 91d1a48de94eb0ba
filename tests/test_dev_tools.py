"""The development tools stay in step with the code: ``tools/mutate.py`` names only modules
and test files that exist (a renamed or merged file would otherwise be mutated or run as
nothing, and its score would be a count of the wrong thing)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mutation_targets_exist():
    spec = importlib.util.spec_from_file_location("mutate_tool", ROOT / "tools" / "mutate.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    def in_checkout(path: str) -> Path:  # the installed names of the top-level folders
        for pkg in ("quant", "kernels"):
            path = path.replace(f"edge_llm/{pkg}/", f"{pkg}/")
        return ROOT / path.split("::")[0]  # a test file, or one test by node id

    missing = []
    for name, (sources, tests, *_rest) in tool.MODULES.items():
        missing += [f"{name}: {p}" for p in [*sources, *tests] if not in_checkout(p).exists()]
    assert tool.MODULES and not missing, missing
