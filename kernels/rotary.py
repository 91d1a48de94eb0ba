"""Neox rotary embedding of q and k (kernels/fused.py's conventions: a plain-torch reference
``rotary_ref``, the math the model layers ran before the dispatchers, and a Triton wrapper
``rotary`` with the same contract, rounding where the reference rounds):

    rotary:  x1, x2 = halves of the head dim (rotate_half, neox style), fp32:
             y = dtype(cat(x1 cos - x2 sin, x2 cos + x1 sin)), cos/sin = table[position]

``cos_sin`` and ``rotate_heads`` are shared with kernels/rotary_kv.py (rotary and the K/V
cache write in one launch). The wrapper reads no tensor on the host and sizes its grid from
shapes only (CUDA-graph safe); outputs are new tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grid import next_pow2
from .kv_fp8 import to_cache
from .pdl import pdl_enter, pdl_kwargs

__all__ = ["check_rotary", "rotary", "rotary_ref", "rotary_rows_ref", "rotate_ref"]


def rotary_ref(
    q: torch.Tensor,  # (T, H, D)
    k: torch.Tensor,  # (T, Hkv, D)
    cos: torch.Tensor,  # (max_positions, D/2)
    sin: torch.Tensor,
    positions: torch.Tensor,  # (T,) int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding of q and k at ``positions``; new tensors in q's/k's dtype.
    q and k of one dtype are rotated as one (T, H + Hkv, D) tensor (views of it returned): half
    the small ops of a CPU layer's rotary, the same values."""
    return rotate_ref(q, k, *rotary_rows_ref(cos, sin, positions))


def rotary_rows_ref(
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of the cos / sin tables at ``positions``, (T, 1, D/2) each (``rotate_ref``'s
    arguments: the same for every layer of one forward)."""
    # index_select: the same rows as cos[positions], at a fraction of advanced indexing's cost
    return (cos.index_select(0, positions).unsqueeze(1),
            sin.index_select(0, positions).unsqueeze(1))


def rotate_ref(
    q: torch.Tensor, k: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rotary_ref`` given the table rows of ``rotary_rows_ref``."""
    if q.dtype != k.dtype:
        return _rotate_half_ref(q, cos_t, sin_t), _rotate_half_ref(k, cos_t, sin_t)
    qk = _rotate_half_ref(torch.cat((q, k), dim=1), cos_t, sin_t)  # (T, H + Hkv, D)
    return qk.split((q.shape[1], k.shape[1]), dim=1)


def _rotate_half_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


@triton.jit
def rotate_heads(src_ptr, dst_ptr, stride_src_h, stride_dst_h, cos, sin, offs, d_ok,
                  NUM_HEADS: tl.constexpr, H_PAD: tl.constexpr, HALF: tl.constexpr):
    """All heads of one token: [H_PAD, HALF_PAD] first halves and second halves."""
    h = tl.arange(0, H_PAD)
    mask = (h[:, None] < NUM_HEADS) & d_ok[None, :]
    src = src_ptr + h[:, None] * stride_src_h + offs[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + h[:, None] * stride_dst_h + offs[None, :]
    ty = dst_ptr.dtype.element_ty
    src_ty = src_ptr.dtype.element_ty
    # to_cache: a plain cast, or fp8 codes when dst is an fp8 KV cache (kernels/rotary_kv.py)
    tl.store(dst, to_cache(x1 * cos[None, :] - x2 * sin[None, :], ty, src_ty), mask=mask)
    tl.store(dst + HALF, to_cache(x2 * cos[None, :] + x1 * sin[None, :], ty, src_ty),
             mask=mask)


@triton.jit
def cos_sin(cos_ptr, sin_ptr, pos_ptr, t, stride_cos, stride_sin, offs, d_ok):
    """Token t's cos and sin rows (fp32 [HALF_PAD]) at its position."""
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cos_ptr + pos * stride_cos + offs, mask=d_ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_sin + offs, mask=d_ok, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, pos_ptr, qo_ptr, ko_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh,
    stride_cos, stride_sin,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr,
    HALF_PAD: tl.constexpr, HQ_PAD: tl.constexpr, HK_PAD: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """One program per token: its cos/sin row is read once and applied to q and k."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, HALF_PAD)
    d_ok = offs < HALF
    cos, sin = cos_sin(cos_ptr, sin_ptr, pos_ptr, t, stride_cos, stride_sin, offs, d_ok)
    rotate_heads(q_ptr + t * stride_qt, qo_ptr + t * stride_qot, stride_qh, stride_qoh,
                  cos, sin, offs, d_ok, NUM_Q_HEADS, HQ_PAD, HALF)
    rotate_heads(k_ptr + t * stride_kt, ko_ptr + t * stride_kot, stride_kh, stride_koh,
                  cos, sin, offs, d_ok, NUM_KV_HEADS, HK_PAD, HALF)


def check_rotary(q, k, cos, sin, positions) -> tuple[int, int, int, int]:
    """(T, H, Hkv, D) of a rotary call's arguments; ValueError naming what does not fit."""
    if q.dim() != 3 or k.dim() != 3 or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"q, k: expected (T, H, D) and (T, Hkv, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}")
    t, h, d = q.shape
    if d % 2 or cos.dim() != 2 or cos.shape[1] != d // 2 or sin.shape != cos.shape:
        raise ValueError(f"cos, sin: expected (max_positions, {d // 2}) tables for an even "
                         f"head dim {d}, got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if positions.shape != (t,) or positions.is_floating_point():
        raise ValueError(f"positions: expected ({t},) integers, got {tuple(positions.shape)} "
                         f"{positions.dtype}")
    return t, h, k.shape[1], d


def rotary(
    q: torch.Tensor,  # (T, H, D)
    k: torch.Tensor,  # (T, Hkv, D)
    cos: torch.Tensor,  # (max_positions, D/2)
    sin: torch.Tensor,
    positions: torch.Tensor,  # (T,) int32/int64, each in [0, max_positions)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``rotary_ref``: one kernel rotates q and k; new contiguous tensors.

    Positions are not range-checked on the device (that would need a host sync): a position
    outside the tables reads out of bounds, where the reference raises an IndexError.
    """
    t, h, hkv, d = check_rotary(q, k, cos, sin, positions)
    if q.dtype != k.dtype:
        raise ValueError(f"q, k: one dtype expected, got {q.dtype} and {k.dtype}")
    q = q if q.stride(2) == 1 else q.contiguous()
    k = k if k.stride(2) == 1 else k.contiguous()
    cos = cos if cos.stride(1) == 1 else cos.contiguous()
    sin = sin if sin.stride(1) == 1 else sin.contiguous()
    q_out, k_out = torch.empty_like(q, memory_format=torch.contiguous_format), \
        torch.empty_like(k, memory_format=torch.contiguous_format)
    if t == 0:
        return q_out, k_out
    half = d // 2
    hq_pad, hk_pad = next_pow2(h), next_pow2(hkv)
    half_pad = next_pow2(half)
    warps = max(1, min(8, hq_pad * half_pad // 512))
    _rotary_kernel[(t,)](
        q, k, cos, sin, positions, q_out, k_out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        cos.stride(0), sin.stride(0),
        NUM_Q_HEADS=h, NUM_KV_HEADS=hkv, HALF=half, HALF_PAD=half_pad, HQ_PAD=hq_pad,
        HK_PAD=hk_pad, num_warps=warps, **pdl_kwargs(q.device))
    return q_out, k_out
