"""W4A16 with the weights as the dot's left operand: out^T[n, m] = W^T[n, k] @ x^T[k, m].

The "dot" kernel computes x [BM, BK] @ W [BK, BN], so the dequantized weights are the right
operand. On Hopper the right operand of a warp-group MMA must sit in shared memory, so every
dequantized tile makes a round trip through it; the left operand may come from registers,
which is how mixed-input GEMMs (CUTLASS's, vLLM's Machete) keep dequantization next to the
MMA. Here the packed tile is read as [BN, BK8] (N contiguous in memory), dequantized
elementwise into planes (plane j of word r is W[k0 + 8r + j, n]) and either

- joined into one [BN, BK] tile in k order for one dot (``JOINED``), or
- consumed plane by plane: eight dots of K = BK8 with x[k0 + 8r + j, :] (BLOCK_K >= 128),
  reading x copied into plane order (``X_PLANES``) or x's tile split in registers
  (``X_SPLIT``).

The activation rows are the MMA's N side (BLOCK_M >= 16), the weight columns its M side
(BLOCK_N, 64 per warp group on Hopper). fp16 activations only (every table row that takes
this kernel is fp16): the fp16 planes come from the PTX of w4a16_planes.py; fp32
accumulation.
Split K as the other kernels: fp32 partials, summed by the last program of each tile
(``REDUCE``, kernels/splitk.py) or by a second launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edge_llm import envs

from . import splitk
from .grid import next_pow2
from .pdl import pdl_enter, pdl_kwargs
from .splitk import sum_if_last
from .w4a16_config import Swap
from .w4a16_planes import fp16_planes
from .w4a16_ref import PLANE_TILE, unplane_order


@triton.jit
def _scales_t(s_ptr, z_ptr, k0, rows, offs_n, n_mask, K, group_size, stride_sg, stride_zg,
              ONE_GROUP: tl.constexpr):
    """Scales and zero * scale for the transposed tile: [BN, 1] (ONE_GROUP) or [BN, BK8]."""
    if ONE_GROUP:
        g = k0 // group_size
        s = tl.load(s_ptr + g * stride_sg + offs_n[:, None], mask=n_mask[:, None], other=0.0)
        z = tl.load(z_ptr + g * stride_zg + offs_n[:, None], mask=n_mask[:, None], other=0.0)
    else:
        g = (rows * 8) // group_size  # (BK8,)
        mask = n_mask[:, None] & (rows[None, :] < K // 8)
        s = tl.load(s_ptr + g[None, :] * stride_sg + offs_n[:, None], mask=mask, other=0.0)
        z = tl.load(z_ptr + g[None, :] * stride_zg + offs_n[:, None], mask=mask, other=0.0)
    s = s.to(tl.float32)
    return s, z.to(tl.float32) * s


@triton.jit
def _join8(w0, w1, w2, w3, w4, w5, w6, w7, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
           PLANE_MAJOR: tl.constexpr = False):
    """Planes [BN, BK8] -> [BN, BK] with column 8 r + j = plane j's column r (PLANE_MAJOR:
    column BK8 j + r, the k order of plane-packed words in a 128-row tile). Each join adds
    a last axis; the three axes, slowest first, carry bits 4, 2 and 1 of j."""
    a = tl.join(tl.join(tl.join(w0, w4), tl.join(w2, w6)),
                tl.join(tl.join(w1, w5), tl.join(w3, w7)))  # [BN, BK8, 2, 2, 2]
    if PLANE_MAJOR:
        a = tl.permute(a, (0, 2, 3, 4, 1))  # [BN, 2, 2, 2, BK8]
    return tl.reshape(a, (BLOCK_N, BLOCK_K))


@triton.jit
def _plane_dot_ordered(acc, w, x_ptr, offs_m, m_mask, k0, j: tl.constexpr, stride_xm,
                       stride_xk, BLOCK_K: tl.constexpr):
    """acc + w @ (x^T rows of plane j) when x's columns are in plane order within each K
    tile (column k0 + j BK8 + r holds k = k0 + 8 r + j): one contiguous [BK8, BM] slice."""
    cols = k0 + j * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    xt = tl.load(x_ptr + offs_m[None, :] * stride_xm + cols[:, None] * stride_xk,
                 mask=m_mask[None, :], other=0.0)  # (BK8, BM)
    return tl.dot(w, xt, acc)


@triton.jit
def _dots8(acc, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7):
    """acc + the eight plane products w_j [BN, BK8] @ x_j [BK8, BM], in plane order."""
    acc = tl.dot(w0, x0, acc)
    acc = tl.dot(w1, x1, acc)
    acc = tl.dot(w2, x2, acc)
    acc = tl.dot(w3, x3, acc)
    acc = tl.dot(w4, x4, acc)
    acc = tl.dot(w5, x5, acc)
    acc = tl.dot(w6, x6, acc)
    return tl.dot(w7, x7, acc)


@triton.jit
def _x_planes_split(x_ptr, offs_m, m_mask, k0, K, stride_xm, stride_xk, BLOCK_K: tl.constexpr):
    """The eight x^T planes [BK8, BM] of one K tile from one contiguous [BM, BK] load, split
    apart in registers (plane j: k = k0 + 8 r + j)."""
    cols = k0 + tl.arange(0, BLOCK_K // 8)[:, None] * 8 + tl.arange(0, 8)[None, :]  # (BK8, 8)
    xt = tl.load(x_ptr + offs_m[:, None, None] * stride_xm + cols[None, :, :] * stride_xk,
                 mask=m_mask[:, None, None] & (cols < K)[None, :, :], other=0.0)
    # (BM, BK8, 8) -> (BM, BK8, 2, 2, 2): j = 4 a + 2 b + c, each split peels the last axis
    xt = tl.reshape(xt, (offs_m.shape[0], BLOCK_K // 8, 2, 2, 2))
    even, odd = tl.split(xt)  # c = 0 / 1: (BM, BK8, 2, 2) each
    e0, e1 = tl.split(even)
    o0, o1 = tl.split(odd)
    p0, p4 = tl.split(e0)
    p2, p6 = tl.split(e1)
    p1, p5 = tl.split(o0)
    p3, p7 = tl.split(o1)
    return (tl.trans(p0), tl.trans(p1), tl.trans(p2), tl.trans(p3), tl.trans(p4),
            tl.trans(p5), tl.trans(p6), tl.trans(p7))  # (BK8, BM) each


@triton.jit(do_not_specialize=["M"])  # M varies per step; one compiled variant serves all
def _w4a16_swap_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, final_ptr, cnt_ptr,
    M, N, K, k_per_split, group_size, split,
    stride_xm, stride_xk, stride_qk, stride_sg, stride_zg, stride_om, stride_os, stride_fm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ONE_GROUP: tl.constexpr, JOINED: tl.constexpr, USE_ASM: tl.constexpr,
    REDUCE: tl.constexpr, SPLIT_P2: tl.constexpr,
    X_PLANES: tl.constexpr, X_SPLIT: tl.constexpr, PLANE_MAJOR: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    pdl_enter(PDL)
    pid_m = tl.program_id(0)  # fastest: programs that share a W tile run together (L2 reuse)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rows = k0 // 8 + tl.arange(0, BLOCK_K // 8)  # (BK8,)
        r_mask = rows < K // 8
        packed = tl.load(qw_ptr + rows[None, :] * stride_qk + offs_n[:, None],
                         mask=n_mask[:, None] & r_mask[None, :], other=0)  # (BN, BK8)
        s, zs = _scales_t(s_ptr, z_ptr, k0, rows, offs_n, n_mask, K, group_size, stride_sg,
                          stride_zg, ONE_GROUP)
        w0, w1, w2, w3, w4, w5, w6, w7 = fp16_planes(packed, s, zs, USE_ASM)
        if JOINED:
            w = _join8(w0, w1, w2, w3, w4, w5, w6, w7, BLOCK_N, BLOCK_K, PLANE_MAJOR)
            cols = k0 + tl.arange(0, BLOCK_K)
            xt = tl.load(x_ptr + offs_m[None, :] * stride_xm + cols[:, None] * stride_xk,
                         mask=(cols[:, None] < K) & m_mask[None, :], other=0.0)  # (BK, BM)
            acc = tl.dot(w, xt, acc)
        elif X_PLANES:
            acc = _plane_dot_ordered(acc, w0, x_ptr, offs_m, m_mask, k0, 0, stride_xm,
                                     stride_xk, BLOCK_K)
            acc = _plane_dot_ordered(acc, w1, x_ptr, offs_m, m_mask, k0, 1, stride_xm,
                                     stride_xk, BLOCK_K)
            acc = _plane_dot_ordered(acc, w2, x_ptr, offs_m, m_mask, k0, 2, stride_xm,
                                     stride_xk, BLOCK_K)
            acc = _plane_dot_ordered(acc, w3, x_ptr, offs_m, m_mask, k0, 3, stride_xm,
                                     stride_xk, BLOCK_K)
            acc = _plane_dot_ordered(acc, w4, x_ptr, offs_m, m_mask, k0, 4, stride_xm,
                                     stride_xk, BLOCK_K)
            acc = _plane_dot_ordered(acc, w5, x_ptr, offs_m, m_mask, k0, 5, stride_xm,
                                     stride_xk, BLOCK_K)
            acc = _plane_dot_ordered(acc, w6, x_ptr, offs_m, m_mask, k0, 6, stride_xm,
                                     stride_xk, BLOCK_K)
            acc = _plane_dot_ordered(acc, w7, x_ptr, offs_m, m_mask, k0, 7, stride_xm,
                                     stride_xk, BLOCK_K)
        else:  # X_SPLIT
            x0, x1, x2, x3, x4, x5, x6, x7 = _x_planes_split(
                x_ptr, offs_m, m_mask, k0, K, stride_xm, stride_xk, BLOCK_K)
            acc = _dots8(acc, w0, w1, w2, w3, w4, w5, w6, w7, x0, x1, x2, x3, x4, x5, x6, x7)
    out = out_ptr + pid_k * stride_os + offs_m[None, :] * stride_om + offs_n[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])
    if REDUCE:
        sum_if_last(cnt_ptr, pid_n * tl.num_programs(0) + pid_m, split, out_ptr, final_ptr,
                    offs_m, offs_n, m_mask[:, None] & n_mask[None, :], stride_os, stride_om,
                    stride_fm, SPLIT_P2)


def launch_swap(cfg: Swap, x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                zeros: torch.Tensor, group_size: int, integer_zeros: bool = False,
                planes_packed: bool = False) -> torch.Tensor:
    """x2 [M, K] @ W, [M, N] (x2's dtype), by the swap kernel in ``cfg``'s configuration.

    ``cfg.x_planes`` (eight plane dots): x2's columns in plane order within each K tile
    (``plane_order``, a copy; none needed on plane-packed words with block_k 128), so each
    plane dot reads one contiguous [BK8, BM] slice of x; in k order it reads every eighth
    column, which the compiled loop gathers through shared memory with a barrier per plane.
    ``cfg.x_split`` (eight plane dots): x's K tile loaded whole and split into its eight planes in
    registers (mma.sync takes them from there; Hopper's wgmma needs them stored to shared
    memory, with a fence per plane). ``cfg.plane_major`` (joined tile, block_k 128,
    plane-packed words): the tile's columns in plane order, x's natural order for those
    words. Other launches on plane-packed words get x permuted to match (a copy).
    ``integer_zeros`` is not used here (the zero points are subtracted as they are)."""
    if x2.dtype != torch.float16:
        raise ValueError(f"the swap kernel takes fp16 activations, got {x2.dtype}: {cfg}")
    m, k = x2.shape
    n = qweight.shape[1]
    qweight, scales, zeros = qweight.contiguous(), scales.contiguous(), zeros.contiguous()
    block_k = cfg.block_k
    if cfg.x_planes and k % block_k:
        raise ValueError(f"x_planes needs K ({k}) a multiple of block_k: {cfg}")
    plane_major = cfg.plane_major
    if plane_major and not (planes_packed and block_k == PLANE_TILE):
        raise ValueError(f"plane_major on the swap kernel needs plane-packed words and "
                         f"block_k {PLANE_TILE}: {cfg}")
    in_order = planes_packed and block_k == PLANE_TILE  # the words' order is plane order
    if planes_packed and not (plane_major or (cfg.x_planes and in_order)):
        x2 = unplane_order(x2)  # k-order tiles: x in the words' order (a copy)
    if cfg.x_planes and not in_order:
        x2 = plane_order(x2, block_k)
    t = splitk.tiled(x2, n, block_k, cfg)
    target, final, counters, split = t.target, t.final, t.counters, t.split
    reduce = counters is not None
    _w4a16_swap_kernel[t.grid](
        x2, qweight, scales, zeros, target, final, counters if reduce else target,
        m, n, k, t.k_per_split, group_size, split,
        x2.stride(0), x2.stride(1), qweight.stride(0), scales.stride(0), zeros.stride(0),
        target.stride(1), target.stride(0), final.stride(-2), BLOCK_M=t.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=block_k,
        ONE_GROUP=group_size >= k or group_size % block_k == 0,
        JOINED=not (cfg.x_planes or cfg.x_split), USE_ASM=not envs.TRITON_INTERPRET.get(),
        REDUCE=reduce,
        SPLIT_P2=next_pow2(split) if reduce else 1, X_PLANES=cfg.x_planes,
        X_SPLIT=cfg.x_split, PLANE_MAJOR=plane_major, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, **pdl_kwargs(x2.device))
    return splitk.finish(target, t.out, counters)


def plane_order(x2: torch.Tensor, block_k: int) -> torch.Tensor:
    """x2 [M, K] with the columns of each K tile in plane order: column k0 + j BK8 + r takes
    x2[:, k0 + 8 r + j] (K a multiple of block_k). Plane j of a tile then multiplies one
    contiguous slice of x instead of every eighth column."""
    m, k = x2.shape
    tiles = x2.reshape(m, k // block_k, block_k // 8, 8)  # (M, tiles, BK8 words, 8 nibbles j)
    return tiles.transpose(2, 3).reshape(m, k)  # (M, tiles, j, BK8) flattened
