"""W4A16: 4-bit weights (runtime GPTQ-style layout) times fp16/bf16 activations, fp32 accumulation.

Public API (no repacking: the kernels read QuantLinear's runtime layout as it is)::

    w4a16_matmul(x [..., K], qweight [K/8, N] int32, scales [G, N], zeros [G, N], group_size,
                 config=None) -> [..., N] in x's dtype          (Triton; CUDA or TRITON_INTERPRET)
    w4a16_matmul_ref(x, qweight, scales, zeros, group_size) -> same, plain torch (the oracle;
        the references live in kernels/w4a16_ref.py and are re-exported here)
    dequantize_w4a16(qweight, scales, zeros, group_size) -> W [K, N] in scales' dtype (Triton)
    dequantize_w4a16_ref(qweight, scales, zeros, group_size) -> W [K, N] fp32 (plain torch)
    pack_w4_ref(q [K, N] ints in 0..15) -> qweight [K/8, N] int32 (for tests and benchmarks)
    pick_config(m, n, k, group_size, num_sms) -> W4A16Config  (kind "dequant": dequant + cuBLAS)

Runtime layout, G = ceil(K / group_size)::

    q[k, n] = (qweight[k // 8, n] >> (4 * (k % 8))) & 0xF            unsigned 0..15
    W[k, n] = (q[k, n] - zeros[k // gs, n]) * scales[k // gs, n]      y = x @ W

    qweight rows:  | k 0..7 | k 8..15 | ...      one int32 word holds 8 consecutive k of one n
    every word lies in one group (group_size % 8 == 0, else the dequant path serves it).

Paths, by the number of activation rows M (thresholds measured, notes/kernels.md):
  * fp16 activations, M 3..64: "swap" (kernels/w4a16_swap.py), out^T = W^T x^T with the
    dequantized PTX planes joined in registers as the MMA's left operand. Where dots
    compile for mma.sync (sm_8x: the 3090/4090), M 3..16 takes eight plane dots instead,
    x's tile split into its planes in registers, and M 17..64 the plane dots over x copied
    into plane order; on Hopper, M 3..16 at N >= 16,384 takes the plane dots over such a
    copy.
  * plane-packed words (``planes_packed``, pack_planes_ref: the loader's default for fp16
    with groups of 128k), fp16 x: the plane dots read x as it is at 3..32 rows (3..64 on
    mma.sync); on Hopper the joined tile with its columns in plane order serves 33..64,
    and 65..128 over 128-row tiles for weights of >= 16M (else dequantize + cuBLAS).
  * fp16 activations at M <= 2, bf16 at M <= 4: "gemv16" (kernels/w4a16_gemv.py), words
    turned into fp16 pairs by inline PTX and shared by up to four activation rows per
    program (it serves any M <= 16 when asked). At 1-2 rows K is split for about 2.5
    programs per multiprocessor (the per-shape best on the H200). fp16 with groups of a
    multiple of 128: K tiles of one group, loads staged through shared memory (cp.async)
    and, when the caller vouches for integer zero points, the zeros folded into the PTX.
  * fp32 activations (the interpreter's tests), M == 1, GEMV: no tensor cores; works on the
    packed [BK/8, BN] tile nibble by nibble (no reshape), accumulating in a 2-D fp32 register
    tile reduced once at the end.
  * fp32, M 2..4: tl.dot on each nibble plane (eight K = BK/8 dots), BLOCK_M 16.
  * bf16 M 5..64 (fp16 on mma.sync GPUs at 17..64): the tile unpacked to [BK, BN] in k
    order, one tl.dot (BLOCK_K kept inside a group so scales are one [1, BN] row); with fp16
    activations the unpacking is the inline-PTX planes of w4a16_planes.py joined into it.
  * both split K over a third grid axis when the (M, N) tiles alone cannot fill the GPU; the
    fp32 partial sums [SPLIT, M, N] are added by a small reduce kernel.
  * M > 64 (but see plane-packed words): dequantize W to the activation dtype (one Triton
    pass) and torch.matmul (cuBLAS).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .device import dots_from_registers, num_sms
from .splitk import counters as splitk_counters
from .splitk import reduce_partials, sum_if_last
from .w4a16_config import W4A16Config, auto_split, pick_config
from .w4a16_dequant import _nibble_f32, dequantize_w4a16
from .w4a16_gemv import launch_gemv16
from .w4a16_planes import (
    join_planes,
    joined_cols,
    plane_dot,
    planes_asm,
    planes_emulated,
    scale_pairs,
)
from .w4a16_ref import (  # noqa: F401 - the references are part of this module's API
    PACK,
    PLANE_TILE,
    _check_inputs,
    check_planes,
    dequantize_w4a16_ref,
    pack_planes_ref,
    pack_w4_ref,
    unplane_order,
    w4a16_matmul_ref,
)
from .w4a16_swap import launch_swap, plane_order

# --------------------------------------------------------------------------- Triton kernels


@triton.jit
def _nibble_f32_scaled(packed, hi, j: tl.constexpr):
    """q_j * 16**(j % 5) as fp32 with one LOP3 and one FADD (no shift per nibble).

    The nibble is masked in place, so the fp32 2**23 + q * 16**p stays exact while the
    nibble stays below bit 23 (j <= 4); nibbles 5..7 sit at positions 0..2 of ``hi`` =
    packed >> 20. The caller folds 16**-(j % 5) into x.
    """
    src = packed if j < 5 else hi
    bits = (src & (0xF << (4 * (j % 5)))) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _unpack_tile(packed, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_K // 8, BLOCK_N] int32 words -> [BLOCK_K, BLOCK_N] fp32 values in k order."""
    shifts = tl.arange(0, 8) * 4
    bits = ((packed[:, None, :] >> shifts[None, :, None]) & 0xF) | 0x4B000000  # (BK8, 8, BN)
    q = bits.to(tl.float32, bitcast=True) - 8388608.0
    return tl.reshape(q, (BLOCK_K, BLOCK_N))  # row 8r + j = nibble j of word row r


