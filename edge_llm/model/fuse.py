"""Merge each decoder layer's q/k/v projections into one ``qkv_proj`` and gate/up into one
``gate_up_proj`` after loading (vLLM's QKVParallelLinear / MergedColumnParallelLinear): one
W4A16 launch instead of three (two) per layer, with a larger N that fills more of the GPU at
1-16 tokens.

Output columns of the merged linears::

    qkv_proj:     [ q: H*D | k: Hkv*D | v: Hkv*D ]
    gate_up_proj: [ gate: I | up: I ]

A group is merged only when its parts are compatible: all ``nn.Linear`` of one dtype and
device (bias on all or none), or all ``QuantLinear`` that ``concat_mismatch`` accepts (same
spec, group size, dtype, device, in_features, one act-order permutation, no general g_idx).
Anything else (a linear the producer left unquantized beside quantized ones, different
permutations) keeps the separate modules, which the layers still run.

Act-order GPTQ layers gather their input (``x[..., perm]``) before each product. After
merging, ``fold_act_order`` hands those gathers to the producers where one can do it for free:
the RMSNorm before q/k/v and before gate/up writes its output in the linear's order, and
gate/up's output columns are permuted by down_proj's order (SiLU-and-multiply is elementwise,
so its output arrives sorted). Only o_proj, which reads the attention output, keeps a gather.

``load_model`` merges by default (``merge_projections=False``: separate modules, the tests'
reference).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from .llama import CausalLM

logger = logging.getLogger(__name__)

# (merged name, part names in column order)
_GROUPS = {"self_attn": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
           "mlp": ("gate_up_proj", ("gate_proj", "up_proj"))}


def merge_mismatch(parts: list[nn.Module]) -> str | None:
    """Why ``parts`` cannot become one linear (a sentence), or None when they can."""
    from edge_llm.quant import QuantLinear, concat_mismatch

    if all(type(p) is nn.Linear for p in parts):
        first = parts[0]
        for p in parts[1:]:
            if p.weight.dtype != first.weight.dtype or p.weight.device != first.weight.device:
                return "plain linears of different dtypes or devices"
            if (p.bias is None) != (first.bias is None) or p.in_features != first.in_features:
                return "plain linears with different inputs or bias"
        return None
    if all(type(p) is QuantLinear for p in parts):
        return concat_mismatch(parts)
    return "a mix of quantized and unquantized linears"


def merge_linears(parts: list[nn.Module]) -> nn.Module:
    """One linear whose output is ``cat([p(x) for p in parts], -1)``; new tensors (the caller
    frees the parts). Raises ValueError when ``merge_mismatch`` names a reason."""
    reason = merge_mismatch(parts)
    if reason is not None:
        raise ValueError(f"cannot merge these linears: {reason}.")
    from edge_llm.quant import QuantLinear, concat_linears

    if isinstance(parts[0], QuantLinear):
        return concat_linears(parts)
    first = parts[0]
    with torch.device("meta"):  # parameters replaced below: no allocation here
        merged = nn.Linear(first.in_features, sum(p.out_features for p in parts),
                           bias=first.bias is not None)
    weight = torch.cat([p.weight for p in parts], dim=0)  # (N1 + N2 + ..., K)
    merged.weight = nn.Parameter(weight, requires_grad=False)
    if first.bias is not None:
        merged.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
    return merged


def fuse_projections(lm: CausalLM) -> int:
    """Merge q/k/v and gate/up in every layer of a loaded ``lm`` where the parts are
    compatible; returns how many groups were merged (at most 2 per layer).

    Works one layer at a time and deletes the parts as it goes, so the extra memory at any
    moment is one layer's projections. Run after the weights are loaded (not on meta).
    """
    merged = 0
    layers = lm.model.layers
    for i, layer in enumerate(layers):
        for owner_name, (merged_name, part_names) in _GROUPS.items():
            owner = getattr(layer, owner_name)
            if getattr(owner, merged_name) is not None:  # merged already
                continue
            parts = [getattr(owner, name) for name in part_names]
            reason = merge_mismatch(parts)
            if reason is not None:
                logger.debug("layers.%d.%s: %s kept separate: %s", i, owner_name,
                             "/".join(part_names), reason)
                continue
            setattr(owner, merged_name, merge_linears(parts))
            for name in part_names:
                delattr(owner, name)
            del parts
            merged += 1
    full = sum(1 for layer in layers if layer.self_attn.qkv_proj is not None
               and layer.mlp.gate_up_proj is not None)
    logger.info("Merged q/k/v and gate/up projections in %d of %d layers (%d of %d groups)",
                full, len(layers), merged, 2 * len(layers))
    return merged


def _permute_outputs(lin: nn.Module, cols: torch.Tensor) -> None:
    from edge_llm.quant import QuantLinear

    if isinstance(lin, QuantLinear):
        lin.permute_outputs(cols)
        return
    cols = cols.to(lin.weight.device)
    lin.weight = nn.Parameter(lin.weight.index_select(0, cols), requires_grad=False)
    if lin.bias is not None:
        lin.bias = nn.Parameter(lin.bias.index_select(0, cols), requires_grad=False)


def _act_order(lin: nn.Module | None) -> bool:
    from edge_llm.quant import QuantLinear

    return isinstance(lin, QuantLinear) and lin.perm is not None and not lin.input_permuted


def fold_act_order(lm: CausalLM) -> int:
    """Move act-order input gathers into their producers (see the module docstring): the
    norms before merged q/k/v and gate/up, and gate/up's output columns for down_proj.
    Returns how many gathers were removed (at most 3 per layer). Run after
    ``fuse_projections``; the model computes the same function before and after."""
    folded = 0
    for layer in lm.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for norm, lin in ((layer.input_layernorm, attn.qkv_proj),
                          (layer.mlp_input_norm, mlp.gate_up_proj)):
            if _act_order(lin) and norm.out_perm is None:
                norm.out_perm = lin.perm
                lin.take_permuted_input()
                folded += 1
        if _act_order(mlp.down_proj) and mlp.gate_up_proj is not None:
            perm = mlp.down_proj.perm
            _permute_outputs(mlp.gate_up_proj, torch.cat([perm, perm + perm.numel()]))
            mlp.down_proj.take_permuted_input()
            folded += 1
    if folded:
        logger.info("Act-order: %d input gathers folded into norms and gate/up columns",
                    folded)
    return folded
