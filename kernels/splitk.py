"""Split-K sums for the W4A16 kernels: inside the kernel (the last program of a tile adds the
partials) or by a second launch.

When K is split over ``split`` programs per output tile, each writes fp32 partial sums to
``part`` [SPLIT, M, N]. In-kernel ("fused") reduction, the scheme of CUTLASS's serial split-K
semaphore and of stream-K::

    store my partials                      every program of the tile
    barrier; count = atomic_add(counter[tile], 1)   (acq_rel, gpu scope: the partials of
                                                     all earlier programs are visible)
    if count == split - 1:                  the last one to arrive
        out[tile] = sum_s part[s, tile]     in s order, so the result does not depend on
        counter[tile] = 0                   which program came last; reset for the next launch

It saves a launch per split linear (128 per Llama-2-7B decode step) and keeps CUDA graphs
replayable (every launch leaves its counters at zero). The counters are one int32 buffer per
device, shared by every launch: launches that use them must not run concurrently on two
streams of one device (the engine runs the model on one stream). ``counters`` returns None
when the buffer does not exist yet and a CUDA graph is being captured (no allocation inside a
capture), or when a launch needs more tiles than it holds; the caller then reduces with
``reduce_partials``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .device import num_sms
from .grid import cdiv, next_pow2
from .pdl import pdl_enter, pdl_kwargs

MAX_TILES = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """The device's zeroed int32 tile counters (MAX_TILES of them), or None (see module)."""
    if tiles > MAX_TILES:
        return None
    key = torch.device(device.type, device.index if device.index is not None
                       else (torch.cuda.current_device() if device.type == "cuda" else None))
    buf = _COUNTERS.get(key)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = _COUNTERS[key] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
    return buf


@triton.jit
def last_of_tile(counter_ptr, tile, split):
    """True in the program that completes ``tile`` (the split-th to arrive). Call after this
    program's partial stores; the caller then sums and calls ``release_tile``."""
    tl.debug_barrier()  # every thread of this program has issued its partial stores
    count = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu")
    return count == split - 1


@triton.jit
def release_tile(counter_ptr, tile):
    """Reset ``tile``'s counter for the next launch (by the program that summed it)."""
    tl.atomic_xchg(counter_ptr + tile, 0, sem="relaxed", scope="gpu")


@triton.jit
def sum_partials(part_ptr, out_ptr, offs_m, offs_n, mask, split, stride_ps, stride_pm,
                 stride_om, SPLIT_P2: tl.constexpr):
    """out[m, n] = sum over s < split of part[s, m, n] for the [BM, BN] tile ``offs_m`` x
    ``offs_n`` (``SPLIT_P2`` >= split, a power of two). The loop is unrolled so all loads are
    in flight at once, and adds in s order (as ``_splitk_reduce_kernel``: equal bits). Loads
    bypass L1 (``.cg``): other programs wrote the partials."""
    acc = tl.zeros((offs_m.shape[0], offs_n.shape[0]), dtype=tl.float32)
    ptrs = part_ptr + offs_m[:, None] * stride_pm + offs_n[None, :]
    for s in tl.static_range(SPLIT_P2):
        live = (offs_m * 0 + s) < split  # [BM]: a scalar mask is not accepted everywhere
        acc += tl.load(ptrs + s * stride_ps, mask=mask & live[:, None], other=0.0,
                       cache_modifier=".cg")
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sum_if_last(cnt_ptr, tile, split, part_ptr, out_ptr, offs_m, offs_n, mask, stride_ps,
                stride_pm, stride_om, SPLIT_P2: tl.constexpr):
    """The in-kernel reduction of one tile, called after this program's partial stores: the
    program that completes ``tile`` sums the partials into ``out`` and resets the counter."""
    if last_of_tile(cnt_ptr, tile, split):
        sum_partials(part_ptr, out_ptr, offs_m, offs_n, mask, split, stride_ps, stride_pm,
                     stride_om, SPLIT_P2)
        release_tile(cnt_ptr, tile)