@triton.jit
def _scale_rows(s_ptr, z_ptr, k0, rows, offs_n, n_mask, K, group_size, stride_sg, stride_zg,
                ONE_GROUP: tl.constexpr):
    """scales and zeros*scales for word rows ``rows`` (k // 8 per k also works: gs % 8 == 0).

    ONE_GROUP: the whole K tile lies in one group, so one [1, BN] row serves every word.
    Returns ([1 or BK8, BN] fp32, same shape): s and z * s.
    """
    if ONE_GROUP:
        g = k0 // group_size
        # 2-D [1, BN] loads land in the packed tile's layout (a 1-D load would be shuffled)
        s = tl.load(s_ptr + g * stride_sg + offs_n[None, :], mask=n_mask[None, :], other=0.0)
        z = tl.load(z_ptr + g * stride_zg + offs_n[None, :], mask=n_mask[None, :], other=0.0)
        s_out = s.to(tl.float32)
        zs_out = z.to(tl.float32) * s_out
    else:
        g = (rows * 8) // group_size  # (BK8,)
        mask = (rows[:, None] < K // 8) & n_mask[None, :]
        s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :], mask=mask, other=0.0)
        z = tl.load(z_ptr + g[:, None] * stride_zg + offs_n[None, :], mask=mask, other=0.0)
        s_out = s.to(tl.float32)
        zs_out = z.to(tl.float32) * s_out
    return s_out, zs_out


@triton.jit
def _gemv_tile_loads(qw_ptr, s_ptr, z_ptr, rows, r_end, offs_n, n_mask, group_size,
                     stride_qk, stride_sg, stride_zg):
    """Packed words, scales and zeros of word rows ``rows`` ([BK8, BN] each; rows >= r_end
    are masked off). Per-row scales even when the tile lies in one group: [BK8, BN] loads
    share the packed tile's register layout, where a [1, BN] row costs a shuffle per tile."""
    mask = (rows < r_end)[:, None] & n_mask[None, :]
    packed = tl.load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :], mask=mask, other=0)
    g = (rows * 8) // group_size  # (BK8,)
    s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :], mask=mask, other=0.0)
    z = tl.load(z_ptr + g[:, None] * stride_zg + offs_n[None, :], mask=mask, other=0.0)
    return packed, s, z


