"""Architecture description parsed from a Hugging Face ``config.json``.

Accepts both the transformers 4 keys (``rope_theta``, ``rope_scaling``) and the transformers 5
``rope_parameters`` dict, so configs written by either load the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear")


# The longest context a config may claim: a RoPE table of this many positions is already
# gigabytes; a larger value is a broken config, refused before anything is allocated.
MAX_POSITIONS = 1 << 24


class UnsupportedArchitectureError(ValueError):
    pass


class InvalidConfigError(ValueError):
    """A ``config.json`` that cannot describe a model; the message names the key and value."""


def read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict; InvalidConfigError naming the file otherwise."""
    file = folder / "config.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidConfigError(f"{file}: invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidConfigError(f"{file}: expected a JSON object, got {type(data).__name__}.")
    return data


def _count(cfg: dict[str, Any], key: str, default: Any = None, limit: int | None = None) -> int:
    """A positive integer field (``default`` when absent); InvalidConfigError naming it."""
    value = cfg.get(key, default) if default is not None else cfg.get(key)
    if value is None:
        raise InvalidConfigError(f"config.json: {key} is missing.")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidConfigError(f"config.json: {key} must be a positive integer, got "
                                 f"{value!r}.")
    if limit is not None and value > limit:
        raise InvalidConfigError(f"config.json: {key}={value} is not a plausible value (at "
                                 f"most {limit}); the config is broken.")
    return value


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
    heads = _count(cfg, "num_attention_heads")
    hidden = _count(cfg, "hidden_size")
    head_dim = _count(cfg, "head_dim") if cfg.get("head_dim") else hidden // heads
    if not head_dim:
        raise InvalidConfigError(f"config.json: hidden_size={hidden} is smaller than "
                                 f"num_attention_heads={heads}.")
    kind = SUPPORTED_ARCHITECTURES[arch]
    window = cfg.get("sliding_window")
    if kind == "qwen2" and not cfg.get("use_sliding_window", False):
        window = None
    if kind == "qwen3" and not cfg.get("use_sliding_window", False):
        window = None
    return ArchConfig(
        architecture=arch,
        vocab_size=_count(cfg, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_count(cfg, "intermediate_size"),
        num_layers=_count(cfg, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=_count(cfg, "num_key_value_heads") if cfg.get("num_key_value_heads")
        else heads,
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=scaling,
        max_position_embeddings=_count(cfg, "max_position_embeddings", 2048, MAX_POSITIONS),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=kind == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=kind == "qwen3",
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        sliding_window=int(window) if window else None,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
    )
