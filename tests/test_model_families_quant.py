"""The families of issue 39 (Gemma 2, Gemma 3, Phi-3 with its merged qkv_proj / gate_up_proj,
Mistral-Nemo's explicit head_dim, Qwen2.5 with YaRN) as 4-bit checkpoints, fp32 on the CPU:

* AWQ and act-order GPTQ tensors written by the packers, loaded by our loader, against
  transformers run on the dequantized weights;
* checkpoints made by our own quantizer (``quantize_model``, the code behind ``edge-llm
  quantize``) in both formats, against transformers run on the weights the quantizer left in
  the model (its linears dequantized in place, the rest rounded to the fp16 it stores).

Every run is 40-45 tokens: past each case's sliding window and RoPE scaling threshold.
"""

from __future__ import annotations

import pytest
import torch

from edge_llm.model.loader import load_model
from edge_llm.quant import quantization_config_for, quantize_model, save_quantized
from tests.helpers import rel_err, tiny_hf_model
from tests.test_model_parity import run_prefill_then_decode
from tests.test_model_quant_parity import CASES, _check
from tests.test_quant_gptq_method import _byte_tokenizer

FAMILIES = ["Gemma2ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "MistralNemo",
            "Qwen2.5-yarn"]
FORMATS = {"awq": CASES[0], "gptq-act": CASES[2]}  # AWQ g32; GPTQ v1 g32 sym act-order


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_checkpoints_match_transformers(family, fmt, tmp_path):
    _check(tiny_hf_model(family), FORMATS[fmt], tmp_path)


@pytest.mark.parametrize("fmt,opts", [
    ("awq", dict(method="rtn", group_size=32)),
    ("gptq", dict(method="gptq", group_size=32, desc_act=True, nsamples=4, seqlen=32,
                  batch_size=4)),
])
@pytest.mark.parametrize("family", FAMILIES)
def test_our_quantizer_matches_transformers(family, fmt, opts, tmp_path):
    hf = tiny_hf_model(family, vocab=256)  # the byte tokenizer's vocabulary
    tok = _byte_tokenizer()
    state = quantize_model(hf, tok, fmt=fmt, **opts)
    linears = {f"{n}.weight" for n, m in hf.named_modules() if isinstance(m, torch.nn.Linear)
               and ".layers." in n}
    assert all(n.removesuffix("weight") + "qweight" in state for n in linears)
    with torch.no_grad():  # what the checkpoint stores outside the 4-bit linears: fp16
        for name, p in hf.named_parameters():
            if name not in linears:
                p.copy_(p.half().float())
    qcfg = quantization_config_for(fmt, group_size=32, desc_act=opts.get("desc_act", False))
    out = save_quantized(tmp_path / "q", state, hf.config.to_dict(), qcfg)
    loaded = load_model(str(out), device="cpu", dtype="float32", progress=False)
    assert loaded.quant_spec is not None and loaded.quant_spec.method == fmt
    assert loaded.dtype == torch.float32
    torch.manual_seed(4)
    ids = torch.randint(0, 256, (45,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(run_prefill_then_decode(loaded.model, ids), ref) < 1e-4


def test_gemma_act_order_gathers_fold_into_its_sandwich_norms(tmp_path):
    """Act-order GPTQ with one g_idx per layer input (as GPTQ gives q/k/v and gate/up): after
    merging, the gathers of q/k/v and gate/up move into the norms that feed them, which for
    Gemma is pre_feedforward_layernorm (not post_attention_layernorm, which norms attention's
    output); the logits still match."""
    from tests.test_model_quant_parity import _quantized_checkpoint

    hf = tiny_hf_model("Gemma2ForCausalLM")
    path = _quantized_checkpoint(hf, CASES[2], tmp_path / "g", shared_perm=True)
    lm = load_model(str(path), device="cpu", dtype="float32", progress=False).model
    for layer in lm.model.layers:
        assert layer.input_layernorm.out_perm is not None
        assert layer.pre_feedforward_layernorm.out_perm is not None
        assert layer.post_attention_layernorm.out_perm is None
    ids = torch.randint(0, hf.config.vocab_size, (45,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(run_prefill_then_decode(lm, ids), ref) < 1e-4


@pytest.mark.parametrize("shape", ["gemma2-9b", "gemma3-12b", "phi3-mini", "mistral-nemo-12b"])
def test_benchmark_shapes_load(shape, tmp_path, monkeypatch):
    """benchmarks/random_checkpoint.py's shapes of these families (the GPU benchmarks'
    inputs), shrunk to a few layers and a small vocabulary with their head_dim, window and
    family keys kept: written as act-order GPTQ, they load and give finite logits."""
    from benchmarks import random_checkpoint as rc
    from edge_llm.model.full_forward import full_logits

    small = {**rc.SHAPES[shape], "hidden_size": 256, "intermediate_size": 512,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 512, "sliding_window_pattern": 2}
    if small.get("sliding_window"):
        small["sliding_window"] = 16
    monkeypatch.setitem(rc.SHAPES, shape, small)
    path = rc.make_random_checkpoint(shape, "gptq-act", tmp_path / shape, device="cpu")
    loaded = load_model(str(path), device="cpu", dtype="float32", progress=False)
    arch = loaded.arch
    assert arch.head_dim == rc.SHAPES[shape].get("head_dim", 64)
    assert [arch.layer_window(i) for i in range(2)] == {
        "gemma2-9b": [16, None], "gemma3-12b": [16, None], "phi3-mini": [16, 16],
        "mistral-nemo-12b": [None, None]}[shape]
    logits = full_logits(loaded.model, torch.randint(0, 512, (40,)))
    assert logits.shape == (40, 512) and bool(torch.isfinite(logits).all())