@triton.jit(do_not_specialize=["numel"])
def _splitk_reduce_kernel(part_ptr, out_ptr, numel, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
                          PDL: tl.constexpr = False):
    """out[i] = sum_s part[s, i] for the flat [SPLIT, numel] fp32 partial sums."""
    pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + s * numel + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def auto_split(tiles: int, k: int, block_k: int, sms: int, waves: float = 2,
               min_k_tiles: int = 4) -> int:
    """Split K until the grid covers about ``waves`` programs per multiprocessor, keeping at
    least ``min_k_tiles`` K tiles per split."""
    split = 1
    while (tiles * split < waves * sms and k // (2 * split) >= min_k_tiles * block_k
           and split < 32):
        split *= 2
    return split


def plan(tiles: int, k: int, block_k: int, split_k: int, waves: float, min_k_tiles: int,
         sms: int) -> tuple[int, int]:
    """(splits, K per split) of a launch of ``tiles`` output tiles: ``split_k`` ways, or
    (0) ``auto_split``'s; each split whole ``block_k`` tiles, none of them empty."""
    split = split_k or auto_split(tiles, k, block_k, sms, waves, min_k_tiles)
    k_per_split = cdiv(cdiv(k, split), block_k) * block_k
    return cdiv(k, k_per_split), k_per_split


def buffers(out: torch.Tensor, split: int, tiles: int, fused: bool
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(target, final, counters) of a launch into ``out`` [M, N]: one split writes ``out``
    itself (as [1, M, N]); more write fp32 partials [SPLIT, M, N] that the last program of
    each tile sums into ``final`` = ``out`` where ``fused`` and ``counters`` has them, else
    ``finish`` adds them by a second launch (``final`` is then ``target``)."""
    if split == 1:
        target = out.view(1, *out.shape)
        return target, target, None
    target = torch.empty((split, *out.shape), device=out.device, dtype=torch.float32)
    cnt = counters(out.device, tiles) if fused else None
    return target, out if cnt is not None else target, cnt


@dataclass(frozen=True)
class TiledLaunch:
    """A [BLOCK_M, BLOCK_N]-tiled launch with K split over its third grid axis: its grid, the
    K each split covers, the result ``out`` and ``buffers``' (target, final, counters)."""

    block_m: int
    grid: tuple[int, int, int]
    split: int
    k_per_split: int
    out: torch.Tensor
    target: torch.Tensor
    final: torch.Tensor
    counters: torch.Tensor | None


def tiled(x2: torch.Tensor, n: int, block_k: int, cfg) -> TiledLaunch:
    """The tiles, split and buffers of x2 [M, K] @ W [K, n] for a config with ``block_m``
    (None: next_pow2(M) within 16..64), ``block_n`` and the split-K fields (``split_k``,
    ``waves``, ``min_k_tiles``, ``fused_reduce``), as the tiled W4A16 kernels launch."""
    m, k = x2.shape
    block_m = max(16, next_pow2(cfg.block_m or min(64, next_pow2(m))))
    tiles = cdiv(m, block_m) * cdiv(n, cfg.block_n)
    split, k_per_split = plan(tiles, k, block_k, cfg.split_k, cfg.waves, cfg.min_k_tiles,
                              num_sms(x2.device))
    out = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    target, final, cnt = buffers(out, split, tiles, cfg.fused_reduce)
    return TiledLaunch(block_m, (cdiv(m, block_m), cdiv(n, cfg.block_n), split), split,
                       k_per_split, out, target, final, cnt)


def finish(target: torch.Tensor, out: torch.Tensor, cnt: torch.Tensor | None) -> torch.Tensor:
    """``out`` after the launch of ``buffers``' targets: the partials summed by a second
    launch where the kernel did not sum them."""
    if target.shape[0] > 1 and cnt is None:
        reduce_partials(target, out)
    return out


def reduce_partials(part: torch.Tensor, out: torch.Tensor) -> None:
    """out [M, N] = part [SPLIT, M, N].sum(0) in a second launch."""
    split, m, n = part.shape
    block = 1024
    _splitk_reduce_kernel[(cdiv(m * n, block),)](
        part, out, m * n, SPLIT=split, BLOCK=block, num_warps=4, **pdl_kwargs(part.device))
