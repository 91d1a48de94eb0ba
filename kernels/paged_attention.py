"""Paged attention over a block-structured KV cache, and the write of new K/V into it.

KV cache layout, one pair of tensors per layer (vLLM's "flash" layout):

    k_cache, v_cache: (num_blocks, block_size, num_kv_heads, head_dim)
    slot = block_id * block_size + offset_in_block

A step's batch is flat: the query tokens of all sequences are concatenated.

    query_start_loc: (B + 1,) int32   seq b's queries are q[query_start_loc[b]:query_start_loc[b+1]]
    seq_lens:        (B,)     int32   context length of seq b after this step (cached + new)
    block_tables:    (B, max_blocks) int32, padded with any valid id beyond ceil(seq_len/bs)

    positions of seq b:  0 ............ seq_len - num_q ......... seq_len - 1
                         |<- from the cache ->|<----- new queries ----->|
    query i (0-based among the new ones) sees keys 0 .. seq_len - num_q + i (causal).

Sliding-window layers (``window`` W): a query at position p sees keys p - W + 1 .. p only
(transformers' ``kv_idx > q_idx - W``); the kernels start each key loop at the first tile
holding a visible key, so a step's work is bounded by the window, not the context. Gemma 2's
``softcap`` c turns each score s (after the scale) into c * tanh(s / c) before the masks.

The torch references below are the CPU path and the oracle for the Triton kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grid import next_pow2
from .kv_fp8 import from_cache_ref, to_cache, to_cache_ref
from .paged_decode import DecodeConfig, decode_split_plan, paged_decode
from .paged_prefill import PrefillConfig, paged_prefill
from .pdl import pdl_enter, pdl_kwargs

__all__ = [
    "DecodeConfig", "PrefillConfig", "decode_split_plan", "paged_attention_ref",
    "paged_attention_triton", "paged_decode", "paged_prefill", "write_kv", "write_kv_ref",
]


def write_kv_ref(
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    k_cache: torch.Tensor,  # (num_blocks, bs, Hkv, D)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64
) -> None:
    """Store each new token's K/V at its slot; slots < 0 are skipped (padding). An fp8 cache
    (uint8) stores e4m3 codes (kernels/kv_fp8.py)."""
    num_blocks, bs, hkv, d = k_cache.shape
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    for cache, x in ((k_cache, k), (v_cache, v)):
        x = to_cache_ref(x, cache.dtype)
        if cache.is_contiguous():
            cache.view(num_blocks * bs, hkv, d).index_copy_(0, slot_mapping, x)
        else:  # a strided view of a cache
            cache[slot_mapping // bs, slot_mapping % bs] = x


def _gather_context(
    cache: torch.Tensor, block_table: torch.Tensor, seq_len: int
) -> torch.Tensor:
    bs = cache.shape[1]
    nblk = (seq_len + bs - 1) // bs
    blocks = cache.index_select(0, block_table[:nblk].long())  # (nblk, bs, Hkv, D)
    return blocks.reshape(nblk * bs, *cache.shape[2:])[:seq_len]  # (L, Hkv, D)


def paged_attention_ref(
    q: torch.Tensor,  # (T, H, D)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    query_start_loc: torch.Tensor,  # (B + 1,) int32, on the host or the device
    seq_lens: torch.Tensor,  # (B,) int32
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
    scratch: dict | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its whole cached context (the
    last ``window`` positions of it, with a window; scores soft-capped with ``softcap``).

    The K/V of the new tokens must already be in the cache (``write_kv`` first). Computes in
    fp32 and returns q's dtype, (T, H, D). One query per sequence (decode) runs in torch's
    ``scaled_dot_product_attention`` (on the CPU 0.5-0.8x the CPU time of einsum / softmax /
    einsum, BENCHMARKS.md "CPU"); chunks with several queries keep the einsums, which were
    faster there than SDPA's causal kernel at these head sizes. ``scratch``
    (``AttentionMetadata.scratch``, one forward's): where the host copies of the lengths and
    the decode gather's table and mask are kept for the next layers.
    """
    t, h, d = q.shape
    hkv = k_cache.shape[2]
    group = h // hkv
    out = torch.empty_like(q)
    plan = scratch.get("ref_plan") if scratch is not None else None
    if plan is None:
        plan = _RefPlan(query_start_loc, seq_lens, block_tables, k_cache.shape[1])
        if scratch is not None:
            scratch["ref_plan"] = plan
    starts, lens = plan.starts, plan.lens
    if plan.decode:
        return _decode_ref(q, k_cache, v_cache, plan, scale, window, softcap)
    for b, seq_len in enumerate(lens):
        qs, qe = starts[b], starts[b + 1]
        nq = qe - qs
        if nq == 0:
            continue
        k = from_cache_ref(_gather_context(k_cache, block_tables[b], seq_len))  # (L, Hkv, D)
        v = from_cache_ref(_gather_context(v_cache, block_tables[b], seq_len))
        qb = q[qs:qe].float().reshape(nq, hkv, group, d)  # (nq, Hkv, G, D)
        scores = _softcap(torch.einsum("qhgd,khd->hgqk", qb, k) * scale, softcap)  # (Hkv, G, nq, L)
        qpos = torch.arange(seq_len - nq, seq_len, device=q.device).view(nq, 1)
        kpos = torch.arange(seq_len, device=q.device).view(1, seq_len)
        hidden = kpos > qpos  # (nq, L)
        if window is not None:
            hidden |= kpos <= qpos - window
        scores.masked_fill_(hidden, float("-inf"))
        probs = scores.softmax(dim=-1)
        ob = torch.einsum("hgqk,khd->qhgd", probs, v)  # (nq, Hkv, G, D)
        out[qs:qe] = ob.reshape(nq, h, d).to(q.dtype)
    return out


