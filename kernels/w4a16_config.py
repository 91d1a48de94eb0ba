"""Which W4A16 kernel serves an (M, N, K) problem, with which parameters: one frozen config
type per kernel kind and, per GPU family, a table of rows "conditions -> config".

The rows are the measured winners per row-count bucket over the Llama-2-7B / Qwen2.5-7B
linear shapes (BENCHMARKS.md, "Kernels: how fast against cuBLAS and SDPA?"; the candidates
are re-measured against the table's choice by ``benchmarks/kernels_bench.py sweep``). Every
mma.sync row fits the 99 KB of shared memory of sm_86/89 (tests/test_kernels_compile.py), and
the rows of each table cover every problem exactly once (tests/test_kernels_ref.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Dequant", "Dot", "Gemv", "Gemv16", "Row", "Swap", "W4A16Config", "TABLES", "lookup",
]

Act = Literal["fp16", "bf16", "fp32"]
Family = Literal["wgmma", "mma_sync"]
INF = 1 << 62


@dataclass(frozen=True, kw_only=True)
class _SplitK:
    """How K is split over a third grid axis (kernels/splitk.py): ``split_k`` > 0 splits that
    many ways; 0 splits until the grid holds about ``waves`` programs per multiprocessor,
    keeping at least ``min_k_tiles`` K tiles per split (``splitk.auto_split``)."""

    split_k: int = 0
    waves: float = 2
    min_k_tiles: int = 4
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True, kw_only=True)
class Gemv16(_SplitK):
    """The fp16x2 PTX GEMV (kernels/w4a16_gemv.py): ``rows`` activation rows per program
    (1..4; None: all of M up to 4). ``fold_zero``: zero points in the PTX constants where the
    caller vouches they are integers (exact only then), with one scale row per K tile, at
    1-2 rows. ``flat_scales``: 1-D scale rows and 16-byte x loads (FLAT/EVEN).
    ``pipe_stages`` > 0: tile loads staged through shared memory by cp.async (PIPE); 0:
    register double buffering. ``fused_reduce``: split K summed by the last program of a
    tile, else by a second launch."""

    block_n: int
    block_k: int
    rows: int | None = None
    fold_zero: bool = False
    flat_scales: bool = False
    pipe_stages: int = 0
    fused_reduce: bool = True


@dataclass(frozen=True, kw_only=True)
class Gemv(_SplitK):
    """The fp32 one-row GEMV without tensor cores (kernels/w4a16_dot.py); one activation
    row only; split K summed by a second launch."""

    block_n: int = 64
    block_k: int = 128


@dataclass(frozen=True, kw_only=True)
class Dot(_SplitK):
    """x [BM, BK] @ W [BK, BN] by tl.dot (kernels/w4a16_dot.py). ``block_m`` None:
    next_pow2(M) within 16..64. ``nibble_dots``: eight K = BK/8 dots on the fp32-unpacked
    nibble planes (block_k >= 128); else one tile in k order (its K tile kept inside one
    group), unpacked in fp32 or, with ``fp16_planes`` and fp16 x, from the PTX planes of
    kernels/w4a16_planes.py."""

    block_m: int | None = None
    block_n: int = 128
    block_k: int = 64
    nibble_dots: bool = False
    fp16_planes: bool = False
    fused_reduce: bool = True

    def __post_init__(self) -> None:
        if self.nibble_dots and self.fp16_planes:
            raise ValueError(f"the fp16 planes join into one tile (no nibble_dots): {self}")


@dataclass(frozen=True, kw_only=True)
class Swap(_SplitK):
    """out^T = W^T x^T with the fp16 weight planes (PTX) as the MMA's left operand, fp16 x
    (kernels/w4a16_swap.py). One joined tile (``plane_major``: its columns in plane order,
    for plane-packed words with block_k 128), or eight plane dots (block_k >= 128) over a
    copy of x in plane order (``x_planes``; K a multiple of block_k; none needed on
    plane-packed words) or over x's tile split into planes in registers (``x_split``)."""

    block_m: int | None = None
    block_n: int = 64
    block_k: int = 128
    plane_major: bool = False
    x_planes: bool = False
    x_split: bool = False
    fused_reduce: bool = True

    def __post_init__(self) -> None:
        if self.x_planes + self.x_split + self.plane_major > 1:
            raise ValueError(f"x_planes, x_split and plane_major exclude each other: {self}")


