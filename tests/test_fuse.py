"""Merged q/k/v and gate/up projections (edge_llm/model/fuse.py): the merged model computes what
the unmerged one does, in every architecture and format of the parity tests; incompatible parts
stay separate and still compute correctly; sleep/wake keeps the merged layout (CPU)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from torch import nn

from edge_llm.engine import llm_engine
from edge_llm.model.fuse import fuse_projections, merge_linears, merge_mismatch
from edge_llm.model.loader import load_model
from edge_llm.quant import (
    QuantLinear,
    QuantSpec,
    concat_linears,
    pack_awq,
    pack_gptq,
)
from tests.engine_fixtures import demo_dir, tiny_dir  # noqa: F401
from tests.helpers import ARCH_CASES, rel_err, save_hf_checkpoint, tiny_hf_model
from tests.test_model_parity import run_prefill_then_decode
from tests.test_model_quant_parity import CASES, _quantized_checkpoint, _random_qweight


def _logits(lm, ids: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(7)  # the same random KV pages and block table for every model
    return run_prefill_then_decode(lm, ids).float()


def _layout(lm) -> list[tuple[bool, bool]]:
    """(attention merged, MLP merged) per layer; a merged group has no separate parts left."""
    out = []
    for layer in lm.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, gu = attn.qkv_proj is not None, mlp.gate_up_proj is not None
        assert qkv != hasattr(attn, "q_proj") and qkv != hasattr(attn, "v_proj")
        assert gu != hasattr(mlp, "gate_proj") and gu != hasattr(mlp, "up_proj")
        out.append((qkv, gu))
    return out


def _load_both(path, **kw):
    kw.setdefault("dtype", "float32")  # the fp32 reference: compared with transformers in fp32
    on = load_model(str(path), device="cpu", progress=False, merge_projections=True, **kw)
    off = load_model(str(path), device="cpu", progress=False, merge_projections=False, **kw)
    return on.model, off.model


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("arch", list(ARCH_CASES))
def test_plain_merged_equals_unmerged(arch, dtype, tmp_path):
    hf = tiny_hf_model(arch)
    merged, plain = _load_both(save_hf_checkpoint(hf, tmp_path / arch), dtype=dtype)
    n = len(merged.model.layers)
    in_checkpoint = merged.arch.merged_checkpoint  # Phi-3: merged whatever the switch
    assert _layout(merged) == [(True, True)] * n
    assert _layout(plain) == [(in_checkpoint, in_checkpoint)] * n
    qkv = merged.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == getattr(torch, dtype)
    assert (qkv.bias is not None) == (merged.arch.kind == "qwen2")  # qkv bias merged too
    ids = torch.randint(0, hf.config.vocab_size, (37,))
    tol = 1e-5 if dtype == "float32" else 1e-2
    assert rel_err(_logits(merged, ids), _logits(plain, ids)) < tol
    if dtype == "float32":
        with torch.no_grad():
            assert rel_err(_logits(merged, ids), hf(ids[None]).logits[0]) < 1e-4


def test_fuse_projections_counts_groups_and_frees_parts(tmp_path):
    hf = tiny_hf_model("Qwen3ForCausalLM", layers=3)
    lm = load_model(str(save_hf_checkpoint(hf, tmp_path / "m")), device="cpu", progress=False,
                    merge_projections=False).model
    ids = torch.randint(0, 160, (21,))
    before = _logits(lm, ids)
    n_params = sum(p.numel() for p in lm.parameters())
    assert fuse_projections(lm) == 6
    assert _layout(lm) == [(True, True)] * 3
    assert sum(p.numel() for p in lm.parameters()) == n_params  # no copy left behind
    assert fuse_projections(lm) == 0  # nothing left to merge
    assert rel_err(_logits(lm, ids), before) < 1e-5


def unmerged_engine_loads(monkeypatch) -> None:
    """Engines built from now on load their models with separate projections (the reference
    the merged layers are compared with)."""
    monkeypatch.setattr(llm_engine, "load_model",
                        functools.partial(load_model, merge_projections=False))


def test_load_model_merges_by_default(tmp_path):
    path = save_hf_checkpoint(tiny_hf_model("LlamaForCausalLM"), tmp_path / "m")
    assert _layout(load_model(str(path), device="cpu", progress=False).model)[0] == (True, True)
    plain = load_model(str(path), device="cpu", progress=False, merge_projections=False)
    assert _layout(plain.model)[0] == (False, False)


def _checkpoint(hf, case, path, shared_perm: bool = True, keep_plain: tuple[str, ...] = ()):
    """tests/test_model_quant_parity.py's quantized checkpoint, act-order g_idx shared per
    layer input by default."""
    return _quantized_checkpoint(hf, case, path, shared_perm, keep_plain, seed=5)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_quantized_merged_equals_unmerged(case, tmp_path):
    hf = tiny_hf_model("LlamaForCausalLM")
    path = _checkpoint(hf, case, tmp_path / case[0])
    merged, plain = _load_both(path)
    assert _layout(merged) == [(True, True)] * 2
    qkv = merged.model.layers[1].self_attn.qkv_proj
    assert isinstance(qkv, QuantLinear) and qkv.out_features == 64 + 2 * 32
    # act-order with several groups (K = 64): the shared permutation kept, and every gather
    # but o_proj's folded into the norms and gate/up's columns (model/fuse.py)
    act = case[4] and case[2] < 64
    assert (qkv.perm is not None) == act
    folded = 0
    for layer in merged.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for norm, lin in ((layer.input_layernorm, attn.qkv_proj),
                          (layer.post_attention_layernorm, mlp.gate_up_proj),
                          (None, mlp.down_proj)):
            assert lin.input_permuted == (lin.perm is not None)
            if norm is not None:
                assert (norm.out_perm is not None) == (lin.perm is not None)
            folded += lin.input_permuted
        assert not attn.o_proj.input_permuted
    assert (folded > 0) == case[4]  # down_proj (K = 128) has several groups in both
    ids = torch.randint(0, 160, (33,))
    ours = _logits(merged, ids)
    assert rel_err(ours, _logits(plain, ids)) < 1e-5
    with torch.no_grad():
        assert rel_err(ours, hf(ids[None]).logits[0]) < 1e-4


@pytest.mark.parametrize("arch", [a for a in ARCH_CASES if a != "LlamaForCausalLM"])
def test_quantized_other_architectures(arch, tmp_path):
    case = CASES[list(ARCH_CASES).index(arch) * 2 % len(CASES)]  # as the parity test picks
    hf = tiny_hf_model(arch)
    merged, plain = _load_both(_checkpoint(hf, case, tmp_path / case[0]))
    assert _layout(merged) == [(True, True)] * len(merged.model.layers)
    ids = torch.randint(0, 160, (29,))
    assert rel_err(_logits(merged, ids), _logits(plain, ids)) < 1e-5


def test_different_permutations_stay_separate(tmp_path):
    """Act-order with an independent permutation per linear (the parity test's checkpoint)."""
    case = next(c for c in CASES if c[4])
    hf = tiny_hf_model("Qwen2ForCausalLM")
    merged, plain = _load_both(_checkpoint(hf, case, tmp_path / "m", shared_perm=False))
    assert _layout(merged) == [(False, False)] * 2
    ids = torch.randint(0, 160, (25,))
    ours = _logits(merged, ids)
    with torch.no_grad():
        assert rel_err(ours, hf(ids[None]).logits[0]) < 1e-4


def test_mixed_plain_and_quantized_stay_separate(tmp_path):
    """Layer 0's k_proj left unquantized by the producer: that attention keeps q/k/v apart,
    everything else merges, and the logits still match transformers."""
    hf = tiny_hf_model("MistralForCausalLM")
    case = CASES[0]
    path = _checkpoint(hf, case, tmp_path / "m", keep_plain=("model.layers.0.self_attn.k_proj",))
    merged, plain = _load_both(path)
    assert _layout(merged) == [(False, True), (True, True)]
    assert type(merged.model.layers[0].self_attn.k_proj) is nn.Linear
    ids = torch.randint(0, 160, (30,))
    ours = _logits(merged, ids)
    assert rel_err(ours, _logits(plain, ids)) < 1e-5
    with torch.no_grad():
        assert rel_err(ours, hf(ids[None]).logits[0]) < 1e-4


def _general_g_idx_linear(k: int, n: int, gen) -> QuantLinear:
    """A GPTQ linear whose groups have unequal sizes (kept as a general g_idx)."""
    w = _random_qweight(k, n, 32, False, False, gen)
    g_idx = torch.cat([torch.zeros(40), torch.ones(k - 40)]).to(torch.int32)  # 40 + 24 rows
    w = dataclasses.replace(w, g_idx=g_idx[torch.randperm(k, generator=gen)])
    spec = QuantSpec("gptq", group_size=32, desc_act=True)
    lin = QuantLinear(k, n, False, spec, torch.float32)
    lin.load_checkpoint_tensors(pack_gptq(w, checkpoint_format="gptq"), "cpu")
    assert lin.g_idx is not None and lin.perm is None
    return lin


def _quant_linear(k, n, spec, gen, bias=False, g_idx=None) -> QuantLinear:
    w = _random_qweight(k, n, spec.group_size, spec.sym, g_idx is not None, gen)
    if g_idx is not None:
        w = dataclasses.replace(w, g_idx=g_idx)
    tensors = pack_awq(w) if spec.method == "awq" else pack_gptq(w, checkpoint_format="gptq")
    if bias:
        tensors["bias"] = torch.randn(n, generator=gen)
    lin = QuantLinear(k, n, bias, spec, torch.float32)
    lin.load_checkpoint_tensors(tensors, "cpu")
    return lin


def test_quantlinear_concat_and_refusals():
    gen = torch.Generator().manual_seed(11)
    gptq = QuantSpec("gptq", group_size=32, desc_act=True)
    g_idx = _random_qweight(64, 8, 32, False, True, gen).g_idx
    parts = [_quant_linear(64, n, gptq, gen, bias=True, g_idx=g_idx) for n in (32, 16, 16)]
    merged = concat_linears(parts)
    x = torch.randn(5, 64, generator=gen)
    assert merged.out_features == 64 and merged.perm is parts[0].perm
    assert torch.allclose(merged(x), torch.cat([p(x) for p in parts], -1), atol=1e-5)
    assert merge_mismatch(parts) is None

    other_perm = _quant_linear(64, 16, gptq, gen, g_idx=_random_qweight(
        64, 8, 32, False, True, gen).g_idx)
    no_bias = [_quant_linear(64, 16, gptq, gen, g_idx=g_idx) for _ in range(2)]
    awq = _quant_linear(64, 16, QuantSpec("awq", group_size=32), gen)
    general = _general_g_idx_linear(64, 16, gen)
    cases = {"different act-order permutations": [no_bias[0], other_perm],
             "bias": [parts[0], no_bias[0]],
             "spec": [no_bias[0], awq],
             "general g_idx": [general, _general_g_idx_linear(64, 16, gen)],
             "act-order on some": [no_bias[0], _quant_linear(64, 16, gptq, gen)],
             "mix of quantized": [no_bias[0], nn.Linear(64, 16)]}
    for reason, bad in cases.items():
        assert reason in merge_mismatch(bad)
        with pytest.raises(ValueError, match="cannot merge"):
            merge_linears(bad)
    assert general(x).shape == (5, 16)  # the refused kind still computes (torch reference)


def test_plain_linear_merge_refusals():
    a, b = nn.Linear(16, 8), nn.Linear(16, 8)
    merged = merge_linears([a, b])
    x = torch.randn(3, 16)
    assert torch.allclose(merged(x), torch.cat([a(x), b(x)], -1), atol=1e-6)
    assert not merged.weight.requires_grad
    assert "dtypes" in merge_mismatch([a, nn.Linear(16, 8, dtype=torch.float16)])
    assert "bias" in merge_mismatch([a, nn.Linear(16, 8, bias=False)])


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_wake_keeps_merged_layers(tiny_dir, level, monkeypatch):  # noqa: F811
    """Greedy outputs of the merged engine equal the unmerged one's, and stay the same across
    sleep/wake; level 2 reloads through load_model, which merges again."""
    from edge_llm import LLM, SamplingParams

    prompts = ["The capital of France is", "1, 2, 3, 4,", "def main():"]
    params = SamplingParams(max_tokens=8, temperature=0.0)
    with monkeypatch.context() as patch:
        unmerged_engine_loads(patch)
        plain = LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256)
    assert _layout(plain.engine.runner.model)[0] == (False, False)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    llm = LLM(str(tiny_dir), device="cpu", max_num_batched_tokens=256)
    assert _layout(llm.engine.runner.model) == [(True, True)] * 2
    before = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    llm.engine.sleep(level)
    llm.engine.wake_up()
    assert _layout(llm.engine.runner.model) == [(True, True)] * 2
    after = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert before == want and after == want
