"""What a program of the fp16x2 GEMV (kernels/w4a16_gemv.py) reads from the weights: one K
tile's words with their scales and zeros, and, before its PDL wait, the L2 prefetch of its
first tiles (``EDGE_LLM_GEMV_PREFETCH``)."""

from __future__ import annotations

import triton
import triton.language as tl

from edge_llm import envs

from .pdl import prefetch_l2
from .w4a16_gemv_x import _ld


def gemv_prefetch() -> int:
    """``EDGE_LLM_GEMV_PREFETCH``: K tiles of weights each one-row GEMV program asks L2 for
    before its PDL wait (0, the default: none; a power of two)."""
    return envs.GEMV_PREFETCH.get()


@triton.jit
def _tile_loads(qw_ptr, s_ptr, z_ptr, rows, r_end, offs_n, n_mask, N, k0, group_size,
                stride_qk, stride_sg, stride_zg, ONE_GROUP: tl.constexpr, FLAT: tl.constexpr,
                EVEN: tl.constexpr):
    """Words [BK8, BN] of word rows ``rows`` (rows >= r_end masked off), and their scales and
    zeros: one [1, BN] row (ONE_GROUP; loaded as a 1-D row if FLAT) or one per word row
    [BK8, BN]. EVEN: the tile lies inside the matrix (no masks)."""
    r_mask = rows < r_end
    mask = r_mask[:, None] & n_mask[None, :]
    w = _ld(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :], mask, 0, EVEN)
    if ONE_GROUP and FLAT:
        g = k0 // group_size
        sz_mask = offs_n < N * tl.minimum(tl.maximum(r_end * 8 - k0, 0), 1)
        s = _ld(s_ptr + g * stride_sg + offs_n, sz_mask, 0.0, EVEN)[None, :]
        z = _ld(z_ptr + g * stride_zg + offs_n, sz_mask, 0.0, EVEN)[None, :]
    elif ONE_GROUP:
        g = k0 // group_size
        sz_mask = offs_n[None, :] < N * tl.minimum(tl.maximum(r_end * 8 - k0, 0), 1)
        s = _ld(s_ptr + g * stride_sg + offs_n[None, :], sz_mask, 0.0, EVEN)
        z = _ld(z_ptr + g * stride_zg + offs_n[None, :], sz_mask, 0.0, EVEN)
    else:
        g = (rows * 8) // group_size
        s = _ld(s_ptr + g[:, None] * stride_sg + offs_n[None, :], mask, 0.0, EVEN)
        z = _ld(z_ptr + g[:, None] * stride_zg + offs_n[None, :], mask, 0.0, EVEN)
    return w, s, z


@triton.jit
def _prefetch_rows_cols(pid_n, pid_k, N, K, k_per_split, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr, SILU: tl.constexpr):
    """The words the program (pid_n, pid_k) reads first: the word rows of its first PREFETCH
    K tiles [R] (clamped to its split) and one column per 128-byte line (32 words) of its
    column tile [L] (clamped to the matrix; with SILU its gate, then its up columns)."""
    cols = tl.arange(0, BLOCK_N // 32) * 32
    if SILU:
        cols = pid_n * (BLOCK_N // 2) + cols % (BLOCK_N // 2) + (cols // (BLOCK_N // 2)) * N
        cols = tl.minimum(cols, 2 * N - 1)
    else:
        cols = tl.minimum(pid_n * BLOCK_N + cols, N - 1)
    k_lo = pid_k * k_per_split
    r_end = tl.minimum(K, k_lo + k_per_split) // 8
    rows = tl.minimum(k_lo // 8 + tl.arange(0, PREFETCH * BLOCK_K // 8), r_end - 1)
    return rows, cols


@triton.jit
def _prefetch_first_tiles(qw_ptr, s_ptr, z_ptr, N, K, k_per_split, group_size, stride_qk,
                          stride_sg, stride_zg, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          PREFETCH: tl.constexpr, SILU: tl.constexpr):
    """Before the PDL wait: the words, scales and zeros of this program's first PREFETCH K
    tiles requested into L2. The weights are never written by the kernels this one waits
    for, so they may be read while those still run; the loop's first loads then find them in
    L2 instead of waiting out the DRAM latency after the previous kernel ends."""
    rows, cols = _prefetch_rows_cols(tl.program_id(0), tl.program_id(1), N, K, k_per_split,
                                     BLOCK_N, BLOCK_K, PREFETCH, SILU)
    prefetch_l2(qw_ptr + rows[:, None] * stride_qk + cols[None, :])
    g = (rows * 8) // group_size
    prefetch_l2(s_ptr + g[:, None] * stride_sg + cols[None, :])
    prefetch_l2(z_ptr + g[:, None] * stride_zg + cols[None, :])
