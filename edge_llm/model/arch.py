"""Architecture description parsed from a Hugging Face ``config.json``.

Accepts both the transformers 4 keys (``rope_theta``, ``rope_scaling``) and the transformers 5
``rope_parameters`` dict, so configs written by either load the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")


class UnsupportedArchitectureError(ValueError):
    pass


@dataclass(frozen=True)
class ArchConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2
    qk_norm: bool  # Qwen3
    torch_dtype: str | None
    sliding_window: int | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @property
    def kind(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def parse_arch_config(cfg: dict[str, Any]) -> ArchConfig:
    """Read the fields our decoder needs; raise ``UnsupportedArchitectureError`` otherwise."""
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        found = ", ".join(archs) if archs else f"model_type={cfg.get('model_type')!r}"
        raise UnsupportedArchitectureError(
            f"Unsupported architecture {found}; edge-llm supports "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}."
        )
    rope = dict(cfg.get("rope_parameters") or {})
    theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or None
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = rope
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedArchitectureError(
                f"Unsupported RoPE scaling {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}."
            )
        if rope_type == "default":
            scaling = None
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    head_dim = cfg.get("head_dim") or hidden // heads
    kind = SUPPORTED_ARCHITECTURES[arch]
    window = cfg.get("sliding_window")
    if kind == "qwen2" and not cfg.get("use_sliding_window", False):
        window = None
    if kind == "qwen3" and not cfg.get("use_sliding_window", False):
        window = None
    return ArchConfig(
        architecture=arch,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=scaling,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=kind == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=kind == "qwen3",
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        sliding_window=int(window) if window else None,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
    )
