"""Every W4A16 launch configuration the kernel benchmarks build, and the one place that knows
the config types' fields (``kernels/w4a16_config.py``: ``Gemv16``, ``Gemv``, ``Dot``, ``Swap``,
``Dequant``) and ``lookup``'s signature: when a config type or the dispatch table changes, this
module is what the benchmarks need adapted.

- ``kernels_variants(m)``: candidates timed beside the dispatched choice by
  ``kernels_bench.py`` (without ``--quick``); ``specials(auto, m, fp16)``: the dispatched
  config with its split K summed by a second launch (where it has a split-K sum), and the
  fp16-planes dot tiles.
- ``sweep_variants(m, n)``, ``sweep_variants_planes(m)``, ``sweep_variants_pm(m)``: the
  candidates of ``kernels_bench.py sweep`` (standard words; ``--planes``; ``--planes --pm``).
- ``patch_gemv(name or {(m, n, k): name})``: the engine's 1-2 row dispatch routed to sweep
  candidates (``kernels_bench.py graphs --variant``); ``best_per_shape(rows)``: a sweep's
  winner per problem.
"""

from __future__ import annotations

import dataclasses

from edge_llm.kernels.w4a16_config import Dequant, Dot, Gemv, Gemv16, Swap, W4A16Config


def specials(auto: W4A16Config, m: int, fp16: bool) -> dict[str, W4A16Config]:
    """Named configs timed in the same run as the dispatched ``auto``: "separate reduce" (its
    split K summed by a second launch instead of inside the kernel; only for the kinds with
    an in-kernel sum) and, above 4 fp16 rows, the fp16-planes dot path (w4a16_planes.py: the
    planes joined into one tile in k order)."""
    out: dict[str, W4A16Config] = (
        {"separate reduce": dataclasses.replace(auto, fused_reduce=False)}
        if hasattr(auto, "fused_reduce") else {})
    if m > 4 and fp16:
        bm = min(64, max(16, 1 << (m - 1).bit_length()))
        for bn, bk, warps in ((64, 128, 4), (128, 128, 8), (64, 256, 4)):
            out[f"planes bn{bn} bk{bk} w{warps}"] = Dot(
                block_m=bm, block_n=bn, block_k=bk, num_warps=warps, fp16_planes=True)
    return out


def kernels_variants(m: int) -> list[W4A16Config]:
    """kernels_bench's candidate launch configs per M, timed beside the dispatched one (all
    fit 99 KB of shared memory on sm_86/89)."""
    def dot(bm: int, bn: int, bk: int, w: int = 4, st: int = 3, nibble: bool = False) -> Dot:
        return Dot(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=st,
                   nibble_dots=nibble)

    if m == 1:
        gemv: list[W4A16Config] = [
            Gemv(block_n=bn, block_k=bk, num_warps=w)
            for bn, bk, w in ((64, 128, 4), (128, 128, 4), (128, 256, 4), (64, 256, 4),
                              (256, 128, 8), (64, 64, 2))]
        return gemv + [dot(16, 64, 128), dot(16, 64, 128, nibble=True)]
    if m <= 16:
        nib = [dot(16, bn, bk, w, st, nibble=True)
               for bn, bk, w, st in ((64, 128, 4, 3), (128, 128, 8, 3), (64, 256, 4, 3))]
        nat = [dot(16, bn, bk, w, st) for bn, bk, w, st in (
            (64, 128, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4), (128, 64, 4, 3), (32, 128, 2, 3))]
        return [*nib, *nat]
    if m <= 128:
        bm, bm2 = min(m, 64), min(m, 128)
        return [dot(bm, 64, 128), dot(bm, 128, 64), dot(bm, 128, 128, 8), dot(bm2, 128, 64, 8),
                dot(bm2, 64, 64, 4, 4), dot(bm, 128, 128, 8, nibble=True), Dequant()]
    return [*(dot(bm, bn, bk, w, st) for bm, bn, bk, w, st in (
        (64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 64, 64, 4, 3), (128, 128, 64, 4, 4),
        (64, 256, 64, 8, 3))), Dequant()]


