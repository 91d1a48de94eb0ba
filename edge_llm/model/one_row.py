"""The decode step of one sequence on CUDA (one fp16 row) with each RMSNorm folded into the
W4A16 GEMV that reads its output and each residual add into the GEMV whose output it adds
(kernels/w4a16_gemv.py NORM and RESIDUAL)::

    h = input_layernorm(x); residual = x                  the first layer: a norm kernel
    per layer:
        qkv = qkv_proj(input_layernorm(residual))      one GEMV; from the second layer on
                                                         it normalises as it reads (NORM)
        o = attend(qkv)                                  rotary + K/V write, decode attention
        residual, sq = residual + o_proj(o)             one GEMV, the add in its epilogue
        h = silu(gate) * up of gate_up(post_attention_layernorm(residual))   one GEMV
        residual, sq = residual + down_proj(h)          one GEMV
    out = norm(residual)

``sq`` is the fp32 sum of squares of the new residual in parts, one a column tile, which the
GEMV after it adds up for its norm: an RMSNorm needs the whole row's sum before it can scale
any element, and that sum is complete only when every tile of the add is, so each GEMV that
adds leaves its tiles' sums and the next one finishes the norm as it starts. A layer runs 6
kernels where the separate norms made it 8. The result is the layer-by-layer path's, up to
the summation order of each norm's sum of squares.

It serves Llama-order layers (no sandwich norms; Gemma 2 / 3 take the general path) whose
qkv and [gate | up] projections are merged, whose MLP is SiLU's, whose four projections are
4-bit linears that ``fuses_norm_and_add`` and whose norms write in their natural order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from edge_llm.kernels import triton_enabled

from .attention_metadata import AttentionMetadata

if TYPE_CHECKING:
    from torch import nn


def one_row_step(x: torch.Tensor) -> bool:
    """Whether a forward of the embedded rows ``x`` is a step the chain may take: one fp16
    row on CUDA with the Triton kernels on."""
    return x.shape[0] == 1 and x.dtype == torch.float16 and triton_enabled(x.device, x.dtype)


def one_row_chain_fits(lm: nn.Module) -> bool:
    """Whether every decoder layer of ``lm`` (a ``CausalLM``) has the form the chain serves
    (module doc)."""
    from edge_llm.quant.linear import QuantLinear

    def fused(linear: nn.Module | None, bias_ok: bool = False) -> bool:
        return (isinstance(linear, QuantLinear) and linear.fuses_norm_and_add()
                and (bias_ok or linear.bias is None))

    for layer in lm.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if layer.sandwich or mlp.gelu:
            return False
        if not (fused(attn.qkv_proj, bias_ok=True)  # a bias (Qwen2) is added after it
                and all(fused(m) for m in (attn.o_proj, mlp.gate_up_proj, mlp.down_proj))):
            return False
        if any(norm.out_perm is not None
               for norm in (layer.input_layernorm, layer.post_attention_layernorm)):
            return False
    return lm.model.norm.out_perm is None


def one_row_forward(lm: nn.Module, x: torch.Tensor, layers: list[nn.Module],
                    positions: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                    meta: AttentionMetadata) -> torch.Tensor:
    """The final hidden state (1, hidden) of the embedded row ``x`` through ``layers`` (the
    module doc's chain); the same contract as ``CausalLM.forward``."""
    residual, squares = x, None
    for layer, kv in zip(layers, kv_caches, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        first, second = layer.input_layernorm, layer.post_attention_layernorm
        if squares is None:
            qkv = attn.qkv_proj(first(residual))
        else:
            qkv = attn.qkv_proj.forward_normed(residual, first.weight, first.eps, squares)
        o = attn.attend(*attn.split_qkv(qkv), positions, kv, meta)
        residual, squares = attn.o_proj.forward_add(o, residual)
        h = mlp.gate_up_proj.forward_normed(residual, second.weight, second.eps, squares,
                                            silu_mul=True)
        residual, squares = mlp.down_proj.forward_add(h, residual)
    return lm.model.norm(residual)
