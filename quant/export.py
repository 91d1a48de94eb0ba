"""Quantization configs as the producers write them, and a checkpoint folder writer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

DEFAULT_MAX_SHARD_SIZE = 4 * 1024**3  # bytes; transformers' default is 5 GB


def quantization_config_for(
    fmt: str,
    *,
    group_size: int = 128,
    sym: bool = False,
    desc_act: bool = False,
    checkpoint_format: str = "gptq",
    damp_percent: float = 0.01,
    true_sequential: bool = True,
    static_groups: bool = False,
) -> dict[str, Any]:
    """The ``quantization_config`` dict of a 4-bit checkpoint in ``fmt`` ("awq" | "gptq").

    AWQ: AutoAWQ 0.2.x ``AwqConfig.to_transformers_dict`` (zero points are always stored, so
    ``zero_point`` is true even for a symmetric quantization, whose zeros are all 8).
    GPTQ: AutoGPTQ ``BaseQuantizeConfig.to_dict`` (``checkpoint_format`` "gptq" or GPTQModel's
    "gptq_v2").
    """
    if group_size != -1 and group_size < 1:
        raise ValueError(f"group_size must be -1 or >= 1, got {group_size}.")
    if fmt == "awq":
        if desc_act:
            raise ValueError("AWQ GEMM stores sequential groups only; desc_act needs fmt='gptq'.")
        if group_size == -1:
            raise ValueError("AWQ GEMM needs a positive group_size.")
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": group_size,
            "zero_point": True,
            "version": "gemm",
            "modules_to_not_convert": None,
        }
    if fmt == "gptq":
        if checkpoint_format not in ("gptq", "gptq_v2"):
            raise ValueError(
                f"checkpoint_format must be 'gptq' or 'gptq_v2', got {checkpoint_format!r}."
            )
        return {
            "bits": 4,
            "group_size": group_size,
            "damp_percent": damp_percent,
            "desc_act": desc_act,
            "static_groups": static_groups,
            "sym": sym,
            "true_sequential": true_sequential,
            "model_name_or_path": None,
            "model_file_base_name": "model",
            "quant_method": "gptq",
            "checkpoint_format": checkpoint_format,
        }
    raise ValueError(f"fmt must be 'awq' or 'gptq', got {fmt!r}.")


def _shards(state_dict: dict[str, torch.Tensor], max_shard_size: int) -> list[dict]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_size:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def save_quantized(
    out_dir: str | Path,
    state_dict: dict[str, torch.Tensor],
    hf_config_dict: dict[str, Any],
    quantization_config: dict[str, Any],
    tokenizer=None,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write a loadable checkpoint folder and return its path.

    Files: ``model.safetensors`` (or ``model-0000i-of-0000n.safetensors`` plus
    ``model.safetensors.index.json`` when the tensors exceed ``max_shard_size`` bytes),
    ``config.json`` with ``quantization_config`` and a float16 dtype, ``quantize_config.json``
    for GPTQ (AutoGPTQ reads it), and the tokenizer files when ``tokenizer`` is given.
    """
    if max_shard_size < 1:
        raise ValueError(f"max_shard_size must be >= 1 byte, got {max_shard_size}.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    shards = _shards(tensors, max_shard_size)
    meta = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata=meta)
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / name), metadata=meta)
            weight_map.update(dict.fromkeys(shard, name))
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config = dict(hf_config_dict)
    config["quantization_config"] = quantization_config
    dtype_keys = [k for k in ("torch_dtype", "dtype") if k in config] or ["torch_dtype"]
    for key in dtype_keys:
        config[key] = "float16"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if quantization_config.get("quant_method") == "gptq":
        text = json.dumps(quantization_config, indent=2) + "\n"
        (out / "quantize_config.json").write_text(text)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    return out
