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
}


def tiny_hf_model(arch: str, *, hidden: int = 64, inter: int = 128, vocab: int = 160,
                  heads: int = 4, kv_heads: int = 2, layers: int = 2, seed: int = 0,
                  max_pos: int = 2048):
    """A random transformers model of the given architecture (fp32, eval)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = dict(ARCH_CASES[arch])
    model_type = extra.pop("model_type")
    cfg = AutoConfig.for_model(
        model_type, vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=hidden // heads, max_position_embeddings=max_pos, **extra,
    )
    cfg.architectures = [arch]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # HF zero-inits biases; random ones make the Qwen2 bias path count
        for name, p in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
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
