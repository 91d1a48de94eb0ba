"""The programmatic-dependent-launch switch (kernels/pdl.py): off by default, on only for
``EDGE_LLM_PDL=1`` on a CUDA device of compute capability 9.0 or later, never for CPU tensors
(the interpreter). What the kernels compile to with it: tests/test_kernels_compile.py; on the
GPU: tests/test_pdl_gpu.py."""

from __future__ import annotations

import importlib

import pytest
import torch

pdl = importlib.import_module("edge_llm.kernels.pdl")


@pytest.fixture(autouse=True)
def fresh_flag():
    pdl.pdl_wanted.cache_clear()
    yield
    pdl.pdl_wanted.cache_clear()


def test_off_by_default_and_flag_values(monkeypatch):
    monkeypatch.delenv(pdl.ENV, raising=False)
    assert not pdl.pdl_wanted()
    for value, want in (("0", False), ("1", True)):
        monkeypatch.setenv(pdl.ENV, value)
        pdl.pdl_wanted.cache_clear()
        assert pdl.pdl_wanted() is want
    monkeypatch.setenv(pdl.ENV, "yes")
    pdl.pdl_wanted.cache_clear()
    with pytest.raises(ValueError, match="EDGE_LLM_PDL must be 0 or 1"):
        pdl.pdl_wanted()


@pytest.mark.parametrize("capability, want", [((8, 6), False), ((8, 9), False),
                                              ((9, 0), True), ((12, 0), True)])
def test_only_sm90_and_later(capability, want, monkeypatch):
    monkeypatch.setenv(pdl.ENV, "1")
    monkeypatch.setattr(pdl, "compute_capability", lambda device: capability)
    cuda = torch.device("cuda", 0)
    assert pdl.pdl_on(cuda) is want
    assert pdl.pdl_kwargs(cuda) == {"PDL": want, "launch_pdl": want}
    assert not pdl.pdl_on(torch.device("cpu"))
    monkeypatch.setenv(pdl.ENV, "0")
    pdl.pdl_wanted.cache_clear()
    assert not pdl.pdl_on(cuda)
