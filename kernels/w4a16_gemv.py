"""W4A16 for few activation rows (M <= 16): packed fp16x2 dequantization in inline PTX.

Why: on a fast-memory GPU the plain-Triton GEMV spent ~9 instructions per weight (shift, mask,
int->float, scale, fma in fp32), so it was issue-bound far below what its byte count allows. Here
one 32-bit word of eight nibbles costs ~5 integer and 4 fp16x2 instructions to become four fp16
pairs, shared by up to four activation rows, and each row adds four fp16x2 multiply-adds and a short
fp32 sum (the FasterTransformer/Marlin trick: ``(w & 0x000F000F) | 0x64006400`` read as two fp16 is
(1024 + q_lo, 1024 + q_hi)).

Per word (runtime layout, nibble j of word r = k 8r + j) and activation row m::

    t0 = (q0, q4)   t1 = (q1, q5)   t2 = (q2, q6)   t3 = (q3, q7)          fp16 pairs, exact
    part[m] = f32(lo + hi) of t0*(x0,x4) + t1*(x1,x5) + t2*(x2,x6) + t3*(x3,x7)   four products
                                                                  per half in fp16, then fp32
    y[m, n] += s[g, n] * part[m] - z[g, n] * s[g, n] * sum_j x[m, 8r + j]  fp32 accumulation

Each fp16 partial holds four products q*x (q <= 15), so it overflows only for |x| > ~1,000.
``USE_ASM=False`` computes the same pairs in plain Triton (the interpreter has no PTX): the CPU
tests check the pairing and epilogue logic that way, the GPU tests the PTX.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from edge_llm import envs

from . import splitk
from .device import num_sms
from .grid import cdiv, next_pow2
from .pdl import pdl_enter, pdl_kwargs
from .splitk import sum_if_last
from .w4a16_config import Gemv16
from .w4a16_gemv_ptx import (
    ASM1,
    ASM1F,
    ASM2,
    ASM2F,
    ASM3,
    ASM4,
    CON1,
    CON1F,
    CON2,
    CON2F,
    CON3,
    CON4,
    FOLD_Z,
    FOLD_Z_CON,
)
from .w4a16_gemv_tile import tile_at, tile_loads
from .w4a16_gemv_x import bits_half, fp16x2_pair, pairs_from_raw, x_pairs, x_raw
from .w4a16_ref import PLANE_TILE, unplane_order

# The pipelined GEMV of this many activation rows per program (and fewer) reads weights
# before the PDL wait: its split's K tiles cycle through four register buffers, the first
# four loaded before the wait (RING), where the whole grid is resident at once
# at the ring's registers (124-128 a thread on sm_89 / sm_90: RING_RESIDENT programs of four
# warps a multiprocessor); else the staged loop, its first tile read before the wait
# (EARLY). Both measured at one row (BENCHMARKS.md, "Kernels"); a grid of more programs
# than fit (Qwen2.5-7B's gate/up, 592) ran 0.89x slower alone with the ring.
EARLY_ROWS = 1
RING_RESIDENT = 4


@triton.jit
def _dot8_emulated(w, zf, xa, xb, xc, xd):
    """Plain-Triton twin of one row of the PTX (fp32 throughout, z as fp32)."""
    acc = (((w & 0xF).to(tl.float32) - zf) * bits_half(xa)
           + (((w >> 16) & 0xF).to(tl.float32) - zf) * bits_half(xa >> 16))
    acc += ((((w >> 4) & 0xF).to(tl.float32) - zf) * bits_half(xb)
            + (((w >> 20) & 0xF).to(tl.float32) - zf) * bits_half(xb >> 16))
    acc += ((((w >> 8) & 0xF).to(tl.float32) - zf) * bits_half(xc)
            + (((w >> 24) & 0xF).to(tl.float32) - zf) * bits_half(xc >> 16))
    acc += ((((w >> 12) & 0xF).to(tl.float32) - zf) * bits_half(xd)
            + (((w >> 28) & 0xF).to(tl.float32) - zf) * bits_half(xd >> 16))
    return acc


@triton.jit
def _live(M, m):
    """1 if activation row m exists, else 0 (a scalar that masks a row's loads)."""
    return tl.minimum(tl.maximum(M - m, 0), 1)


@triton.jit
def _f32(bits):
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _store_row(out, acc, m, M, N, offs_n, stride_om):
    tl.store(out + m * stride_om, tl.sum(acc, axis=0).to(out.dtype.element_ty),
             mask=offs_n < N * _live(M, m))


@triton.jit
def _store_silu_row(out_ptr, acc, m, M, N, pid_n, stride_om, HALF: tl.constexpr):
    """The SILU epilogue: the tile's columns are HALF gate columns then the same HALF up
    columns; stores dtype(dtype(silu(g)) * u) at the HALF output columns, with g and u first
    rounded to the output dtype (what the unfused path's gate_up output and
    ``silu_and_mul`` compute)."""
    dt = out_ptr.dtype.element_ty
    v = tl.sum(acc, axis=0).to(dt).to(tl.float32)  # [2 HALF]: gate | up
    g, u = tl.split(tl.permute(tl.reshape(v, (2, HALF)), (1, 0)))
    act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    offs = pid_n * HALF + tl.arange(0, HALF)
    tl.store(out_ptr + m * stride_om + offs, (act * u).to(dt), mask=offs < N * _live(M, m))


@triton.jit
def _tile_update(acc0, acc1, acc2, acc3, w, s, z, rows, r_end, k0, x_ptr, xi_ptr,
                 m0, m1, m2, m3, M, stride_xm, stride_xim, ROWS: tl.constexpr,
                 USE_ASM: tl.constexpr,
                 X_FP16: tl.constexpr, FOLD: tl.constexpr,
                 FLAT: tl.constexpr, EVEN: tl.constexpr, PLANES: tl.constexpr,
                 xr0=None, X_LOADED: tl.constexpr = False):
    """The accumulators after one K tile: words ``w`` [BK8, BN] of word rows ``rows`` with
    their scales and zeros, times the activation rows m0..m0+ROWS-1 (FOLD: ROWS <= 2).
    X_LOADED: row m0's x words come as ``xr0`` (``x_raw``, loaded ahead by the caller)."""
    s = s.to(tl.float32)
    if FOLD and USE_ASM and z.dtype == tl.float16 and FLAT:
        # two columns' zeros in one register: one f16x2 add or sub, a byte permute each
        z_a, z_b = tl.inline_asm_elementwise(FOLD_Z, FOLD_Z_CON, [z], dtype=(tl.int32, tl.int32),
                                             is_pure=True, pack=2)
    elif FOLD:
        zf = z.to(tl.float32)
        z_a = fp16x2_pair(zf + 1024.0)  # exact: zero points are integers (quant/linear.py)
        z_b = fp16x2_pair(-64.0 - zf)
    else:
        z_a = fp16x2_pair(z)  # (z, z) as fp16x2
    if X_LOADED:
        xa0, xb0, xc0, xd0 = pairs_from_raw(xr0, rows.shape[0], PLANES, USE_ASM)
    else:
        xa0, xb0, xc0, xd0 = x_pairs(x_ptr + m0 * stride_xm, xi_ptr + m0 * stride_xim, rows,
                                     r_end, X_FP16, EVEN, FLAT, PLANES, k0, USE_ASM)
    if ROWS >= 2:
        xa1, xb1, xc1, xd1 = x_pairs(x_ptr + m1 * stride_xm, xi_ptr + m1 * stride_xim,
                                     rows, r_end * _live(M, m1), X_FP16, EVEN, FLAT,
                                     PLANES, k0, USE_ASM)
    if ROWS >= 3:
        xa2, xb2, xc2, xd2 = x_pairs(x_ptr + m2 * stride_xm, xi_ptr + m2 * stride_xim,
                                     rows, r_end * _live(M, m2), X_FP16, EVEN, FLAT,
                                     PLANES, k0, USE_ASM)
    if ROWS >= 4:
        xa3, xb3, xc3, xd3 = x_pairs(x_ptr + m3 * stride_xm, xi_ptr + m3 * stride_xim,
                                     rows, r_end * _live(M, m3), X_FP16, EVEN, FLAT,
                                     PLANES, k0, USE_ASM)
    if USE_ASM:
        if FOLD and ROWS == 1:
            p0 = _f32(tl.inline_asm_elementwise(
                ASM1F, CON1F, [w, z_a, z_b, xa0, xb0, xc0, xd0],
                dtype=tl.int32, is_pure=True, pack=1))
        elif FOLD:
            p0, p1 = tl.inline_asm_elementwise(
                ASM2F, CON2F, [w, z_a, z_b, xa0, xb0, xc0, xd0, xa1, xb1, xc1, xd1],
                dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
            p0, p1 = _f32(p0), _f32(p1)
        elif ROWS == 1:
            p0 = _f32(tl.inline_asm_elementwise(
                ASM1, CON1, [w, z_a, xa0, xb0, xc0, xd0],
                dtype=tl.int32, is_pure=True, pack=1))
        elif ROWS == 2:
            p0, p1 = tl.inline_asm_elementwise(
                ASM2, CON2,
                [w, z_a, xa0, xb0, xc0, xd0, xa1, xb1, xc1, xd1],
                dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
            p0, p1 = _f32(p0), _f32(p1)
        elif ROWS == 3:
            p0, p1, p2 = tl.inline_asm_elementwise(
                ASM3, CON3,
                [w, z_a, xa0, xb0, xc0, xd0, xa1, xb1, xc1, xd1, xa2, xb2, xc2, xd2],
                dtype=(tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
            p0, p1, p2 = _f32(p0), _f32(p1), _f32(p2)
        else:
            p0, p1, p2, p3 = tl.inline_asm_elementwise(
                ASM4, CON4,
                [w, z_a, xa0, xb0, xc0, xd0, xa1, xb1, xc1, xd1, xa2, xb2, xc2, xd2,
                 xa3, xb3, xc3, xd3],
                dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
            p0, p1, p2, p3 = _f32(p0), _f32(p1), _f32(p2), _f32(p3)
    else:
        if FOLD:  # z back from both folded constants (checks how they are built)
            zf = 0.5 * (bits_half(z_a >> 16) - 1024.0 - 64.0 - bits_half(z_b))
        else:
            zf = z.to(tl.float16).to(tl.float32)
        p0 = _dot8_emulated(w, zf, xa0, xb0, xc0, xd0)
        if ROWS >= 2:
            p1 = _dot8_emulated(w, zf, xa1, xb1, xc1, xd1)
        if ROWS >= 3:
            p2 = _dot8_emulated(w, zf, xa2, xb2, xc2, xd2)
        if ROWS >= 4:
            p3 = _dot8_emulated(w, zf, xa3, xb3, xc3, xd3)
    acc0 += p0 * s
    if ROWS >= 2:
        acc1 += p1 * s
    if ROWS >= 3:
        acc2 += p2 * s
    if ROWS >= 4:
        acc3 += p3 * s
    return acc0, acc1, acc2, acc3


@triton.jit
def _ring_slot(acc0, acc1, acc2, acc3, w, s, z, xr, kt, k_hi, last, ar, x_ptr, xi_ptr, xi0,
               qw_ptr, s_ptr, z_ptr, r_end, offs_n, n_mask, n_load, group_size, stride_qk,
               stride_sg, stride_zg, m0, m1, m2, m3, M, stride_xm, stride_xim,
               ROWS: tl.constexpr, USE_ASM: tl.constexpr, X_FP16: tl.constexpr,
               FOLD: tl.constexpr, ONE_GROUP: tl.constexpr, FLAT: tl.constexpr,
               EVEN: tl.constexpr, PLANES: tl.constexpr, BLOCK_K: tl.constexpr,
               WHOLE: tl.constexpr, ONCE: tl.constexpr):
    """One buffer of the RING loop: the accumulators after its tile at ``kt`` (words ``w``,
    scales, zeros, x words ``xr``; nothing past the split's end ``k_hi``), and the buffer
    reloaded in place with the tile four further on (the split's ``last`` tile again past
    its end), its x words too; ONCE (the four buffers hold the whole split): no reload."""
    if WHOLE or kt < k_hi:  # WHOLE: every tile lies inside the split, no branch compiled
        acc0, acc1, acc2, acc3 = _tile_update(
            acc0, acc1, acc2, acc3, w, s, z, (kt >> 3) + ar, r_end, kt, x_ptr, xi_ptr, m0, m1,
            m2, m3, M, stride_xm, stride_xim, ROWS, USE_ASM, X_FP16, FOLD, FLAT, EVEN, PLANES,
            xr, True)
    if not ONCE:
        kn = tl.minimum(kt + 4 * BLOCK_K, last)
        w, s, z = tile_at(qw_ptr, s_ptr, z_ptr, kn, ar, r_end, offs_n, n_mask, n_load,
                          group_size, stride_qk, stride_sg, stride_zg, ONE_GROUP, FLAT, EVEN)
        xr = x_raw(xi0, (kn >> 3) + ar, r_end, EVEN, PLANES, kn)
    return acc0, acc1, acc2, acc3, w, s, z, xr


@triton.jit(do_not_specialize=["M"])  # M varies per step; one compiled variant serves all
def _w4a16_gemv16_kernel(
    x_ptr, xi_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, final_ptr, cnt_ptr,
    M, N, K, k_per_split, group_size: tl.constexpr, split,
    stride_xm, stride_xim, stride_qk, stride_sg, stride_zg, stride_om, stride_os, stride_fm,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ONE_GROUP: tl.constexpr, USE_ASM: tl.constexpr, X_FP16: tl.constexpr,
    FOLD: tl.constexpr, FLAT: tl.constexpr, EVEN: tl.constexpr,
    PIPE: tl.constexpr, REDUCE: tl.constexpr, SPLIT_P2: tl.constexpr,
    PLANES: tl.constexpr = False,
    SILU: tl.constexpr = False,
    PDL: tl.constexpr = False,
    EARLY: tl.constexpr = False,
    RING: tl.constexpr = False,
    RING_WHOLE: tl.constexpr = False,
    RING_ONCE: tl.constexpr = False,
):
    """Rows m0..m0+ROWS-1 (ROWS <= 4) of out[pid_k] = x[:, this split's k] @ W[k, n-tile].

    Grid (n tiles, K splits, row chunks). 2-D fp32 accumulators [BK8, BN] per row, reduced
    once at the end. ONE_GROUP (every K tile inside one group): scales and zeros are one
    [1, BN] row per tile; else one per word row ([BK8, BN] loads, any group size % 8 == 0).
    FOLD (ONE_GROUP, ROWS <= 2): the zero point enters the PTX's bias constants, built
    once per tile and column instead of subtracted per word. FLAT (ONE_GROUP only): scales and
    zeros load as 1-D rows and each word row's x as one 16-byte load (a [1, BN] load had set
    a one-column-per-thread layout for the whole tile, seen in the SASS). EVEN (FLAT,
    K a multiple of BLOCK_K, N of BLOCK_N): no load is masked; the last tile's prefetch reads
    that tile again, a missing activation row reads row M - 1 (its result is not stored).
    PIPE > 0: the loop's loads are staged through shared memory PIPE - 1 tiles ahead by
    cp.async (Triton's pipeliner, asked for by tl.range), so the bytes in flight no longer
    cost registers; 0: the next tile is loaded into registers while this one is computed.
    REDUCE: ``out`` holds fp32 partials and the last program of each (row chunk, n tile)
    writes their sum to ``final`` (kernels/splitk.py). PLANES: plane-packed words
    (pack_planes_ref; K tiles and splits whole 128-row tiles; fp16 x), x read in natural
    order (``x_pairs``). SILU (one split, no REDUCE): the weights are a merged [gate | up]
    projection of 2 N columns and ``out`` gets silu(gate) * up, N columns: each program
    reads BLOCK_N / 2 gate columns and the same up columns (N further on), and its epilogue
    stores their product (``_store_silu_row``): no [M, 2 N] intermediate, no second kernel.
    EARLY (PIPE > 0): the split's first K tile of words, scales and zeros is loaded into
    registers before the PDL wait (no kernel of a forward writes weights), so its reads
    overlap the previous kernel's tail; the pipelined loop takes the rest. Set at one
    activation row, where it measured faster (BENCHMARKS.md, "Kernels"); at two rows the
    kernel alone was 2-5% slower with it.
    RING (instead of PIPE and EARLY; fp16 x as PLANES or FLAT words): tile t of the split
    lives in register buffer t % 4, the first four filled before the PDL wait. The loop is
    unrolled by four: each buffer, once its tile is computed, loads the tile four further
    on (the split's last tile again past its end, never computed) and the x words of that
    tile (``x_raw``, after the wait), so three tiles are in flight while one is computed,
    and no copy waits on a load (each buffer is reloaded in place).
    No cp.async staging, shared-memory reads or barriers for the weights; the whole split's
    first tiles are read while the previous kernel finishes. RING_WHOLE (each split a
    multiple of four tiles, K of the split): no buffer's tile lies past the split's end, so
    the four slots compute without a branch and compile to one basic block; RING_ONCE (the
    split is the four buffers' tiles): no buffer reloads. Together 1.010x at one row end to
    end (BENCHMARKS.md, "Kernels"); one basic block alone made the four-tile split slower.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    m0 = tl.program_id(2) * ROWS
    if SILU:
        HALF: tl.constexpr = BLOCK_N // 2
        cols = tl.arange(0, BLOCK_N)
        j = pid_n * HALF + cols % HALF  # the output column of each tile column
        offs_n = j + (cols // HALF) * N  # gate j, then up j
        n_mask = j < N
        n_load = 2 * N
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        n_load = N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    r_end = k_hi // 8
    ar = tl.arange(0, BLOCK_K // 8)
    if EARLY:  # weights only: x is read after the wait
        rows_e = (k_lo >> 3) + ar
        w_e, s_e, z_e = tile_at(qw_ptr, s_ptr, z_ptr, k_lo, ar, r_end, offs_n, n_mask, n_load,
                                group_size, stride_qk, stride_sg, stride_zg, ONE_GROUP, FLAT,
                                EVEN)
    if RING:  # the split's first four tiles of weights, before the wait
        last = k_lo + ((k_hi - k_lo - 1) // BLOCK_K) * BLOCK_K  # the split's last tile
        ka = k_lo
        kb = tl.minimum(k_lo + BLOCK_K, last)
        kc = tl.minimum(k_lo + 2 * BLOCK_K, last)
        kd = tl.minimum(k_lo + 3 * BLOCK_K, last)
        wa, sa, za = tile_at(qw_ptr, s_ptr, z_ptr, ka, ar, r_end, offs_n, n_mask, n_load,
                             group_size, stride_qk, stride_sg, stride_zg, ONE_GROUP, FLAT, EVEN)
        wb, sb, zb = tile_at(qw_ptr, s_ptr, z_ptr, kb, ar, r_end, offs_n, n_mask, n_load,
                             group_size, stride_qk, stride_sg, stride_zg, ONE_GROUP, FLAT, EVEN)
        wc, sc, zc = tile_at(qw_ptr, s_ptr, z_ptr, kc, ar, r_end, offs_n, n_mask, n_load,
                             group_size, stride_qk, stride_sg, stride_zg, ONE_GROUP, FLAT, EVEN)
        wd, sd, zd = tile_at(qw_ptr, s_ptr, z_ptr, kd, ar, r_end, offs_n, n_mask, n_load,
                             group_size, stride_qk, stride_sg, stride_zg, ONE_GROUP, FLAT, EVEN)
    pdl_enter(PDL)
    acc0 = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_K // 8, BLOCK_N), dtype=tl.float32)
    # activation rows past M: EVEN reads row M - 1 instead of masking
    m1, m2, m3 = m0 + 1, m0 + 2, m0 + 3
    if EVEN:
        m1, m2, m3 = tl.minimum(m1, M - 1), tl.minimum(m2, M - 1), tl.minimum(m3, M - 1)
    if RING:
        xi0 = xi_ptr + m0 * stride_xim
        xra = x_raw(xi0, (ka >> 3) + ar, r_end, EVEN, PLANES, ka)
        xrb = x_raw(xi0, (kb >> 3) + ar, r_end, EVEN, PLANES, kb)
        xrc = x_raw(xi0, (kc >> 3) + ar, r_end, EVEN, PLANES, kc)
        xrd = x_raw(xi0, (kd >> 3) + ar, r_end, EVEN, PLANES, kd)
        for k0 in range(k_lo, k_hi, 4 * BLOCK_K):  # tile i of each group in buffer i
            acc0, acc1, acc2, acc3, wa, sa, za, xra = _ring_slot(
                acc0, acc1, acc2, acc3, wa, sa, za, xra, k0, k_hi, last, ar,
                x_ptr, xi_ptr, xi0, qw_ptr, s_ptr, z_ptr, r_end, offs_n, n_mask, n_load,
                group_size, stride_qk, stride_sg, stride_zg, m0, m1, m2, m3, M, stride_xm,
                stride_xim, ROWS, USE_ASM, X_FP16, FOLD, ONE_GROUP, FLAT, EVEN, PLANES, BLOCK_K,
                RING_WHOLE, RING_ONCE)
            acc0, acc1, acc2, acc3, wb, sb, zb, xrb = _ring_slot(
                acc0, acc1, acc2, acc3, wb, sb, zb, xrb, k0 + BLOCK_K, k_hi, last, ar,
                x_ptr, xi_ptr, xi0, qw_ptr, s_ptr, z_ptr, r_end, offs_n, n_mask, n_load,
                group_size, stride_qk, stride_sg, stride_zg, m0, m1, m2, m3, M, stride_xm,
                stride_xim, ROWS, USE_ASM, X_FP16, FOLD, ONE_GROUP, FLAT, EVEN, PLANES, BLOCK_K,
                RING_WHOLE, RING_ONCE)
            acc0, acc1, acc2, acc3, wc, sc, zc, xrc = _ring_slot(
                acc0, acc1, acc2, acc3, wc, sc, zc, xrc, k0 + 2 * BLOCK_K, k_hi, last, ar,
                x_ptr, xi_ptr, xi0, qw_ptr, s_ptr, z_ptr, r_end, offs_n, n_mask, n_load,
                group_size, stride_qk, stride_sg, stride_zg, m0, m1, m2, m3, M, stride_xm,
                stride_xim, ROWS, USE_ASM, X_FP16, FOLD, ONE_GROUP, FLAT, EVEN, PLANES, BLOCK_K,
                RING_WHOLE, RING_ONCE)
            acc0, acc1, acc2, acc3, wd, sd, zd, xrd = _ring_slot(
                acc0, acc1, acc2, acc3, wd, sd, zd, xrd, k0 + 3 * BLOCK_K, k_hi, last, ar,
                x_ptr, xi_ptr, xi0, qw_ptr, s_ptr, z_ptr, r_end, offs_n, n_mask, n_load,
                group_size, stride_qk, stride_sg, stride_zg, m0, m1, m2, m3, M, stride_xm,
                stride_xim, ROWS, USE_ASM, X_FP16, FOLD, ONE_GROUP, FLAT, EVEN, PLANES, BLOCK_K,
                RING_WHOLE, RING_ONCE)
    elif PIPE > 0:
        k_start = k_lo
        if EARLY:  # the split's first tile (splits are never empty: splitk.plan)
            acc0, acc1, acc2, acc3 = _tile_update(
                acc0, acc1, acc2, acc3, w_e, s_e, z_e, rows_e, r_end, k_lo, x_ptr, xi_ptr,
                m0, m1, m2, m3, M, stride_xm, stride_xim, ROWS, USE_ASM, X_FP16, FOLD, FLAT,
                EVEN, PLANES)
            k_start += BLOCK_K
        # the tile loads inside the loop, staged through shared memory by cp.async PIPE
        # tiles ahead (tl.range pipelines loads that feed no tl.dot; plain range does not)
        for k0 in tl.range(k_start, k_hi, BLOCK_K, num_stages=PIPE):
            rows = k0 // 8 + tl.arange(0, BLOCK_K // 8)
            w, s, z = tile_loads(qw_ptr, s_ptr, z_ptr, rows, r_end, offs_n, n_mask, n_load, k0,
                                 group_size, stride_qk, stride_sg, stride_zg, ONE_GROUP,
                                 FLAT, EVEN)
            acc0, acc1, acc2, acc3 = _tile_update(
                acc0, acc1, acc2, acc3, w, s, z, rows, r_end, k0, x_ptr, xi_ptr, m0, m1, m2, m3,
                M, stride_xm, stride_xim, ROWS, USE_ASM, X_FP16, FOLD, FLAT, EVEN,
                PLANES)
    else:
        rows = (k_lo >> 3) + ar
        w_n, s_n, z_n = tile_at(qw_ptr, s_ptr, z_ptr, k_lo, ar, r_end, offs_n, n_mask, n_load,
                                group_size, stride_qk, stride_sg, stride_zg, ONE_GROUP, FLAT,
                                EVEN)
        for k0 in range(k_lo, k_hi, BLOCK_K):
            # the next tile's words and scales are requested before this one is computed
            # (register double buffering, no shared memory)
            w, s, z = w_n, s_n, z_n
            k_next = k0 + BLOCK_K
            if EVEN:  # the last tile prefetches itself again rather than read past the split
                k_next = tl.minimum(k_next, k_hi - BLOCK_K)
            w_n, s_n, z_n = tile_loads(qw_ptr, s_ptr, z_ptr, rows + (k_next - k0) // 8,
                                       r_end, offs_n, n_mask, n_load, k_next, group_size,
                                       stride_qk, stride_sg, stride_zg, ONE_GROUP, FLAT, EVEN)
            acc0, acc1, acc2, acc3 = _tile_update(
                acc0, acc1, acc2, acc3, w, s, z, rows, r_end, k0, x_ptr, xi_ptr, m0, m1, m2, m3,
                M, stride_xm, stride_xim, ROWS, USE_ASM, X_FP16, FOLD, FLAT, EVEN,
                PLANES)
            rows += BLOCK_K // 8
    if SILU:
        _store_silu_row(out_ptr, acc0, m0, M, N, pid_n, stride_om, HALF)
        if ROWS >= 2:
            _store_silu_row(out_ptr, acc1, m0 + 1, M, N, pid_n, stride_om, HALF)
        if ROWS >= 3:
            _store_silu_row(out_ptr, acc2, m0 + 2, M, N, pid_n, stride_om, HALF)
        if ROWS >= 4:
            _store_silu_row(out_ptr, acc3, m0 + 3, M, N, pid_n, stride_om, HALF)
    else:
        out = out_ptr + pid_k * stride_os + offs_n
        _store_row(out, acc0, m0, M, N, offs_n, stride_om)
        if ROWS >= 2:
            _store_row(out, acc1, m0 + 1, M, N, offs_n, stride_om)
        if ROWS >= 3:
            _store_row(out, acc2, m0 + 2, M, N, offs_n, stride_om)
        if ROWS >= 4:
            _store_row(out, acc3, m0 + 3, M, N, offs_n, stride_om)
        if REDUCE:
            offs_m = m0 + tl.arange(0, 4)
            mask = ((offs_m < M) & (offs_m < m0 + ROWS))[:, None] & n_mask[None, :]
            sum_if_last(cnt_ptr, tl.program_id(2) * tl.num_programs(0) + pid_n, split, out_ptr,
                        final_ptr, offs_m, offs_n, mask, stride_os, stride_om, stride_fm, SPLIT_P2)


def launch_gemv16(cfg: Gemv16, x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                  zeros: torch.Tensor, group_size: int, integer_zeros: bool = False,
                  planes_packed: bool = False, silu: bool = False) -> torch.Tensor:
    """x2 [M, K] @ W, [M, N] (x2's dtype), by the fp16x2 GEMV in ``cfg``'s configuration.

    ``integer_zeros``: the caller vouches that every zero point is an integer, so
    ``cfg.fold_zero`` may fold them (FOLD; with one scale row per tile, 1-2 rows).
    ``planes_packed``: words from ``pack_planes_ref``; fp16 x with K tiles of whole 128-row
    tiles reads x in that order (PLANES), anything else gets x permuted to match (a copy).
    ``silu``: W is a merged [gate | up] projection and the result is silu(gate) * up,
    [M, N / 2], computed in the epilogue (SILU) where the launch has one split and N is a
    multiple of the column tile (``fuses_silu``); otherwise the plain [M, N] comes back
    (the caller applies ``silu_and_mul``)."""
    m, k = x2.shape
    n = qweight.shape[1]
    qweight, scales, zeros = qweight.contiguous(), scales.contiguous(), zeros.contiguous()
    rows = cfg.rows or min(m, 4)
    block_n, block_k = cfg.block_n, cfg.block_k
    tiles = cdiv(m, rows) * cdiv(n, block_n)
    split, k_per_split = splitk.plan(tiles, k, block_k, cfg.split_k, cfg.waves,
                                     cfg.min_k_tiles, num_sms(x2.device))
    silu = silu and split == 1 and n % block_n == 0
    planes = planes_packed and block_k % PLANE_TILE == 0 and x2.dtype == torch.float16
    if planes_packed and not planes:
        x2 = unplane_order(x2)  # x in the words' order (a copy)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((m, n // 2 if silu else n), device=x2.device, dtype=x2.dtype)
    target, final, counters = splitk.buffers(out, split, tiles, cfg.fused_reduce)
    fp16 = x2.dtype == torch.float16
    xi = x2.view(torch.int32) if fp16 else x2  # (M, K/2) words of two fp16
    one_group = group_size % block_k == 0 and k_per_split % block_k == 0
    flat = cfg.flat_scales and one_group
    n_out = n // 2 if silu else n  # the kernel's N: output columns
    tile_n = block_n // 2 if silu else block_n  # output columns per program
    reduce = counters is not None
    grid = (cdiv(n_out, tile_n), split, cdiv(m, rows))
    early = cfg.pipe_stages > 0 and rows <= EARLY_ROWS
    ring = (early and fp16 and (planes or flat)  # x_raw's two layouts
            and grid[0] * grid[1] * grid[2] <= RING_RESIDENT * num_sms(x2.device))
    # the ring's splits all whole groups of its four buffers' tiles
    whole = ring and k_per_split % (4 * block_k) == 0 and k % k_per_split == 0
    _w4a16_gemv16_kernel[grid](
        x2, xi, qweight, scales, zeros, target, final, counters if reduce else target,
        m, n_out, k, k_per_split, group_size, split, x2.stride(0), xi.stride(0),
        qweight.stride(0), scales.stride(0), zeros.stride(0), target.stride(1),
        target.stride(0), final.stride(-2), ROWS=rows, BLOCK_N=block_n, BLOCK_K=block_k,
        ONE_GROUP=one_group, USE_ASM=not envs.TRITON_INTERPRET.get(), X_FP16=fp16,
        FOLD=cfg.fold_zero and integer_zeros and one_group and rows <= 2,
        FLAT=flat, EVEN=flat and k % block_k == 0 and n_out % tile_n == 0,
        PIPE=cfg.pipe_stages, REDUCE=reduce, SPLIT_P2=next_pow2(split) if reduce else 1,
        PLANES=planes, SILU=silu, EARLY=early and not ring, RING=ring,
        RING_WHOLE=whole, RING_ONCE=whole and k_per_split == 4 * block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_kwargs(x2.device))
    return splitk.finish(target, out, counters)
