"""Rotary embedding of q and k with k and v stored straight into their paged-cache slots: one
launch per layer where rotary (kernels/rotary.py) and write_kv (kernels/paged_attention.py) took
two, and the rotated k never goes through global memory outside the cache.

The reference is the composition ``rotary_ref`` then ``write_kv_ref`` (kernels/__init__.py's
``rotary_write_kv`` falls back to it); the rotated q is returned, k and v land in the cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grid import next_pow2
from .paged_attention import check_kv_write, copy_heads
from .pdl import pdl_enter, pdl_kwargs
from .rotary import check_rotary, cos_sin, rotate_heads

# the slot, position and cos / sin rows read before the PDL wait (_rotary_write_kv_kernel)
EARLY_TABLES = True


@triton.jit
def _slot_cos_sin(slot_ptr, cos_ptr, sin_ptr, pos_ptr, t, stride_cos, stride_sin, offs, d_ok):
    """Token t's cache slot and the cos / sin rows at its position."""
    slot = tl.load(slot_ptr + t).to(tl.int64)
    cos, sin = cos_sin(cos_ptr, sin_ptr, pos_ptr, t, stride_cos, stride_sin, offs, d_ok)
    return slot, cos, sin


@triton.jit
def _rotary_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, qo_ptr, kc_ptr, vc_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_qot, stride_qoh,
    stride_cos, stride_sin, stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs,
    stride_vch,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    HALF_PAD: tl.constexpr, HQ_PAD: tl.constexpr, HK_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr = False, EARLY_TABLES: tl.constexpr = False,
):
    """One program per token: q rotated into qo; k rotated and v copied into cache slot
    slot_mapping[t] (slot < 0: padding, nothing stored). With EARLY_TABLES the slot, the
    position and its cos / sin rows are read before the PDL wait: the engine fills slots and
    positions by copies before a forward, and the tables are built at load, so no kernel of
    a forward writes them (kernels/pdl.py); q, k and v are read after it."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, HALF_PAD)
    d_ok = offs < HALF
    if EARLY_TABLES:
        slot, cos, sin = _slot_cos_sin(slot_ptr, cos_ptr, sin_ptr, pos_ptr, t, stride_cos,
                                       stride_sin, offs, d_ok)
    pdl_enter(PDL)
    if not EARLY_TABLES:
        slot, cos, sin = _slot_cos_sin(slot_ptr, cos_ptr, sin_ptr, pos_ptr, t, stride_cos,
                                       stride_sin, offs, d_ok)
    rotate_heads(q_ptr + t * stride_qt, qo_ptr + t * stride_qot, stride_qh, stride_qoh,
                  cos, sin, offs, d_ok, NUM_Q_HEADS, HQ_PAD, HALF)
    blk = tl.maximum(slot, 0) // BLOCK_SIZE
    off = tl.maximum(slot, 0) % BLOCK_SIZE
    keep_k = offs * 0 + slot >= 0  # a tensor: the interpreter cannot AND a scalar bool
    rotate_heads(k_ptr + t * stride_kt, kc_ptr + blk * stride_kcb + off * stride_kcs,
                  stride_kh, stride_kch, cos, sin, offs, d_ok & keep_k, NUM_KV_HEADS, HK_PAD,
                  HALF)
    keep_v = tl.arange(0, D_PAD)[None, :] * 0 + slot >= 0
    copy_heads(v_ptr + t * stride_vt, vc_ptr + blk * stride_vcb + off * stride_vcs,
               stride_vh, stride_vch, keep_v, NUM_KV_HEADS, HK_PAD, HEAD_DIM, D_PAD)


def rotary_write_kv(
    q: torch.Tensor,  # (T, H, D)
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    cos: torch.Tensor,  # (max_positions, D/2)
    sin: torch.Tensor,
    positions: torch.Tensor,  # (T,) int
    k_cache: torch.Tensor,  # (num_blocks, bs, Hkv, D)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64; < 0 skipped
) -> torch.Tensor:
    """Triton ``rotary_ref`` + ``write_kv_ref`` in one launch; returns the rotated q (a new
    contiguous tensor). Positions are not range-checked on the device (no host sync)."""
    t, h, hkv, d = check_rotary(q, k, cos, sin, positions)
    check_kv_write(k, v, k_cache, v_cache, slot_mapping)
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v: one dtype expected, got {q.dtype}, {k.dtype}, {v.dtype}")
    q, k, v = (x if x.stride(2) == 1 else x.contiguous() for x in (q, k, v))
    cos = cos if cos.stride(1) == 1 else cos.contiguous()
    sin = sin if sin.stride(1) == 1 else sin.contiguous()
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if t == 0:
        return q_out
    half_pad = next_pow2(d // 2)
    hq_pad, hk_pad = next_pow2(h), next_pow2(hkv)
    _rotary_write_kv_kernel[(t,)](
        q, k, v, cos, sin, positions, slot_mapping, q_out, k_cache, v_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), cos.stride(0), sin.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_Q_HEADS=h, NUM_KV_HEADS=hkv, HALF=d // 2, HALF_PAD=half_pad, HQ_PAD=hq_pad,
        HK_PAD=hk_pad, HEAD_DIM=d, D_PAD=next_pow2(d),
        BLOCK_SIZE=k_cache.shape[1], EARLY_TABLES=EARLY_TABLES,
        num_warps=max(1, min(8, hq_pad * half_pad // 512)),
        **pdl_kwargs(q.device))
    return q_out