@triton.jit
def _w4a16_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr,
    N, K, k_per_split, group_size,
    stride_xk, stride_qk, stride_sg, stride_zg, stride_os,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One activation row: out[pid_k, n] = sum over this split's k of x[k] * W[k, n].

    Works on the packed tile [BK8, BN] directly (no reshape, so no layout shuffles): word row
    r holds k = k0 + 8r + j in nibble j, all in one group, so
    sum_j x[k] W[k, n] = s[r, n] * sum_j q_j[r, n] x_j[r] - (z s)[r, n] * sum_j x_j[r].
    The next tile's words and scales are loaded before this tile is computed (register
    double buffering: in a plain range loop Triton's pipeliner stages only loads that feed a
    tl.dot; tl.range(num_stages=) would stage them, see kernels/w4a16_gemv.py PIPE).
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    r_end = k_hi // 8
    rows = k_lo // 8 + tl.arange(0, BLOCK_K // 8)  # (BK8,) word rows of the current tile
    packed, s_raw, z_raw = _gemv_tile_loads(qw_ptr, s_ptr, z_ptr, rows, r_end, offs_n, n_mask,
                                            group_size, stride_qk, stride_sg, stride_zg)
    acc = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
    for _ in range(k_lo, k_hi, BLOCK_K):
        nxt = rows + BLOCK_K // 8
        packed_n, s_n, z_n = _gemv_tile_loads(qw_ptr, s_ptr, z_ptr, nxt, r_end, offs_n, n_mask,
                                              group_size, stride_qk, stride_sg, stride_zg)
        r_mask = rows < r_end
        dot = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
        xsum = tl.zeros((BLOCK_K // 8,), dtype=tl.float32)
        hi = packed >> 20
        for j in tl.static_range(8):
            xj = tl.load(x_ptr + (rows * 8 + j) * stride_xk, mask=r_mask, other=0.0)
            xj = xj.to(tl.float32)
            xsum += xj
            xj = xj * (1.0 / (16 ** (j % 5)))  # exact power of two
            dot += _nibble_f32_scaled(packed, hi, j) * xj[:, None]
        s = s_raw.to(tl.float32)
        acc += dot * s - (z_raw.to(tl.float32) * s) * xsum[:, None]
        packed, s_raw, z_raw, rows = packed_n, s_n, z_n, nxt
    y = tl.sum(acc, axis=0)
    tl.store(out_ptr + pid_k * stride_os + offs_n, y.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit(do_not_specialize=["M"])  # M varies per step; one compiled variant serves all
def _w4a16_dot_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, final_ptr, cnt_ptr,
    M, N, K, k_per_split, group_size, split,
    stride_xm, stride_xk, stride_qk, stride_sg, stride_zg, stride_om, stride_os, stride_fm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ONE_GROUP: tl.constexpr, NIBBLE_DOTS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    REDUCE: tl.constexpr, SPLIT_P2: tl.constexpr, FP16_PLANES: tl.constexpr,
    USE_ASM: tl.constexpr, PLANE_MAJOR: tl.constexpr,
):
    """out[pid_k, m, n] = sum over this split's k of x[m, k] * W[k, n] via tl.dot.

    Default: unpack the tile to [BLOCK_K, BLOCK_N] in k order and issue one tl.dot.
    NIBBLE_DOTS: consume it nibble by nibble instead, dot j multiplying x[:, k0 + 8r + j]
    (BM, BK8) by W[k0 + 8r + j, :] (BK8, BN): each plane keeps the packed tile's register
    layout, at the price of eight K=BK8 dots (BLOCK_K >= 128 so BK8 >= 16). FP16_PLANES
    (with NIBBLE_DOTS, fp16 x): the planes come from inline PTX in fp16 (w4a16_planes.py;
    USE_ASM=False: its plain-Triton twin). FP16_PLANES without NIBBLE_DOTS: the planes are
    joined into one [BK, BN] tile for one dot (PLANE_MAJOR: in plane order, with x's columns
    read in the same order).
    REDUCE: ``out`` holds fp32 partials and the last program of each (m, n) tile writes
    their sum to ``final`` (kernels/splitk.py).
    """
    pid_m = tl.program_id(0)  # fastest: programs that share a W tile run together (L2 reuse)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = tl.arange(0, BLOCK_K // 8)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        rows = k0 // 8 + offs_p  # (BK8,)
        r_mask = rows < K // 8
        packed = tl.load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :],
                         mask=r_mask[:, None] & n_mask[None, :], other=0)
        if NIBBLE_DOTS:
            s, zs = _scale_rows(s_ptr, z_ptr, k0, rows, offs_n, n_mask, K, group_size,
                                stride_sg, stride_zg, ONE_GROUP)
            if FP16_PLANES:
                ss, nzs = scale_pairs(s, zs)
                if USE_ASM:
                    w0, w1, w2, w3, w4, w5, w6, w7 = planes_asm(packed, ss, nzs)
                else:
                    w0, w1, w2, w3, w4, w5, w6, w7 = planes_emulated(packed, ss, nzs)
                args = (x_ptr, offs_m, rows)
                masks = (m_mask, r_mask, stride_xm, stride_xk)
                acc = plane_dot(acc, *args, 0, *masks, w0, DOT_PRECISION)
                acc = plane_dot(acc, *args, 1, *masks, w1, DOT_PRECISION)
                acc = plane_dot(acc, *args, 2, *masks, w2, DOT_PRECISION)
                acc = plane_dot(acc, *args, 3, *masks, w3, DOT_PRECISION)
                acc = plane_dot(acc, *args, 4, *masks, w4, DOT_PRECISION)
                acc = plane_dot(acc, *args, 5, *masks, w5, DOT_PRECISION)
                acc = plane_dot(acc, *args, 6, *masks, w6, DOT_PRECISION)
                acc = plane_dot(acc, *args, 7, *masks, w7, DOT_PRECISION)
            else:
                for j in tl.static_range(8):
                    xj = tl.load(x_ptr + offs_m[:, None] * stride_xm
                                 + (rows * 8 + j)[None, :] * stride_xk,
                                 mask=m_mask[:, None] & r_mask[None, :], other=0.0)  # (BM, BK8)
                    wj = (_nibble_f32(packed, j) * s - zs).to(xj.dtype)  # (BK8, BN)
                    acc = tl.dot(xj, wj, acc, input_precision=DOT_PRECISION)
        elif FP16_PLANES:  # the eight fp16 planes joined into one K = BK tile
            s, zs = _scale_rows(s_ptr, z_ptr, k0, rows, offs_n, n_mask, K, group_size,
                                stride_sg, stride_zg, ONE_GROUP)
            ss, nzs = scale_pairs(s, zs)
            if USE_ASM:
                w0, w1, w2, w3, w4, w5, w6, w7 = planes_asm(packed, ss, nzs)
            else:
                w0, w1, w2, w3, w4, w5, w6, w7 = planes_emulated(packed, ss, nzs)
            w = join_planes(w0, w1, w2, w3, w4, w5, w6, w7, BLOCK_K, BLOCK_N, PLANE_MAJOR)
            cols = joined_cols(k0, BLOCK_K, PLANE_MAJOR)
            xt = tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :] * stride_xk,
                         mask=m_mask[:, None] & (cols[None, :] < K), other=0.0)  # (BM, BK)
            acc = tl.dot(xt, w, acc, input_precision=DOT_PRECISION)
        else:
            cols = k0 + tl.arange(0, BLOCK_K)
            xt = tl.load(x_ptr + offs_m[:, None] * stride_xm + cols[None, :] * stride_xk,
                         mask=m_mask[:, None] & (cols[None, :] < K), other=0.0)  # (BM, BK)
            s, zs = _scale_rows(s_ptr, z_ptr, k0, cols // 8, offs_n, n_mask, K, group_size,
                                stride_sg, stride_zg, ONE_GROUP)  # (1 or BK, BN)
            w = (_unpack_tile(packed, BLOCK_K, BLOCK_N) * s - zs).to(xt.dtype)  # (BK, BN)
            acc = tl.dot(xt, w, acc, input_precision=DOT_PRECISION)
    out = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)
    if REDUCE:
        sum_if_last(cnt_ptr, pid_n * tl.num_programs(0) + pid_m, split, out_ptr, final_ptr,
                    offs_m, offs_n, mask, stride_os, stride_om, stride_fm, SPLIT_P2)


