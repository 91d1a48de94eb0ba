"""A checkout's kernels/ folder must not shadow an installed `kernels` distribution."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from edge_llm.checkout_path import unshadow

REPO = Path(__file__).resolve().parents[1]


def _package(parent: Path, name: str, mark: str) -> None:
    (parent / name).mkdir(parents=True)
    (parent / name / "__init__.py").write_text(f"MARK = {mark!r}\n")


@pytest.fixture
def fake_paths(tmp_path, monkeypatch):
    """A checkout (pyproject.toml and a folder named like a distribution) first on sys.path,
    and a site folder after it; the name unimported."""
    checkout, site = tmp_path / "checkout", tmp_path / "site"
    _package(checkout, "fakedist", "checkout folder")
    (checkout / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(checkout), str(site), *sys.path])
    monkeypatch.delitem(sys.modules, "fakedist", raising=False)
    return checkout, site


def test_installed_distribution_wins_over_the_checkout_folder(fake_paths):
    checkout, site = fake_paths
    _package(site, "fakedist", "installed")
    assert unshadow(("fakedist",), root=str(checkout)) == ["fakedist"]
    import fakedist

    assert fakedist.MARK == "installed"  # loaded lazily, on this first use


def test_nothing_installed_marks_the_name_absent(fake_paths):
    """As for a wheel install: the checkout's folder is not importable under the name."""
    checkout, _ = fake_paths
    try:
        assert unshadow(("fakedist",), root=str(checkout)) == ["fakedist"]
        assert importlib.util.find_spec("fakedist") is None
        with pytest.raises(ImportError):
            import fakedist  # noqa: F401
    finally:
        sys.modules.pop("fakedist", None)


def test_outside_a_checkout_nothing_happens(fake_paths):
    checkout, site = fake_paths
    _package(site, "fakedist", "installed")
    (checkout / "pyproject.toml").unlink()
    assert unshadow(("fakedist",), root=str(checkout)) == []


def test_transformers_imports_from_the_checkout_root():
    """What broke: in the checkout's root, transformers (which imports the Hub's `kernels`
    when installed) failed on `from kernels import CUDAProperties` against our folder."""
    code = ("import edge_llm, sys; from transformers import LlamaConfig; "
            "m = sys.modules.get('kernels'); "
            "print('ok', getattr(m, '__file__', None))")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("ok")
    assert str(REPO / "kernels") not in res.stdout
