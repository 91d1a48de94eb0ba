"""The programmatic-dependent-launch switch (kernels/pdl.py): ``EDGE_LLM_PDL`` auto (the
default: forwards of at most 4 tokens), 1 (every kernel) or 0; only on a CUDA device of
compute capability 9.0 or later, never for CPU tensors (the interpreter). What the kernels
compile to with it: tests/test_kernels_compile.py; on the GPU: tests/test_pdl_gpu.py."""

from __future__ import annotations

import importlib

import pytest
import torch

from edge_llm import envs

pdl = importlib.import_module("edge_llm.kernels.pdl")


def test_flag_values(monkeypatch):
    monkeypatch.delenv(envs.PDL.name, raising=False)
    assert envs.PDL.get() == "auto"
    for value in ("auto", "0", "1"):
        monkeypatch.setenv(envs.PDL.name, value)
        assert envs.PDL.get() == value
    monkeypatch.setenv(envs.PDL.name, "yes")
    with pytest.raises(ValueError, match="EDGE_LLM_PDL must be auto, 0 or 1, got 'yes'"):
        pdl.pdl_on(torch.device("cuda", 0))


@pytest.fixture
def sm90(monkeypatch):
    monkeypatch.setattr(pdl, "compute_capability", lambda device: (9, 0))
    return torch.device("cuda", 0)


def _set(monkeypatch, value):
    monkeypatch.setenv(envs.PDL.name, value)


@pytest.mark.parametrize("capability, want", [((8, 6), False), ((8, 9), False),
                                              ((9, 0), True), ((12, 0), True)])
def test_only_sm90_and_later(capability, want, monkeypatch):
    _set(monkeypatch, "1")
    monkeypatch.setattr(pdl, "compute_capability", lambda device: capability)
    cuda = torch.device("cuda", 0)
    assert pdl.pdl_on(cuda) is want
    assert pdl.pdl_kwargs(cuda) == {"PDL": want, "launch_pdl": want}
    assert not pdl.pdl_on(torch.device("cpu"))
    _set(monkeypatch, "0")
    assert not pdl.pdl_on(cuda)


def test_auto_takes_short_forwards_only(sm90, monkeypatch):
    _set(monkeypatch, "auto")
    assert not pdl.pdl_on(sm90)  # outside a forward
    for n in (1, 2, pdl.AUTO_MAX_TOKENS):
        with pdl.forward_tokens(n):
            assert pdl.pdl_on(sm90)
            assert not pdl.pdl_on(torch.device("cpu"))
    with pdl.forward_tokens(pdl.AUTO_MAX_TOKENS + 1):
        assert not pdl.pdl_on(sm90)
        with pdl.forward_tokens(1):  # nested: the inner forward decides, then the outer again
            assert pdl.pdl_on(sm90)
        assert not pdl.pdl_on(sm90)
    assert not pdl.pdl_on(sm90)
    _set(monkeypatch, "1")
    assert pdl.pdl_on(sm90)
    with pdl.forward_tokens(512):
        assert pdl.pdl_on(sm90)
    _set(monkeypatch, "0")
    with pdl.forward_tokens(1):
        assert not pdl.pdl_on(sm90)


def test_model_forward_declares_its_tokens(monkeypatch):
    """CausalLM.forward runs every layer and the final norm inside ``forward_tokens(T)``."""
    from edge_llm.model import llama
    from edge_llm.model.arch import ArchConfig
    from edge_llm.model.full_forward import full_logits

    arch = ArchConfig(
        architecture="LlamaForCausalLM", vocab_size=32, hidden_size=16, intermediate_size=32,
        num_layers=2, num_heads=2, num_kv_heads=1, head_dim=8, rms_norm_eps=1e-5,
        rope_theta=10000.0, rope_scaling=None, max_position_embeddings=64,
        tie_word_embeddings=False, qkv_bias=False, qk_norm=False, torch_dtype="float32",
        sliding_window=None, bos_token_id=None, eos_token_ids=(0,))
    lm = llama.CausalLM(arch, 64)
    seen = []
    for module in (*lm.model.layers, lm.model.norm):
        module.register_forward_pre_hook(lambda *_: seen.append(pdl._tokens.get()))
    real_add = lm.model.norm.add_forward
    lm.model.norm.add_forward = lambda x, r: (seen.append(pdl._tokens.get()), real_add(x, r))[1]
    logits = full_logits(lm, torch.arange(5))
    assert logits.shape == (5, 32)
    assert seen == [5, 5, 5], seen  # two layers and the final norm
    assert pdl._tokens.get() is None


def test_gemv_prefetch_flag(monkeypatch):
    """``EDGE_LLM_GEMV_PREFETCH`` (kernels/w4a16_gemv_tile.py): K tiles the one-row GEMV asks L2
    for before its PDL wait; 0 by default, powers of two only, a clear error otherwise (also
    from the launch itself for a bad count)."""
    gv = importlib.import_module("edge_llm.kernels.w4a16_gemv")
    gt = importlib.import_module("edge_llm.kernels.w4a16_gemv_tile")
    monkeypatch.delenv(envs.GEMV_PREFETCH.name, raising=False)
    assert gt.gemv_prefetch() == 0
    for text, want in (("0", 0), ("1", 1), ("4", 4), ("32", 32), ("", 0)):  # empty: unset
        monkeypatch.setenv(envs.GEMV_PREFETCH.name, text)
        assert gt.gemv_prefetch() == want
    for text in ("3", "-2", "yes"):
        monkeypatch.setenv(envs.GEMV_PREFETCH.name, text)
        with pytest.raises(ValueError, match="EDGE_LLM_GEMV_PREFETCH must be 0 or a power"):
            gt.gemv_prefetch()
    x = torch.zeros(1, 256, dtype=torch.float16)
    words = torch.zeros(32, 64, dtype=torch.int32)
    scales = torch.ones(2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="prefetch must be 0 or a power of two"):
        gv.launch_gemv16(x, words, scales, scales, torch.empty(1, 1, 64), 128, 1, 64, 128,
                         256, 1, 4, 2, use_asm=False, prefetch=3)