def sweep_variants(m: int, n: int) -> dict[str, W4A16Config]:
    """The candidate launch configurations per row count, against the dispatched choice:
    at 1-2 rows the one-row GEMV's split-K choices (in-kernel sum, second launch, fixed
    splits, waves); at 3-16 rows the eight plane dots with x split in registers (the mma.sync
    choice) over tiles, stages, warps and splits; at 64 rows and above the plane dots
    against dequantize + cuBLAS; in between the "dot" kernel, the joined swap tile and the
    plane dots with x split or copied into plane order."""
    out: dict[str, W4A16Config] = {}
    if m <= 2:  # the dispatched tile with its split K summed in the kernel at every width,
        # by a second launch, or with a fixed split
        def g(bn: int, bkk: int, pipe: int, warps: int = 4, waves: float = 2.5,
              fused: bool = n <= 8192, split: int = 0) -> Gemv16:
            return Gemv16(block_n=bn, block_k=bkk, split_k=split, num_warps=warps,
                          fold_zero=True, flat_scales=True, waves=waves, min_k_tiles=1,
                          fused_reduce=fused, pipe_stages=pipe)
        out["g16 bn64 bk128 flat fold p4"] = g(64, 128, 4)
        out["g16 p4 fused"] = g(64, 128, 4, fused=True)
        out["g16 p4 reduce launch"] = g(64, 128, 4, fused=False)
        for split in (1, 2, 3, 4):
            out[f"g16 p4 fused split{split}"] = g(64, 128, 4, fused=True, split=split)
        for waves in (1.5, 4):
            out[f"g16 p4 fused v{waves}"] = g(64, 128, 4, waves=waves, fused=True)
        return out

    def pl(bm: int, bn: int, warps: int, stages: int, waves: float = 2, min_k: int = 4,
           mode: str = "split") -> Swap:
        return Swap(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages,
                    fused_reduce=m <= 16, waves=waves, min_k_tiles=min_k,
                    x_planes=mode == "planes", x_split=mode == "split")
    if m <= 16:  # mma.sync: the split plane dots' tile, stages, warps and split
        for bn, warps, st, waves, min_k in ((64, 4, 2, 2.5, 1), (64, 4, 4, 2.5, 1),
                                            (64, 4, 5, 2.5, 1), (64, 4, 3, 1.5, 1),
                                            (64, 4, 3, 4, 1), (64, 4, 3, 8, 1),
                                            (32, 2, 3, 2.5, 1), (128, 8, 3, 2.5, 1),
                                            (64, 4, 3, 2, 4)):
            out[f"split bn{bn} w{warps} st{st} v{waves}"] = pl(16, bn, warps, st, waves, min_k)
        out["split bn64 w4 st3 v2.5 bk256"] = Swap(
            block_m=16, block_k=256, waves=2.5, min_k_tiles=1, x_split=True)
        return out
    if m >= 64:  # the plane dots at 64-256 rows against dequantize + cuBLAS
        # ("planes": x copied into plane order, for wgmma; "split": x split in registers,
        # for mma.sync); tiles of 64/128 rows x 64/128 weight columns within 99 KB
        for mode in ("planes", "split"):
            for bm, bn, warps, st, waves in ((64, 64, 4, 3, 2), (64, 128, 8, 3, 2),
                                             (64, 128, 4, 3, 2), (128, 64, 4, 2, 2),
                                             (128, 128, 8, 2, 2), (128, 128, 8, 2, 1),
                                             (128, 128, 8, 2, 4)):
                out[f"{mode} bm{bm} bn{bn} w{warps} st{st} v{waves}"] = Swap(
                    block_m=bm, block_n=bn, num_warps=warps, num_stages=st, waves=waves,
                    x_planes=mode == "planes", x_split=mode == "split")
        return out
    bm = min(64, max(16, 1 << (m - 1).bit_length()))
    out[f"dot bm{bm} bn128 bk64 planes"] = Dot(block_m=bm, fused_reduce=m <= 16,
                                               fp16_planes=True)
    out[f"split bm{min(bm, 32)} bn64 w4 st3"] = pl(min(bm, 32), 64, 4, 3)
    out[f"joined bm{bm} bn64 bk128"] = Swap(block_m=bm, fused_reduce=m <= 16)
    if m > 16:
        out[f"split bm{bm} bn128 w4 st3"] = pl(bm, 128, 4, 3)
        # x copied into plane order wins at 64 rows under mma.sync: where between 17 and 64
        # does it start to win?
        for bn, warps in ((64, 4), (128, 8)):
            out[f"planes bm{bm} bn{bn} w{warps} st3 v2"] = pl(bm, bn, warps, 3, mode="planes")
    return out


def sweep_variants_planes(m: int) -> dict[str, W4A16Config]:
    """Plane-packed words (``--planes``): at 1-2 rows the one-row GEMV's launch choices; at
    3-64 rows the plane dots reading x as it is against the joined swap tile fed x permuted
    to match (a copy), or with its columns in plane order (``plane_major``: no copy)."""
    out: dict[str, W4A16Config] = {}
    if m <= 2:  # the one-row GEMV's tile, pipeline depth, warps and waves around the dispatched
        # one (64 x 128, 4 stages, 4 warps, 2.5 waves): which shapes gain from another?
        for bn, bk, pipe, warps, waves in ((32, 128, 4, 4, 2.5), (128, 128, 4, 4, 2.5),
                                           (128, 128, 4, 8, 2.5), (64, 256, 3, 4, 2.5),
                                           (32, 256, 4, 4, 2.5), (64, 128, 3, 4, 2.5),
                                           (64, 128, 6, 4, 2.5), (64, 128, 4, 2, 2.5),
                                           (64, 128, 4, 8, 2.5), (32, 128, 6, 2, 4),
                                           (64, 128, 4, 4, 4), (32, 128, 4, 4, 6)):
            out[f"g16 bn{bn} bk{bk} p{pipe} w{warps} v{waves}"] = Gemv16(
                block_n=bn, block_k=bk, pipe_stages=pipe, num_warps=warps, waves=waves,
                fold_zero=True, flat_scales=True, min_k_tiles=1)
        return out
    bm = min(64, max(16, 1 << (m - 1).bit_length()))
    for tile in sorted({16 if m <= 16 else 32 if m <= 32 else 64, bm}):
        fused = m <= 16
        out[f"planes bm{tile}"] = Swap(block_m=tile, x_planes=True,
                                       waves=2.5 if fused else 2,
                                       min_k_tiles=1 if fused else 4, fused_reduce=fused)
    out[f"joined bm{bm} + copy"] = Swap(block_m=bm, fused_reduce=m <= 16)
    # the joined tile with its columns in plane order: x as it is
    out[f"joined pm bm{bm}"] = Swap(block_m=bm, fused_reduce=m <= 16, plane_major=True)
    return out


