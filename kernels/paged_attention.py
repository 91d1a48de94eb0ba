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

The torch references below are the CPU path and the oracle for the Triton kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


def write_kv_ref(
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    k_cache: torch.Tensor,  # (num_blocks, bs, Hkv, D)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64
) -> None:
    """Store each new token's K/V at its slot; slots < 0 are skipped (padding)."""
    num_blocks, bs, hkv, d = k_cache.shape
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    k_cache.view(num_blocks * bs, hkv, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.view(num_blocks * bs, hkv, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


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
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its whole cached context.

    The K/V of the new tokens must already be in the cache (``write_kv`` first). Computes in
    fp32 and returns q's dtype, (T, H, D).
    """
    t, h, d = q.shape
    hkv = k_cache.shape[2]
    group = h // hkv
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    if len(lens) and all(starts[b + 1] - starts[b] == 1 for b in range(len(lens))):
        return _decode_ref(q, k_cache, v_cache, block_tables, seq_lens, scale)
    for b, seq_len in enumerate(lens):
        qs, qe = starts[b], starts[b + 1]
        nq = qe - qs
        if nq == 0:
            continue
        k = _gather_context(k_cache, block_tables[b], seq_len).float()  # (L, Hkv, D)
        v = _gather_context(v_cache, block_tables[b], seq_len).float()
        qb = q[qs:qe].float().view(nq, hkv, group, d)  # (nq, Hkv, G, D)
        scores = torch.einsum("qhgd,khd->hgqk", qb, k) * scale  # (Hkv, G, nq, L)
        qpos = torch.arange(seq_len - nq, seq_len, device=q.device).view(nq, 1)
        kpos = torch.arange(seq_len, device=q.device).view(1, seq_len)
        scores.masked_fill_(kpos > qpos, float("-inf"))
        probs = scores.softmax(dim=-1)
        ob = torch.einsum("hgqk,khd->qhgd", probs, v)  # (nq, Hkv, G, D)
        out[qs:qe] = ob.reshape(nq, h, d).to(q.dtype)
    return out


def _decode_ref(
    q: torch.Tensor,  # (B, H, D): one query per sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Batched single-query attention: gather every table padded to the longest context."""
    b, h, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    group = h // hkv
    max_len = int(seq_lens.max())
    nblk = (max_len + bs - 1) // bs
    table = block_tables[:, :nblk].long()  # (B, nblk)
    k = k_cache[table].reshape(b, nblk * bs, hkv, d).float()  # (B, S, Hkv, D)
    v = v_cache[table].reshape(b, nblk * bs, hkv, d).float()
    qf = q.float().view(b, hkv, group, d)  # (B, Hkv, G, D)
    scores = torch.einsum("bhgd,bshd->bhgs", qf, k) * scale  # (B, Hkv, G, S)
    kpos = torch.arange(nblk * bs, device=q.device).view(1, -1)
    pad = kpos >= seq_lens.to(q.device).view(-1, 1).long()  # (B, S)
    scores.masked_fill_(pad.view(b, 1, 1, -1), float("-inf"))
    # slots past a sequence's end hold whatever was there (possibly NaN): 0 * NaN is NaN
    v = v.masked_fill(pad.view(b, -1, 1, 1), 0.0)
    probs = scores.softmax(dim=-1)
    out = torch.einsum("bhgs,bshd->bhgd", probs, v)  # (B, Hkv, G, D)
    return out.reshape(b, h, d).to(q.dtype)


# ============================================================================ Triton kernels
#
# Decode (one query per sequence), split-K / flash-decoding:
#
#   grid (B, Hkv, S): program (b, h, s) owns the G = H / Hkv query heads of kv head h and
#   context tokens [s * P, min((s + 1) * P, seq_len)), P = partition size (a multiple of
#   BLOCK_N). Each loaded K/V tile [BLOCK_N, D] serves all G heads through one tl.dot whose
#   M rows are the heads (padded to 16). With S > 1 every program writes its normalised
#   partial output and log2-sum-exp; the reduce kernel weights the S partials per head.
#
# Prefill / chunked prefill (any number of queries per sequence):
#
#   grid (num_q_tiles_upper_bound, Hkv): a q tile is BLOCK_Q consecutive new tokens of one
#   sequence times its G heads, flattened into BLOCK_M >= BLOCK_Q * G rows (row = token * G +
#   head). tile_starts[b] = sum of q tiles of sequences < b (device cumsum, no host sync); a
#   program finds its sequence by binary search. Key loop: 0 .. last query position + 1,
#   masked causally (query at position p sees keys <= p) and by seq_len.

_LOG2E = 1.4426950408889634


@triton.jit
def _load_kv_tile(cache_ptr, table_row_ptr, tok, t_mask, kvh, offs_d, d_mask,
                  stride_b, stride_s, stride_h, BLOCK_SIZE: tl.constexpr):
    """[BLOCK_N, D_PAD] keys or values of context tokens ``tok`` (block-table gather)."""
    blk = tl.load(table_row_ptr + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
    ptrs = cache_ptr + blk[:, None] * stride_b + (tok % BLOCK_SIZE)[:, None] * stride_s \
        + kvh * stride_h + offs_d[None, :]
    return tl.load(ptrs, mask=t_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
    scale_log2, partition_size,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ot, stride_oh, stride_pb, stride_ph, stride_ps,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    start = split * partition_size
    end = tl.minimum(seq_len, start + partition_size)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, D_PAD)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + b * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)  # (G_PAD, D_PAD)
    m_i = tl.full((GROUP_PAD,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((GROUP_PAD,), dtype=tl.float32)
    acc = tl.zeros((GROUP_PAD, D_PAD), dtype=tl.float32)
    table_row = table_ptr + b * stride_bt
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(start, end, BLOCK_N):
        tok = n0 + offs_n
        t_mask = tok < end
        k = _load_kv_tile(k_ptr, table_row, tok, t_mask, kvh, offs_d, d_mask,
                          stride_kb, stride_ks, stride_kh, BLOCK_SIZE)  # (BLOCK_N, D_PAD)
        s = tl.dot(q, tl.trans(k)) * scale_log2  # (G_PAD, BLOCK_N), log2 units
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _load_kv_tile(v_ptr, table_row, tok, t_mask, kvh, offs_d, d_mask,
                          stride_vb, stride_vs, stride_vh, BLOCK_SIZE)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # an empty context gives zeros
    o_mask = g_mask[:, None] & d_mask[None, :]
    if not SPLIT:
        tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        base = b * stride_pb + heads * stride_ph + split * stride_ps  # (G_PAD,)
        tl.store(part_out_ptr + base[:, None] * HEAD_DIM + offs_d[None, :], out, mask=o_mask)
        tl.store(part_lse_ptr + base, m_i + tl.log2(l_i), mask=g_mask)


@triton.jit
def _paged_decode_reduce_kernel(
    part_out_ptr, part_lse_ptr, seq_lens_ptr, out_ptr, partition_size,
    stride_pb, stride_ph, stride_ps, stride_ot, stride_oh,
    num_splits, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    """out[b, h] = sum_s w_s * part[b, h, s] with w_s = 2^lse_s / sum 2^lse (valid splits)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    num_valid = tl.cdiv(seq_len, partition_size)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_mask = (offs_s < num_valid) & (offs_s < num_splits)
    base = b * stride_pb + h * stride_ph + offs_s * stride_ps  # (S_PAD,)
    lse = tl.load(part_lse_ptr + base, mask=s_mask, other=float("-inf"))
    m = tl.max(lse, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.where(s_mask, tl.exp2(lse - m), 0.0)
    denom = tl.sum(w, axis=0)
    parts = tl.load(part_out_ptr + base[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)
    out = tl.sum(parts * w[:, None], axis=0) / tl.where(denom > 0, denom, 1.0)
    tl.store(out_ptr + b * stride_ot + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


@triton.jit
def _tile_owner(tile_starts_ptr, tile, num_seqs, SEARCH_STEPS: tl.constexpr):
    """Largest b < num_seqs with tile_starts[b] <= tile (binary search; sequences with no
    queries own no tiles, so equal neighbours resolve to the later one)."""
    lo = 0
    hi = num_seqs
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        go_right = tl.load(tile_starts_ptr + mid) <= tile
        lo = tl.where(go_right, mid, lo)
        hi = tl.where(go_right, hi, mid)
    return lo


@triton.jit
def _paged_prefill_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, qsl_ptr, tile_starts_ptr, out_ptr,
    scale_log2, num_seqs,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, SEARCH_STEPS: tl.constexpr,
):
    tile = tl.program_id(0)
    kvh = tl.program_id(1)
    b = _tile_owner(tile_starts_ptr, tile, num_seqs, SEARCH_STEPS)
    num_tiles = tl.load(tile_starts_ptr + num_seqs)
    tile_valid = tile < num_tiles
    q_start = tl.load(qsl_ptr + b)
    num_q = tl.load(qsl_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    first_q = (tile - tl.load(tile_starts_ptr + b)) * BLOCK_Q  # among this seq's new tokens
    rows = tl.arange(0, BLOCK_M)
    q_local = first_q + rows // GROUP
    # (rows * 0 + tile): a tensor, as the interpreter cannot AND a tensor with a scalar bool
    row_mask = (rows < BLOCK_Q * GROUP) & (q_local < num_q) & (rows * 0 + tile < num_tiles)
    heads = kvh * GROUP + rows % GROUP
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    tok = (q_start + q_local).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # (BLOCK_M, D_PAD)
    q_pos = seq_len - num_q + q_local  # (BLOCK_M,) absolute position of each row's query
    last_pos = tl.minimum(seq_len - num_q + first_q + BLOCK_Q - 1, seq_len - 1)
    kv_end = tl.where(tile_valid, last_pos + 1, 0)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), dtype=tl.float32)
    table_row = table_ptr + b * stride_bt
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(0, kv_end, BLOCK_N):
        kpos = n0 + offs_n
        t_mask = kpos < kv_end
        k = _load_kv_tile(k_ptr, table_row, kpos, t_mask, kvh, offs_d, d_mask,
                          stride_kb, stride_ks, stride_kh, BLOCK_SIZE)
        s = tl.dot(q, tl.trans(k)) * scale_log2  # (BLOCK_M, BLOCK_N)
        visible = (kpos[None, :] <= q_pos[:, None]) & t_mask[None, :]
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = _load_kv_tile(v_ptr, table_row, kpos, t_mask, kvh, offs_d, d_mask,
                          stride_vb, stride_vs, stride_vh, BLOCK_SIZE)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask[None, :])


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, H_PAD: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """Copy token t's K and V (Hkv, D) into cache slot slot_mapping[t]; slot < 0 is skipped."""
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    offs_h = tl.arange(0, H_PAD)
    offs_d = tl.arange(0, D_PAD)
    keep = offs_d[None, :] * 0 + slot >= 0  # a tensor: the interpreter cannot AND a scalar bool
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM) & keep
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    k = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(kc_ptr + blk * stride_kcb + off * stride_kcs + offs_h[:, None] * stride_kch
             + offs_d[None, :], k.to(kc_ptr.dtype.element_ty), mask=mask)
    tl.store(vc_ptr + blk * stride_vcb + off * stride_vcs + offs_h[:, None] * stride_vch
             + offs_d[None, :], v.to(vc_ptr.dtype.element_ty), mask=mask)


# ============================================================================ wrappers


@dataclass(frozen=True)
class DecodeConfig:
    """Decode launch knobs; num_splits 0 = choose from the GPU size and the longest context."""

    block_n: int = 64
    num_splits: int = 0
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class PrefillConfig:
    block_m: int = 64  # query rows per program: BLOCK_M // G tokens times G heads
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2


def _check_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ValueError(f"k_cache/v_cache: expected equal (num_blocks, block_size, Hkv, D) "
                         f"shapes, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if q.dim() != 3 or q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"q: expected (T, H, D) with D = {k_cache.shape[3]} and H a multiple "
                         f"of Hkv = {k_cache.shape[2]}, got {tuple(q.shape)}")
    if q.stride(2) != 1 or k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("q, k_cache, v_cache: the head_dim axis must be contiguous")


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 8
    return torch.cuda.get_device_properties(device).multi_processor_count


def decode_split_plan(programs: int, max_context: int, sms: int, block_n: int,
                      num_splits: int = 0) -> tuple[int, int]:
    """(num_splits, partition_size): split contexts until about 2 programs per multiprocessor,
    keeping partitions >= 256 tokens; the partition is a multiple of block_n."""
    max_context = max(max_context, 1)
    if num_splits <= 0:
        num_splits = min(triton.cdiv(2 * sms, max(programs, 1)),
                         triton.cdiv(max_context, 256), 64)
        num_splits = max(1, num_splits)
    partition = triton.cdiv(triton.cdiv(max_context, num_splits), block_n) * block_n
    return triton.cdiv(max_context, partition), partition


def paged_decode(
    q: torch.Tensor,  # (B, H, D): one query per sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    seq_lens: torch.Tensor,  # (B,) int32, on q's device
    scale: float,
    max_seq_len: int | None = None,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """Decode attention (Triton). No host sync: safe to capture in a CUDA graph.

    ``max_seq_len`` (host int) sizes the context split; default block_tables' width.
    """
    _check_cache(q, k_cache, v_cache)
    cfg = config or DecodeConfig()
    b, h, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    group = h // hkv
    out = torch.empty_like(q)
    if b == 0:
        return out
    max_ctx = max_seq_len if max_seq_len is not None else block_tables.shape[1] * bs
    splits, partition = decode_split_plan(b * hkv, max_ctx, _num_sms(q.device), cfg.block_n,
                                          cfg.num_splits)
    d_pad = triton.next_power_of_2(d)
    part_out = part_lse = out  # placeholders, unused without a split
    if splits > 1:
        part_out = torch.empty((b, h, splits, d), device=q.device, dtype=torch.float32)
        part_lse = torch.empty((b, h, splits), device=q.device, dtype=torch.float32)
    seq_lens = seq_lens.to(q.device)
    _paged_decode_kernel[(b, hkv, splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_out, part_lse,
        scale * _LOG2E, partition, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), h * splits, splits, 1,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=d,
        D_PAD=d_pad, BLOCK_SIZE=bs, BLOCK_N=cfg.block_n, SPLIT=splits > 1,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if splits > 1:
        _paged_decode_reduce_kernel[(b, h)](
            part_out, part_lse, seq_lens, out, partition, h * splits, splits, 1,
            out.stride(0), out.stride(1), splits, HEAD_DIM=d, D_PAD=d_pad,
            SPLITS_PAD=triton.next_power_of_2(splits), num_warps=4)
    return out


def paged_prefill(
    q: torch.Tensor,  # (T, H, D)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,  # (B + 1,) int32, host or device
    seq_lens: torch.Tensor,
    scale: float,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """Prefill / chunked-prefill / mixed-batch attention (Triton), causal over the cache."""
    _check_cache(q, k_cache, v_cache)
    cfg = config or PrefillConfig()
    t, h, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    group = h // hkv
    num_seqs = seq_lens.shape[0]
    out = torch.empty_like(q)
    if t == 0 or num_seqs == 0:
        return out
    block_m = max(cfg.block_m, 16, triton.next_power_of_2(group))
    block_q = block_m // group
    qsl = query_start_loc.to(q.device, torch.int32)
    tiles = (qsl[1:] - qsl[:-1] + block_q - 1) // block_q  # (B,) q tiles per sequence
    tile_starts = torch.zeros(num_seqs + 1, device=q.device, dtype=torch.int32)
    tile_starts[1:] = torch.cumsum(tiles, 0)
    grid = (t // block_q + num_seqs, hkv)  # >= sum over b of ceil(num_q_b / block_q)
    _paged_prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, seq_lens.to(q.device), qsl, tile_starts, out,
        scale * _LOG2E, num_seqs, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=d, D_PAD=triton.next_power_of_2(d), BLOCK_SIZE=bs,
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=cfg.block_n,
        SEARCH_STEPS=max(1, num_seqs.bit_length()),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


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
) -> torch.Tensor:
    """Same contract as ``paged_attention_ref``; decode kernel when every sequence has exactly
    one new query, else the prefill kernel.

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
        return paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale, max_seq_len)
    return paged_prefill(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale)


def write_kv(
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,
    k_cache: torch.Tensor,  # (num_blocks, bs, Hkv, D)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64; < 0 skipped
) -> None:
    """Triton version of ``write_kv_ref`` (same contract); one program per token."""
    t, hkv, d = k.shape
    if v.shape != k.shape or k_cache.shape[2:] != (hkv, d) or v_cache.shape != k_cache.shape:
        raise ValueError(f"k, v, k_cache, v_cache: shapes {tuple(k.shape)}, {tuple(v.shape)}, "
                         f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)} do not agree")
    if slot_mapping.shape != (t,):
        raise ValueError(f"slot_mapping: expected shape ({t},), got {tuple(slot_mapping.shape)}")
    if t == 0:
        return
    if k.stride(2) != 1 or v.stride(2) != 1:
        k, v = k.contiguous(), v.contiguous()
    _write_kv_kernel[(t,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=hkv, HEAD_DIM=d, H_PAD=triton.next_power_of_2(hkv),
        D_PAD=triton.next_power_of_2(d), BLOCK_SIZE=k_cache.shape[1], num_warps=1)
