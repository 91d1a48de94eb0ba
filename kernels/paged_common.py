"""Pieces shared by the paged-attention kernels: the block-table gather of a K/V tile, input
checks, and the multiprocessor count (layout: ``kernels/paged_attention.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .device import has_fp8_cvt, num_sms
from .kv_fp8 import fp8_decode
from .pdl import prefetch_l2

__all__ = ["LOG2E", "check_cache", "context_partition", "fp8_cvt", "kv_line", "load_k_tile",
           "load_kv_tile", "merge_partials", "num_sms", "prefetch_kv_lines", "softcap_scores",
           "window_floor"]

LOG2E = 1.4426950408889634


@triton.jit
def _kv_ptrs(cache_ptr, blk, tok, kvh, offs_d, stride_b, stride_s, stride_h,
             BLOCK_SIZE: tl.constexpr):
    """[tokens, offs_d] addresses in a paged cache of kv head ``kvh``: token t sits in block
    blk[t] (from the table) at slot t % BLOCK_SIZE."""
    return cache_ptr + blk[:, None] * stride_b + (tok % BLOCK_SIZE)[:, None] * stride_s \
        + kvh * stride_h + offs_d[None, :]


@triton.jit
def load_kv_tile(cache_ptr, table_row_ptr, tok, t_mask, kvh, offs_d, d_mask,
                  stride_b, stride_s, stride_h, BLOCK_SIZE: tl.constexpr, OUT_TY: tl.constexpr,
                  FP8_CVT: tl.constexpr):
    """[BLOCK_N, D_PAD] values of context tokens ``tok`` from a token-major cache, gathered
    per token (``t_mask`` off: zeros); keys come by whole blocks (``load_k_tile``). An fp8
    cache (uint8 codes, kernels/kv_fp8.py) is decoded to ``OUT_TY``, the queries' dtype, by
    the hardware conversion when ``FP8_CVT``."""
    blk = tl.load(table_row_ptr + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
    ptrs = _kv_ptrs(cache_ptr, blk, tok, kvh, offs_d, stride_b, stride_s, stride_h, BLOCK_SIZE)
    x = tl.load(ptrs, mask=t_mask[:, None] & d_mask[None, :], other=0)
    if cache_ptr.dtype.element_ty == tl.uint8:
        x = fp8_decode(x, FP8_CVT).to(OUT_TY)
    return x


@triton.jit
def _tile_blocks(table_row_ptr, n0, end, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr):
    """The blocks holding context tokens n0 .. n0 + BLOCK_N (n0 a multiple of min(BLOCK_N,
    BLOCK_SIZE)): their ids from the table row (0 for those from ``end`` on), which of them
    start before ``end``, and the tile's slots in each (a whole block, or the tile's part of
    a block longer than the tile)."""
    SLOTS: tl.constexpr = BLOCK_SIZE if BLOCK_SIZE < BLOCK_N else BLOCK_N
    NB: tl.constexpr = BLOCK_N // SLOTS
    first = n0 + tl.arange(0, NB) * SLOTS  # each block's first token in the tile
    b_mask = first < end
    blk = tl.load(table_row_ptr + first // BLOCK_SIZE, mask=b_mask, other=0).to(tl.int64)
    slot = n0 % BLOCK_SIZE if NB == 1 else 0
    return blk, b_mask, slot + tl.arange(0, SLOTS)


@triton.jit
def load_k_tile(cache_ptr, table_row_ptr, n0, end, kvh, offs_d, d_mask, stride_b, stride_s,
                stride_h, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                OUT_TY: tl.constexpr, FP8_CVT: tl.constexpr):
    """[BLOCK_N, D_PAD] keys of context tokens n0 .. n0 + BLOCK_N (n0 a multiple of
    min(BLOCK_N, BLOCK_SIZE)), gathered by whole blocks: one table read and one base address
    per block of the tile ([blocks, slots, D_PAD], reshaped), where ``load_kv_tile`` takes
    both per token (Triton 3.6, sm_89 decode: 629 -> 577 instructions a key tile with fp16).
    Blocks from ``end`` on read as zeros;
    the slots past ``end`` of a block that starts before it are read as they are, whatever
    they hold: the caller masks those scores. (Values gathered so, with a mask per token,
    lost the 16-byte asynchronous copies: Triton loaded them into registers first.)"""
    blk, b_mask, slots = _tile_blocks(table_row_ptr, n0, end, BLOCK_SIZE, BLOCK_N)
    ptrs = cache_ptr + blk[:, None, None] * stride_b + kvh * stride_h \
        + slots[None, :, None] * stride_s + offs_d[None, None, :]
    x = tl.load(ptrs, mask=b_mask[:, None, None] & d_mask[None, None, :], other=0)
    x = tl.reshape(x, (BLOCK_N, offs_d.shape[0]))
    if cache_ptr.dtype.element_ty == tl.uint8:
        x = fp8_decode(x, FP8_CVT).to(OUT_TY)
    return x


@triton.jit
def prefetch_kv_lines(k_ptr, v_ptr, table_row_ptr, tok, kvh, stride_kb, stride_ks, stride_kh,
                      stride_vb, stride_vs, stride_vh, BLOCK_SIZE: tl.constexpr,
                      D_PAD: tl.constexpr, LINE: tl.constexpr):
    """Ask L2 for the keys and values of kv head ``kvh`` at context tokens ``tok`` (every one
    a valid position of the table row): D_PAD / LINE lines per token and cache, LINE the
    elements of one 128-byte line (or the whole head, if shorter). Reads the block table."""
    blk = tl.load(table_row_ptr + tok // BLOCK_SIZE).to(tl.int64)
    offs = tl.arange(0, D_PAD // LINE) * LINE
    prefetch_l2(_kv_ptrs(k_ptr, blk, tok, kvh, offs, stride_kb, stride_ks, stride_kh,
                         BLOCK_SIZE))
    prefetch_l2(_kv_ptrs(v_ptr, blk, tok, kvh, offs, stride_vb, stride_vs, stride_vh,
                         BLOCK_SIZE))


@triton.jit
def window_floor(pos, window, BLOCK_N: tl.constexpr):
    """The first key tile (a multiple of BLOCK_N) holding a key that a query at ``pos`` sees
    through a sliding window of ``window`` positions (keys pos - window + 1 .. pos)."""
    return (tl.maximum(pos - window + 1, 0) // BLOCK_N) * BLOCK_N


@triton.jit
def softcap_scores(s, cap):
    """cap * tanh(s / cap), ``s`` and ``cap`` in the same (log2) units: tanh(x) = 1 - 2 /
    (e^2x + 1), which saturates to +-1 without overflow (e^2x = inf gives 1)."""
    e = tl.exp2((2.0 * 1.4426950408889634) * (s / cap))
    return cap * (1.0 - 2.0 / (e + 1.0))


@triton.jit
def context_partition(seq_len, num_splits, BLOCK_N: tl.constexpr):
    """Tokens per context split of one sequence (or one prefill q tile's keys):
    ceil(seq_len / num_splits), a multiple of BLOCK_N (at least BLOCK_N)."""
    return tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N), 1) * BLOCK_N


@triton.jit
def merge_partials(part_out_ptr, part_lse_ptr, rows, s_mask, offs_d, HEAD_DIM: tl.constexpr):
    """One output row from its context partitions: the fp32 partials at ``rows`` (one per
    partition, [.., HEAD_DIM] each; ``s_mask`` the live ones) weighted by 2^lse, their
    log2-sum-exps (an empty partition carries -inf, weight 0). Used by the second launches
    of decode (paged_decode.py) and prefill (paged_prefill.py) attention."""
    lse = tl.load(part_lse_ptr + rows, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.where(s_mask, tl.exp2(lse - m), 0.0)
    denom = tl.sum(w, axis=0)
    parts = tl.load(part_out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    return tl.sum(parts * w[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)


def kv_line(k_cache: torch.Tensor, d_pad: int) -> int:
    """``prefetch_kv_lines``'s LINE for a cache: elements per 128-byte line, at most d_pad."""
    return min(128 // k_cache.element_size(), d_pad)


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