class _RefPlan:
    """What every layer's ``paged_attention_ref`` derives alike from one forward's metadata:
    host lists of the query starts and context lengths and, for a decode (one query per
    sequence), the used blocks of all sequences in one flat table (one gather a layer)."""

    def __init__(self, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                 block_tables: torch.Tensor, block_size: int) -> None:
        self.starts: list[int] = query_start_loc.tolist()
        self.lens: list[int] = seq_lens.tolist()
        b = len(self.lens)
        self.decode = bool(b) and all(self.starts[i + 1] - self.starts[i] == 1
                                      for i in range(b))
        if not self.decode:
            return
        nblks = [(n + block_size - 1) // block_size for n in self.lens]
        self.first_slot = [0] * b  # sequence i's context: gathered slots first_slot[i] + 0..len
        for i in range(1, b):
            self.first_slot[i] = self.first_slot[i - 1] + nblks[i - 1] * block_size
        # index_select on this, far cheaper than cache[table]
        self.table = (block_tables[0, :nblks[0]] if b == 1 else
                      torch.cat([block_tables[i, :n] for i, n in enumerate(nblks)]))


def _decode_ref(
    q: torch.Tensor,  # (B, H, D): one query per sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: _RefPlan,
    scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Single-query attention of each sequence over exactly its own context: a sequence's
    result does not depend on what else is in the batch (padding to the longest context
    changed SDPA's rounding, and greedy tokens with it)."""
    b, h, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    group = h // hkv
    k = from_cache_ref(k_cache.index_select(0, plan.table)).reshape(-1, hkv, d)  # (slots, ..)
    v = from_cache_ref(v_cache.index_select(0, plan.table)).reshape(-1, hkv, d)
    qf = q.float().unsqueeze(2)  # (B, H, 1, D)
    out = torch.empty(b, h, 1, d, device=q.device)
    for i, (first, n) in enumerate(zip(plan.first_slot, plan.lens, strict=True)):
        # the query sits at position n - 1: a window shows it positions n - window .. n - 1
        lo = first + (max(0, n - window) if window is not None else 0)
        ki, vi = k[lo:first + n], v[lo:first + n]  # (L, Hkv, D)
        if softcap:  # SDPA has no soft-capped scores
            qg = qf[i, :, 0].view(hkv, group, d)  # (Hkv, G, D)
            scores = _softcap(torch.einsum("hgd,lhd->hgl", qg, ki) * scale, softcap)
            ob = torch.einsum("hgl,lhd->hgd", scores.softmax(dim=-1), vi)  # (Hkv, G, D)
            out[i] = ob.reshape(h, 1, d)
            continue
        # 4-d (1, heads, len, D): the shape SDPA's fused CPU kernel takes (3-d ran its math)
        out[i] = torch.nn.functional.scaled_dot_product_attention(
            qf[i:i + 1], ki.transpose(0, 1).unsqueeze(0), vi.transpose(0, 1).unsqueeze(0),
            scale=scale, enable_gqa=True)[0]  # (H, 1, D)
    return out.view(b, h, d).to(q.dtype)


def _softcap(scores: torch.Tensor, cap: float | None) -> torch.Tensor:
    return scores if not cap else torch.tanh(scores / cap) * cap


# Triton kernels: write_kv below; decode in paged_decode.py, prefill in paged_prefill.py.


@triton.jit
def copy_heads(src_ptr, dst_ptr, stride_src_h, stride_dst_h, keep,
               NUM_HEADS: tl.constexpr, H_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
               D_PAD: tl.constexpr):
    """One token's heads [NUM_HEADS, HEAD_DIM] from src to dst (cast to dst's dtype, or fp8
    codes for a uint8 cache) where ``keep`` ([1, D_PAD] bools) holds."""
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, D_PAD)
    mask = (h[:, None] < NUM_HEADS) & (d[None, :] < HEAD_DIM) & keep
    x = tl.load(src_ptr + h[:, None] * stride_src_h + d[None, :], mask=mask)
    tl.store(dst_ptr + h[:, None] * stride_dst_h + d[None, :],
             to_cache(x, dst_ptr.dtype.element_ty, src_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, H_PAD: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Copy token t's K and V (Hkv, D) into cache slot slot_mapping[t]; slot < 0 is skipped."""
    pdl_enter(PDL)
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    # a tensor, not a scalar bool: the interpreter cannot AND those
    keep = tl.arange(0, D_PAD)[None, :] * 0 + slot >= 0
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    copy_heads(k_ptr + t * stride_kt, kc_ptr + blk * stride_kcb + off * stride_kcs, stride_kh,
               stride_kch, keep, NUM_KV_HEADS, H_PAD, HEAD_DIM, D_PAD)
    copy_heads(v_ptr + t * stride_vt, vc_ptr + blk * stride_vcb + off * stride_vcs, stride_vh,
               stride_vch, keep, NUM_KV_HEADS, H_PAD, HEAD_DIM, D_PAD)


def paged_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    scratch: dict | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Same contract as ``paged_attention_ref``; decode kernel when every sequence has exactly
    one new query, else the prefill kernel (``scratch``: see ``paged_prefill``).

    Without ``max_query_len`` a host ``query_start_loc`` is read directly; a device one is not
    read (no sync): T == B is then taken as one query per sequence, which holds because the
    scheduler never schedules a sequence with zero new tokens.
    """
    b = seq_lens.shape[0]
    if max_query_len is None:
        if query_start_loc.device.type == "cpu" and b:
            max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
        else:
            max_query_len = 1 if q.shape[0] == b else 2
    if max_query_len == 1 and q.shape[0] == b:
        return paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len,
                            window=window, softcap=softcap)
    return paged_prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                         scratch=scratch, max_seq_len=max_seq_len, window=window, softcap=softcap)


def check_kv_write(k, v, k_cache, v_cache, slot_mapping) -> int:
    """T of a K/V cache write's arguments; ValueError naming what does not fit."""
    t, hkv, d = k.shape
    if v.shape != k.shape or k_cache.shape[2:] != (hkv, d) or v_cache.shape != k_cache.shape:
        raise ValueError(f"k, v, k_cache, v_cache: shapes {tuple(k.shape)}, {tuple(v.shape)}, "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)} do not agree")
    if slot_mapping.shape != (t,):
        raise ValueError(f"slot_mapping: expected shape ({t},), got {tuple(slot_mapping.shape)}")
    return t


def write_kv(
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,
    k_cache: torch.Tensor,  # (num_blocks, bs, Hkv, D)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64; < 0 skipped
) -> None:
    """Triton version of ``write_kv_ref`` (same contract); one program per token."""
    t = check_kv_write(k, v, k_cache, v_cache, slot_mapping)
    if t == 0:
        return
    hkv, d = k.shape[1:]
    if k.stride(2) != 1 or v.stride(2) != 1:
        k, v = k.contiguous(), v.contiguous()
    _write_kv_kernel[(t,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=hkv, HEAD_DIM=d, H_PAD=next_pow2(hkv),
        D_PAD=next_pow2(d), BLOCK_SIZE=k_cache.shape[1],
        num_warps=1, **pdl_kwargs(k_cache.device))
