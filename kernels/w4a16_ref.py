"""Plain-torch references of the W4A16 runtime layout (kernels/w4a16.py): the oracle the
Triton kernels are tested against, the input checks both share, and the test packer."""

from __future__ import annotations

import torch

PACK = 8  # 4-bit values per int32 word
PLANE_TILE = 128  # rows per tile of the plane-packed layout (pack_planes_ref)
_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)


def check_inputs(x, qweight, scales, zeros, group_size) -> tuple[int, int]:
    """Validate shapes and dtypes; returns (K, N). Errors name the offending argument."""
    if x.dtype not in _SUPPORTED:
        raise ValueError(f"x: dtype {x.dtype} not supported (fp16, bf16, fp32)")
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"qweight: expected 2-D int32 [K/8, N], got {qweight.dtype} "
                         f"{tuple(qweight.shape)}")
    k = qweight.shape[0] * PACK
    n = qweight.shape[1]
    if x.shape[-1] != k:
        raise ValueError(f"x: last dim {x.shape[-1]} != K = 8 * qweight.shape[0] = {k}")
    if group_size <= 0:
        raise ValueError(f"group_size: must be positive, got {group_size}")
    g = -(-k // group_size)
    for name, t in (("scales", scales), ("zeros", zeros)):
        if tuple(t.shape) != (g, n):
            raise ValueError(f"{name}: expected shape ({g}, {n}) for K={k}, N={n}, "
                             f"group_size={group_size}; got {tuple(t.shape)}")
        if not t.is_floating_point():
            raise ValueError(f"{name}: expected a floating dtype, got {t.dtype}")
    if not (x.device == qweight.device == scales.device == zeros.device):
        raise ValueError("x, qweight, scales, zeros: must be on one device")
    return k, n


def check_planes(k: int, group_size: int) -> None:
    """Plane-packed words need whole 128-row tiles inside one group each."""
    if k % PLANE_TILE or group_size % PLANE_TILE:
        raise ValueError(f"plane-packed weights need K ({k}) and group_size ({group_size}) "
                         f"multiples of {PLANE_TILE}")


def plane_rows(k: int, device=None) -> torch.Tensor:
    """int64 (K,): the row of W that row i of the plane-packed layout holds. Within each
    tile of 128 rows, word r's nibble j (row 8 r + j of the packed matrix) holds row
    16 j + r, so plane j of a tile covers 16 consecutive rows of W (``pack_planes_ref``)."""
    t = torch.arange(k // PLANE_TILE, device=device).view(-1, 1, 1) * PLANE_TILE
    r = torch.arange(PLANE_TILE // PACK, device=device).view(1, -1, 1)
    j = torch.arange(PACK, device=device).view(1, 1, -1)
    return (t + 16 * j + r).reshape(-1)  # index (t, r, j) = packed row t 128 + 8 r + j


def pack_planes_ref(qweight: torch.Tensor) -> torch.Tensor:
    """Standard words (nibble j of word r holds row 8 r + j) -> plane-packed words (within
    each 128-row tile, nibble j of word r holds row 16 j + r): the layout that lets plane
    dots and the one-row GEMV read x in its natural order (kernels/w4a16.py). K must be a
    multiple of 128."""
    k = qweight.shape[0] * PACK
    check_planes(k, PLANE_TILE)
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32)
    q = ((qweight.unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF).reshape(k, -1)  # (K, N)
    return pack_w4_ref(q.index_select(0, plane_rows(k, q.device)))


def unplane_order(x2: torch.Tensor) -> torch.Tensor:
    """x2 [M, K] -> x2[:, plane_rows(K)]: the activations that k-order kernels multiply
    with plane-packed words (column 8 r + j of a tile takes column 16 j + r)."""
    m, k = x2.shape
    return x2.reshape(m, k // PLANE_TILE, PACK, PLANE_TILE // PACK).transpose(2, 3).reshape(m, k)


def dequantize_w4a16_ref(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
    planes_packed: bool = False,
) -> torch.Tensor:
    """W [K, N] in fp32, straight from the layout definition (``planes_packed``: words
    from ``pack_planes_ref``; W comes back in its natural row order)."""
    shifts = torch.arange(0, 32, 4, device=qweight.device, dtype=torch.int32)  # (8,)
    q = (qweight.unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF  # (K/8, 8, N): k = 8 * row + j
    q = q.reshape(-1, qweight.shape[1]).float()  # (K, N)
    g = torch.arange(q.shape[0], device=q.device) // group_size  # (K,)
    w = (q - zeros.float()[g]) * scales.float()[g]  # a tile lies in one group when planes
    if planes_packed:
        check_planes(w.shape[0], group_size)
        natural = torch.empty_like(w)
        natural[plane_rows(w.shape[0], w.device)] = w
        w = natural
    return w


def w4a16_matmul_ref(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
    group_size: int, integer_zeros: bool = False, planes_packed: bool = False,
) -> torch.Tensor:
    """y = x @ W in fp32, returned in x's dtype; shape [..., N]. ``integer_zeros`` is the
    kernels' hint (see w4a16_matmul); the reference is exact for any zero point.
    ``planes_packed``: qweight from ``pack_planes_ref``."""
    check_inputs(x, qweight, scales, zeros, group_size)
    w = dequantize_w4a16_ref(qweight, scales, zeros, group_size, planes_packed)
    return (x.float() @ w).to(x.dtype)


def pack_w4_ref(q: torch.Tensor) -> torch.Tensor:
    """[K, N] integers in 0..15 -> qweight [K/8, N] int32 (nibble j of word r holds k = 8r + j)."""
    if q.shape[0] % PACK:
        raise ValueError(f"q: K={q.shape[0]} is not a multiple of {PACK}")
    if int(q.min()) < 0 or int(q.max()) > 15:
        raise ValueError("q: values must lie in 0..15")
    shifts = torch.arange(0, 32, 4, device=q.device, dtype=torch.int64)  # (8,)
    v = q.to(torch.int64).reshape(-1, PACK, q.shape[1])  # (K/8, 8, N)
    words = (v << shifts.view(1, PACK, 1)).sum(dim=1)  # (K/8, N), 0 .. 2**32 - 1
    words = torch.where(words >= 2**31, words - 2**32, words)  # two's complement int32
    return words.to(torch.int32)
