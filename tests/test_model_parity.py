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


# what each case must exercise: the ArchConfig change that breaks it (and by how much at least)
FEATURES = [
    ("Gemma2ForCausalLM", dict(sliding_window=None), "window"),
    ("Gemma2ForCausalLM", dict(attn_softcap=None), "softcap"),
    ("Gemma2ForCausalLM", dict(final_softcap=None), None),
    ("Gemma3ForCausalLM", dict(local_rope_theta=1000.0), None),
    ("Gemma3ForCausalLM", dict(sliding_window=None), "window"),
    ("Phi3ForCausalLM", dict(sliding_window=None), "window"),
    ("MistralNemo", dict(sliding_window=None), "window"),
    ("Qwen2.5-yarn", dict(rope_scaling=None), None),
]


@pytest.mark.parametrize("case,change,attr", FEATURES,
                         ids=[f"{c}-{next(iter(ch))}" for c, ch, _ in FEATURES])
def test_parity_cases_exercise_their_feature(case, change, attr, tmp_path):
    """Each family's parity test would fail without the feature it is there for: the same
    model with that feature switched off is far from transformers' logits."""
    import dataclasses

    hf = tiny_hf_model(case)
    lm = load_model(str(save_hf_checkpoint(hf, tmp_path / "m")), device="cpu",
                    progress=False).model
    torch.manual_seed(3)
    ids = torch.randint(0, hf.config.vocab_size, (45,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(run_prefill_then_decode(lm, ids), ref) < 1e-4
    lm.arch = dataclasses.replace(lm.arch, **change)
    for module in lm.modules():
        if attr is not None and hasattr(module, attr):
            setattr(module, attr, None)
    for rot in (lm.rotary, lm.local_rotary):
        if rot is not None:
            rot.arch = lm.arch
            rot.build_tables(None)
    assert rel_err(run_prefill_then_decode(lm, ids), ref) > 1e-3


def test_longrope_short_factors_within_the_original_context(tmp_path):
    """Phi-3's LongRoPE: loaded for a context within original_max_position_embeddings (32
    here), the short factors serve, as transformers uses them for a sequence that short;
    loaded for more, the long ones (the parity test above, at 45 tokens)."""
    hf = tiny_hf_model("Phi3ForCausalLM")
    path = save_hf_checkpoint(hf, tmp_path / "m")
    short = load_model(str(path), device="cpu", progress=False, max_positions=32).model
    long = load_model(str(path), device="cpu", progress=False).model
    ids = torch.randint(0, hf.config.vocab_size, (30,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(run_prefill_then_decode(short, ids), ref) < 1e-4
    assert rel_err(run_prefill_then_decode(long, ids), ref) > 1e-3


@pytest.mark.parametrize("arch,needle", [
    ("MixtralForCausalLM", "mixture-of-experts"),
    ("Qwen3MoeForCausalLM", "mixture-of-experts"),
    ("Phi4MMForCausalLM", "multimodal"),
    ("FalconForCausalLM", "Unsupported architecture FalconForCausalLM"),
])
def test_unsupported_families_are_refused_by_name(arch, needle):
    with pytest.raises(UnsupportedArchitectureError, match=needle) as err:
        parse_arch_config({"architectures": [arch], "num_attention_heads": 4,
                           "hidden_size": 64})
    assert arch in str(err.value) and "Gemma2ForCausalLM" in str(err.value)


def test_partial_rotary_and_unknown_rope_are_refused():
    base = {"architectures": ["Phi3ForCausalLM"], "num_attention_heads": 4, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 100}
    with pytest.raises(UnsupportedArchitectureError, match="partial_rotary_factor=0.75"):
        parse_arch_config({**base, "partial_rotary_factor": 0.75})
    with pytest.raises(UnsupportedArchitectureError, match="'dynamic'"):
        parse_arch_config({**base, "rope_scaling": {"type": "dynamic", "factor": 2.0}})


def test_hub_style_configs_parse():
    """The keys the hub's config.json files carry (transformers 4): Gemma 3's
    rope_local_base_freq and sliding_window_pattern, Gemma 2's alternating layers, Phi-3's
    ``su`` scaling, Mistral-Nemo's explicit head_dim."""
    common = {"num_attention_heads": 8, "hidden_size": 256, "intermediate_size": 512,
              "vocab_size": 100, "num_key_value_heads": 4}
    g3 = parse_arch_config({**common, "architectures": ["Gemma3ForCausalLM"],
                            "num_hidden_layers": 12, "rope_theta": 1e6, "head_dim": 256,
                            "rope_local_base_freq": 1e4, "sliding_window": 512,
                            "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
                            "rope_scaling": {"rope_type": "linear", "factor": 8.0}})
    assert [g3.layer_window(i) for i in range(12)] == ([512] * 5 + [None]) * 2
    assert g3.local_rope_theta == 1e4 and g3.rope_scaling["factor"] == 8.0
    assert g3.qk_norm and g3.norm_plus_one and g3.attn_scale == 256 ** -0.5
    g2 = parse_arch_config({**common, "architectures": ["Gemma2ForCausalLM"],
                            "num_hidden_layers": 4, "sliding_window": 4096,
                            "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0})
    assert [g2.layer_window(i) for i in range(4)] == [4096, None, 4096, None]
    assert g2.attn_softcap == 50.0 and g2.mlp_act == "gelu_tanh" and g2.tie_word_embeddings
    phi = parse_arch_config({**common, "architectures": ["Phi3ForCausalLM"],
                             "num_hidden_layers": 2, "original_max_position_embeddings": 4096,
                             "max_position_embeddings": 131072, "rope_scaling": {
                                 "type": "su", "short_factor": [1.0] * 16,
                                 "long_factor": [2.0] * 16}})
    assert phi.rope_scaling["rope_type"] == "longrope" and phi.merged_checkpoint
    assert phi.rope_scaling["original_max_position_embeddings"] == 4096
    nemo = parse_arch_config({**common, "architectures": ["MistralForCausalLM"],
                              "num_hidden_layers": 2, "head_dim": 128, "hidden_size": 5120,
                              "num_attention_heads": 32, "sliding_window": None})
    assert nemo.head_dim == 128 and nemo.sliding_window is None


@pytest.mark.parametrize("layout", ["language_model.model.", "model.language_model."])
def test_multimodal_gemma3_loads_its_text_decoder(layout, tmp_path):
    """Gemma3ForConditionalGeneration (gemma-3-4b/12b/27b): the text decoder's tensors under
    the transformers 4 (``language_model.model.``) or 5 (``model.language_model.``) prefix
    load, the vision tower and projector are skipped, the config's ``text_config`` fills
    Gemma3TextConfig's defaults, and the logits are transformers' Gemma3ForCausalLM's."""
    import json

    from safetensors.torch import save_file

    hf = tiny_hf_model("Gemma3ForCausalLM")
    out = tmp_path / "mm"
    out.mkdir()
    state = {(layout + k.removeprefix("model.")) if k.startswith("model.") else k: v
             for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    state["vision_tower.vision_model.post_layernorm.weight"] = torch.randn(8)
    state["multi_modal_projector.mm_input_projection_weight"] = torch.randn(8, 64)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    text = {k: v for k, v in hf.config.to_dict().items() if k != "architectures"}
    (out / "config.json").write_text(json.dumps({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": text, "vision_config": {"model_type": "siglip_vision_model"},
        "eos_token_id": [1, 106], "torch_dtype": "float32"}))
    loaded = load_model(str(out), device="cpu", progress=False)
    assert loaded.arch.multimodal_text and loaded.arch.eos_token_ids == (1, 106)
    ids = torch.randint(0, hf.config.vocab_size, (45,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(run_prefill_then_decode(loaded.model, ids), ref) < 1e-4


def test_multimodal_gemma3_hub_config_takes_text_defaults():
    """gemma-3-4b-it's config.json lists only what differs from Gemma3TextConfig."""
    arch = parse_arch_config({
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "eos_token_id": [1, 106], "torch_dtype": "bfloat16",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                        "model_type": "gemma3_text", "num_hidden_layers": 34,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024}})
    assert (arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.vocab_size) == (
        8, 4, 256, 262208)
    assert [arch.layer_window(i) for i in range(6)] == [1024] * 5 + [None]
    assert arch.local_rope_theta == 10000.0 and arch.rope_theta == 1e6
    assert arch.rope_scaling["factor"] == 8.0 and arch.torch_dtype == "bfloat16"
    assert arch.attn_scale == 256 ** -0.5 and arch.qk_norm and arch.tie_word_embeddings
