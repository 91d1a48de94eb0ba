"""The code base stays ruff-clean (the rules in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (it comes with the test extra)")
    res = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:]


def test_no_module_imports_another_modules_private_names():
    """ruff's SLF001 sees ``obj._name`` but not ``from .mod import _name``: a name with a
    leading underscore belongs to its module, so importing it elsewhere is reported here
    (a module imported under a private alias, ``from . import fused as _fused``, is fine)."""
    import ast

    found = []
    for folder in ("edge_llm", "kernels", "quant"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                    found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name}"
                              for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, "\n".join(found)
