"""Launch configurations of the W4A16 kernels and the choice between them by shape. Each
threshold is where the measured winner changes (BENCHMARKS.md, "Kernels"; the sweep is
benchmarks/gemv_sweep.py)."""

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
    # (x read in that column order) instead of k order; slower on "dot". On the joined "swap"
    # tile: plane-packed words only, whose plane order is x's natural order (no copy of x)
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

    Per M bucket, the variant with the best geometric mean over the eight Llama-2 /
    Qwen2.5-7B linear shapes against fp16 cuBLAS (benchmarks/gemv_sweep.py); above M = 64
    (128 on plane-packed words) dequantize + cuBLAS wins. Every config fits 99 KB of shared
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
        # K tiles of one group (one scale row per tile, 1-D), 64 columns, the tile loads
        # staged through shared memory 4 tiles ahead (cp.async), zero points folded when they
        # are integers: the fewest instructions per weight byte, so the closest to copy
        # bandwidth of every variant at 1-2 rows. Split K summed in the kernel at every width
        # (no second launch)
        return W4A16Config("gemv16", block_n=64, block_k=128, split_k=0, num_warps=4, rows=m,
                           chain4=True, fold_zero=integer_zeros, flat_scales=True, waves=2.5,
                           min_k_tiles=1, fused_reduce=True, pipe_stages=4)
    if half and m <= 2:
        # groups that are not a multiple of 128: split K to about 2.5 programs per
        # multiprocessor (the best split per shape); summed in the kernel up to N = 8,192,
        # by a second launch above (where the in-kernel sum's serialisation costs more)
        return W4A16Config("gemv16", block_n=32, block_k=512, split_k=0, num_warps=4, rows=m,
                           chain4=True, waves=2.5, min_k_tiles=1, fused_reduce=n <= 8192)
    if fp16 and m <= 16 and mma_sync:
        # mma.sync (sm_8x, sm_12x): eight plane dots with x's tile split into its planes in
        # registers, since mma.sync takes both operands from there; the joined swap tile
        # below converts its tile through shared memory instead. Where the weights are large
        # enough to carry a copy of x into plane order (>= 32M weights at 3-8 rows, gate/up
        # widths at 16) the dots read that copy instead. Plane-packed words need no copy.
        wide = planes_packed or n >= 16384 or (m <= 8 and n * k >= 1 << 25)
        return W4A16Config("swap", 16, 64, 128, split_k=0, num_warps=4, num_stages=3,
                           fp16_planes=True, nibble_dots=True, x_split=not (planes_ok and wide),
                           x_planes=planes_ok and wide, waves=2.5, min_k_tiles=1)
    if fp16 and m <= 16 and (n >= 16384 or planes_packed) and planes_ok:
        # wgmma, 3-16 rows: the plane dots beat the joined tile where they read x as it is
        # (plane-packed words, pack_planes_ref) or where the weights are wide enough (the
        # gate/up projections) to carry the copy of x into plane order; at N <= 12,288 on
        # standard words the copy outweighs the gain
        return W4A16Config("swap", 16, 64, 128, split_k=0, num_warps=4, num_stages=3,
                           fp16_planes=True, nibble_dots=True, x_planes=True, waves=2.5,
                           min_k_tiles=1)
    if fp16 and m <= 64 and planes_ok and (mma_sync or (planes_packed and m <= 32)):
        # 17-64 rows: on mma.sync the plane dots over x in plane order beat the "dot" kernel
        # (splitting x in registers instead runs out of registers here); on wgmma with
        # plane-packed words they win up to 32 rows, above which the joined tile below with
        # its columns in plane order wins
        return W4A16Config("swap", 32 if m <= 32 else 64, 64, 128, split_k=0, num_warps=4,
                           num_stages=3, fp16_planes=True, nibble_dots=True, x_planes=True,
                           fused_reduce=False, waves=2, min_k_tiles=4)
    if fp16 and m <= 64 and not mma_sync:
        # the weights as the MMA's left operand, from registers (kernels/w4a16_swap.py): on
        # wgmma the dequantized tile never goes through shared memory, which beats both the
        # GEMV and the "dot" kernel at 3-64 rows. On plane-packed words (33-64 rows here) its
        # columns follow the words' plane order, so it reads x as it is (no copy)
        bm = min(64, max(16, next_pow2(m)))
        return W4A16Config("swap", bm, 64, 128, split_k=0, num_warps=4, num_stages=3,
                           fused_reduce=m <= 16, fp16_planes=True,
                           plane_major=planes_packed and planes_ok)
    if (fp16 and planes_packed and planes_ok and not mma_sync and 64 < m <= 128
            and n * k >= 1 << 24):
        # wgmma, plane-packed words, 65-128 rows: the joined tile in plane order over row
        # tiles of 128 beats dequantize + cuBLAS on shapes of >= 16M weights (the smaller
        # ones amortise the dequantization better); above 128 rows cuBLAS wins
        return W4A16Config("swap", 128, 64, 128, split_k=0, num_warps=4, num_stages=3,
                           fused_reduce=False, fp16_planes=True, plane_major=True, waves=1,
                           min_k_tiles=4)
    if half and m <= 4:  # the fp16x2 GEMV beats the nibble-plane dots at 3-4 rows
        return W4A16Config("gemv16", block_n=32, block_k=256, split_k=0, num_warps=4, rows=m,
                           chain4=True, waves=2, min_k_tiles=2)
    if m == 1:
        block_k = 256 if n * k >= (32 << 20) else 128  # more bytes in flight per program
        return W4A16Config("gemv", block_n=64, block_k=block_k, split_k=0, num_warps=4)
    if m <= 4:
        return W4A16Config("dot", 16, 64, 128, split_k=0, num_warps=4, nibble_dots=True)
    if m <= 64:  # split K summed in the kernel serialises too much at 32-64 rows
        # fp16 x: the weight planes from PTX joined into one tile in k order (fewer
        # instructions than the fp32 unpacking); bf16 x keeps the fp32 unpacking
        return W4A16Config("dot", min(64, max(16, next_pow2(m))), 128, 64,
                           split_k=0, num_warps=4, num_stages=3, fused_reduce=m <= 16,
                           fp16_planes=half, plane_major=False)
    return W4A16Config("dequant")