# --------------------------------------------------------------------------- host side


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    config: W4A16Config | None = None,
    integer_zeros: bool = False,
    planes_packed: bool = False,
) -> torch.Tensor:
    """y = x @ W for the runtime 4-bit layout; x [..., K] fp16/bf16 (fp32 in the interpreter).

    fp32 accumulation; returns x's dtype, shape [..., N]. ``config`` overrides the tuned
    choice (benchmarks use it). ``integer_zeros``: every zero point is an integer, as in
    every checkpoint format (pick_config may then fold them into the GEMV's constants).
    Any group_size works: one not a multiple of 8 (a word would straddle two groups), or
    not of 16 on the plain "dot" path, is served by dequantize + torch.matmul. "dot" with
    nibble_dots needs block_k >= 128.

    ``planes_packed``: qweight from ``pack_planes_ref`` (within each 128-row tile, plane j of
    the words covers 16 consecutive rows; K and group_size multiples of 128). The plane dots
    then read x as it is, where standard words need x copied into plane order; the one-row
    GEMV and the dequantize pass read the new order; every other kernel gets x permuted to
    match (``unplane_order``, a copy).
    """
    k, n = _check_inputs(x, qweight, scales, zeros, group_size)
    if planes_packed:
        check_planes(k, group_size)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)  # (M, K)
    m = x2.shape[0]
    if m == 0:
        return torch.empty((*lead, n), device=x.device, dtype=x.dtype)
    sms = num_sms(x.device)
    cfg = config or pick_config(m, n, k, group_size, sms, half=x.dtype != torch.float32,
                                fp16=x.dtype == torch.float16, integer_zeros=integer_zeros,
                                mma_sync=dots_from_registers(x.device),
                                planes_packed=planes_packed)
    block_k = cfg.block_k
    if cfg.kind == "dot" and not cfg.nibble_dots and group_size < k:
        # keep each K tile inside one group: per-row [BK, BN] scale tiles would be staged in
        # shared memory by the pipeliner (> 99 KB for BM=64, BK=64 at group_size 32)
        while block_k > 16 and group_size % block_k:
            block_k //= 2
    one_group = group_size >= k or group_size % block_k == 0  # every K tile in one group
    odd_groups = cfg.kind == "dot" and not cfg.nibble_dots and not one_group
    if cfg.kind == "dequant" or group_size % PACK or odd_groups or (
            cfg.kind == "gemv" and m != 1):
        w = dequantize_w4a16(qweight, scales, zeros, group_size, dtype=x.dtype, reuse=True,
                             planes_packed=planes_packed)
        return torch.matmul(x2, w).reshape(*lead, n)
    if (cfg.x_planes or cfg.x_split) and (cfg.kind != "swap" or not cfg.nibble_dots or (
            cfg.x_planes and (cfg.x_split or k % block_k))):
        raise ValueError("x_planes / x_split need the swap kernel's plane dots (one of them; "
                         f"x_planes K a multiple of block_k): K={k}, {cfg}")
    gemv_planes = (planes_packed and cfg.kind == "gemv16" and block_k % PLANE_TILE == 0
                   and x2.dtype == torch.float16)
    joined_pm = cfg.kind == "swap" and cfg.plane_major and not cfg.nibble_dots
    if joined_pm and not (planes_packed and block_k == PLANE_TILE and cfg.fp16_planes):
        raise ValueError(f"plane_major on the swap kernel needs plane-packed words, fp16 "
                         f"planes and block_k {PLANE_TILE}: {cfg}")
    if planes_packed and not (gemv_planes or joined_pm
                              or (cfg.x_planes and block_k == PLANE_TILE)):
        x2 = unplane_order(x2)  # k-order kernels: x in the words' order (a copy)
    if cfg.x_planes and not (planes_packed and block_k == PLANE_TILE):
        x2 = plane_order(x2, block_k)
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    _launch_fused(x2, qweight.contiguous(), scales.contiguous(), zeros.contiguous(), out,
                  group_size, cfg, block_k, one_group, sms, gemv_planes)
    return out.reshape(*lead, n)


