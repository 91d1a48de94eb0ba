"""A decode step on the CPU in about half the torch ops of the general forward.

Why: at batch 1 on a CPU each op's fixed cost (Python, the dispatcher, an allocation) is a
large part of the step: the demo runs ~60 small ops a layer through the kernels' torch
references (kernels/dispatch.py), built to serve every batch shape and every family. This path
serves one kind of step only, a decode (one new token per sequence) of a Llama-like layer
(merged ``qkv_proj`` / ``gate_up_proj``, SiLU MLP, no sandwich norms, qk-norm, soft-cap, sliding
window or act-order gather in a norm, a KV cache in the activation dtype), and computes the
same values as the references, op for op in the same precision (tests/test_cpu_decode.py
asserts equal hidden states):

- RMSNorm: ``add_rms_norm_ref`` itself, without the module and dispatcher layers;
- rotary: q and k rotated in one pass as ``x * [cos | cos] + roll(x, D/2) * [-sin | sin]``
  with the tables' rows expanded once per step (the same products and sums as
  ``_rotate_half_ref``: a - b is a + (-b) in IEEE arithmetic);
- K/V: the new token's rows copied into the cache at its slot (no per-layer check of the slot
  mapping: the step's plan checks it once);
- attention: each sequence's context read as one slice of the cache where its blocks are
  consecutive (a fresh sequence's usually are), else gathered once, in fp32 through SDPA as
  ``paged_attention_ref``'s decode does.

Threads: a step of a small model runs on one thread (``decode_threads``). torch's CPU ops wake
their pool's other threads for each parallel region, and with ``OMP_WAIT_POLICY=PASSIVE``
(edge_llm/__init__.py) those sleep between regions: on the 2-core machine one int4 product
took 18 us on one thread and 70 us on two for 576 x 576 weights, the same time at 2048 x 2048
(4.2 M weights), and 0.53x at 4096 x 22016. So where every linear has fewer weights than
``ONE_THREAD_MAX_WEIGHTS`` the layers run on one thread (the demo decoded 1.5x faster at batch 1,
1.4x at batch 8); the logits' product, larger, keeps the threads.

Each linear's packed int4 form and each norm's weight are looked up once per decoder, not per
call (a method call and module attribute walks, a few microseconds each, 120 linears a step).
Measured figures: BENCHMARKS.md, "CPU".
"""

from __future__ import annotations

import torch
from torch import nn

from edge_llm.kernels import add_rms_norm_ref, rms_norm_ref
from edge_llm.quant.cpu_dense import DENSE_MIN_ROWS
from edge_llm.quant.cpu_int4 import cpu_int4_matmul

from .arch import ArchConfig
from .attention_metadata import AttentionMetadata
from .layers import RMSNorm
from .llama import CausalLM, DecoderLayer, KVCache


def cpu_decode_supported(lm: CausalLM) -> bool:
    """Whether ``CpuDecoder`` serves this model's layers (see the module docstring)."""
    arch = lm.arch
    if (arch.sandwich_norms or arch.qk_norm or arch.attn_softcap or arch.mlp_act != "silu"
            or arch.embed_scale is not None):
        return False
    for layer in lm.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if (attn.qkv_proj is None or mlp.gate_up_proj is None or attn.window is not None
                or layer.input_layernorm.out_perm is not None
                or layer.post_attention_layernorm.out_perm is not None):
            return False
    return True


# the int4 kernel's break-even between one and two threads on the 2-core machine (see above)
ONE_THREAD_MAX_WEIGHTS = 4 * 1024 * 1024


def decode_threads(arch: ArchConfig) -> int | None:
    """The thread count for ``CpuDecoder``: 1 where every linear of the layers has
    fewer than ``ONE_THREAD_MAX_WEIGHTS`` weights, else None (as set)."""
    h, d = arch.hidden_size, arch.head_dim
    qkv = h * (arch.num_heads + 2 * arch.num_kv_heads) * d
    largest = max(qkv, arch.num_heads * d * h, 2 * h * arch.intermediate_size)
    return 1 if largest < ONE_THREAD_MAX_WEIGHTS else None