@dataclass(frozen=True)
class Dequant:
    """W dequantized to x's dtype in one Triton pass (kernels/w4a16_dequant.py), then
    torch.matmul (cuBLAS)."""


W4A16Config = Gemv16 | Gemv | Dot | Swap | Dequant


@dataclass(frozen=True)
class Row:
    """Conditions (inclusive ranges) -> config. ``g128``: group size a multiple of 128;
    ``tiles128``: K too (whole 128-row K tiles in one group: what a copy of x in plane
    order, and plane-packed words, need); ``packed``: plane-packed words (implies
    tiles128); ``weights``: N * K. None: either."""

    m: tuple[int, int]
    act: Act
    config: W4A16Config
    g128: bool | None = None
    tiles128: bool | None = None
    packed: bool | None = None
    n: tuple[int, int] = (1, INF)
    weights: tuple[int, int] = (1, INF)

    def matches(self, act: Act, m: int, n: int, k: int, group_size: int,
                packed: bool) -> bool:
        g128 = group_size % 128 == 0
        return (self.act == act and self.m[0] <= m <= self.m[1]
                and self.n[0] <= n <= self.n[1] and self.weights[0] <= n * k <= self.weights[1]
                and self.g128 in (None, g128) and self.packed in (None, packed)
                and self.tiles128 in (None, g128 and k % 128 == 0))


M32 = 1 << 25  # 32M weights
# 1-2 rows: the fp16x2 GEMV. Groups of 128k (fp16): one-group K tiles, 64 columns, loads
# staged 4 tiles ahead, zero points folded: the closest to copy bandwidth. Otherwise 32
# columns by 512; split K summed in the kernel up to N = 8,192, by a second launch above
# (where the in-kernel sum's serialisation costs more). 3-4 rows (bf16): 32 by 256.
G16_PIPE = Gemv16(block_n=64, block_k=128, fold_zero=True, flat_scales=True, pipe_stages=4,
                  waves=2.5, min_k_tiles=1)
G16_WIDE = Gemv16(block_n=32, block_k=512, waves=2.5, min_k_tiles=1)
G16_WIDE_2L = Gemv16(block_n=32, block_k=512, waves=2.5, min_k_tiles=1, fused_reduce=False)
G16_FOUR = Gemv16(block_n=32, block_k=256, min_k_tiles=2)
# the swap kernel's plane dots at 3-16 rows: over a copy of x in plane order (or x as it is
# on plane-packed words), or (mma.sync) x's tile split into planes in registers
PLANES_FEW = Swap(block_m=16, x_planes=True, waves=2.5, min_k_tiles=1)
SPLIT_FEW = Swap(block_m=16, x_split=True, waves=2.5, min_k_tiles=1)
PLANES_MANY = Swap(x_planes=True, fused_reduce=False)  # 17-64 rows
JOINED_FEW = Swap()  # one joined tile in k order, split K summed in the kernel (3-16 rows)
JOINED_MANY = Swap(fused_reduce=False)  # 17-64: the in-kernel sum serialises too much
JOINED_PM = Swap(plane_major=True, fused_reduce=False)  # plane-packed words: x as it is
JOINED_PM128 = Swap(block_m=128, plane_major=True, fused_reduce=False, waves=1)
DOT_FEW = Dot()  # 5-16 rows: the tile unpacked in k order, split K summed in the kernel
DOT_MANY = Dot(fused_reduce=False)
DOT16_MANY = Dot(fp16_planes=True, fused_reduce=False)  # the PTX planes joined in k order
DEQUANT = Dequant()

