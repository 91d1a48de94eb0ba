"""Small assert helpers and builders shared by tests (no fixtures here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run_bench_script(name: str, tmp_path: Path, *args: str, timeout: float = 300):
    """``python benchmarks/<name> *args`` with OUT=tmp_path and cwd tmp_path (the smoke runs
    of the benchmark scripts); asserts exit code 0 and returns the finished process."""
    env = dict(os.environ, OUT=str(tmp_path), OMP_WAIT_POLICY="PASSIVE")
    proc = subprocess.run([sys.executable, str(BENCHMARKS / name), *args], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc

ARCH_CASES = {
    "LlamaForCausalLM": dict(
        model_type="llama",
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
    "MistralForCausalLM": dict(model_type="mistral"),
    "Qwen2ForCausalLM": dict(model_type="qwen2", tie_word_embeddings=True),
    "Qwen3ForCausalLM": dict(model_type="qwen3"),
    # the families of issue 39; the tests run 40-45 tokens: past every window here and past
    # every scaling threshold (original_max_position_embeddings)
    "Gemma2ForCausalLM": dict(
        model_type="gemma2", layers=3, sliding_window=8, query_pre_attn_scalar=24,
        # q/k weights scaled so that scores reach the cap's range; caps that change them
        qk_gain=6.0, attn_logit_softcapping=1.0, final_logit_softcapping=2.0,
    ),
    "Gemma3ForCausalLM": dict(
        model_type="gemma3_text", layers=3, sliding_window=8, query_pre_attn_scalar=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                         "full_attention": {"rope_type": "linear", "factor": 4.0,
                                            "rope_theta": 1000.0}},
    ),
    "Phi3ForCausalLM": dict(
        model_type="phi3", max_pos=128, original_max_position_embeddings=32, pad_token_id=0,
        bos_token_id=1, eos_token_id=2,
        sliding_window=24, rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0,
            "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0],
            "long_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 12.0, 16.0]},
    ),
    # Mistral-Nemo: head_dim 32 where hidden / heads is 16
    "MistralNemo": dict(model_type="mistral", arch="MistralForCausalLM", head_dim=32,
                        sliding_window=16),
    # Qwen2.5 with YaRN past 16 positions
    "Qwen2.5-yarn": dict(model_type="qwen2", arch="Qwen2ForCausalLM", rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
}


def tiny_hf_model(arch: str, *, hidden: int = 64, inter: int = 128, vocab: int = 160,
                  heads: int = 4, kv_heads: int = 2, layers: int = 2, seed: int = 0,
                  max_pos: int = 2048):
    """A random transformers model of ``ARCH_CASES[arch]`` (fp32, eval); a case's ``layers``,
    ``max_pos`` and ``head_dim`` override the arguments, ``arch`` names its class."""
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = dict(ARCH_CASES[arch])
    model_type = extra.pop("model_type")
    layers = extra.pop("layers", layers)
    max_pos = extra.pop("max_pos", max_pos)
    extra.setdefault("head_dim", hidden // heads)
    arch = extra.pop("arch", arch)
    qk_gain = extra.pop("qk_gain", 1.0)
    cfg = AutoConfig.for_model(
        model_type, vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_pos, **extra,
    )
    cfg.architectures = [arch]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # HF zero-inits biases; random ones make the Qwen2 bias path count
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(qk_gain)
    return model


def save_hf_checkpoint(model, out: Path, state: dict | None = None,
                       quantization_config: dict | None = None, dtype: str = "float32") -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = state if state is not None else model.state_dict()
    tied = model.config.tie_word_embeddings
    tensors = {k: v.contiguous() for k, v in state.items()
               if not (tied and k == "lm_head.weight")}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg["torch_dtype"] = dtype
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    return float((a - b).norm() / b.norm())