def _launch_fused(x2, qweight, scales, zeros, out, group_size: int, cfg: W4A16Config,
                  block_k: int, one_group: bool, sms: int, gemv_planes: bool = False) -> None:
    """GEMV or dot kernel into ``out`` [M, N]; fp32 partials + reduce when K is split."""
    m, k = x2.shape
    n = out.shape[1]
    block_m = max(16, triton.next_power_of_2(cfg.block_m))
    m_tiles = (triton.cdiv(m, block_m) if cfg.kind in ("dot", "swap") else
               triton.cdiv(m, cfg.rows) if cfg.kind == "gemv16" else 1)
    n_tiles = triton.cdiv(n, cfg.block_n)
    split = cfg.split_k or auto_split(m_tiles * n_tiles, k, block_k, sms, cfg.waves,
                                      cfg.min_k_tiles)
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    split = triton.cdiv(k, k_per_split)
    target = torch.empty((split, m, n), device=x2.device, dtype=torch.float32) if split > 1 \
        else out.view(1, m, n)  # (SPLIT, M, N)
    # the last program of each tile sums the partials (kernels/splitk.py) on the fp16x2 and
    # dot paths; the fp32 GEMV, or no counters to hand, takes a second launch
    cnt = splitk_counters(x2.device, m_tiles * n_tiles) if (
        split > 1 and cfg.fused_reduce and cfg.kind != "gemv") else None
    final = out if cnt is not None else target
    if cfg.kind == "gemv16":
        launch_gemv16(x2, qweight, scales, zeros, target, group_size, cfg.rows, cfg.block_n,
                      block_k, k_per_split, split, cfg.num_warps, cfg.num_stages,
                      use_asm=not _interpreting(), per_tile_scales=cfg.per_tile_scales,
                      chain4=cfg.chain4, fold_zero=cfg.fold_zero,
                      flat_scales=cfg.flat_scales, pipe=cfg.pipe_stages,
                      final=out if cnt is not None else None, counters=cnt,
                      planes=gemv_planes)
    elif cfg.kind == "swap":
        launch_swap(x2, qweight, scales, zeros, target, final, cnt, group_size, block_m,
                    cfg.block_n, block_k, k_per_split, split, one_group,
                    joined=not cfg.nibble_dots, planes=cfg.fp16_planes,
                    use_asm=not _interpreting(), num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages, x_planes=cfg.x_planes,
                    x_split=cfg.x_split, plane_major=cfg.plane_major and not cfg.nibble_dots)
    elif cfg.kind == "gemv":
        _w4a16_gemv_kernel[(n_tiles, split)](
            x2, qweight, scales, zeros, target, n, k, k_per_split, group_size,
            x2.stride(1), qweight.stride(0), scales.stride(0), zeros.stride(0),
            target.stride(0), BLOCK_N=cfg.block_n, BLOCK_K=block_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    else:
        precision = "ieee" if x2.dtype == torch.float32 else "tf32"
        _w4a16_dot_kernel[(m_tiles, n_tiles, split)](
            x2, qweight, scales, zeros, target, final, target if cnt is None else cnt,
            m, n, k, k_per_split, group_size, split,
            x2.stride(0), x2.stride(1), qweight.stride(0), scales.stride(0), zeros.stride(0),
            target.stride(1), target.stride(0), final.stride(-2), BLOCK_M=block_m,
            BLOCK_N=cfg.block_n, BLOCK_K=block_k, ONE_GROUP=one_group,
            NIBBLE_DOTS=cfg.nibble_dots, DOT_PRECISION=precision, REDUCE=cnt is not None,
            FP16_PLANES=cfg.fp16_planes and x2.dtype == torch.float16,
            USE_ASM=not _interpreting(), PLANE_MAJOR=cfg.plane_major,
            SPLIT_P2=triton.next_power_of_2(split) if cnt is not None else 1,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1 and cnt is None:
        reduce_partials(target, out)
