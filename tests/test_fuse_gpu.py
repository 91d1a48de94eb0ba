"""Merged q/k/v and gate/up projections on a CUDA GPU (``pytest -m gpu``), fp16 AWQ.

Random checkpoints of real 7B layer shapes, cut to a few layers and a 1,024-word vocabulary
(benchmarks/random_checkpoint.py): Llama-2-7B (hidden 4096, MHA 32 heads, intermediate 11008),
Qwen2.5-7B (hidden 3584, GQA 28/4, qkv bias, intermediate 18944) and Qwen3-8B (GQA 32/8,
q/k norm, intermediate 12288). Checks:

- the loader merged every layer (one W4A16 linear for q/k/v, one for gate/up);
- logits of one-sequence forwards of 1, 3, 12 and 100 tokens (the gemv16, dot and
  dequant + cuBLAS kernel paths) equal the unmerged model's within fp16 rounding (< 1e-2
  relative): a larger N changes only the split-K partial sums;
- greedy 32 tokens through the engine (CUDA graphs on; the Llama shape) equal the unmerged
  engine's, or the first difference is at a near-tie of the unmerged run; level-1 sleep/wake
  keeps them.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm import LLM, SamplingParams  # noqa: E402
from edge_llm.model.full_forward import full_logits  # noqa: E402
from edge_llm.model.loader import load_model  # noqa: E402
from tests.helpers import rel_err  # noqa: E402
from tests.test_cuda_graphs_gpu import _scale_lm_head, assert_same_or_near_tie  # noqa: E402
from tests.test_fuse import unmerged_engine_loads  # noqa: E402

VOCAB = 1024
SHAPES = {
    "llama2-7b-4l": dict(architectures=["LlamaForCausalLM"], model_type="llama",
                         hidden_size=4096, intermediate_size=11008, num_hidden_layers=4,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=VOCAB,
                         max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False),
    "qwen2.5-7b-2l": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                          hidden_size=3584, intermediate_size=18944, num_hidden_layers=2,
                          num_attention_heads=28, num_key_value_heads=4, vocab_size=VOCAB,
                          max_position_embeddings=1024, rope_theta=1000000.0,
                          rms_norm_eps=1e-6, tie_word_embeddings=False),
    # q/k norm over (T, H, D) views of the merged output (the two-stride rms_norm path)
    "qwen3-8b-2l": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                        hidden_size=4096, intermediate_size=12288, num_hidden_layers=2,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        vocab_size=VOCAB, max_position_embeddings=1024, rope_theta=1000000.0,
                        rms_norm_eps=1e-6, tie_word_embeddings=False),
}
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=32, logprobs=2)


@pytest.fixture(scope="module")
def awq_dirs(tmp_path_factory) -> Callable[[str], Path]:
    """Shape name -> its random AWQ checkpoint, written on first use."""
    from benchmarks import random_checkpoint as rc

    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            rc.SHAPES[name] = SHAPES[name]
            try:
                made[name] = rc.make_random_checkpoint(
                    name, "awq", tmp_path_factory.mktemp(name), group_size=128, device="cuda")
            finally:
                rc.SHAPES.pop(name)
            _scale_lm_head(made[name], 20.0)  # logits spread like a trained model's
            if SHAPES[name]["model_type"] == "qwen3":
                _add_qk_norms(made[name], SHAPES[name])
        return made[name]

    return get


def _add_qk_norms(path: Path, cfg: dict) -> None:
    """The q_norm / k_norm weights random_checkpoint.py does not write, in a shard of their
    own (listed in the index)."""
    import json

    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(2)
    d = cfg["head_dim"]
    tensors = {f"model.layers.{i}.self_attn.{n}.weight":
               (1 + 0.1 * torch.randn(d, generator=gen)).half()
               for i in range(cfg["num_hidden_layers"]) for n in ("q_norm", "k_norm")}
    save_file(tensors, str(path / "qk-norms.safetensors"), metadata={"format": "pt"})
    index_path = path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update(dict.fromkeys(tensors, "qk-norms.safetensors"))
    index_path.write_text(json.dumps(index, indent=1))


@pytest.fixture(autouse=True)
def free_device():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def _merged_layers(lm) -> list[bool]:
    return [layer.self_attn.qkv_proj is not None and layer.mlp.gate_up_proj is not None
            and not hasattr(layer.self_attn, "q_proj") and not hasattr(layer.mlp, "up_proj")
            for layer in lm.model.layers]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_merged_logits_equal_unmerged(awq_dirs, shape):
    awq_dir = awq_dirs(shape)
    kw = dict(device="cuda", dtype="float16", progress=False)
    merged = load_model(str(awq_dir), merge_projections=True, **kw).model
    plain = load_model(str(awq_dir), merge_projections=False, **kw).model
    assert all(_merged_layers(merged)) and not any(_merged_layers(plain))
    gen = torch.Generator().manual_seed(0)
    for t in (1, 3, 12, 100):
        ids = torch.randint(3, VOCAB, (t,), generator=gen)
        got, want = full_logits(merged, ids), full_logits(plain, ids)
        assert torch.isfinite(got).all() and want.std() > 1.0  # not a degenerate model
        err = rel_err(got, want)
        assert err < 1e-2, f"{t} tokens: relative error {err:.2e}"


def _llm(path: Path, monkeypatch, merge: bool) -> LLM:
    with monkeypatch.context() as patch:
        if not merge:
            unmerged_engine_loads(patch)
        return LLM(str(path), device="cuda", dtype="float16", max_model_len=512,
                   block_size=16, max_num_seqs=4, max_num_batched_tokens=256,
                   kv_cache_memory=1 << 28, swap_space=0.0, enable_prefix_caching=False)


def test_greedy_equals_unmerged_engine(awq_dirs, monkeypatch):
    awq_dir = awq_dirs("llama2-7b-4l")
    gen = torch.Generator().manual_seed(1)
    prompts = [{"prompt_token_ids": torch.randint(3, VOCAB, (n,), generator=gen).tolist()}
               for n in (5, 17, 40)]
    plain = _llm(awq_dir, monkeypatch, merge=False)
    assert not any(_merged_layers(plain.engine.runner.model))
    ref = [o.outputs[0] for o in plain.generate(prompts, GREEDY, use_tqdm=False)]
    del plain
    gc.collect()
    llm = _llm(awq_dir, monkeypatch, merge=True)
    assert all(_merged_layers(llm.engine.runner.model))
    assert llm.engine.stats()["num_cuda_graphs"] > 0  # the merged layers captured in graphs
    got = [o.outputs[0] for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert all(len(o.token_ids) == 32 for o in got)
    assert_same_or_near_tie(ref, got)
    llm.engine.sleep(1)
    llm.engine.wake_up()
    again = [o.outputs[0] for o in llm.generate(prompts, GREEDY, use_tqdm=False)]
    assert [o.token_ids for o in again] == [o.token_ids for o in got]
