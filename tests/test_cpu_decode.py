"""The CPU decode path of model/cpu_decode.py: the same hidden states and cache contents as the
general forward, bit for bit, for 4-bit bf16 and plain fp32 models, over consecutive and
scattered blocks; the layers it does not serve keep the general forward; the engine takes it."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from edge_llm import LLM, SamplingParams
from edge_llm.engine.cpu_threads import threads_at_most
from edge_llm.model.cpu_decode import (
    ONE_THREAD_MAX_WEIGHTS,
    CpuDecoder,
    cpu_decode_supported,
    decode_threads,
)
from edge_llm.model.loader import load_model
from tests.engine_fixtures import TOKENIZER_FILES, demo_dir  # noqa: F401
from tests.helpers import save_hf_checkpoint, tiny_hf_model
from tests.test_model_parity import _meta
from tests.test_model_quant_parity import CASES, _quantized_checkpoint

BS = 8  # block size


def _decode_once(lm, kv, lens: list[int], tables: list[list[int]], ids: torch.Tensor, fast: bool):
    """One decode step (a token per sequence at position lens[i]) on a copy of ``kv``;
    (hidden, the copy)."""
    kv = [(k.clone(), v.clone()) for k, v in kv]
    slots = [t[n // BS] * BS + n % BS for t, n in zip(tables, lens, strict=True)]
    meta = _meta(list(range(len(lens) + 1)), [n + 1 for n in lens], tables, slots, BS)
    positions = torch.tensor(lens)
    with torch.inference_mode():
        if fast:
            hidden = CpuDecoder(lm)(ids, positions, kv, meta)
            assert hidden is not None
        else:
            hidden = lm(ids, positions, kv, meta)
    return hidden, kv


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    hf = tiny_hf_model("LlamaForCausalLM")
    out = tmp_path_factory.mktemp("cpu_decode")
    quant = load_model(str(_quantized_checkpoint(hf, CASES[0], out / "awq")), device="cpu",
                       progress=False)
    plain = load_model(str(save_hf_checkpoint(hf, out / "plain")), device="cpu",
                       progress=False)
    assert (quant.dtype, plain.dtype) == (torch.bfloat16, torch.float32)
    return {"awq-bf16": quant.model, "plain-fp32": plain.model}


@pytest.mark.parametrize("name", ["awq-bf16", "plain-fp32"])
def test_same_hidden_states_and_cache_as_the_general_forward(models, name):
    lm = models[name]
    assert cpu_decode_supported(lm)
    arch = lm.arch
    gen = torch.Generator().manual_seed(4)
    shape = (12, BS, arch.num_kv_heads, arch.head_dim)
    dtype = lm.lm_head.weight.dtype
    kv = [(torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype))
          for _ in range(arch.num_layers)]
    # contexts of 1, 8 (a block boundary) and 21 tokens: consecutive blocks, one block,
    # scattered blocks
    lens, tables = [0, 8, 21], [[5], [2, 3], [9, 0, 7]]
    for rows in ([0], [2], [0, 1, 2]):
        ids = torch.randint(0, arch.vocab_size, (len(rows),), generator=gen)
        sub_lens, sub_tables = [lens[i] for i in rows], [tables[i] for i in rows]
        ref, ref_kv = _decode_once(lm, kv, sub_lens, sub_tables, ids, fast=False)
        got, got_kv = _decode_once(lm, kv, sub_lens, sub_tables, ids, fast=True)
        assert torch.equal(got, ref), rows
        for (k0, v0), (k1, v1) in zip(ref_kv, got_kv, strict=True):
            assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_prefill_steps_and_other_layers_keep_the_general_forward(models, tmp_path):
    lm = models["awq-bf16"]
    arch = lm.arch
    kv = [(torch.zeros(4, BS, arch.num_kv_heads, arch.head_dim, dtype=torch.bfloat16),) * 2
          for _ in range(arch.num_layers)]
    prefill = _meta([0, 3], [3], [[0]], [0, 1, 2], BS)
    assert CpuDecoder(lm)(torch.tensor([1, 2, 3]), torch.arange(3), kv, prefill) is None
    gemma = load_model(str(save_hf_checkpoint(tiny_hf_model("Gemma2ForCausalLM"),
                                              tmp_path / "gemma")), device="cpu",
                       progress=False)
    assert not cpu_decode_supported(gemma.model)  # sandwich norms, soft-cap, windows
    unmerged = load_model(str(save_hf_checkpoint(tiny_hf_model("LlamaForCausalLM"),
                                                 tmp_path / "llama")), device="cpu",
                          progress=False, merge_projections=False)
    assert not cpu_decode_supported(unmerged.model)
    with pytest.raises(ValueError, match="not served"):
        CpuDecoder(unmerged.model)


def test_engine_decodes_on_it_with_the_same_tokens(demo_dir, tmp_path):  # noqa: F811
    """A 4-bit model (bf16 on the CPU) in the engine, batch 1 and 3, greedy: the same tokens
    as the general forward."""
    hf = tiny_hf_model("LlamaForCausalLM", vocab=49152)
    path = _quantized_checkpoint(hf, CASES[0], tmp_path / "awq")
    for name in TOKENIZER_FILES:  # the demo's tokenizer
        if (demo_dir / name).is_file():
            shutil.copy(demo_dir / name, path / name)
    llm = LLM(str(path), device="cpu", max_model_len=128, enable_prefix_caching=False)
    runner = llm.engine.runner
    assert runner.cpu_decode and runner.decode_threads == 1
    assert llm.engine.loaded.dtype == torch.bfloat16
    sp = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    for count in (1, 3):
        prompts = [{"prompt_token_ids": list(range(100 + i, 109 + 3 * i))} for i in range(count)]
        runner.cpu_decode = True
        fast = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
        runner.cpu_decode = False
        general = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
        assert fast == general and all(len(t) == 10 for t in fast)
    runner.cpu_decode = True
    llm.engine.sleep(level=2)  # the weights dropped: the decoder lets go of them too
    assert runner.cpu_decoder is None
    llm.engine.wake_up()
    assert runner.cpu_decoder.lm is runner.model
    again = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    assert again == general


def test_small_models_decode_on_one_thread(models):
    arch = models["awq-bf16"].arch
    assert decode_threads(arch) == 1
    h = 1024  # gate_up: 2 * 1024 * 2048 weights, the break-even
    assert 2 * h * 2 * h == ONE_THREAD_MAX_WEIGHTS
    assert decode_threads(dataclasses.replace(arch, hidden_size=h, intermediate_size=2 * h,
                                              head_dim=64, num_heads=16)) is None
    before = torch.get_num_threads()
    with threads_at_most(1):
        assert torch.get_num_threads() == 1
    with threads_at_most(None), threads_at_most(before + 1):
        assert torch.get_num_threads() == before  # never raised
    assert torch.get_num_threads() == before


def test_only_a_bf16_model_gets_the_int4_copy(models, tmp_path):
    """The int4 kernel's packed form is a second copy of the words: built for a bf16 model,
    whose decode runs that kernel, and not for one loaded in fp32 (the exact reference)."""
    def forms(decoder: CpuDecoder) -> list:
        return [lin.form for layer in decoder.layers
                for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]

    assert all(form is not None for form in forms(CpuDecoder(models["awq-bf16"])))
    path = _quantized_checkpoint(tiny_hf_model("LlamaForCausalLM"), CASES[0], tmp_path / "awq")
    fp32 = load_model(str(path), device="cpu", dtype="float32", progress=False).model
    assert fp32.lm_head.weight.dtype == torch.float32
    assert all(form is None for form in forms(CpuDecoder(fp32)))
