"""Paged decode attention: one query per sequence, split along the context (flash-decoding)
with a reduce kernel; the oracle is ``paged_attention_ref`` (kernels/paged_attention.py).

    grid (B, Hkv, S): program (b, h, s) owns the G = H / Hkv query heads of kv head h and
    context tokens [s * P, min((s + 1) * P, seq_len)). The partition P = ceil(seq_len / S)
    rounded up to BLOCK_N is per sequence, read from seq_lens on the device: the grid S is
    sized for the longest context the launch allows (a CUDA graph's max_model_len), and a
    short context still spreads over the S programs instead of leaving all but the first
    partition empty (else at batch 1 one program per head walks the whole context while the
    others idle). Each loaded K/V tile [BLOCK_N, D] serves all G heads through
    one tl.dot whose M rows are the heads (padded to 16). With S > 1 every program writes
    its normalised partial output and log2-sum-exp, and the S partials per head are weighted
    by their sum-exps: by the last of the S programs of (b, h) to finish (``FUSED_REDUCE``, the
    counter scheme of kernels/splitk.py: no second launch), or by a reduce kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .grid import cdiv, next_pow2
from .paged_common import (
    LOG2E,
    check_cache,
    context_partition,
    fp8_cvt,
    kv_line,
    load_k_tile,
    load_kv_tile,
    merge_partials,
    num_sms,
    prefetch_kv_lines,
    softcap_scores,
    window_floor,
)
from .pdl import pdl_enter, pdl_kwargs
from .splitk import counters as splitk_counters
from .splitk import last_of_tile, release_tile


@triton.jit
def _prefetch_tokens(seq_len, split, num_splits, BLOCK_N: tl.constexpr,
                     PREFETCH: tl.constexpr):
    """The context tokens of the first PREFETCH tiles of split ``split``: past the split's
    end its last token again; for an empty split the sequence's last token."""
    partition_size = context_partition(seq_len, num_splits, BLOCK_N)
    start = split * partition_size
    end = tl.minimum(seq_len, start + partition_size)
    last = tl.maximum(tl.where(end > start, end, seq_len) - 1, 0)
    return tl.minimum(start + tl.arange(0, PREFETCH * BLOCK_N), last)


@triton.jit
def _prefetch_partition(k_ptr, v_ptr, table_ptr, seq_lens_ptr, b, kvh, split, stride_kb,
                        stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                        BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, D_PAD: tl.constexpr,
                        LINE: tl.constexpr, PREFETCH: tl.constexpr):
    """Before the PDL wait: the keys and values of the first PREFETCH tiles of this
    program's context split asked into L2 (tokens past the split repeat its last one; an
    empty split repeats the sequence's last token). Reads ``seq_lens`` and the block table,
    which the engine fills by copies before a forward, never from a kernel of it."""
    tok = _prefetch_tokens(tl.load(seq_lens_ptr + b), split, tl.num_programs(2), BLOCK_N,
                           PREFETCH)
    prefetch_kv_lines(k_ptr, v_ptr, table_ptr + b * stride_bt, tok, kvh, stride_kb, stride_ks,
                      stride_kh, stride_vb, stride_vs, stride_vh, BLOCK_SIZE, D_PAD, LINE)


