"""Random-weight checkpoints of real model shapes, written in the real AWQ / GPTQ formats.

Any int32 bit pattern is a valid set of eight 4-bit values, so packed tensors are drawn
directly; scales are small positive fp16 so activations stay in range. A word-level tokenizer
with exactly the model's vocabulary makes the folder loadable by the engine.

    python benchmarks/random_checkpoint.py llama2-7b awq /tmp/llama2-7b-awq
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

SHAPES = {
    "llama2-7b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                      intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
                      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    "qwen2.5-7b": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
    "smollm2-135m": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    # issue 39's families: sliding windows, soft caps, head_dim 256, merged projections
    "gemma2-9b": dict(architectures=["Gemma2ForCausalLM"], model_type="gemma2", hidden_size=3584,
                      intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=256, vocab_size=256000,
                      max_position_embeddings=8192, rope_theta=10000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, sliding_window=4096, query_pre_attn_scalar=256,
                      attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                      hidden_activation="gelu_pytorch_tanh"),
    "gemma3-12b": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                       hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                       vocab_size=262208, max_position_embeddings=131072, rope_theta=1000000.0,
                       rope_local_base_freq=10000.0, sliding_window=1024,
                       sliding_window_pattern=6, rope_scaling={"rope_type": "linear",
                                                               "factor": 8.0},
                       query_pre_attn_scalar=256, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       hidden_activation="gelu_pytorch_tanh"),
    "phi3-mini": dict(architectures=["Phi3ForCausalLM"], model_type="phi3", hidden_size=3072,
                      intermediate_size=8192, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32064, max_position_embeddings=4096,
                      rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=2047,
                      tie_word_embeddings=False),
    "mistral-nemo-12b": dict(architectures=["MistralForCausalLM"], model_type="mistral",
                             hidden_size=5120, intermediate_size=14336, num_hidden_layers=40,
                             num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                             vocab_size=131072, max_position_embeddings=131072,
                             rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    # long prompts (issue 37): 128k vocabulary, GQA 8, llama3 rope scaling
    "llama3.1-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                        intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072,
                        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}),
    # CPU smoke runs of the benchmarks (every K a multiple of the group size 128)
    "tiny-llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128,
                       intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=1024, max_position_embeddings=1024,
                       rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    # the long-prompt scenario's smoke: GQA 4, llama3 rope scaling active past 64 positions
    "tiny-llama3": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128,
                        intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=1, vocab_size=1024, max_position_embeddings=4096,
                        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                        rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 64}),
}
FORMATS = ("awq", "gptq", "gptq-act", "fp16")


def _linears(cfg: dict) -> list[tuple[str, int, int, bool]]:
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]  # Gemma, Mistral-Nemo: given
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    bias = cfg["model_type"] == "qwen2"
    if cfg["model_type"] == "phi3":  # merged in the checkpoint: [q | k | v], [gate | up]
        return [("self_attn.qkv_proj", h, q + 2 * kv, False), ("self_attn.o_proj", q, h, False),
                ("mlp.gate_up_proj", h, 2 * i, False), ("mlp.down_proj", i, h, False)]
    return [("self_attn.q_proj", h, q, bias), ("self_attn.k_proj", h, kv, bias),
            ("self_attn.v_proj", h, kv, bias), ("self_attn.o_proj", q, h, False),
            ("mlp.gate_proj", h, i, False), ("mlp.up_proj", h, i, False),
            ("mlp.down_proj", i, h, False)]


def _norms(cfg: dict) -> tuple[tuple[str, ...], float]:
    """A layer's norm names, and the value their weights centre on (Gemma stores w of a
    (1 + w) scale)."""
    if cfg["model_type"].startswith("gemma"):
        return ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm"), 0.0
    return ("input_layernorm", "post_attention_layernorm"), 1.0


# linears that read the same layer input
_INPUT_OF = {"self_attn.q_proj": "attn_in", "self_attn.k_proj": "attn_in",
             "self_attn.v_proj": "attn_in", "mlp.gate_proj": "mlp_in", "mlp.up_proj": "mlp_in"}


def _int32(*shape, gen, device) -> torch.Tensor:
    return torch.randint(-(2**31), 2**31 - 1, shape, generator=gen, dtype=torch.int64,
                         device=device).to(torch.int32)


def _quantized(fmt: str, k: int, n: int, gs: int, gen, device,
               g_idx: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """One linear's checkpoint tensors; ``g_idx``: the act-order groups to use (gptq-act),
    else a random permutation's."""
    g = k // gs
    # (q - z) * s with s ~ 1/(8 sqrt(K)) keeps each output's variance near its input's
    scales = (torch.rand(g, n, generator=gen, device=device) + 0.5) / (6 * k**0.5)
    if fmt == "awq":
        return {"qweight": _int32(k, n // 8, gen=gen, device=device),
                "qzeros": _int32(g, n // 8, gen=gen, device=device), "scales": scales.half()}
    if fmt == "gptq-act" and g_idx is not None:
        g_idx = g_idx.clone()  # safetensors refuses tensors that share memory
    elif fmt == "gptq-act":
        perm = torch.randperm(k, generator=gen, device=device)
        g_idx = torch.empty(k, dtype=torch.int32, device=device)
        g_idx[perm] = (torch.arange(k, device=device) // gs).to(torch.int32)
    else:
        g_idx = (torch.arange(k, device=device) // gs).to(torch.int32)
    return {"qweight": _int32(k // 8, n, gen=gen, device=device),
            "qzeros": _int32(g, n // 8, gen=gen, device=device), "scales": scales.half(),
            "g_idx": g_idx}


def write_tokenizer(out: Path, vocab_size: int) -> None:
    """A word-level tokenizer whose ids are exactly 0..vocab_size-1 ("t0", "t1", ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2",
                                   unk_token="t0")
    fast.save_pretrained(str(out))


def make_random_checkpoint(shape: str, fmt: str, out: Path, group_size: int = 128,
                           device: str = "cpu", seed: int = 0,
                           tokenizer: Path | None = None) -> Path:
    """``tokenizer``: a folder whose tokenizer files are copied in (the vocabulary then takes
    its size), for benchmarks that need real text, e.g. JSON grammars; else ``write_tokenizer``."""
    cfg = dict(SHAPES[shape])
    if tokenizer is not None:
        from tokenizers import Tokenizer

        cfg["vocab_size"] = Tokenizer.from_file(str(tokenizer / "tokenizer.json")).get_vocab_size()
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=device).manual_seed(seed)
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]

    def rnd(*s, scale=0.02):
        return (torch.randn(*s, generator=gen, device=device) * scale).half().cpu()

    norms, centre = _norms(cfg)
    shard: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": rnd(vocab, h),
        "model.norm.weight": (centre + rnd(h, scale=0.1).float()).half()}
    if not cfg["tie_word_embeddings"]:
        shard["lm_head.weight"] = rnd(vocab, h)
    shards = [shard]
    for layer in range(cfg["num_hidden_layers"]):
        t: dict[str, torch.Tensor] = {}
        p = f"model.layers.{layer}"
        for norm in norms:
            t[f"{p}.{norm}.weight"] = (centre + rnd(h, scale=0.1).float()).half()
        if cfg["model_type"] in ("gemma3_text", "qwen3"):  # q/k norms over each head
            d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
            for norm in ("q_norm", "k_norm"):
                t[f"{p}.self_attn.{norm}.weight"] = (centre + rnd(d, scale=0.1).float()).half()
        # act-order: one g_idx per layer input, as GPTQ gives the linears that read it (one
        # Hessian per input, so one column order for q/k/v and one for gate/up)
        shared: dict[str, torch.Tensor] = {}
        for name, k, n, bias in _linears(cfg):
            if fmt == "fp16":
                t[f"{p}.{name}.weight"] = rnd(n, k, scale=1 / (2 * k**0.5))
            else:
                q = _quantized("gptq" if fmt == "gptq" else fmt, k, n, group_size, gen, device,
                               shared.get(_INPUT_OF.get(name, name)))
                if "g_idx" in q:
                    shared.setdefault(_INPUT_OF.get(name, name), q["g_idx"])
                t.update({f"{p}.{name}.{key}": v.cpu() for key, v in q.items()})
            if bias:
                t[f"{p}.{name}.bias"] = rnd(n)
        shards.append(t)
    _save_shards(out, shards)
    if fmt != "fp16":
        qcfg = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                "version": "gemm"} if fmt == "awq" else {
                "quant_method": "gptq", "bits": 4, "group_size": group_size, "sym": False,
                "desc_act": fmt == "gptq-act", "checkpoint_format": "gptq"}
        cfg["quantization_config"] = qcfg
    cfg["torch_dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if tokenizer is None:
        write_tokenizer(out, vocab)
    else:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (tokenizer / name).is_file():
                shutil.copy(tokenizer / name, out / name)
    return out


def _save_shards(out: Path, shards: list[dict[str, torch.Tensor]], per_file: int = 4) -> None:
    groups = [shards[i:i + per_file] for i in range(0, len(shards), per_file)]
    weight_map = {}
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {k: v.contiguous() for d in group for k, v in d.items()}
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, name))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", choices=list(SHAPES))
    ap.add_argument("format", choices=FORMATS)
    ap.add_argument("out", type=Path)
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokenizer", type=Path,
                    help="copy this folder's tokenizer files (the vocabulary takes their size)")
    a = ap.parse_args()
    make_random_checkpoint(a.shape, a.format, a.out, a.group_size, a.device,
                           tokenizer=a.tokenizer)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