# bf16 and fp32 activations: the same rows on both families
_BF16_FP32 = [
    Row((1, 2), "bf16", G16_WIDE, n=(1, 8192)),
    Row((1, 2), "bf16", G16_WIDE_2L, n=(8193, INF)),
    Row((3, 4), "bf16", G16_FOUR),
    Row((5, 16), "bf16", DOT_FEW),
    Row((17, 64), "bf16", DOT_MANY),
    Row((65, INF), "bf16", DEQUANT),
    Row((1, 1), "fp32", Gemv(block_k=128), weights=(1, M32 - 1)),
    Row((1, 1), "fp32", Gemv(block_k=256), weights=(M32, INF)),  # more bytes in flight
    Row((2, 4), "fp32", Dot(block_m=16, block_n=64, block_k=128, nibble_dots=True)),
    Row((5, 16), "fp32", DOT_FEW),
    Row((17, 64), "fp32", DOT_MANY),
    Row((65, INF), "fp32", DEQUANT),
]
_FP16_ONE_TWO = [
    Row((1, 2), "fp16", G16_PIPE, g128=True),
    Row((1, 2), "fp16", G16_WIDE, g128=False, n=(1, 8192)),
    Row((1, 2), "fp16", G16_WIDE_2L, g128=False, n=(8193, INF)),
]

TABLES: dict[Family, list[Row]] = {
    # Hopper: the joined swap tile never stages the dequantized weights through shared
    # memory; the plane dots win only where they read x as it is (plane-packed words) or the
    # weights are wide enough (gate/up) to carry the copy of x into plane order
    "wgmma": _FP16_ONE_TWO + [
        Row((3, 16), "fp16", PLANES_FEW, packed=True),
        Row((3, 16), "fp16", PLANES_FEW, packed=False, tiles128=True, n=(16384, INF)),
        Row((3, 16), "fp16", JOINED_FEW, packed=False, tiles128=True, n=(1, 16383)),
        Row((3, 16), "fp16", JOINED_FEW, tiles128=False),
        Row((17, 32), "fp16", PLANES_MANY, packed=True),
        Row((33, 64), "fp16", JOINED_PM, packed=True),
        Row((17, 64), "fp16", JOINED_MANY, packed=False),
        Row((65, 128), "fp16", JOINED_PM128, packed=True, weights=(1 << 24, INF)),
        Row((65, 128), "fp16", DEQUANT, packed=True, weights=(1, (1 << 24) - 1)),
        Row((65, 128), "fp16", DEQUANT, packed=False),
        Row((129, INF), "fp16", DEQUANT),
    ] + _BF16_FP32,
    # mma.sync (sm_8x, sm_12x) takes both operands from registers: the plane dots with x's
    # tile split there, or over x in plane order where the weights carry that copy
    "mma_sync": _FP16_ONE_TWO + [
        Row((3, 16), "fp16", PLANES_FEW, packed=True),
        Row((3, 16), "fp16", PLANES_FEW, packed=False, tiles128=True, n=(16384, INF)),
        Row((3, 8), "fp16", PLANES_FEW, packed=False, tiles128=True, n=(1, 16383),
            weights=(M32, INF)),
        Row((3, 8), "fp16", SPLIT_FEW, packed=False, tiles128=True, n=(1, 16383),
            weights=(1, M32 - 1)),
        Row((9, 16), "fp16", SPLIT_FEW, packed=False, tiles128=True, n=(1, 16383)),
        Row((3, 16), "fp16", SPLIT_FEW, tiles128=False),
        Row((17, 64), "fp16", PLANES_MANY, tiles128=True),
        Row((17, 64), "fp16", DOT16_MANY, tiles128=False),
        Row((65, INF), "fp16", DEQUANT),
    ] + _BF16_FP32,
}


@functools.lru_cache(maxsize=8192)  # pure; called for every W4A16 launch
def lookup(family: Family, act: Act, m: int, n: int, k: int, group_size: int,
           packed: bool = False) -> W4A16Config:
    """The config of the one row of ``TABLES[family]`` that matches the problem; groups
    whose words straddle two groups (group_size not a multiple of 8) take the dequantize
    pass whatever the row."""
    if group_size % 8:
        return DEQUANT
    rows = [r for r in TABLES[family] if r.matches(act, m, n, k, group_size, packed)]
    if len(rows) != 1:
        raise LookupError(f"W4A16 table {family}: {len(rows)} rows match {act} M={m} N={n} "
                          f"K={k} group_size={group_size} packed={packed}")
    return rows[0].config