@triton.jit(do_not_specialize=["stride_bt"])
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, table_ptr, seq_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr, cnt_ptr,
    scale_log2,
    stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
    stride_bt, stride_ot, stride_oh, stride_pb, stride_ph, stride_ps,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    FUSED_REDUCE: tl.constexpr, SPLITS_PAD: tl.constexpr, FP8_CVT: tl.constexpr,
    PDL: tl.constexpr = False,
    PREFETCH: tl.constexpr = 0,
    LINE: tl.constexpr = 64,
    window=0, softcap_log2=0.0,
    WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False,
):
    """WINDOW: the splits cover keys from the first tile of the window on (``window_floor``),
    and keys before seq_len - window are masked; SOFTCAP: scores soft-capped at
    ``softcap_log2`` (the cap in log2 units)."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    if PDL and PREFETCH > 0:
        _prefetch_partition(k_ptr, v_ptr, table_ptr, seq_lens_ptr, b, kvh, split, stride_kb,
                            stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
                            BLOCK_SIZE, BLOCK_N, D_PAD, LINE, PREFETCH)
    pdl_enter(PDL)
    seq_len = tl.load(seq_lens_ptr + b)
    lo = 0
    if WINDOW:
        lo = window_floor(seq_len - 1, window, BLOCK_N)
    partition_size = context_partition(seq_len - lo, tl.num_programs(2), BLOCK_N)
    start = lo + split * partition_size
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
        k = load_k_tile(k_ptr, table_row, n0, end, kvh, offs_d, d_mask, stride_kb, stride_ks,
                        stride_kh, BLOCK_SIZE, BLOCK_N, q.dtype, FP8_CVT)  # (BLOCK_N, D_PAD)
        s = tl.dot(q, tl.trans(k)) * scale_log2  # (G_PAD, BLOCK_N), log2 units
        if SOFTCAP:
            s = softcap_scores(s, softcap_log2)
        if WINDOW:  # the first tile of the window holds one visible key at least
            t_mask = t_mask & (tok > seq_len - 1 - window)
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = load_kv_tile(v_ptr, table_row, tok, t_mask, kvh, offs_d, d_mask, stride_vb,
                         stride_vs, stride_vh, BLOCK_SIZE, q.dtype, FP8_CVT)
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
        if FUSED_REDUCE:
            tile = b * tl.num_programs(1) + kvh
            if last_of_tile(cnt_ptr, tile, tl.num_programs(2)):
                _sum_splits(part_out_ptr, part_lse_ptr, out_ptr, b, heads, g_mask, offs_d,
                            o_mask, tl.cdiv(seq_len - lo, partition_size), stride_ps, stride_pb,
                            stride_ph, stride_ot, stride_oh, HEAD_DIM, SPLITS_PAD)
                release_tile(cnt_ptr, tile)


@triton.jit
def _sum_splits(part_out_ptr, part_lse_ptr, out_ptr, b, heads, g_mask, offs_d, o_mask,
                num_valid, stride_ps, stride_pb, stride_ph, stride_ot, stride_oh,
                HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr):
    """out[b, heads] = the partials of the num_valid non-empty splits weighted by 2^lse (as
    ``_paged_decode_reduce_kernel``). The sum-exps come in one [G, SPLITS_PAD] load and the
    partials in an unrolled loop, so every load is in flight at once (a runtime loop waited
    for each in turn: two round trips per split). Loads bypass L1: other programs wrote the
    partials."""
    base = b * stride_pb + heads * stride_ph  # (G_PAD,)
    offs_s = tl.arange(0, SPLITS_PAD)
    lse = tl.load(part_lse_ptr + base[:, None] + offs_s[None, :] * stride_ps,
                  mask=g_mask[:, None] & (offs_s[None, :] < num_valid), other=float("-inf"),
                  cache_modifier=".cg")  # (G_PAD, SPLITS_PAD)
    m = tl.max(lse, axis=1)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m[:, None])
    den = tl.sum(w, axis=1)
    acc = tl.zeros((heads.shape[0], offs_d.shape[0]), dtype=tl.float32)
    for s in tl.static_range(SPLITS_PAD):
        w_s = tl.sum(tl.where(offs_s[None, :] == s, w, 0.0), axis=1)
        live = offs_d[None, :] * 0 + s < num_valid  # a tensor: the interpreter cannot AND
        part = tl.load(part_out_ptr + (base + s * stride_ps)[:, None] * HEAD_DIM
                       + offs_d[None, :], mask=o_mask & live, other=0.0, cache_modifier=".cg")
        acc += w_s[:, None] * part
    out = acc / tl.where(den > 0, den, 1.0)[:, None]
    tl.store(out_ptr + b * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=o_mask)


@triton.jit
def _paged_decode_reduce_kernel(
    part_out_ptr, part_lse_ptr, seq_lens_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps, stride_ot, stride_oh,
    num_splits, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = False,
    window=0, WINDOW: tl.constexpr = False,
):
    """out[b, h] = sum_s w_s * part[b, h, s] with w_s = 2^lse_s / sum 2^lse (valid splits)."""
    pdl_enter(PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    if WINDOW:  # the splits cover the window's tiles only (as in _paged_decode_kernel)
        seq_len = seq_len - window_floor(seq_len - 1, window, BLOCK_N)
    num_valid = tl.cdiv(seq_len, context_partition(seq_len, num_splits, BLOCK_N))
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_mask = (offs_s < num_valid) & (offs_s < num_splits)
    base = b * stride_pb + h * stride_ph + offs_s * stride_ps  # (S_PAD,)
    out = merge_partials(part_out_ptr, part_lse_ptr, base, s_mask, offs_d, HEAD_DIM)
    tl.store(out_ptr + b * stride_ot + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty),
             mask=offs_d < HEAD_DIM)


MAX_FUSED_SPLITS = 16
# context tiles each decode program asks L2 for before its PDL wait (with PDL only)
PREFETCH_TILES = 1


@dataclass(frozen=True)
class DecodeConfig:
    """Decode launch knobs; num_splits 0 = choose from the GPU size and the longest context;
    fused_reduce: the last program of each (sequence, kv head) sums the splits (when there
    are at most ``max_fused_splits`` of them); max_registers: see below."""

    block_n: int = 64
    num_splits: int = 0
    num_warps: int = 4
    num_stages: int = 3
    fused_reduce: bool = True
    max_fused_splits: int = MAX_FUSED_SPLITS
    # a per-thread register cap for the launches that sum their splits in the kernel (ptxas
    # .maxnreg; None: ptxas decides). Triton 3.6 on sm_90 gives that kernel far more registers
    # than without the sum (the atomic counter alone does it): 3 programs per multiprocessor
    # instead of 4, so a batch that fits one wave of 4 runs in two. Not applied elsewhere: the
    # one-split launch loses a little capped. sm_89 compiles the sum to <= 128 anyway.
    max_registers: int | None = 128


def decode_split_plan(programs: int, max_context: int, sms: int, block_n: int,
                      num_splits: int = 0) -> tuple[int, int]:
    """(num_splits, partition_size) at ``max_context``: split contexts until about 2 programs
    per multiprocessor, keeping partitions >= 256 tokens; the partition is a multiple of
    block_n. The kernel re-derives each sequence's partition from its own length."""
    max_context = max(max_context, 1)
    if num_splits <= 0:
        num_splits = min(cdiv(2 * sms, max(programs, 1)),
                         cdiv(max_context, 256), 64)
        num_splits = max(1, num_splits)
    partition = cdiv(cdiv(max_context, num_splits), block_n) * block_n
    return cdiv(max_context, partition), partition