def sweep_variants_pm(m: int) -> dict[str, W4A16Config]:
    """Plane-packed words (``--pm``): launch choices of the joined swap tile with
    its columns in plane order around the one dispatched on wgmma at 33-64 rows (BN 64, 4
    warps, 3 stages, 2 waves), and at 65-256 rows, where dequantize + cuBLAS serves."""
    out: dict[str, W4A16Config] = {}
    if m > 128:  # row tiles of 128 or 256 (the MMA's widest N), 4 / 8 warps
        grid = [(bm, bn, w, st, v, 4) for bm in (128, 256) for bn in (32, 64)
                for w in (4, 8) for st in (2, 3) for v in (1, 2)
                if not (bm == 256 and w == 4)]
    else:
        bm = min(128, max(16, 1 << (m - 1).bit_length()))
        grid = [(bm, bn, w, st, v, k) for bn, w, st, v, k in (
            (64, 4, 3, 2, 4), (64, 4, 4, 2, 4), (64, 4, 2, 2, 4), (128, 8, 3, 2, 4),
            (128, 4, 3, 2, 4), (64, 4, 3, 1, 4), (64, 4, 3, 4, 4), (64, 4, 3, 2, 8),
            (64, 8, 3, 2, 4), (32, 4, 3, 2, 4), (32, 4, 3, 1, 4), (64, 4, 3, 1, 1))]
    for bm, bn, warps, st, waves, min_k in grid:
        out[f"pm bm{bm} bn{bn} w{warps} st{st} v{waves} k{min_k}"] = Swap(
            block_m=bm, block_n=bn, num_warps=warps, num_stages=st, fused_reduce=m <= 16,
            plane_major=True, waves=waves, min_k_tiles=min_k)
    return out


def patch_gemv(variant: str | dict[tuple[int, int, int], str]) -> None:
    """Route fp16 matmuls of 1-2 rows to a sweep candidate (this process only): the table's
    ``lookup`` as ``w4a16.prepare`` (every launch) consults it, patched at M <= 2. ``variant``:
    one candidate's name for every shape, or per (m, n, k) (``best_per_shape``; "auto" or a
    problem it does not name keeps the dispatched choice). The name is looked up among the
    candidates of the words the engine holds (``sweep_variants_planes`` for plane-packed
    words, the default; ``sweep_variants`` otherwise)."""
    from edge_llm.kernels import w4a16

    dispatched = w4a16.lookup

    def candidate(name: str, m: int, n: int, packed: bool) -> W4A16Config:
        return (sweep_variants_planes(m) if packed else sweep_variants(m, n))[name]

    def pick(family: str, act: str, m: int, n: int, k: int, group_size: int,
             packed: bool = False) -> W4A16Config:
        if act == "fp16" and m <= 2:
            name = variant.get((m, n, k), "auto") if isinstance(variant, dict) else variant
            if name != "auto":
                return candidate(name, m, n, packed)
        return dispatched(family, act, m, n, k, group_size, packed)

    for m, name in ([(1, variant)] if isinstance(variant, str)
                    else [(key[0], v) for key, v in variant.items()]):
        if name != "auto" and name not in {**sweep_variants_planes(m), **sweep_variants(m, 4096)}:
            raise SystemExit(f"no sweep candidate named {name!r} at M={m}")  # before the load
    w4a16.lookup = pick


def best_per_shape(rows: list[dict]) -> dict[tuple[int, int, int], str]:
    """Per (m, n, k) of a sweep's rows (its JSON "rows"), the candidate with the best speed-up
    whose relative error is under 1e-2, "auto" (the dispatched choice) included."""
    out = {}
    for r in rows:
        ok = {v: x["speedup"] for v, x in r["res"].items() if x["err"] < 1e-2}
        if ok:
            out[(r["m"], r["n"], r["k"])] = max(ok, key=ok.get)
    return out
