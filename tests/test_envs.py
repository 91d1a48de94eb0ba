"""The environment-variable registry (edge_llm/envs.py): one declaration per variable, parsed
lazily with clear errors, every EDGE_LLM_* name in the code declared there or generated from a
serve flag, and listed by ``edge-llm --help``."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from edge_llm import envs
from edge_llm.cli import build_parser
from edge_llm.flags import SERVE_OPTIONS

REPO = Path(__file__).resolve().parents[1]


def test_values_follow_the_environment_without_a_reset(monkeypatch):
    monkeypatch.delenv(envs.PROBE_CACHE.name, raising=False)
    assert envs.PROBE_CACHE.get() is True  # the default
    monkeypatch.setenv(envs.PROBE_CACHE.name, "0")
    assert envs.PROBE_CACHE.get() is False
    monkeypatch.setenv(envs.PROBE_CACHE.name, "")  # empty: unset
    assert envs.PROBE_CACHE.get() is True
    monkeypatch.setenv(envs.KERNELS.name, "Torch")
    assert envs.KERNELS.get() == "torch"
    monkeypatch.delenv(envs.MODEL.name, raising=False)
    assert envs.MODEL.get() is None


@pytest.mark.parametrize("var, bad", [
    (envs.PROBE_CACHE, "yes"), (envs.PRELOAD, "2"), (envs.KERNELS, "cuda"),
])
def test_a_bad_value_names_the_variable_and_what_it_takes(var, bad, monkeypatch):
    monkeypatch.setenv(var.name, bad)
    with pytest.raises(ValueError, match=re.escape(f"{var.name} must be {var.kind}, got "
                                                   f"{bad!r}")):
        var.get()
    with pytest.raises(ValueError, match=var.name):
        envs.check_all()


def test_a_mapping_instead_of_the_process_environment(monkeypatch):
    monkeypatch.setenv(envs.CACHE_DIR.name, "/from/process")
    assert envs.CACHE_DIR.get({envs.CACHE_DIR.name: "/from/map"}) == Path("/from/map")
    assert envs.CACHE_DIR.get() == Path("/from/process")  # the mapping left no trace
    env = {"TRITON_CACHE_DIR": "/mine"}
    assert not envs.set_default(envs.TRITON_CACHE_DIR, "/x", env)  # the user's value wins
    assert envs.set_default(envs.TORCHINDUCTOR_CACHE_DIR, "/y", env)
    assert env == {"TRITON_CACHE_DIR": "/mine", "TORCHINDUCTOR_CACHE_DIR": "/y"}


def test_groups_and_one_line_reasons():
    assert set(envs.GROUP_TITLES) == {v.group for v in envs.REGISTRY.values()}
    for var in envs.REGISTRY.values():
        assert var.doc and "\n" not in var.doc, var.name
        if var.group != envs.FOREIGN:
            assert var.name.startswith("EDGE_LLM_"), var.name
    flag_vars = {e for o in SERVE_OPTIONS for e in o.envs}
    assert not flag_vars & set(envs.REGISTRY)  # a serve flag's variable is the flag's


def test_at_most_six_settings_beyond_the_serve_flags():
    """Every experiment is decided (no switch between two implementations is left), and the
    user and debugging variables are few."""
    assert set(envs.GROUP_TITLES) == {envs.USER, envs.DEBUG, envs.FOREIGN}
    own = [v.name for v in envs.REGISTRY.values() if v.group != envs.FOREIGN]
    assert len(own) <= 6, own


def test_every_edge_llm_variable_in_the_code_is_declared():
    """Source, recipes and the Dockerfile: each EDGE_LLM_* name is in the registry or is a
    serve flag's generated variable (tests and benchmarks may name either)."""
    files = subprocess.run(["git", "ls-files", "*.py", "Dockerfile", "recipes"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split()
    known = set(envs.REGISTRY) | {e for o in SERVE_OPTIONS for e in o.envs}
    found: dict[str, str] = {}
    for name in files:
        if name.startswith(("tests/", "benchmarks/")) or not (REPO / name).is_file():
            continue
        for var in re.findall(r"\bEDGE_LLM_[A-Z0-9_]*[A-Z0-9]\b", (REPO / name).read_text()):
            found.setdefault(var, name)
    found.pop("EDGE_LLM_SOME_FLAG", None)  # the docstring's example of a flag's variable
    undeclared = {v: f for v, f in found.items() if v not in known}
    assert not undeclared, undeclared


def test_only_the_registry_and_the_flag_resolver_read_the_environment():
    out = subprocess.run(["git", "grep", "-l", "-E", r"os\.environ|getenv", "--", "*.py",
                          ":!tests", ":!benchmarks", ":!recipes", ":!tools"], cwd=REPO,
                         capture_output=True, text=True).stdout.split()
    assert set(out) <= {"edge_llm/envs.py", "edge_llm/flags.py"}, out


def test_help_lists_every_variable():
    text = build_parser().format_help()
    for var in envs.REGISTRY.values():
        assert var.name in text
    for title in envs.GROUP_TITLES.values():
        assert title in text


def test_a_child_environment_from_the_registry(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/x")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    env = envs.child_environ({envs.TORCHINDUCTOR_CACHE_DIR: None, envs.CUDA_VISIBLE_DEVICES: ""},
                             {"OMP_NUM_THREADS": "8", "SOME_TOOL": "1"})
    assert "TORCHINDUCTOR_CACHE_DIR" not in env and env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["OMP_NUM_THREADS"] == "8" and env["SOME_TOOL"] == "1"
    assert env["PATH"] == os.environ["PATH"]
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/x"  # this process's is left alone
