"""Architecture description parsed from a Hugging Face ``config.json``.

Accepts both the transformers 4 keys (``rope_theta``, ``rope_scaling``, Gemma 3's
``rope_local_base_freq`` and ``sliding_window_pattern``) and the transformers 5 ``rope_parameters``
dict (per layer type for Gemma 3) and ``layer_types`` list, so configs written by either load the
same way. Everything a family changes in the decoder is a field here; the model code reads
fields, never the architecture name.
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
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",  # Phi-3, Phi-3.5 and Phi-4 (mini and 14B)
    # the text decoder of the multimodal Gemma 3 (4B, 12B, 27B); the vision tower is not loaded
    "Gemma3ForConditionalGeneration": "gemma3",
}
# multimodal checkpoints: where their text decoder's tensors sit (-> ours), what is skipped
_TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head."))
_SKIPPED_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                     "model.multi_modal_projector.")
# Gemma3TextConfig's defaults: the hub's multimodal configs list only what differs from them
_GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
    "head_dim": 256, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0, "query_pre_attn_scalar": 256, "sliding_window": 4096,
    "max_position_embeddings": 131072, "hidden_activation": "gelu_pytorch_tanh",
}
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear", "yarn", "longrope")
# architectures refused with a reason of their own (the rest: "unsupported architecture")
_REFUSED = {
    **dict.fromkeys(
        ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM",
         "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "PhiMoEForCausalLM",
         "OlmoeForCausalLM", "GraniteMoeForCausalLM", "JambaForCausalLM", "DbrxForCausalLM",
         "GptOssForCausalLM", "Llama4ForCausalLM", "Llama4ForConditionalGeneration"),
        "a mixture-of-experts model (its expert layers have no kernels here)"),
    "Phi3VForCausalLM": "a vision-language model",
    "Phi4MMForCausalLM": "a multimodal model",
}


# The longest context a config may claim: a RoPE table of this many positions is already
# gigabytes; a larger value is a broken config, refused before anything is allocated.
MAX_POSITIONS = 1 << 24


class UnsupportedArchitectureError(ValueError):
    pass


class InvalidConfigError(ValueError):
    """A ``config.json`` that cannot describe a model; the message names the key and value."""


def read_json_object(file: Path, error: type[ValueError] = ValueError) -> dict[str, Any]:
    """``file``'s JSON object; ``error`` naming the file when it is not JSON or not an object
    (a model folder's config.json, tokenizer_config.json, ...)."""
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error(f"{file}: invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise error(f"{file}: expected a JSON object, got {type(data).__name__}.")
    return data


def read_config(folder: Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict; InvalidConfigError naming the file otherwise."""
    return read_json_object(folder / "config.json", InvalidConfigError)


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
    qk_norm: bool  # Qwen3, Gemma 3
    torch_dtype: str | None
    sliding_window: int | None  # the window of the layers that have one (tokens, inclusive)
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # per layer: True where the layer attends to the last ``sliding_window`` positions only
    sliding_layers: tuple[bool, ...] = ()
    # the RoPE base of the sliding layers, unscaled (Gemma 3's rope_local_base_freq); None:
    # every layer uses rope_theta / rope_scaling
    local_rope_theta: float | None = None
    attn_scale: float | None = None  # None: head_dim ** -0.5 (Gemma: query_pre_attn_scalar)
    attn_softcap: float | None = None  # scores -> cap * tanh(scores / cap) (Gemma 2)
    final_softcap: float | None = None  # the same on the logits (Gemma 2)
    embed_scale: float | None = None  # embeddings times this, in their dtype (Gemma)
    norm_plus_one: bool = False  # RMSNorm scales by (1 + weight) (Gemma)
    sandwich_norms: bool = False  # norms after attention and MLP, and before the MLP (Gemma)
    mlp_act: str = "silu"  # "silu" or "gelu_tanh" (Gemma)
    merged_checkpoint: bool = False  # qkv_proj / gate_up_proj in the checkpoint (Phi-3)
    multimodal_text: bool = False  # the text decoder of a multimodal checkpoint (Gemma 3)

    @property
    def kind(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]

    def layer_window(self, layer: int) -> int | None:
        """Layer ``layer``'s sliding window (None: full attention)."""
        if self.sliding_window and (not self.sliding_layers or self.sliding_layers[layer]):
            return self.sliding_window
        return None

    @property
    def full_attention_layers(self) -> int:
        return sum(self.layer_window(i) is None for i in range(self.num_layers))

    @property
    def prefers_bf16(self) -> bool:
        """Gemma's residual stream outgrows fp16's range (activations in the thousands, times
        the sqrt(hidden) embedding scale); transformers and vLLM run it in bf16."""
        return self.kind in ("gemma2", "gemma3")


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def checkpoint_tensor_name(arch: ArchConfig, name: str) -> str | None:
    """Our name of checkpoint tensor ``name``; None for one we do not load (a multimodal
    checkpoint's vision tower and projector). Other checkpoints' names are ours already."""
    if not arch.multimodal_text:
        return name
    for theirs, ours in _TEXT_PREFIXES:
        if name.startswith(theirs):
            return ours + name[len(theirs):]
    return None if name.startswith(_SKIPPED_PREFIXES) else name


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config's text decoder config; the top level's token ids and dtype (the
    whole model's: its EOS list holds <end_of_turn>) win over the text config's."""
    text = {**_GEMMA3_TEXT_DEFAULTS, **(cfg.get("text_config") or {})}
    for key in ("eos_token_id", "bos_token_id", "torch_dtype", "dtype"):
        if cfg.get(key) is not None:
            text[key] = cfg[key]
    return {**text, "architectures": cfg["architectures"]}


def _refuse(cfg: dict[str, Any]) -> None:
    archs = cfg.get("architectures") or []
    for a in archs:
        if a in _REFUSED:
            raise UnsupportedArchitectureError(
                f"Unsupported architecture {a}: {_REFUSED[a]}; edge-llm supports "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}.")
    found = ", ".join(archs) if archs else f"model_type={cfg.get('model_type')!r}"
    raise UnsupportedArchitectureError(
        f"Unsupported architecture {found}; edge-llm supports "
        f"{', '.join(SUPPORTED_ARCHITECTURES)}."
    )


def _rope(cfg: dict[str, Any], kind: str) -> tuple[float, dict[str, Any] | None, float | None]:
    """(base, scaling or None, local base or None) of the global (full-attention) layers."""
    rope = dict(cfg.get("rope_parameters") or {})
    local = None
    if kind == "gemma3":
        if "full_attention" in rope or "sliding_attention" in rope:  # transformers 5
            local = (rope.get("sliding_attention") or {}).get("rope_theta", 10000.0)
            rope = dict(rope.get("full_attention") or {})
        else:
            local = cfg.get("rope_local_base_freq", 10000.0)
        local = float(local)
    theta = rope.get("rope_theta", cfg.get("rope_theta", 1e6 if kind == "gemma3" else 10000.0))
    scaling = cfg.get("rope_scaling") or None
    if scaling is None and rope.get("rope_type", rope.get("type", "default")) != "default":
        scaling = rope
    if scaling is not None:
        scaling = dict(scaling)
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's old name
        scaling["rope_type"] = rope_type
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise UnsupportedArchitectureError(
                f"Unsupported RoPE scaling {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}."
            )
        if rope_type in ("yarn", "longrope"):
            scaling.setdefault("original_max_position_embeddings",
                               cfg.get("original_max_position_embeddings"))
            if scaling["original_max_position_embeddings"] is None:
                raise UnsupportedArchitectureError(
                    f"RoPE scaling {rope_type!r} without original_max_position_embeddings.")
        if rope_type == "default":
            scaling = None
    partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    if partial is not None and float(partial) != 1.0:
        raise UnsupportedArchitectureError(
            f"Partial rotary embeddings (partial_rotary_factor={partial}, e.g. Phi-4-mini) "
            f"are not supported.")
    return float(theta), scaling, local


def _sliding_layers(cfg: dict[str, Any], kind: str, n: int) -> tuple[bool, ...]:
    """Which layers have a sliding window: ``layer_types`` where the config lists them, else
    each family's rule (Gemma 2: every other layer from the first; Gemma 3: all but every
    ``sliding_window_pattern``-th; Qwen2/3: from ``max_window_layers`` on; others: all)."""
    types = cfg.get("layer_types")
    if types:
        if len(types) != n:
            raise ValueError(f"layer_types lists {len(types)} layers, the model has {n}.")
        unknown = set(types) - {"sliding_attention", "full_attention"}
        if unknown:
            raise UnsupportedArchitectureError(f"Unsupported layer types {sorted(unknown)}.")
        return tuple(t == "sliding_attention" for t in types)
    if kind == "gemma2":
        return tuple(i % 2 == 0 for i in range(n))
    if kind == "gemma3":
        pattern = int(cfg.get("sliding_window_pattern", 6))
        return tuple(bool((i + 1) % pattern) for i in range(n))
    if kind in ("qwen2", "qwen3"):
        first = int(cfg.get("max_window_layers", 0) or 0)
        return tuple(i >= first for i in range(n))
    return (True,) * n


def _family(cfg: dict[str, Any], kind: str, head_dim: int) -> dict[str, Any]:
    """The ArchConfig fields a family sets beyond the Llama decoder."""
    if kind in ("gemma2", "gemma3"):
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise UnsupportedArchitectureError(f"Unsupported Gemma activation {act!r}.")
        if cfg.get("use_bidirectional_attention"):
            raise UnsupportedArchitectureError(
                "Bidirectional Gemma 3 (an embedding model) is not a causal LM.")
        scalar = cfg.get("query_pre_attn_scalar") or head_dim
        return dict(
            attn_scale=float(scalar) ** -0.5,
            attn_softcap=cfg.get("attn_logit_softcapping"),
            final_softcap=cfg.get("final_logit_softcapping"),
            embed_scale=float(cfg["hidden_size"]) ** 0.5,
            norm_plus_one=True, sandwich_norms=True, mlp_act="gelu_tanh",
            qk_norm=kind == "gemma3",
        )
    if kind == "phi3":
        return dict(merged_checkpoint=True)
    return {}


def parse_arch_config(cfg: dict[str, Any]) -> ArchConfig:
    """Read the fields our decoder needs; raise ``UnsupportedArchitectureError`` otherwise."""
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        _refuse(cfg)
    kind = SUPPORTED_ARCHITECTURES[arch]
    multimodal = arch == "Gemma3ForConditionalGeneration"
    if multimodal:
        cfg = _text_config(cfg)
    heads = _count(cfg, "num_attention_heads")
    hidden = _count(cfg, "hidden_size")
    # Mistral-Nemo states head_dim 128, not hidden / heads = 160
    head_dim = _count(cfg, "head_dim") if cfg.get("head_dim") else hidden // heads
    if not head_dim:
        raise InvalidConfigError(f"config.json: hidden_size={hidden} is smaller than "
                                 f"num_attention_heads={heads}.")
    theta, scaling, local_theta = _rope(cfg, kind)
    n = _count(cfg, "num_hidden_layers")
    window = cfg.get("sliding_window")
    if kind in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
        window = None
    window = int(window) if window else None
    sliding = _sliding_layers(cfg, kind, n) if window else ()
    if window and not any(sliding):
        window, sliding = None, ()
    family = _family(cfg, kind, head_dim)
    qk_norm = family.pop("qk_norm", kind == "qwen3")
    return ArchConfig(
        architecture=arch,
        vocab_size=_count(cfg, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_count(cfg, "intermediate_size"),
        num_layers=n,
        num_heads=heads,
        num_kv_heads=_count(cfg, "num_key_value_heads") if cfg.get("num_key_value_heads")
        else heads,
        head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=_count(cfg, "max_position_embeddings", 2048, MAX_POSITIONS),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", kind.startswith("gemma"))),
        qkv_bias=kind == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=qk_norm,
        torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        sliding_window=window,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
        sliding_layers=sliding,
        local_rope_theta=local_theta if window else None,
        multimodal_text=multimodal,
        **family,
    )
