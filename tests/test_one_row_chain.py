"""The one-row decode chain (edge_llm/model/one_row.py: each RMSNorm and residual add inside
the W4A16 GEMVs) on the CPU, where its linears' fused calls run the torch references: the
chain computes the layer-by-layer forward's hidden state for 4-bit Llama, Qwen2 (a qkv bias)
and Qwen3 (qk-norm) checkpoints; it declines the layers it does not serve (Gemma 2's sandwich
norms, act-order GPTQ's input gathers, unquantized weights); it is never taken off CUDA.
The kernels themselves: tests/test_gemv_norm_interpret.py; the chain on the GPU, through the
engine: tests/test_one_row_chain_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from edge_llm.model.loader import load_model
from edge_llm.model.one_row import one_row_chain_fits, one_row_forward, one_row_step
from tests.helpers import rel_err, save_hf_checkpoint, tiny_hf_model
from tests.test_model_parity import _meta
from tests.test_model_quant_parity import CASES, _quantized_checkpoint

AWQ = CASES[0]  # awq-g32
ACT_ORDER = CASES[2]  # gptq-v1-g32-sym-act


def _load(arch: str, case, tmp_path, dtype: str = "float32"):
    hf = tiny_hf_model(arch)
    path = _quantized_checkpoint(hf, case, tmp_path / f"{arch}-{case[0]}")
    return load_model(str(path), device="cpu", dtype=dtype, progress=False).model, hf


def _prefill(lm, ids: torch.Tensor, block_size: int = 16):
    """The KV caches after ``ids`` and the metadata of decoding one token after them, on the
    model's device (the query starts stay on the host, as the engine keeps them)."""
    arch, t = lm.arch, ids.numel()
    dev, dtype = lm.lm_head.weight.device, lm.lm_head.weight.dtype
    nblk = t // block_size + 2
    table = torch.randperm(nblk + 3)[:nblk].tolist()
    shape = (nblk + 3, block_size, arch.num_kv_heads, arch.head_dim)
    kv = [(torch.randn(shape).to(dev, dtype), torch.randn(shape).to(dev, dtype))
          for _ in range(arch.num_layers)]
    slot = lambda p: table[p // block_size] * block_size + p % block_size  # noqa: E731

    def on_device(meta):
        for f in ("slot_mapping", "seq_lens", "block_tables"):
            setattr(meta, f, getattr(meta, f).to(dev))
        return meta

    with torch.no_grad():
        lm(ids.to(dev), torch.arange(t, device=dev), kv,
           on_device(_meta([0, t], [t], [table], [slot(p) for p in range(t)], block_size)))
    return kv, on_device(_meta([0, 1], [t + 1], [table], [slot(t)], block_size))


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_chain_equals_layer_by_layer(arch, tmp_path):
    lm, hf = _load(arch, AWQ, tmp_path)
    assert one_row_chain_fits(lm)
    ids = torch.randint(0, hf.config.vocab_size, (23,))
    kv, meta = _prefill(lm, ids[:-1])
    pos = torch.tensor([ids.numel() - 1])
    with torch.no_grad():
        plain = lm(ids[-1:], pos, kv, meta)  # on the CPU: the layer-by-layer path
        x = lm.model.embed_tokens(ids[-1:])
        chain = one_row_forward(lm, x, list(lm.model.layers), pos, kv, meta)
        # the chain's residual stream is the layers' own: off by one layer, it differs
        short = one_row_forward(lm, x, list(lm.model.layers)[:-1], pos, kv[:-1], meta)
    assert chain.shape == plain.shape == (1, hf.config.hidden_size)
    assert rel_err(chain, plain) < 1e-5
    assert rel_err(short, plain) > 1e-2


def test_chain_declines_what_it_does_not_serve(tmp_path):
    assert not one_row_chain_fits(_load("Gemma2ForCausalLM", AWQ, tmp_path)[0])  # sandwich
    assert not one_row_chain_fits(_load("LlamaForCausalLM", ACT_ORDER, tmp_path)[0])  # gathers
    hf = tiny_hf_model("LlamaForCausalLM")
    plain = load_model(str(save_hf_checkpoint(hf, tmp_path / "fp")), device="cpu",
                       progress=False).model
    assert not one_row_chain_fits(plain)  # nn.Linear weights


def test_chain_is_for_one_fp16_cuda_row_only():
    for x in (torch.zeros(1, 64, dtype=torch.float16), torch.zeros(1, 64)):
        assert not one_row_step(x)  # the CPU: the references, layer by layer
