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
