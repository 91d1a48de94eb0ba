"""What a program of the fp16x2 GEMV (kernels/w4a16_gemv.py) reads from the weights: one K
tile's words with their scales and zeros (``tile_loads``, or ``tile_at`` by the tile's first
k)."""

from __future__ import annotations

import triton
import triton.language as tl

from .w4a16_gemv_x import masked_load


@triton.jit
def tile_loads(qw_ptr, s_ptr, z_ptr, rows, r_end, offs_n, n_mask, N, k0, group_size,
               stride_qk, stride_sg, stride_zg, ONE_GROUP: tl.constexpr, FLAT: tl.constexpr,
               EVEN: tl.constexpr):
    """Words [BK8, BN] of word rows ``rows`` (rows >= r_end masked off), and their scales and
    zeros: one [1, BN] row (ONE_GROUP; loaded as a 1-D row if FLAT) or one per word row
    [BK8, BN]. EVEN: the tile lies inside the matrix (no masks)."""
    r_mask = rows < r_end
    mask = r_mask[:, None] & n_mask[None, :]
    w = masked_load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :], mask, 0, EVEN)
    if ONE_GROUP and FLAT:
        g = k0 // group_size
        sz_mask = offs_n < N * tl.minimum(tl.maximum(r_end * 8 - k0, 0), 1)
        s = masked_load(s_ptr + g * stride_sg + offs_n, sz_mask, 0.0, EVEN)[None, :]
        z = masked_load(z_ptr + g * stride_zg + offs_n, sz_mask, 0.0, EVEN)[None, :]
    elif ONE_GROUP:
        g = k0 // group_size
        sz_mask = offs_n[None, :] < N * tl.minimum(tl.maximum(r_end * 8 - k0, 0), 1)
        s = masked_load(s_ptr + g * stride_sg + offs_n[None, :], sz_mask, 0.0, EVEN)
        z = masked_load(z_ptr + g * stride_zg + offs_n[None, :], sz_mask, 0.0, EVEN)
    else:
        g = (rows * 8) // group_size
        s = masked_load(s_ptr + g[:, None] * stride_sg + offs_n[None, :], mask, 0.0, EVEN)
        z = masked_load(z_ptr + g[:, None] * stride_zg + offs_n[None, :], mask, 0.0, EVEN)
    return w, s, z


@triton.jit
def tile_at(qw_ptr, s_ptr, z_ptr, k0, ar, r_end, offs_n, n_mask, N, group_size, stride_qk,
            stride_sg, stride_zg, ONE_GROUP: tl.constexpr, FLAT: tl.constexpr,
            EVEN: tl.constexpr):
    """``tile_loads`` of the K tile starting at ``k0``: word rows k0 / 8 + ``ar``
    (ar = arange(BLOCK_K / 8))."""
    return tile_loads(qw_ptr, s_ptr, z_ptr, (k0 >> 3) + ar, r_end, offs_n, n_mask, N, k0,
                      group_size, stride_qk, stride_sg, stride_zg, ONE_GROUP, FLAT, EVEN)
