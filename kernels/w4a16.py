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

Paths, by the number of activation rows M (thresholds measured, w4a16_config.py):
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
    programs per multiprocessor (the per-shape best). fp16 with groups of a
    multiple of 128: K tiles of one group, loads staged through shared memory (cp.async)
    and, when the caller vouches for integer zero points, the zeros folded into the PTX.
  * fp32 activations (the interpreter's tests), M == 1, "gemv" (kernels/w4a16_dot.py, as
    "dot" below): no tensor cores; works on the
    packed [BK/8, BN] tile nibble by nibble (no reshape), accumulating in a 2-D fp32 register
    tile reduced once at the end.
  * fp32, M 2..4: tl.dot on each nibble plane (eight K = BK/8 dots), BLOCK_M 16.
  * bf16 M 5..64 (fp16 on mma.sync GPUs at 17..64 where K or the group size is not a
    multiple of 128): the tile unpacked to [BK, BN] in k
    order, one tl.dot (BLOCK_K kept inside a group so scales are one [1, BN] row); with fp16
    activations the unpacking is the inline-PTX planes of w4a16_planes.py joined into it.
  * both split K over a third grid axis when the (M, N) tiles alone cannot fill the GPU; the
    fp32 partial sums [SPLIT, M, N] are added by a small reduce kernel.
  * M > 64 (but see plane-packed words): dequantize W to the activation dtype (one Triton
    pass) and torch.matmul (cuBLAS).