def paged_decode(
    q: torch.Tensor,  # (B, H, D): one query per sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # (B, max_blocks) int32
    seq_lens: torch.Tensor,  # (B,) int32, on q's device
    scale: float,
    max_seq_len: int | None = None,
    config: DecodeConfig | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Decode attention (Triton). No host sync: safe to capture in a CUDA graph.

    ``max_seq_len`` (host int) sizes the context split; default block_tables' width.
    ``window``, ``softcap``: as ``paged_attention_ref``.
    """
    check_cache(q, k_cache, v_cache)
    cfg = config or DecodeConfig()
    b, h, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    group = h // hkv
    out = torch.empty_like(q)
    if b == 0:
        return out
    max_ctx = max_seq_len if max_seq_len is not None else block_tables.shape[1] * bs
    if window is not None:  # the keys one sequence's splits cover
        max_ctx = min(max_ctx, window + cfg.block_n)
    splits, _ = decode_split_plan(b * hkv, max_ctx, num_sms(q.device), cfg.block_n,
                                  cfg.num_splits)
    d_pad = next_pow2(d)
    part_out = part_lse = out  # placeholders, unused without a split
    cnt = None
    if splits > 1:
        part_out = torch.empty((b, h, splits, d), device=q.device, dtype=torch.float32)
        part_lse = torch.empty((b, h, splits), device=q.device, dtype=torch.float32)
        # summed in the kernel up to 16 splits: the unrolled sum wins or ties against a
        # second launch there (a runtime loop over the splits would lose)
        fused = cfg.fused_reduce and splits <= cfg.max_fused_splits
        cnt = splitk_counters(q.device, b * hkv) if fused else None
    seq_lens = seq_lens.to(q.device)
    pdl = pdl_kwargs(q.device)
    prefetch = PREFETCH_TILES if pdl["PDL"] else 0
    _paged_decode_kernel[(b, hkv, splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_out, part_lse,
        out if cnt is None else cnt, scale * LOG2E, q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1), h * splits, splits, 1,
        GROUP=group, GROUP_PAD=max(16, next_pow2(group)), HEAD_DIM=d,
        D_PAD=d_pad, BLOCK_SIZE=bs, BLOCK_N=cfg.block_n, SPLIT=splits > 1,
        FUSED_REDUCE=cnt is not None,
        SPLITS_PAD=next_pow2(splits) if cnt is not None else 1,
        FP8_CVT=fp8_cvt(k_cache), PREFETCH=prefetch, LINE=kv_line(k_cache, d_pad),
        window=window or 0, softcap_log2=(softcap or 0.0) * LOG2E, WINDOW=window is not None,
        SOFTCAP=bool(softcap), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        maxnreg=cfg.max_registers if cnt is not None else None, **pdl)
    if splits > 1 and cnt is None:
        _paged_decode_reduce_kernel[(b, h)](
            part_out, part_lse, seq_lens, out, h * splits, splits, 1,
            out.stride(0), out.stride(1), splits, HEAD_DIM=d, D_PAD=d_pad,
            SPLITS_PAD=next_pow2(splits), BLOCK_N=cfg.block_n, num_warps=4,
            window=window or 0, WINDOW=window is not None, **pdl_kwargs(out.device))
    return out