class _StepPlan:
    """What every layer of one decode step shares: the rotary rows, the slots, and each
    sequence's context as (first flat slot, length) where its blocks are consecutive, else
    (block ids to gather, length)."""

    def __init__(self, lm: CausalLM, positions: torch.Tensor, meta: AttentionMetadata,
                 block_size: int) -> None:
        rot = lm.rotary
        cos = rot.cos.index_select(0, positions).unsqueeze(1)  # (B, 1, D/2) fp32
        sin = rot.sin.index_select(0, positions).unsqueeze(1)
        self.cos2 = torch.cat((cos, cos), dim=-1)  # (B, 1, D)
        self.sin2 = torch.cat((-sin, sin), dim=-1)
        self.slots = meta.slot_mapping
        self.contexts: list[tuple[int | torch.Tensor, int]] = []
        for row, n in zip(meta.block_tables.tolist(), meta.seq_lens.tolist(), strict=True):
            blocks = row[:(n + block_size - 1) // block_size]
            if blocks == list(range(blocks[0], blocks[0] + len(blocks))):
                self.contexts.append((blocks[0] * block_size, n))
            else:
                self.contexts.append((torch.tensor(blocks), n))


class _Linear:
    """One linear of a layer as the step calls it: the int4 kernel's packed form where the
    module would run that kernel for bf16 rows (``QuantLinear.cpu_int4_weight``; fewer rows
    than the dense copy's ``DENSE_MIN_ROWS``), else the module. ``bf16``: whether the model
    runs in bf16; only then is the form built (it is a second copy of the weight's words)."""

    def __init__(self, lin: nn.Module, bf16: bool) -> None:
        self.module = lin
        self.form = (lin.cpu_int4_weight() if bf16 and hasattr(lin, "cpu_int4_weight")
                     else None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        form = self.form
        if form is None or x.dtype != torch.bfloat16 or x.shape[0] >= DENSE_MIN_ROWS:
            return self.module.forward(x)
        return cpu_int4_matmul(x, form)


class _Norm:
    """An RMSNorm's weight and epsilon, read once."""

    def __init__(self, norm: RMSNorm) -> None:
        self.weight, self.eps = norm.weight, norm.eps

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(RMSNorm(residual + x), residual + x), x alone where residual is None."""
        if residual is None:
            return rms_norm_ref(x, self.weight, self.eps), x
        return add_rms_norm_ref(x, residual, self.weight, self.eps)


class _Layer:
    """One decoder layer's weights and attention shape, looked up once (``nn.Module``
    attribute access is a dictionary walk per name)."""

    def __init__(self, layer: DecoderLayer, bf16: bool) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm = _Norm(layer.input_layernorm)
        self.post_norm = _Norm(layer.post_attention_layernorm)
        self.qkv, self.o = _Linear(attn.qkv_proj, bf16), _Linear(attn.o_proj, bf16)
        self.gate_up = _Linear(mlp.gate_up_proj, bf16)
        self.down = _Linear(mlp.down_proj, bf16)
        self.heads, self.kv_heads, self.head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        self.scale = attn.scale

    def attention(self, x: torch.Tensor, kv: KVCache, plan: _StepPlan) -> torch.Tensor:
        b = x.shape[0]
        h, hkv, d = self.heads, self.kv_heads, self.head_dim
        qkv = self.qkv(x).view(b, h + 2 * hkv, d)  # (B, H + 2 Hkv, D)
        qk = qkv.narrow(1, 0, h + hkv).float()  # (B, H + Hkv, D)
        swapped = qk.roll(d // 2, 2)  # [x2 | x1]
        qk = (qk * plan.cos2 + swapped * plan.sin2).to(x.dtype)
        k_cache, v_cache = kv
        nb, bs = k_cache.shape[:2]
        k_flat = k_cache.view(nb * bs, hkv, d)  # (slots, Hkv, D)
        v_flat = v_cache.view(nb * bs, hkv, d)
        k_flat.index_copy_(0, plan.slots, qk.narrow(1, h, hkv))
        v_flat.index_copy_(0, plan.slots, qkv.narrow(1, h + hkv, hkv))
        q = qk.narrow(1, 0, h).float().unsqueeze(2)  # (B, H, 1, D)
        outs = []
        for i, (where, n) in enumerate(plan.contexts):
            if isinstance(where, int):
                k, v = k_flat.narrow(0, where, n), v_flat.narrow(0, where, n)  # (L, Hkv, D)
            else:
                k = k_cache.index_select(0, where).view(-1, hkv, d).narrow(0, 0, n)
                v = v_cache.index_select(0, where).view(-1, hkv, d).narrow(0, 0, n)
            outs.append(torch.nn.functional.scaled_dot_product_attention(
                q if b == 1 else q.narrow(0, i, 1), k.float().transpose(0, 1).unsqueeze(0),
                v.float().transpose(0, 1).unsqueeze(0), scale=self.scale, enable_gqa=True))
        o = outs[0] if b == 1 else torch.cat(outs)  # (B, H, 1, D) fp32
        return self.o(o.view(b, h * d).to(x.dtype))

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None, kv: KVCache,
                 plan: _StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_norm(x, residual)
        h = self.attention(h, kv, plan)
        h, residual = self.post_norm(h, residual)
        gate, up = self.gate_up(h).chunk(2, dim=-1)  # (B, I) each
        return self.down(torch.nn.functional.silu(gate) * up), residual


class CpuDecoder:
    """``CausalLM.forward`` of CPU decode steps for one model whose layers
    ``cpu_decode_supported`` accepts."""

    def __init__(self, lm: CausalLM) -> None:
        if not cpu_decode_supported(lm):
            raise ValueError("cpu_decode: this model's layers are not served (see "
                             "cpu_decode_supported)")
        self.lm = lm
        bf16 = lm.lm_head.weight.dtype == torch.bfloat16
        self.layers = [_Layer(layer, bf16) for layer in lm.model.layers]

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 kv_caches: list[KVCache], meta: AttentionMetadata) -> torch.Tensor | None:
        """The final hidden states (B, hidden) of a CPU decode step; None where this path
        does not serve the step (the caller runs the general forward)."""
        lm = self.lm
        if (input_ids.is_cuda or not meta.is_decode_only or not kv_caches
                or lm.num_active_layers is not None):
            return None
        k0 = kv_caches[0][0]
        if k0.dtype != lm.lm_head.weight.dtype or not k0.is_contiguous():
            return None
        if bool((meta.slot_mapping < 0).any()):
            return None
        plan = _StepPlan(lm, positions, meta, k0.shape[1])
        x = lm.model.embed_tokens(input_ids)  # (B, hidden)
        residual = None
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, kv, plan)
        x, _ = lm.model.norm.add_forward(x, residual)
        return x
