"""Our decoder against transformers' implementation of the same weights (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from edge_llm.model.arch import UnsupportedArchitectureError, parse_arch_config
from edge_llm.model.attention_metadata import AttentionMetadata
from edge_llm.model.loader import load_model
from tests.helpers import ARCH_CASES, rel_err, save_hf_checkpoint, tiny_hf_model


def _meta(starts: list[int], lens: list[int], tables: list[list[int]], slots: list[int], bs):
    width = max(len(t) for t in tables)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_query_len=max(b - a for a, b in zip(starts, starts[1:], strict=False)),
        max_seq_len=max(lens),
    )


def run_prefill_then_decode(lm, ids: torch.Tensor, block_size: int = 16):
    """Prefill ``ids[:-1]`` in two chunks then decode the last token, over shuffled blocks."""
    arch = lm.arch
    t = ids.numel()
    nblk = t // block_size + 2
    table = torch.randperm(nblk + 3)[:nblk].tolist()  # non-contiguous physical blocks
    shape = (nblk + 3, block_size, arch.num_kv_heads, arch.head_dim)
    kv = [(torch.randn(shape), torch.randn(shape)) for _ in range(arch.num_layers)]
    slot = lambda p: table[p // block_size] * block_size + p % block_size  # noqa: E731
    logits = []
    cut = (t - 1) // 2
    for lo, hi in ((0, cut), (cut, t - 1), (t - 1, t)):
        meta = _meta([0, hi - lo], [hi], [table], [slot(p) for p in range(lo, hi)], block_size)
        with torch.no_grad():
            h = lm(ids[lo:hi], torch.arange(lo, hi), kv, meta)
            logits.append(lm.compute_logits(h))
    return torch.cat(logits)


@pytest.mark.parametrize("arch", list(ARCH_CASES))
def test_logits_match_transformers(arch, tmp_path):
    hf = tiny_hf_model(arch)
    path = save_hf_checkpoint(hf, tmp_path / arch)
    loaded = load_model(str(path), device="cpu", progress=False)
    assert loaded.dtype == torch.float32 and loaded.quant_spec is None
    torch.manual_seed(1)
    ids = torch.randint(0, hf.config.vocab_size, (45,))
    ours = run_prefill_then_decode(loaded.model, ids)
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(ours, ref) < 1e-4


def test_batched_sequences_match_alone(tmp_path):
    """Two sequences in one flat batch give the same logits as each alone."""
    hf = tiny_hf_model("Qwen2ForCausalLM")
    lm = load_model(str(save_hf_checkpoint(hf, tmp_path / "m")), device="cpu",
                    progress=False).model
    a, b = torch.randint(0, 160, (20,)), torch.randint(0, 160, (7,))
    bs = 8
    shape = (10, bs, 2, 16)
    kv = [(torch.randn(shape), torch.randn(shape)) for _ in range(2)]
    ta, tb = [3, 0, 7], [5]
    slots = [ta[p // bs] * bs + p % bs for p in range(20)] + [tb[0] * bs + p for p in range(7)]
    meta = _meta([0, 20, 27], [20, 7], [ta, tb], slots, bs)
    with torch.no_grad():
        both = lm.compute_logits(lm(torch.cat([a, b]), torch.cat([torch.arange(20),
                                                                   torch.arange(7)]), kv, meta))
        ref_a = hf(a[None]).logits[0]
        ref_b = hf(b[None]).logits[0]
    assert rel_err(both[:20], ref_a) < 1e-4
    assert rel_err(both[20:], ref_b) < 1e-4


def test_first_layers_runs_a_truncated_model(tmp_path):
    """``CausalLM.first_layers(1)`` (the start-up warm-ups): the forward runs the first
    decoder layer only, over the first layer's cache, as transformers' model cut to one
    layer does; afterwards, and after an error inside, the whole model runs again."""
    hf = tiny_hf_model("LlamaForCausalLM")
    lm = load_model(str(save_hf_checkpoint(hf, tmp_path / "m")), device="cpu",
                    progress=False).model
    assert len(lm.model.layers) > 1
    torch.manual_seed(2)
    ids = torch.randint(0, hf.config.vocab_size, (12,))
    bs = 16
    meta = _meta([0, 12], [12], [[0]], list(range(12)), bs)
    shape = (1, bs, lm.arch.num_kv_heads, lm.arch.head_dim)
    with torch.no_grad(), lm.first_layers(1):
        one = lm.compute_logits(lm(ids, torch.arange(12), [(torch.zeros(shape),
                                                            torch.zeros(shape))], meta))
    hf.model.layers = hf.model.layers[:1]
    hf.config.num_hidden_layers = 1
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(one, ref) < 1e-4
    assert lm.num_active_layers is None
    with pytest.raises(RuntimeError, match="boom"), lm.first_layers(1):
        raise RuntimeError("boom")
    assert lm.num_active_layers is None
    with pytest.raises(ValueError, match="n must be 1.."):
        with lm.first_layers(0):
            pass
    kv = [(torch.zeros(shape), torch.zeros(shape)) for _ in lm.model.layers]
    with torch.no_grad():  # the whole model: a different result
        full = lm.compute_logits(lm(ids, torch.arange(12), kv, meta))
    assert rel_err(full, ref) > 1e-2


def test_half_precision_checkpoint_loads(tmp_path):
    hf = tiny_hf_model("LlamaForCausalLM")
    state = {k: v.half() for k, v in hf.state_dict().items()}
    path = save_hf_checkpoint(hf, tmp_path / "fp16", state=state, dtype="float16")
    loaded = load_model(str(path), device="cpu", dtype="float32", progress=False)
    ids = torch.randint(0, 160, (12,))
    ours = run_prefill_then_decode(loaded.model, ids)
    hf.load_state_dict({k: v.float() for k, v in state.items()})
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(ours, ref) < 1e-4
    bf = load_model(str(path), device="cpu", dtype="bfloat16", progress=False)
    assert bf.model.lm_head.weight.dtype == torch.bfloat16


def test_unsupported_architecture_is_named():
    with pytest.raises(UnsupportedArchitectureError) as err:
        parse_arch_config({"architectures": ["GPT2LMHeadModel"]})
    msg = str(err.value)
    assert "GPT2LMHeadModel" in msg and "LlamaForCausalLM" in msg and "Qwen3ForCausalLM" in msg
