"""Quantized checkpoints of every format load through our loader and match transformers run
on the dequantized weights (fp32, CPU: ``dtype="float32"``, the reference path; "auto" would
take bf16 and the int4 CPU kernel, whose agreement tests/test_quant_linear.py checks)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edge_llm.model.loader import load_model
from edge_llm.quant import (
    QuantizedWeight,
    detect_quant_spec,
    pack_awq,
    pack_compressed,
    pack_gptq,
    quantization_config_for,
)
from tests.helpers import ARCH_CASES, rel_err, save_hf_checkpoint, tiny_hf_model
from tests.test_model_parity import run_prefill_then_decode

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
           "qkv_proj", "gate_up_proj")  # the last two: Phi-3's merged checkpoint linears


def _random_qweight(k: int, n: int, gs: int, sym: bool, act_order: bool, gen) -> QuantizedWeight:
    g = k // gs
    q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
    zeros = (torch.full((g, n), 8, dtype=torch.int32) if sym
             else torch.randint(0, 16, (g, n), generator=gen, dtype=torch.int32))
    # fp16-representable scales, as every format stores them
    scales = (torch.rand(g, n, generator=gen) * 0.04 + 0.01).half().float()
    if act_order:
        perm = torch.randperm(k, generator=gen)
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[perm] = (torch.arange(k) // gs).to(torch.int32)  # non-monotonic
    else:
        g_idx = (torch.arange(k) // gs).to(torch.int32)
    return QuantizedWeight(q=q, zeros=zeros, scales=scales, g_idx=g_idx, group_size=gs)


def _dequant(w: QuantizedWeight) -> torch.Tensor:
    gi = w.g_idx.long()
    return ((w.q - w.zeros[gi]).float() * w.scales[gi]).t().contiguous()  # (N, K)


def _compressed_config(gs: int, sym: bool, act_order: bool) -> dict:
    strategy = "channel" if gs == -1 else "group"
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "symmetric": sym, "strategy": strategy,
                        "group_size": None if gs == -1 else gs, "dynamic": False,
                        "actorder": "group" if act_order else None},
            "input_activations": None, "output_activations": None,
        }},
    }


# (name, format, group size, sym, act-order, checkpoint_format)
CASES = [
    ("awq-g32", "awq", 32, False, False, None),
    ("awq-g64-sym", "awq", 64, True, False, None),
    ("gptq-v1-g32-sym-act", "gptq", 32, True, True, "gptq"),
    ("gptq-v1-perchannel-asym", "gptq", -1, False, False, "gptq"),
    ("gptq-v2-g64-asym-act", "gptq", 64, False, True, "gptq_v2"),
    ("ct-g32-sym", "compressed-tensors", 32, True, False, None),
    ("ct-channel-asym", "compressed-tensors", -1, False, False, None),
]


# which layer input each linear reads (act-order GPTQ gives linears of one input one g_idx)
INPUT_GROUPS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "o",
                "gate_proj": "gate_up", "up_proj": "gate_up", "down_proj": "down",
                "qkv_proj": "qkv", "gate_up_proj": "gate_up"}


def _quantized_checkpoint(hf, case, path, shared_perm: bool = False,
                          keep_plain: tuple[str, ...] = (), seed: int | None = None):
    """``hf``'s linears quantized into ``case``'s format (``hf`` gets the dequantized weights).
    ``shared_perm``: one act-order g_idx per layer input (as GPTQ gives q/k/v and gate/up),
    else one per linear. ``keep_plain``: linears the producer leaves unquantized."""
    _, fmt, gs, sym, act, ckpt = case
    gen = torch.Generator().manual_seed(hash(case[0]) % 1000 if seed is None else seed)
    shared: dict[tuple[str, str], torch.Tensor] = {}
    state = dict(hf.state_dict())
    for name, module in hf.named_modules():
        if not name.endswith(LINEARS) or name in keep_plain:
            continue
        k, n = module.in_features, module.out_features
        w = _random_qweight(k, n, k if gs == -1 else gs, sym, act, gen)
        if act and shared_perm:
            owner, _, leaf = name.rpartition(".")
            g_idx = shared.setdefault((owner, INPUT_GROUPS[leaf]), w.g_idx)
            w = dataclasses.replace(w, g_idx=g_idx.clone())  # safetensors refuses shared
        with torch.no_grad():
            module.weight.copy_(_dequant(w))  # the reference runs on the dequantized weights
        del state[f"{name}.weight"]
        if fmt == "awq":
            packed = pack_awq(w)
        elif fmt == "gptq":
            packed = pack_gptq(w, checkpoint_format=ckpt)
        else:
            packed = pack_compressed(w, sym=sym)
        state.update({f"{name}.{key}": t for key, t in packed.items()})
    if fmt == "compressed-tensors":
        qcfg = _compressed_config(gs, sym, act)
    else:
        qcfg = quantization_config_for(fmt, group_size=gs, sym=sym, desc_act=act,
                                       **({"checkpoint_format": ckpt} if ckpt else {}))
    return save_hf_checkpoint(hf, path, state=state, quantization_config=qcfg)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_llama_every_format(case, tmp_path):
    _check(tiny_hf_model("LlamaForCausalLM"), case, tmp_path)


@pytest.mark.parametrize("arch", [a for a in ARCH_CASES if a != "LlamaForCausalLM"])
def test_other_architectures_quantized(arch, tmp_path):
    case = CASES[list(ARCH_CASES).index(arch) * 2 % len(CASES)]
    _check(tiny_hf_model(arch), case, tmp_path)


def _check(hf, case, tmp_path):
    path = _quantized_checkpoint(hf, case, tmp_path / case[0])
    loaded = load_model(str(path), device="cpu", dtype="float32", progress=False)
    assert loaded.quant_spec is not None and loaded.quant_spec.method == case[1]
    ids = torch.randint(0, hf.config.vocab_size, (40,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(run_prefill_then_decode(loaded.model, ids), ref) < 1e-4


def _add_to_checkpoint(path, extra: dict) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(path / "model.safetensors"))
    save_file({**state, **extra}, str(path / "model.safetensors"), metadata={"format": "pt"})


def _matches(hf, path) -> None:
    loaded = load_model(str(path), device="cpu", dtype="float32", progress=False)
    ids = torch.randint(0, hf.config.vocab_size, (24,))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    assert rel_err(run_prefill_then_decode(loaded.model, ids), ref) < 1e-4


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen2ForCausalLM"])
def test_autogptq_zero_biases_on_every_linear_are_skipped(arch, tmp_path):
    """AutoGPTQ 0.2-0.7.1 and optimum saved a zero ``bias`` on every quantized linear; where
    the model has no bias they are skipped (as vLLM does). A nonzero one is still refused."""
    hf = tiny_hf_model(arch)
    case = CASES[2]  # GPTQ v1, act-order
    path = _quantized_checkpoint(hf, case, tmp_path / "gptq")
    zeros = {f"{name}.bias": torch.zeros(m.out_features) for name, m in hf.named_modules()
             if name.endswith(LINEARS) and m.bias is None}
    assert zeros
    _add_to_checkpoint(path, zeros)
    _matches(hf, path)
    some = next(iter(zeros))
    _add_to_checkpoint(path, {some: torch.ones_like(zeros[some])})
    with pytest.raises(ValueError, match="unexpected tensors \\['bias'\\]"):
        load_model(str(path), device="cpu", progress=False)


def test_unquantized_projection_with_a_bias_loads(tmp_path):
    """Qwen2 with its attention left unquantized in one layer (AWQ modules_to_not_convert):
    the q/k/v biases, which come before their weights, go to the plain linears."""
    hf = tiny_hf_model("Qwen2ForCausalLM")
    plain = tuple(f"model.layers.1.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj",
                                                            "o_proj"))
    path = _quantized_checkpoint(hf, CASES[0], tmp_path / "awq", keep_plain=plain)
    _matches(hf, path)


def test_compressed_tensors_producer_variants(tmp_path):
    """llm-compressor 0.2-0.5's ``sparsity_config`` of format "dense" and compressed-tensors
    <= 0.6's ``compression_config`` key load; a ``transform_config`` is refused."""
    import json

    from edge_llm.quant import UnsupportedQuantizationError

    hf = tiny_hf_model("LlamaForCausalLM")
    path = _quantized_checkpoint(hf, CASES[5], tmp_path / "ct")
    cfg = json.loads((path / "config.json").read_text())
    qc = cfg.pop("quantization_config")
    dense = {"format": "dense", "global_sparsity": 0.15, "sparsity_structure": "unstructured",
             "targets": [], "ignore": [], "registry_requires_subclass": False}
    (path / "config.json").write_text(json.dumps(
        {**cfg, "compression_config": {**qc, "sparsity_config": dense}}))
    _matches(hf, path)
    for extra in ({"sparsity_config": {**dense, "format": "sparse-24-bitmask"}},
                  {"transform_config": {"config_groups": {"u": {"type": "hadamard"}}}}):
        (path / "config.json").write_text(json.dumps({**cfg, "quantization_config": {**qc,
                                                                                     **extra}}))
        with pytest.raises(UnsupportedQuantizationError, match=next(iter(extra))):
            load_model(str(path), device="cpu", progress=False)


