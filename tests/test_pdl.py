"""When kernels launch with programmatic dependent launch (kernels/pdl.py): inside forwards
of at most 4 tokens, only on a CUDA device of compute capability 9.0 or later, never for CPU
tensors (the interpreter). What the kernels compile to with it:
tests/test_kernels_compile.py; on the GPU: tests/test_pdl_gpu.py."""

from __future__ import annotations

import importlib

import pytest
import torch

pdl = importlib.import_module("edge_llm.kernels.pdl")


@pytest.fixture
def sm90(monkeypatch):
    monkeypatch.setattr(pdl, "compute_capability", lambda device: (9, 0))
    return torch.device("cuda", 0)


@pytest.mark.parametrize("capability, want", [((8, 6), False), ((8, 9), False),
                                              ((9, 0), True), ((12, 0), True)])
def test_only_sm90_and_later(capability, want, monkeypatch):
    monkeypatch.setattr(pdl, "compute_capability", lambda device: capability)
    cuda = torch.device("cuda", 0)
    with pdl.forward_tokens(1):
        assert pdl.pdl_on(cuda) is want
        assert pdl.pdl_kwargs(cuda) == {"PDL": want, "launch_pdl": want}
        assert not pdl.pdl_on(torch.device("cpu"))


def test_short_forwards_only(sm90):
    assert not pdl.pdl_on(sm90)  # outside a forward
    assert pdl.pdl_kwargs(sm90) == {"PDL": False, "launch_pdl": False}
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
