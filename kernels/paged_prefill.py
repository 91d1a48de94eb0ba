"""Paged prefill / chunked-prefill attention: any number of new queries per sequence over its
cached prefix; the oracle is ``paged_attention_ref`` (kernels/paged_attention.py).

    grid (num_q_tiles_upper_bound, Hkv): a q tile is BLOCK_Q consecutive new tokens of one
    sequence times its G heads, flattened into BLOCK_M >= BLOCK_Q * S rows (row = token * S +
    head, S = G). tile_starts[b] = sum of
    q tiles of sequences < b (device cumsum, no host sync); a program finds its sequence by
    binary search. Key loop: 0 .. last query position + 1,
    masked causally (query at position p sees keys <= p) and by seq_len.

Split keys (grid axis 2, SPLIT): when the q tiles times the kv heads are too few programs for
the GPU (a short chunk or a few cached-prefix queries over a long context; one program per
head would walk 1,000 keys alone), each tile's keys 0 .. last query position are cut into
at most ``num_programs(2)`` partitions of at least MIN_PARTITION_TILES key tiles, as decode
attention cuts a context (paged_decode.py). Each program stores its normalised partial and
log2-sum-exp per row to fp32 scratch (past the tile's last partition: an empty one, weight
0), and a second launch (``_merge_partitions_kernel``) weighs them together. (Summed in the
kernel by the last program of a tile, as decode does, the [BLOCK_M, D] partials spilled
1.5 KB per thread.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .grid import next_pow2
from .paged_common import (
    LOG2E,
    check_cache,
    context_partition,
    fp8_cvt,
    load_k_tile,
    load_kv_tile,
    merge_partials,
    num_sms,
    softcap_scores,
    window_floor,
)
from .paged_decode import decode_split_plan
from .pdl import pdl_enter, pdl_kwargs

# key partitions per q tile at most; the merge kernel is compiled for this many whatever the
# split (one variant)
MAX_SPLITS = 8
# what a split costs, in keys one program walks: the merge launch and the partials' writes,
# plus a part per (token, head) row merged. Fitted on the prefill split's kernel table
# (BENCHMARKS.md, "Kernels"): it keeps every measured gain and drops the one measured loss
# under the programs cut-off (Qwen2.5's 28 / 4 heads, 256 new tokens over 1,000 keys)
SPLIT_FIXED_KEYS = 340
SPLIT_KEYS_PER_ROW = 0.068
# each q tile sizes its partitions from its own keys, but never below this many key tiles
# (256 keys at the default 64, the plan's own minimum): a tile whose keys are fewer than the
# plan assumed (a graph plans for max_model_len) takes fewer partitions, not smaller ones
MIN_PARTITION_TILES = tl.constexpr(4)


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


# num_seqs and the block-table stride change from step to step: not specialised on (Triton would
# compile a variant per divisibility class during serving instead of at warm-up)
@triton.jit(do_not_specialize=["num_seqs", "stride_bt", "num_tokens"])
def _paged_prefill_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, qsl_ptr, tile_starts_ptr, out_ptr,
    part_out_ptr, part_lse_ptr,
    scale_log2, num_seqs, num_tokens,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, SEARCH_STEPS: tl.constexpr, FP8_CVT: tl.constexpr,
    SPLIT: tl.constexpr = False,
    PDL: tl.constexpr = False,
    window=0, softcap_log2=0.0,
    WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False,
):
    """WINDOW: a tile's keys start at the first tile its first query sees through the window
    (``window_floor``), keys before each query's window masked; SOFTCAP: scores soft-capped
    at ``softcap_log2`` (log2 units)."""
    pdl_enter(PDL)
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
    head_in = rows % GROUP
    # (rows * 0 + tile): a tensor, as the interpreter cannot AND a tensor with a scalar bool
    row_mask = (rows < BLOCK_Q * GROUP) & (q_local < num_q) \
        & (rows * 0 + tile < num_tiles)
    heads = kvh * GROUP + head_in
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    tok = (q_start + q_local).to(tl.int64)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_mask[:, None] & d_mask[None, :], other=0.0)  # (BLOCK_M, D_PAD)
    q_pos = seq_len - num_q + q_local  # (BLOCK_M,) absolute position of each row's query
    last_pos = tl.minimum(seq_len - num_q + first_q + BLOCK_Q - 1, seq_len - 1)
    kv_end = tl.where(tile_valid, last_pos + 1, 0)
    kv_lo = 0
    if WINDOW:
        kv_lo = window_floor(seq_len - num_q + first_q, window, BLOCK_N)
    kv_start = kv_lo
    if SPLIT:  # this program's partition of the tile's keys (past kv_end: none)
        partition = tl.maximum(context_partition(kv_end - kv_lo, tl.num_programs(2), BLOCK_N),
                               MIN_PARTITION_TILES * BLOCK_N)
        kv_start = kv_lo + tl.program_id(2) * partition
        kv_end = tl.minimum(kv_end, kv_start + partition)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D_PAD), dtype=tl.float32)
    table_row = table_ptr + b * stride_bt
    offs_n = tl.arange(0, BLOCK_N)
    for n0 in range(kv_start, kv_end, BLOCK_N):
        kpos = n0 + offs_n
        t_mask = kpos < kv_end
        k = load_k_tile(k_ptr, table_row, n0, kv_end, kvh, offs_d, d_mask, stride_kb,
                        stride_ks, stride_kh, BLOCK_SIZE, BLOCK_N, q.dtype, FP8_CVT)
        s = tl.dot(q, tl.trans(k)) * scale_log2  # (BLOCK_M, BLOCK_N)
        if SOFTCAP:
            s = softcap_scores(s, softcap_log2)
        visible = (kpos[None, :] <= q_pos[:, None]) & t_mask[None, :]
        if WINDOW:
            visible = visible & (kpos[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = load_kv_tile(v_ptr, table_row, kpos, t_mask, kvh, offs_d, d_mask, stride_vb,
                         stride_vs, stride_vh, BLOCK_SIZE, q.dtype, FP8_CVT)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_mask = row_mask[:, None] & d_mask[None, :]
    out_offs = tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    if not SPLIT:
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        # partition p's (token, head) rows: [p, T, H] in part_lse, [p, T, H, HEAD_DIM]
        rows = (tl.program_id(2) * num_tokens + tok) * (GROUP * tl.num_programs(1)) + heads
        tl.store(part_out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], out, mask=o_mask)
        tl.store(part_lse_ptr + rows, m_i + tl.log2(l_i), mask=row_mask)


@triton.jit(do_not_specialize=["num_tokens", "num_splits"])
def _merge_partitions_kernel(part_out_ptr, part_lse_ptr, out_ptr, num_tokens, num_splits,
                             stride_ot, stride_oh, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                             SPLITS_PAD: tl.constexpr, PDL: tl.constexpr = False):
    """out[t, h] = the key partitions' partials of row (t, h) weighted by 2^lse (a partition
    with no visible key carries -inf, weight 0); grid (T, H)."""
    pdl_enter(PDL)
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_mask = offs_s < num_splits
    rows = (offs_s * num_tokens + t) * tl.num_programs(1) + h  # (SPLITS_PAD,)
    out = merge_partials(part_out_ptr, part_lse_ptr, rows, s_mask, offs_d, HEAD_DIM)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


@dataclass(frozen=True)
class PrefillConfig:
    block_m: int = 64  # query rows per program: BLOCK_M // G tokens times G heads
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2
    num_splits: int = 0  # key partitions per q tile: 0 = planned (prefill_splits), 1 = none


def default_prefill_config(head_dim: int) -> PrefillConfig:
    """The launch for ``head_dim``: the defaults up to 128; above (Gemma's 256), 32-key
    tiles: with 64, q [64, 256] and two stages of K and V tiles took 104 KB of shared memory
    for sm_86 (Triton 3.9), past the 99 KB of a 3090 / 4090; with 32, 68 KB. (Decode's
    defaults take 76 KB at 256: kept.) tests/test_kernels_compile.py checks both."""
    if head_dim <= 128:
        return PrefillConfig()
    return PrefillConfig(block_n=32)


def prefill_splits(programs: int, max_context: int, sms: int, block_n: int,
                   num_splits: int = 0, rows: int = 0) -> int:
    """Key partitions per q tile for a launch of ``programs`` (q tiles x kv heads) whose
    longest context is ``max_context``, over ``rows`` (new tokens x heads): none from one
    program per multiprocessor up, else decode attention's plan (about 2 programs per
    multiprocessor, partitions of at least 256 keys), at most MAX_SPLITS, kept only where
    the keys it takes off each program's walk outweigh its cost (SPLIT_FIXED_KEYS +
    SPLIT_KEYS_PER_ROW per row). A few new tokens over a long context gain most; launches
    that already come close to filling the GPU lose, hence the programs cut-off."""
    if num_splits <= 0:
        if programs >= sms:
            return 1
        num_splits = min(decode_split_plan(programs, max_context, sms, block_n)[0],
                         MAX_SPLITS)
        saved = max_context * (1 - 1 / num_splits)
        if saved <= SPLIT_FIXED_KEYS + SPLIT_KEYS_PER_ROW * rows:
            return 1
    return max(1, min(num_splits, MAX_SPLITS))


def paged_prefill(
    q: torch.Tensor,  # (T, H, D)
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,  # (B + 1,) int32, host or device
    seq_lens: torch.Tensor,
    scale: float,
    config: PrefillConfig | None = None,
    scratch: dict | None = None,
    max_seq_len: int | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Prefill / chunked-prefill / mixed-batch attention (Triton), causal over the cache
    (``window``, ``softcap``: as ``paged_attention_ref``).

    ``scratch`` (a dict that lives for one forward, ``AttentionMetadata.scratch``): the tile
    table (six small torch ops, the same for every layer of the step) is computed by the
    first layer and kept there for the others. ``max_seq_len`` (host int; default the block
    tables' width) plans the key split; no sync, so a captured graph passes a fixed one. The
    plan assumes every sequence slot has queries (a graph's empty slots too)."""
    check_cache(q, k_cache, v_cache)
    cfg = config or default_prefill_config(q.shape[2])
    t, h, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    group = h // hkv
    num_seqs = seq_lens.shape[0]
    out = torch.empty_like(q)
    if t == 0 or num_seqs == 0:
        return out
    block_m = max(cfg.block_m, 16, next_pow2(group))
    block_q = block_m // group
    key = ("prefill_tiles", block_q, num_seqs, q.device)
    cached = scratch.get(key) if scratch is not None else None
    if cached is None:
        qsl = query_start_loc.to(q.device, torch.int32)
        tiles = (qsl[1:] - qsl[:-1] + block_q - 1) // block_q  # (B,) q tiles per sequence
        tile_starts = torch.zeros(num_seqs + 1, device=q.device, dtype=torch.int32)
        tile_starts[1:] = torch.cumsum(tiles, 0)
        if scratch is not None:
            scratch[key] = qsl, tile_starts
    else:
        qsl, tile_starts = cached
    tiles = t // block_q + num_seqs  # >= sum over b of ceil(num_q_b / block_q)
    max_ctx = max_seq_len if max_seq_len is not None else block_tables.shape[1] * bs
    if window is not None:  # the keys one q tile walks at most
        max_ctx = min(max_ctx, window + block_q + cfg.block_n)
    splits = prefill_splits((t // block_q + num_seqs) * hkv, max_ctx, num_sms(q.device),
                            cfg.block_n, cfg.num_splits, rows=t * h)
    part_out = part_lse = out  # placeholders, unused without a split
    if splits > 1:
        part_out = torch.empty((splits, t, h, d), device=q.device, dtype=torch.float32)
        part_lse = torch.empty((splits, t, h), device=q.device, dtype=torch.float32)
    _paged_prefill_kernel[(tiles, hkv, splits)](
        q, k_cache, v_cache, block_tables, seq_lens.to(q.device), qsl, tile_starts, out,
        part_out, part_lse,
        scale * LOG2E, num_seqs, t, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, HEAD_DIM=d, D_PAD=next_pow2(d), BLOCK_SIZE=bs,
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=cfg.block_n,
        # extra binary-search steps are no-ops: one variant serves up to 4,095 sequences
        SEARCH_STEPS=max(12, num_seqs.bit_length()), FP8_CVT=fp8_cvt(k_cache),
        SPLIT=splits > 1,
        window=window or 0, softcap_log2=(softcap or 0.0) * LOG2E, WINDOW=window is not None,
        SOFTCAP=bool(softcap), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **pdl_kwargs(q.device))
    if splits > 1:
        _merge_partitions_kernel[(t, h)](
            part_out, part_lse, out, t, splits, out.stride(0), out.stride(1), HEAD_DIM=d,
            D_PAD=next_pow2(d), SPLITS_PAD=MAX_SPLITS, num_warps=4, **pdl_kwargs(q.device))
    return out
