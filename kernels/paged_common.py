"""Pieces shared by the paged-attention kernels: the block-table gather of a K/V tile, input
checks, and the multiprocessor count (layout: ``kernels/paged_attention.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import has_fp8_cvt, num_sms
from .kv_fp8 import fp8_decode

__all__ = ["LOG2E", "check_cache", "fp8_cvt", "load_kv_tile", "num_sms"]

LOG2E = 1.4426950408889634


@triton.jit
def load_kv_tile(cache_ptr, table_row_ptr, tok, t_mask, kvh, offs_d, d_mask,
                  stride_b, stride_s, stride_h, BLOCK_SIZE: tl.constexpr, OUT_TY: tl.constexpr,
                  FP8_CVT: tl.constexpr):
    """[BLOCK_N, D_PAD] keys or values of context tokens ``tok`` (block-table gather); an fp8
    cache (uint8 codes, kernels/kv_fp8.py) is decoded to ``OUT_TY``, the queries' dtype, by
    the hardware conversion when ``FP8_CVT``."""
    blk = tl.load(table_row_ptr + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
    ptrs = cache_ptr + blk[:, None] * stride_b + (tok % BLOCK_SIZE)[:, None] * stride_s \
        + kvh * stride_h + offs_d[None, :]
    x = tl.load(ptrs, mask=t_mask[:, None] & d_mask[None, :], other=0)
    if cache_ptr.dtype.element_ty == tl.uint8:
        x = fp8_decode(x, FP8_CVT).to(OUT_TY)
    return x


def fp8_cvt(k_cache: torch.Tensor) -> bool:
    """The attention kernels' FP8_CVT: an fp8 cache on a GPU with e4m3 conversions."""
    return k_cache.dtype == torch.uint8 and has_fp8_cvt(k_cache.device)


def check_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ValueError(f"k_cache/v_cache: expected equal (num_blocks, block_size, Hkv, D) "
                         f"shapes, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if q.dim() != 3 or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"q: expected (T, H, D) with D = {k_cache.shape[3]} and H a multiple "
                         f"of Hkv = {k_cache.shape[2]}, got {tuple(q.shape)}")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("q, k_cache, v_cache: the head_dim axis must be contiguous")