def test_autoround_gptq_packing_loads(tmp_path):
    """AutoRound's default export (packing_format "auto_round:auto_gptq"): GPTQ v1 words, as
    its exporter's ``pack`` writes them (zero minus one); a layer kept at 16 bits in
    ``extra_config`` is a plain linear. Its AWQ packing and 8-bit layers are refused."""
    import json

    from edge_llm.quant import UnsupportedQuantizationError

    hf = tiny_hf_model("LlamaForCausalLM")
    plain = "model.layers.1.mlp.down_proj"
    for sym in (True, False):
        case = ("gptq-v1", "gptq", 32, sym, False, "gptq")
        path = _quantized_checkpoint(hf, case, tmp_path / f"ar-{sym}", keep_plain=(plain,))
        cfg = json.loads((path / "config.json").read_text())
        cfg["quantization_config"] = {
            "quant_method": "auto-round", "packing_format": "auto_round:auto_gptq", "bits": 4,
            "group_size": 32, "sym": sym, "data_type": "int", "act_bits": 16,
            "autoround_version": "0.8.0", "block_name_to_quantize": "model.layers",
            "extra_config": {plain: {"bits": 16, "data_type": "float"}}}
        (path / "config.json").write_text(json.dumps(cfg))
        _matches(hf, path)
    for change, needle in (({"packing_format": "auto_round:auto_awq"}, "auto_awq"),
                           ({"extra_config": {plain: {"bits": 8}}}, "extra_config"),
                           ({"act_bits": 8}, "activations")):
        qc = {**cfg["quantization_config"], **change}
        with pytest.raises(UnsupportedQuantizationError, match=needle):
            detect_quant_spec(path, {"quantization_config": qc})