"""

from __future__ import annotations

import torch

from edge_llm import envs

from .device import dots_from_registers, num_sms
from .fused import silu_and_mul
from .grid import cdiv, next_pow2
from .splitk import counters as splitk_counters
from .splitk import reduce_partials
from .w4a16_config import W4A16Config, auto_split, pick_config
from .w4a16_dequant import dequantize_w4a16
from .w4a16_dot import launch_dot, launch_gemv
from .w4a16_gemv import launch_gemv16
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

# --------------------------------------------------------------------------- host side


def _interpreting() -> bool:
    return envs.TRITON_INTERPRET.get()


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    config: W4A16Config | None = None,
    integer_zeros: bool = False,
    planes_packed: bool = False,
    silu_mul: bool = False,
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

    ``silu_mul``: W is a merged [gate | up] projection and the result is silu(gate) * up,
    [..., N / 2] (``fused.silu_and_mul`` of y): computed in the one-row GEMV's epilogue when
    that kernel serves the shape in one split (``gemv16_silu``), else by that second kernel.
    """
    k, n = _check_inputs(x, qweight, scales, zeros, group_size)
    if silu_mul and n % 2:
        raise ValueError(f"silu_mul: W must have an even number of columns (gate | up), got {n}")
    if planes_packed:
        check_planes(k, group_size)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)  # (M, K)
    m = x2.shape[0]
    if m == 0:
        return torch.empty((*lead, n // 2 if silu_mul else n), device=x.device, dtype=x.dtype)
    y, fused = _matmul(x2, qweight, scales, zeros, group_size, config, integer_zeros,
                       planes_packed, silu_mul)
    y = y.reshape(*lead, y.shape[-1])
    return silu_and_mul(y) if silu_mul and not fused else y


def gemv16_silu(cfg: W4A16Config, m: int, n: int, k: int, block_k: int, sms: int) -> bool:
    """Whether ``cfg`` computes silu(gate) * up in its epilogue for a merged [gate | up] W of
    N columns: the one-row GEMV ("gemv16") in one split, N / 2 a multiple of half its
    column tile."""
    if cfg.kind != "gemv16" or n % cfg.block_n:
        return False
    return _split(cfg, m, n, k, block_k, sms)[0] == 1


def _matmul(x2, qweight, scales, zeros, group_size, config, integer_zeros, planes_packed,
            silu: bool) -> tuple[torch.Tensor, bool]:
    """(M, K) x2 @ W, (M, N); with ``silu``, (M, N / 2) silu(gate) * up where the chosen
    kernel has that epilogue (``gemv16_silu``). Returns (result, whether it is the
    epilogue's)."""
    (m, k), n = x2.shape, qweight.shape[1]
    sms = num_sms(x2.device)
    cfg = config or pick_config(m, n, k, group_size, sms, half=x2.dtype != torch.float32,
                                fp16=x2.dtype == torch.float16, integer_zeros=integer_zeros,
                                mma_sync=dots_from_registers(x2.device),
                                planes_packed=planes_packed)
    block_k = cfg.block_k
    if cfg.kind == "dot" and not cfg.nibble_dots and group_size < k:
        # keep each K tile inside one group: per-row [BK, BN] scale tiles would be staged in
        # shared memory by the pipeliner (> 99 KB for BM=64, BK=64 at group_size 32)
        while block_k > 16 and group_size % block_k:
            block_k //= 2
    one_group = group_size >= k or group_size % block_k == 0  # every K tile in one group
    odd_groups = cfg.kind == "dot" and not cfg.nibble_dots and not one_group
    silu = silu and group_size % PACK == 0 and gemv16_silu(cfg, m, n, k, block_k, sms)
    if cfg.kind == "dequant" or group_size % PACK or odd_groups or (
            cfg.kind == "gemv" and m != 1):
        w = dequantize_w4a16(qweight, scales, zeros, group_size, dtype=x2.dtype, reuse=True,
                             planes_packed=planes_packed)
        return torch.matmul(x2, w), False
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
    out = torch.empty((m, n // 2 if silu else n), device=x2.device, dtype=x2.dtype)
    _launch_fused(x2, qweight.contiguous(), scales.contiguous(), zeros.contiguous(), out,
                  group_size, cfg, block_k, one_group, sms, gemv_planes, silu)
    return out, silu


def _split(cfg: W4A16Config, m: int, n: int, k: int, block_k: int,
           sms: int) -> tuple[int, int]:
    """(K splits, output tiles) of the launch of ``cfg`` for an (M, N, K) problem."""
    block_m = max(16, next_pow2(cfg.block_m))
    m_tiles = (cdiv(m, block_m) if cfg.kind in ("dot", "swap") else
               cdiv(m, cfg.rows) if cfg.kind == "gemv16" else 1)
    tiles = m_tiles * cdiv(n, cfg.block_n)
    split = cfg.split_k or auto_split(tiles, k, block_k, sms, cfg.waves, cfg.min_k_tiles)
    return cdiv(k, cdiv(cdiv(k, split), block_k) * block_k), tiles


def _launch_fused(x2, qweight, scales, zeros, out, group_size: int, cfg: W4A16Config,
                  block_k: int, one_group: bool, sms: int, gemv_planes: bool = False,
                  silu: bool = False) -> None:
    """GEMV or dot kernel into ``out`` [M, N] ([M, N / 2] with ``silu``); fp32 partials +
    reduce when K is split."""
    m, k = x2.shape
    n = qweight.shape[1]
    block_m = max(16, next_pow2(cfg.block_m))
    split, tiles = _split(cfg, m, n, k, block_k, sms)
    k_per_split = cdiv(cdiv(k, split), block_k) * block_k
    target = torch.empty((split, m, n), device=x2.device, dtype=torch.float32) if split > 1 \
        else out.view(1, m, out.shape[1])  # (SPLIT, M, N); N / 2 with silu
    # the last program of each tile sums the partials (kernels/splitk.py) on the fp16x2 and
    # dot paths; the fp32 GEMV, or no counters to hand, takes a second launch
    cnt = splitk_counters(x2.device, tiles) if (
        split > 1 and cfg.fused_reduce and cfg.kind != "gemv") else None
    final = out if cnt is not None else target
    if cfg.kind == "gemv16":
        launch_gemv16(x2, qweight, scales, zeros, target, group_size, cfg.rows, cfg.block_n,
                      block_k, k_per_split, split, cfg.num_warps, cfg.num_stages,
                      use_asm=not _interpreting(), per_tile_scales=cfg.per_tile_scales,
                      chain4=cfg.chain4, fold_zero=cfg.fold_zero,
                      flat_scales=cfg.flat_scales, pipe=cfg.pipe_stages,
                      final=out if cnt is not None else None, counters=cnt,
                      planes=gemv_planes, silu=silu)
    elif cfg.kind == "swap":
        launch_swap(x2, qweight, scales, zeros, target, final, cnt, group_size, block_m,
                    cfg.block_n, block_k, k_per_split, split, one_group,
                    joined=not cfg.nibble_dots, planes=cfg.fp16_planes,
                    use_asm=not _interpreting(), num_warps=cfg.num_warps,
                    num_stages=cfg.num_stages, x_planes=cfg.x_planes,
                    x_split=cfg.x_split, plane_major=cfg.plane_major and not cfg.nibble_dots)
    elif cfg.kind == "gemv":
        launch_gemv(x2, qweight, scales, zeros, target, group_size, cfg.block_n, block_k,
                    k_per_split, split, cfg.num_warps, cfg.num_stages)
    else:
        launch_dot(x2, qweight, scales, zeros, target, final, cnt, group_size, block_m,
                   cfg.block_n, block_k, k_per_split, split, one_group, cfg.nibble_dots,
                   cfg.fp16_planes, cfg.plane_major, not _interpreting(), cfg.num_warps,
                   cfg.num_stages)
    if split > 1 and cnt is None:
        reduce_partials(target, out)
