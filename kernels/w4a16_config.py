"""Launch configurations of the W4A16 kernels and the choice between them by shape (the
thresholds come from the measurements in notes/kernels.md)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .grid import next_pow2

__all__ = ["W4A16Config", "auto_split", "pick_config"]


@dataclass(frozen=True)
class W4A16Config:
    """One launch configuration. ``kind`` is "gemv16" (fp16x2 pairs in PTX, M <= 16 in chunks
    of ``rows`` <= 4 activation rows), "gemv" (M == 1 only), "dot", "swap" (the weights as
    the dot's left operand, kernels/w4a16_swap.py; ``nibble_dots`` there means eight plane
    dots instead of one joined tile) or "dequant"."""

    kind: str
    block_m: int = 16
    block_n: int = 128
    block_k: int = 64
    split_k: int = 1  # 0: choose from the GPU size (see auto_split)
    num_warps: int = 4
    num_stages: int = 3
    nibble_dots: bool = False  # "dot": eight K/8 dots on nibble planes (needs block_k >= 128)
    rows: int = 4  # "gemv16": activation rows per program (1..4)
    chain4: bool = False  # "gemv16": four fp16 products per partial sum (see w4a16_gemv.py)
    per_tile_scales: bool = True  # "gemv16": one scale row per K tile when tiles fit groups
    fold_zero: bool = False  # "gemv16", per-tile scales, chain4: z in the PTX constants
    # (exact only for integer zero points, which every checkpoint format has)
    flat_scales: bool = False  # "gemv16", per-tile scales: 1-D scale rows, 16-byte x loads,
    # no masks on whole tiles (kernels/w4a16_gemv.py FLAT/EVEN)
    pipe_stages: int = 0  # "gemv16": > 0 stages the tile loads through shared memory by
    # cp.async (kernels/w4a16_gemv.py PIPE) instead of register double buffering
    waves: float = 2  # split_k=0: programs per multiprocessor to aim for (see auto_split)
    min_k_tiles: int = 4  # split_k=0: K tiles each split keeps at least
    fused_reduce: bool = True  # split K: the kernel's last program sums (kernels/splitk.py)
    fp16_planes: bool = False  # "dot", fp16 x: weight planes from PTX (w4a16_planes.py)
    plane_major: bool = False  # fp16_planes without nibble_dots: tile rows in plane order
    # (x read in that column order) instead of k order; measured slower on "dot" (session
    # 12). On the joined "swap" tile: plane-packed words only, whose plane order is x's
    # natural order (no copy of x; dispatched on wgmma at 33-64 rows, session 24)
    x_planes: bool = False  # "swap" with nibble_dots: x copied with the columns of each K tile
    # in plane order first (w4a16_swap.plane_order), so each plane dot reads one contiguous
    # slice of x (needs K a multiple of block_k)
    x_split: bool = False  # "swap" with nibble_dots: x's K tile loaded whole and split into its
    # eight planes in registers (kernels/w4a16_swap.py)


def auto_split(tiles: int, k: int, block_k: int, sms: int, waves: float = 2,
               min_k_tiles: int = 4) -> int:
    """Split K until the grid covers about ``waves`` programs per multiprocessor, keeping at
    least ``min_k_tiles`` K tiles per split."""
    split = 1
    while (tiles * split < waves * sms and k // (2 * split) >= min_k_tiles * block_k
           and split < 32):
        split *= 2
    return split


@functools.lru_cache(maxsize=8192)  # pure; called for every W4A16 launch (~3 us)
def pick_config(m: int, n: int, k: int, group_size: int, sms: int,
                half: bool = True, fp16: bool | None = None,
                integer_zeros: bool = False, mma_sync: bool = False,
                planes_packed: bool = False) -> W4A16Config:
    """The tuned launch choice for an (M, N, K) problem.

    From the sweep in benchmarks/kernels_bench.py on an H200 (notes/kernels.md): the best
    geometric-mean variant per M bucket over the eight Llama-2/Qwen2.5-7B shapes; above
    M = 64 dequantize + cuBLAS won every shape but one. Every config fits 99 KB of shared
    memory on sm_86/89 (tests/test_kernels_compile.py). ``half``: fp16/bf16 activations, which
    the fp16x2 "gemv16" path serves for M <= 2 (fp32 ones keep the fp32 kernels). ``fp16``
    (default: ``half``): fp16 rather than bf16 activations, which take the "swap" kernel at
    3-64 rows (bf16 keeps the paths measured for it). ``integer_zeros``: the caller vouches
    that every zero point is an integer (QuantLinear's are), so the one-row GEMV may fold
    them into its PTX constants. ``mma_sync``: the device's dots compile for mma.sync
    (kernels/device.py dots_from_registers: sm_8x, sm_12x), not Hopper's wgmma, which changes the
    best tile at 3-64 rows. ``planes_packed``: the words are plane-packed (pack_planes_ref),
    which changes the best tile at 3-128 rows.
    """
    fp16 = half if fp16 is None else fp16
    planes_ok = k % 128 == 0 and group_size % 128 == 0  # x_planes: whole K tiles (measured g128)
    if fp16 and m <= 2 and group_size % 128 == 0:
        # session 20 (BENCHMARKS.md): K tiles of one group (one scale row per tile, 1-D),
        # 64 columns, the tile loads staged through shared memory 4 tiles ahead (cp.async),
        # zero points folded when they are integers: geomean 2.01x / 1.61x fp16 cuBLAS at 1 /
        # 2 rows against 1.85x / 1.50x for the register-double-buffered tile below (1.90x /
        # 1.52x without the fold); the best of the sweep on every shape at one row. Split K
        # summed in the kernel at every width (session 23: Llama-2 q/k/v, N = 12,288, 2.08x /
        # 1.66x against 1.99x / 1.58x with the second launch; no other shape changes)
        return W4A16Config("gemv16", block_n=64, block_k=128, split_k=0, num_warps=4, rows=m,
                           chain4=True, fold_zero=integer_zeros, flat_scales=True, waves=2.5,
                           min_k_tiles=1, fused_reduce=True, pipe_stages=4)
    if half and m <= 2:
        # the per-shape sweep of session 12 (BENCHMARKS.md): the best split per shape gave
        # about 2.5 programs per multiprocessor (q/k/v at N = 12,288 unsplit: 2.02x where 8
        # waves' split gave 1.67x; o at N = 4,096 split 4: 1.76x). Split K summed in the
        # kernel won at N <= 4,608 and lost at the merged N of 12,288 and more (session 11).
        return W4A16Config("gemv16", block_n=32, block_k=512, split_k=0, num_warps=4, rows=m,
                           chain4=True, waves=2.5, min_k_tiles=1, fused_reduce=n <= 8192)
    if fp16 and m <= 16 and mma_sync:
        # session 21 (BENCHMARKS.md), on the H200 with DISABLE_MMA_V3=1 (mma.sync, as on the
        # 4090): eight plane dots with x's tile split into its planes in registers (mma.sync
        # takes both operands from there) 1.16-1.24x fp16 cuBLAS at 3-16 rows against 0.62x
        # for the joined swap tile below, whose loop converts the tile through shared memory.
        # The same plane dots over x copied into plane order won where the weights are large
        # enough to carry the copy (session 21's call 5, per shape): at 3-8 rows on the
        # >= 32M-weight q/k/v, gate/up and down (1.25-1.60x against 1.12-1.33x; the 16M
        # o and Qwen q/k/v lost, 0.89-1.12x against 0.99-1.26x), at 16 rows only at gate/up
        # widths (1.36 / 1.44x against 1.29 / 1.26x). Plane-packed words need no copy.
        wide = planes_packed or n >= 16384 or (m <= 8 and n * k >= 1 << 25)
        return W4A16Config("swap", 16, 64, 128, split_k=0, num_warps=4, num_stages=3,
                           fp16_planes=True, nibble_dots=True, x_split=not (planes_ok and wide),
                           x_planes=planes_ok and wide, waves=2.5, min_k_tiles=1)
    if fp16 and m <= 16 and (n >= 16384 or planes_packed) and planes_ok:
        # session 21, wgmma: at the gate/up projections' widths the plane dots over x copied
        # into plane order (a copy of about 3 us) beat the joined tile: 1.26-1.30x against
        # 1.06-1.08x (Llama-2), 1.48-1.58x against 1.31-1.33x (Qwen2.5) at 3-16 rows; at
        # N <= 12,288 the copy outweighed the gain (groups of 128 measured). On plane-packed
        # words (pack_planes_ref) they read x as it is, no copy: session 23, geomean of the
        # 8 shapes 1.50 / 1.47 / 1.40x at 4 / 8 / 16 rows (standard words, dispatched: 1.32 /
        # 1.31 / 1.28x; the joined tile fed a copy of x in the words' order: 1.06 / 1.05 /
        # 1.03x)
        return W4A16Config("swap", 16, 64, 128, split_k=0, num_warps=4, num_stages=3,
                           fp16_planes=True, nibble_dots=True, x_planes=True, waves=2.5,
                           min_k_tiles=1)
    if fp16 and m <= 64 and planes_ok and (mma_sync or (planes_packed and m <= 32)):
        # session 22 (BENCHMARKS.md), DISABLE_MMA_V3=1: at 17-64 rows the plane dots over x
        # copied into plane order beat the "dot" kernel below on 31 of 32 shape/row cells:
        # geomean 0.92 / 0.88 / 0.67 / 0.59x fp16 cuBLAS at 24 / 32 / 48 / 64 rows against
        # 0.79 / 0.78 / 0.49 / 0.48x (x split in registers: 0.38x at 64, register-bound).
        # wgmma, plane-packed words (no copy; session 23): 1.19 / 1.11 / 0.79x at 24 / 32 /
        # 48 rows against 0.96 / 0.95 / 0.77x for the joined tile fed a copy of x; above 32
        # rows the joined tile below with its columns in plane order wins (session 24: 0.86 /
        # 0.84x at 48 / 64 rows against 0.78x for the plane dots, 0.77 / 0.75x + copy). On
        # mma.sync the plane dots win at every row count (session 24: 0.74 / 0.66x at 48 / 64
        # rows against 0.50 / 0.49x for that tile; standard words 0.67 / 0.59x)
        return W4A16Config("swap", 32 if m <= 32 else 64, 64, 128, split_k=0, num_warps=4,
                           num_stages=3, fp16_planes=True, nibble_dots=True, x_planes=True,
                           fused_reduce=False, waves=2, min_k_tiles=4)
    if fp16 and m <= 64 and not mma_sync:
        # the weights as the MMA's left operand, from registers (kernels/w4a16_swap.py):
        # session 13's sweep, geomean over the eight 7B shapes against the paths it replaced:
        # 1.26 vs 1.10x at 4 rows (gemv16), 1.23 vs 0.95x at 16, 0.85 vs 0.77x at 64 (dot).
        # On plane-packed words (33-64 rows here) its columns follow the words' plane order,
        # so it reads x as it is (no copy)
        bm = min(64, max(16, next_pow2(m)))
        return W4A16Config("swap", bm, 64, 128, split_k=0, num_warps=4, num_stages=3,
                           fused_reduce=m <= 16, fp16_planes=True,
                           plane_major=planes_packed and planes_ok)
    if (fp16 and planes_packed and planes_ok and not mma_sync and 64 < m <= 128
            and n * k >= 1 << 24):
        # session 24, wgmma, plane-packed words: the joined tile in plane order over row
        # tiles of 128 beats dequantize + cuBLAS at 65-128 rows on the six >= 16M-weight
        # shapes (geomean of the 8: 0.61 / 0.57x fp16 cuBLAS at 96 / 128 rows against 0.51 /
        # 0.49x; per shape e.g. Llama-2 down 0.74 / 0.71x against 0.50 / 0.49x) and loses on
        # Qwen2.5's 13-16M q/k/v and o (0.46-0.52x against 0.57-0.60x at 128). Above 128
        # rows dequantize + cuBLAS wins (0.51 / 0.57x at 160 / 256 against 0.39 / 0.47x)
        return W4A16Config("swap", 128, 64, 128, split_k=0, num_warps=4, num_stages=3,
                           fused_reduce=False, fp16_planes=True, plane_major=True, waves=1,
                           min_k_tiles=4)
    if half and m <= 4:  # 1.13x geomean at M = 4, the old nibble-plane dots 0.92x
        return W4A16Config("gemv16", block_n=32, block_k=256, split_k=0, num_warps=4, rows=m,
                           chain4=True, waves=2, min_k_tiles=2)
    if m == 1:
        block_k = 256 if n * k >= (32 << 20) else 128  # more bytes in flight per program
        return W4A16Config("gemv", block_n=64, block_k=block_k, split_k=0, num_warps=4)
    if m <= 4:
        return W4A16Config("dot", 16, 64, 128, split_k=0, num_warps=4, nibble_dots=True)
    if m <= 64:  # split K summed in the kernel lost at 32-64 rows (o: 0.69 vs 0.84x at 32)
        # fp16 x: the weight planes from PTX joined into one tile in k order (0.99 / 0.95 /
        # 0.78 / 0.78x geomean at 8 / 16 / 32 / 64 rows against 0.88 / 0.86 / 0.79 / 0.69x
        # for the fp32 unpacking, session 12); bf16 x keeps the fp32 unpacking
        return W4A16Config("dot", min(64, max(16, next_pow2(m))), 128, 64,
                           split_k=0, num_warps=4, num_stages=3, fused_reduce=m <= 16,
                           fp16_planes=half, plane_major=False)
    return W4A16Config("dequant")
