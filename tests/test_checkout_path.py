"""A checkout's kernels/ and quant/ folders must not shadow installed distributions of those
names, whatever the import order (edge_llm/checkout_path.py)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(code: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _hub_kernels_installed() -> bool:
    try:
        importlib.metadata.version("kernels")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_transformers_first_then_edge_llm_in_the_checkout_root():
    """The issue's command, verbatim, run where it failed: the checkout's root."""
    res = _run("import transformers.models.llama; import edge_llm")
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_llama_model_loads_first_then_our_kernels():
    """transformers' Llama modelling, really loaded, imports the Hub's ``kernels`` (when it is
    installed) before edge_llm is imported; ours stays ``edge_llm.kernels``. (The other order
    is what every engine and server test does.)"""
    code = ("import transformers.models.llama.modeling_llama as m, sys; "
            "import edge_llm.kernels as ek, edge_llm.quant as eq; k = sys.modules.get('kernels'); "
            "print(m.LlamaForCausalLM.__name__, callable(ek.rms_norm), eq.QuantLinear.__name__); "
            "print(getattr(k, '__file__', None))")
    res = _run(code)
    assert res.returncode == 0, res.stderr[-2000:]
    names, kernels_file = res.stdout.splitlines()
    assert names == "LlamaForCausalLM True QuantLinear"
    assert str(REPO / "kernels") not in kernels_file


def test_bare_kernels_is_the_installed_distribution_or_nothing():
    code = ("import kernels, sys; print(kernels.__file__); "
            "print(hasattr(kernels, 'rms_norm'))")
    res = _run(code)
    assert res.returncode == 0, res.stderr[-2000:]
    file, has_ours = res.stdout.splitlines()
    assert has_ours == "False"  # never our dispatchers under the bare name
    if _hub_kernels_installed():
        assert file != "None" and str(REPO) not in file
    else:
        assert file == "None"


def test_bare_quant_is_an_empty_namespace_when_nothing_is_installed():
    """No `quant` distribution is installed: the folder is not importable by that name."""
    res = _run("import quant, sys; print(quant.__file__, quant.__path__); "
               "import importlib; importlib.import_module('quant.linear')")
    assert res.returncode != 0
    assert res.stdout.strip() == "None []"
    assert "ModuleNotFoundError" in res.stderr and "quant.linear" in res.stderr
