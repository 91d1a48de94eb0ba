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


def test_equivalents_may_be_scoped_to_one_function(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("mutate_tool", ROOT / "tools" / "mutate.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    listing = tmp_path / "equivalents.txt"
    listing.write_text("# anywhere\n- a = 0\n+ a = 1\n# one method, one function\n"
                       "@ Planner.swap_in\n- used += 1\n+ used -= 1\n"
                       "@ helper\n- x = []\n+ x = None\n- y = []\n+ y = None\n"
                       "# anywhere again\n- used += 1\n+ used = 1\n")
    monkeypatch.setattr(tool, "EQUIVALENTS", listing)
    entries = tool._equivalents()
    method = "m.x\u01c1Planner\u01c1swap_in__mutmut_3"  # mutmut's names of the mutants
    other = "m.x\u01c1Planner\u01c1admit__mutmut_3"
    function = "m.x_helper__mutmut_1"
    assert tool._is_equivalent(other, "a = 0", "a = 1", entries)
    assert tool._is_equivalent(method, "used += 1", "used -= 1", entries)
    assert not tool._is_equivalent(other, "used += 1", "used -= 1", entries)
    assert tool._is_equivalent(function, "y = []", "y = None", entries)
    assert not tool._is_equivalent(method, "y = []", "y = None", entries)
    assert tool._is_equivalent(other, "used += 1", "used = 1", entries)
