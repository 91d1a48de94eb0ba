"""W4A16 dequantization in one Triton pass: W [K, N] from the runtime layout (see w4a16.py),
for the dequantize + cuBLAS path above 64 activation rows and for odd group sizes.

On CUDA the dequantized weights go to one reused buffer per (device, dtype)
(``dequant_scratch``), grown to the largest weight seen. Each is read by the matmul right
after it, on the one stream the model runs on, so one buffer serves every linear. A fresh
[K, N] tensor per linear (32-180 MB each for a 7B model) left the caching allocator with
segments of many sizes (fragmentation while serving), and put two of them (the q/k/v and
gate/up sizes, 280 MB) in the CUDA graphs' pool.

The buffers are shared by every engine of the process, and CUDA graphs write to them: an
engine acquires them at start-up and wake and releases them at sleep, and they are freed
only when no engine holds them (``acquire_dequant_scratch`` / ``release_dequant_scratch``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grid import cdiv
from .pdl import pdl_enter, pdl_kwargs
from .w4a16_config import Dequant
from .w4a16_ref import PACK


@triton.jit
def nibble_f32(packed, j: tl.constexpr):
    """Nibble j of every int32 word as fp32 ((q | 0x4B000000) read as fp32 is 2**23 + q)."""
    bits = ((packed >> (4 * j)) & 0xF) | 0x4B000000
    return bits.to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _dequant_kernel(
    qw_ptr, s_ptr, z_ptr, w_ptr, N, K, group_size, stride_qk, stride_sg, stride_zg, stride_wk,
    BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, PLANES: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    """W[k, n] = (q[k, n] - zeros[g, n]) * scales[g, n] for one [BLOCK_K, BLOCK_N] tile.
    PLANES: plane-packed words (kernels/w4a16_ref.py pack_planes_ref): nibble j of word row
    r holds row 128 (r // 16) + 16 j + r % 16, where W is stored."""
    pdl_enter(PDL)
    rows = tl.program_id(0) * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)  # (BK8,)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < K // 8) & (offs_n[None, :] < N)
    packed = tl.load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :], mask=mask, other=0)
    for j in tl.static_range(8):
        if PLANES:
            k = (rows // 16) * 128 + j * 16 + rows % 16
        else:
            k = rows * 8 + j
        g = k[:, None] // group_size  # per row: any group size works here
        s = tl.load(s_ptr + g * stride_sg + offs_n[None, :], mask=mask, other=0.0)
        z = tl.load(z_ptr + g * stride_zg + offs_n[None, :], mask=mask, other=0.0)
        w = (nibble_f32(packed, j) - z.to(tl.float32)) * s.to(tl.float32)
        tl.store(w_ptr + k[:, None] * stride_wk + offs_n[None, :],
                 w.to(w_ptr.dtype.element_ty), mask=mask)


_SCRATCH: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
# buffers outgrown after a CUDA graph captured them: the graph still writes to them, so they
# stay allocated until release_dequant_scratch (the engine's start-up profile runs every
# linear at its largest row count first, so in the engine this stays empty)
_RETIRED: list[torch.Tensor] = []
_CAPTURED = [False]
_USERS = [0]  # engines whose graphs may use the buffers (acquire / release)


def dequant_scratch(device: torch.device, dtype: torch.dtype, k: int, n: int):
    """A [K, N] view of the one reused buffer of ``device`` and ``dtype`` (module doc), grown
    when too small; None inside a CUDA graph capture when it is too small (no allocation
    that outlives a capture: the caller allocates into the graph's pool)."""
    key = (device, dtype)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    buf = _SCRATCH.get(key)
    if buf is None or buf.numel() < k * n:
        if capturing:
            return None
        old = _SCRATCH.pop(key, None)
        if old is not None and _CAPTURED[0]:
            _RETIRED.append(old)
        del buf, old  # an uncaptured old buffer goes before the larger one is allocated
        buf = _SCRATCH[key] = torch.empty(k * n, device=device, dtype=dtype)
    _CAPTURED[0] = _CAPTURED[0] or capturing
    return buf[: k * n].view(k, n)


def acquire_dequant_scratch(sizes=()) -> None:
    """One more engine uses the buffers (start-up, wake); allocate any of ``sizes`` (from
    ``release_dequant_scratch``) that is missing, before the engine captures graphs: a
    capture with no buffer would put each dequantized weight in the graph's pool."""
    _USERS[0] += 1
    for dev, dtype, numel in sizes:
        if (dev, dtype) not in _SCRATCH:
            _SCRATCH[(dev, dtype)] = torch.empty(numel, device=dev, dtype=dtype)


def release_dequant_scratch() -> list[tuple[torch.device, torch.dtype, int]]:
    """One engine fewer (sleep, after its CUDA graphs are dropped). The buffers go only when
    no engine is left, since another engine's graphs may write to them; their memory returns
    on the next ``empty_cache``. Returns (device, dtype, elements) of each buffer dropped,
    for ``acquire_dequant_scratch`` at wake."""
    _USERS[0] = max(_USERS[0] - 1, 0)
    if _USERS[0]:
        return []
    sizes = [(dev, dtype, buf.numel()) for (dev, dtype), buf in _SCRATCH.items()]
    _SCRATCH.clear()
    _RETIRED.clear()
    _CAPTURED[0] = False
    return sizes


def dequantize_w4a16(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    dtype: torch.dtype | None = None,
    reuse: bool = False,
    planes_packed: bool = False,
) -> torch.Tensor:
    """W [K, N] in ``dtype`` (default: scales' dtype) from the runtime layout, one Triton pass.
    ``reuse`` (CUDA): into the reused buffer (module doc), valid until the next reuse.
    ``planes_packed``: words from ``pack_planes_ref``; W comes out in natural row order."""
    k = qweight.shape[0] * PACK
    n = qweight.shape[1]
    dtype = dtype or scales.dtype
    w = None
    if reuse and qweight.device.type == "cuda":
        w = dequant_scratch(qweight.device, dtype, k, n)
    if w is None:
        w = torch.empty((k, n), device=qweight.device, dtype=dtype)
    scales, zeros, qweight = scales.contiguous(), zeros.contiguous(), qweight.contiguous()
    bk, bn = 64, 128
    _dequant_kernel[(cdiv(k, bk), cdiv(n, bn))](
        qweight, scales, zeros, w, n, k, group_size, qweight.stride(0), scales.stride(0),
        zeros.stride(0), w.stride(0), BLOCK_K=bk, BLOCK_N=bn, PLANES=planes_packed,
        num_warps=4, **pdl_kwargs(qweight.device))
    return w


def launch_dequant(cfg: Dequant, x2: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                   zeros: torch.Tensor, group_size: int, integer_zeros: bool = False,
                   planes_packed: bool = False) -> torch.Tensor:
    """x2 [M, K] @ W, [M, N]: W dequantized to x2's dtype into the reused buffer (CUDA),
    then torch.matmul (cuBLAS). Any group size works here."""
    w = dequantize_w4a16(qweight, scales, zeros, group_size, dtype=x2.dtype, reuse=True,
                         planes_packed=planes_packed)
    return torch.matmul(x2, w)
