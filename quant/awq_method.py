"""AWQ's activation-aware scale and clip search, borrowed from AutoAWQ (optional dependency).

AutoAWQ's ``AwqQuantizer`` with ``export_compatible=True`` searches per-channel scales and clipping
ranges on calibration data and folds them into the model in place (norm weights, v/o and up/down
pairs), leaving weights in floating point. The caller then rounds to nearest and packs with our
own writers, so the produced tensors do not depend on AutoAWQ's packer. We hand AutoAWQ a small
adapter instead of its ``AutoAWQForCausalLM`` wrapper, which insists on loading from a path.
"""

from __future__ import annotations

import types

import torch
from torch import nn


def autoawq_available() -> bool:
    try:
        from awq.quantize.quantizer import AwqQuantizer  # noqa: F401
    except Exception:  # autoawq import errors vary (missing deps, old transformers APIs)
        return False
    return True


def awq_scale_and_clip(
    model: nn.Module, tokenizer, windows: torch.Tensor, group_size: int, sym: bool
) -> None:
    """Apply AutoAWQ's scale and clip search to ``model`` in place (weights stay float)."""
    try:
        from awq.models.auto import AWQ_CAUSAL_LM_MODEL_MAP
        from awq.quantize.quantizer import AwqQuantizer
    except Exception as exc:
        raise RuntimeError(
            "method='awq' needs AutoAWQ: pip install 'autoawq==0.2.9' (or 'edge-llm[awq]')."
        ) from exc
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and ".layers." in name and module.out_features % 64:
            raise ValueError(  # AutoAWQ's clip search walks output channels in batches of 64
                f"method='awq' needs out_features divisible by 64; {name} has "
                f"{module.out_features}."
            )
    model_type = getattr(model.config, "model_type", None)
    awq_cls = AWQ_CAUSAL_LM_MODEL_MAP.get(model_type)
    if awq_cls is None:
        raise ValueError(f"AutoAWQ has no recipe for model_type {model_type!r}.")
    adapter = types.SimpleNamespace(
        model_type=model_type,
        get_model_layers=awq_cls.get_model_layers,
        move_embed=awq_cls.move_embed,
        get_layers_for_scaling=awq_cls.get_layers_for_scaling,
    )
    quantizer = AwqQuantizer(
        adapter, model, tokenizer, w_bit=4, group_size=group_size, zero_point=not sym,
        version="gemm", calib_data=windows.tolist(), split="train", text_column="text",
        duo_scaling=True, export_compatible=True, max_calib_samples=windows.shape[0],
        max_calib_seq_len=windows.shape[1],
    )
    quantizer.quantize()
