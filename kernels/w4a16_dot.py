"""The W4A16 tile kernels that read the runtime layout with plain Triton arithmetic (beside
the fp16x2 GEMV of w4a16_gemv.py and the swap kernel of w4a16_swap.py), and their launches:

  * "gemv": one activation row, fp32 (the interpreter's tests), no tensor cores;
  * "dot": tl.dot tiles for any activation dtype: the tile unpacked in k order, eight dots
    on the nibble planes, or (fp16 x) the inline-PTX planes of w4a16_planes.py joined into
    one tile in k order.

kernels/w4a16_config.py chooses between them; kernels/splitk.py splits K.
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
from .w4a16_config import Dequant, Dot, Gemv
from .w4a16_dequant import launch_dequant, nibble_f32
from .w4a16_planes import fp16_planes, join_planes
from .w4a16_ref import unplane_order


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
    PDL: tl.constexpr = False,
):
    """One activation row: out[pid_k, n] = sum over this split's k of x[k] * W[k, n].

    Works on the packed tile [BK8, BN] directly (no reshape, so no layout shuffles): word row
    r holds k = k0 + 8r + j in nibble j, all in one group, so
    sum_j x[k] W[k, n] = s[r, n] * sum_j q_j[r, n] x_j[r] - (z s)[r, n] * sum_j x_j[r].
    The next tile's words and scales are loaded before this tile is computed (register
    double buffering: in a plain range loop Triton's pipeliner stages only loads that feed a
    tl.dot; tl.range(num_stages=) would stage them, see kernels/w4a16_gemv.py PIPE).
    """
    pdl_enter(PDL)
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
    USE_ASM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """out[pid_k, m, n] = sum over this split's k of x[m, k] * W[k, n] via tl.dot.

    Default: unpack the tile to [BLOCK_K, BLOCK_N] in k order and issue one tl.dot.
    NIBBLE_DOTS: consume it nibble by nibble instead, dot j multiplying x[:, k0 + 8r + j]
    (BM, BK8) by W[k0 + 8r + j, :] (BK8, BN): each plane keeps the packed tile's register
    layout, at the price of eight K=BK8 dots (BLOCK_K >= 128 so BK8 >= 16). FP16_PLANES
    (fp16 x, not with NIBBLE_DOTS): the planes come from inline PTX in fp16
    (w4a16_planes.py; USE_ASM=False: its plain-Triton twin), joined into one [BK, BN] tile
    in k order for one dot.
    REDUCE: ``out`` holds fp32 partials and the last program of each (m, n) tile writes
    their sum to ``final`` (kernels/splitk.py).
    """
    pdl_enter(PDL)
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
            for j in tl.static_range(8):
                xj = tl.load(x_ptr + offs_m[:, None] * stride_xm
                             + (rows * 8 + j)[None, :] * stride_xk,
                             mask=m_mask[:, None] & r_mask[None, :], other=0.0)  # (BM, BK8)
                wj = (nibble_f32(packed, j) * s - zs).to(xj.dtype)  # (BK8, BN)
                acc = tl.dot(xj, wj, acc, input_precision=DOT_PRECISION)
        elif FP16_PLANES:  # the eight fp16 planes joined into one K = BK tile
            s, zs = _scale_rows(s_ptr, z_ptr, k0, rows, offs_n, n_mask, K, group_size,
                                stride_sg, stride_zg, ONE_GROUP)
            w0, w1, w2, w3, w4, w5, w6, w7 = fp16_planes(packed, s, zs, USE_ASM)
            w = join_planes(w0, w1, w2, w3, w4, w5, w6, w7, BLOCK_K, BLOCK_N)
            cols = k0 + tl.arange(0, BLOCK_K)
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


def launch_gemv(cfg: Gemv, x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                zeros: torch.Tensor, group_size: int, integer_zeros: bool = False,
                planes_packed: bool = False) -> torch.Tensor:
    """x2 [1, K] @ W, [1, N], by the fp32 one-row GEMV (split K summed by a second launch).
    ``planes_packed``: x permuted to the words' order (a copy)."""
    m, k = x2.shape
    if m != 1:
        raise ValueError(f"the fp32 GEMV serves one activation row, got {m}: {cfg}")
    n = qweight.shape[1]
    if planes_packed:
        x2 = unplane_order(x2)
    qweight, scales, zeros = qweight.contiguous(), scales.contiguous(), zeros.contiguous()
    split, k_per_split = splitk.plan(cdiv(n, cfg.block_n), k, cfg.block_k, cfg.split_k,
                                     cfg.waves, cfg.min_k_tiles, num_sms(x2.device))
    out = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    target, _, _ = splitk.buffers(out, split, 0, fused=False)
    _w4a16_gemv_kernel[(cdiv(n, cfg.block_n), split)](
        x2, qweight, scales, zeros, target, n, k, k_per_split, group_size,
        x2.stride(1), qweight.stride(0), scales.stride(0), zeros.stride(0),
        target.stride(0), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_kwargs(x2.device))
    return splitk.finish(target, out, None)


def launch_dot(cfg: Dot, x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
               zeros: torch.Tensor, group_size: int, integer_zeros: bool = False,
               planes_packed: bool = False) -> torch.Tensor:
    """x2 [M, K] @ W, [M, N] (x2's dtype), by the "dot" kernel in ``cfg``'s configuration.

    The k-order tile keeps each K tile inside one group (block_k halved down to 16 until it
    divides the group size): per-row [BK, BN] scale tiles would be staged in shared memory
    by the pipeliner (> 99 KB for BM=64, BK=64 at group_size 32). Groups it cannot fit (not
    a multiple of 16) take the dequantize pass. ``planes_packed``: x permuted to the words'
    order (a copy)."""
    m, k = x2.shape
    n = qweight.shape[1]
    block_k = cfg.block_k
    if not cfg.nibble_dots and group_size < k:
        while block_k > 16 and group_size % block_k:
            block_k //= 2
    one_group = group_size >= k or group_size % block_k == 0
    if not (cfg.nibble_dots or one_group):
        return launch_dequant(Dequant(), x2, qweight, scales, zeros, group_size,
                              planes_packed=planes_packed)
    if planes_packed:
        x2 = unplane_order(x2)
    qweight, scales, zeros = qweight.contiguous(), scales.contiguous(), zeros.contiguous()
    t = splitk.tiled(x2, n, block_k, cfg)
    target, final, counters, split = t.target, t.final, t.counters, t.split
    reduce = counters is not None
    _w4a16_dot_kernel[t.grid](
        x2, qweight, scales, zeros, target, final, counters if reduce else target,
        m, n, k, t.k_per_split, group_size, split,
        x2.stride(0), x2.stride(1), qweight.stride(0), scales.stride(0), zeros.stride(0),
        target.stride(1), target.stride(0), final.stride(-2), BLOCK_M=t.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=block_k, ONE_GROUP=one_group,
        NIBBLE_DOTS=cfg.nibble_dots,
        DOT_PRECISION="ieee" if x2.dtype == torch.float32 else "tf32", REDUCE=reduce,
        FP16_PLANES=cfg.fp16_planes and x2.dtype == torch.float16,  # bf16: fp32 unpacking
        USE_ASM=not envs.TRITON_INTERPRET.get(),
        SPLIT_P2=next_pow2(split) if reduce else 1,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_kwargs(x2.device))
    return splitk.finish(target, t.out, counters)
