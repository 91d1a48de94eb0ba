"""The format-independent view of a 4-bit linear, and the int32 nibble packing every format uses.

``QuantizedWeight`` is what every format's ``unpack_*`` returns and every ``pack_*`` takes:

    W[k, n] = (q[k, n] - zeros[g_idx[k], n]) * scales[g_idx[k], n]     W is (K, N) = linear.weight.T

``q`` and ``zeros`` are unsigned 4-bit integers (0..15) held in int32. Eight nibbles share one
int32 word; nibble ``j`` of a word sits at bits ``4j .. 4j+3``. Which logical index each nibble
holds is the format's business (``order``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

PACK = 8  # 4-bit values per int32 word
_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)  # bit offset of nibble j


@dataclass
class QuantizedWeight:
    """One quantized linear in logical (unpacked) form; shapes are checked by ``validate``.

    q: int32 (K, N) in 0..15; zeros: int32 (G, N) in 0..15; scales: float (G, N);
    g_idx: int32 (K,) group of each input row; group_size: rows per group (K for one group).
    """

    q: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor
    group_size: int

    @property
    def in_features(self) -> int:
        return self.q.shape[0]

    @property
    def out_features(self) -> int:
        return self.q.shape[1]

    def validate(self) -> None:
        """Raise ValueError if shapes or value ranges are inconsistent."""
        k, n = self.q.shape
        g = self.scales.shape[0]
        if self.zeros.shape != (g, n) or self.scales.shape != (g, n):
            raise ValueError(
                f"zeros {tuple(self.zeros.shape)} and scales {tuple(self.scales.shape)} must both "
                f"be (G, N) with N={n}."
            )
        if self.g_idx.shape != (k,):
            raise ValueError(f"g_idx has shape {tuple(self.g_idx.shape)}, expected ({k},).")
        if int(self.g_idx.min()) < 0 or int(self.g_idx.max()) >= g:
            raise ValueError(f"g_idx values must lie in [0, {g}), found "
                             f"[{int(self.g_idx.min())}, {int(self.g_idx.max())}].")
        for name, t in (("q", self.q), ("zeros", self.zeros)):
            if int(t.min()) < 0 or int(t.max()) > 15:
                raise ValueError(f"{name} values must lie in 0..15.")

    def is_sequential(self) -> bool:
        """True when row k belongs to group k // group_size (no act-order)."""
        seq = sequential_g_idx(self.in_features, self.group_size, self.g_idx.device)
        return bool(torch.equal(self.g_idx, seq))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W as (K, N) in ``dtype`` (the transpose of ``nn.Linear.weight``)."""
        idx = self.g_idx.long()
        diff = (self.q - self.zeros[idx]).to(dtype)  # (K, N) exact small integers
        return diff * self.scales[idx].to(dtype)

    @classmethod
    def from_rows(
        cls,
        q: torch.Tensor,  # (N, K) as nn.Linear.weight
        scales: torch.Tensor,  # (N, G)
        zeros: torch.Tensor,  # (N, G)
        group_size: int,
        g_idx: torch.Tensor | None = None,
    ) -> QuantizedWeight:
        """Build from a quantizer's output in ``nn.Linear`` orientation."""
        k = q.shape[1]
        g_idx = sequential_g_idx(k, group_size) if g_idx is None else g_idx.to(torch.int32)
        return cls(
            q=q.t().to(torch.int32).contiguous(),
            zeros=torch.round(zeros).t().to(torch.int32).contiguous(),
            scales=scales.t().contiguous(),
            g_idx=g_idx.contiguous(),
            group_size=group_size,
        )


def sequential_g_idx(in_features: int, group_size: int, device=None) -> torch.Tensor:
    """Group of each input row without act-order: ``k // group_size`` (int32, (K,))."""
    k = torch.arange(in_features, device=device)
    return torch.div(k, group_size, rounding_mode="floor").to(torch.int32)


def to_int32(words: torch.Tensor) -> torch.Tensor:
    """Reinterpret int64 values in [0, 2**32) as int32 bit patterns (two's complement)."""
    words = words & 0xFFFFFFFF
    return (words - ((words >> 31) << 32)).to(torch.int32)


def pack_int4(values: torch.Tensor, dim: int, order: Sequence[int] | None = None) -> torch.Tensor:
    """Pack 0..15 integers along ``dim`` into int32 words, eight per word.

    Word ``c`` holds logical indices ``8c .. 8c+7``; nibble ``j`` (bits 4j..4j+3) holds index
    ``8c + order[j]`` (``order`` defaults to sequential: nibble j holds index 8c + j).
    """
    if values.shape[dim] % PACK:
        raise ValueError(f"Packed dimension {dim} has size {values.shape[dim]}, not a multiple "
                         f"of {PACK}.")
    if values.numel() and (int(values.min()) < 0 or int(values.max()) > 15):
        raise ValueError("pack_int4 takes values in 0..15.")
    v = values.to(torch.int64).movedim(dim, -1)
    v = v.reshape(*v.shape[:-1], v.shape[-1] // PACK, PACK)  # (..., M/8, 8) logical order
    if order is not None:
        v = v[..., list(order)]  # nibble j <- logical order[j]
    words = (v << _SHIFTS.to(device=v.device, dtype=torch.int64)).sum(dim=-1)  # (..., M/8)
    return to_int32(words).movedim(-1, dim).contiguous()


def unpack_int4(words: torch.Tensor, dim: int, order: Sequence[int] | None = None) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: int32 words -> int32 values 0..15, eight per word."""
    if words.dtype != torch.int32:
        raise ValueError(f"Packed tensors must be int32, got {words.dtype}.")
    w = words.movedim(dim, -1)
    nib = (w.unsqueeze(-1) >> _SHIFTS.to(w.device)) & 0xF  # (..., M/8, 8) nibble j
    if order is not None:
        inverse = sorted(range(PACK), key=lambda j: order[j])  # logical i <- nibble inverse[i]
        nib = nib[..., inverse]
    out = nib.reshape(*nib.shape[:-2], nib.shape[-2] * PACK)
    return out.movedim(-1, dim).contiguous()


PLANE_TILE = 128  # rows per tile of the plane-packed runtime words (kernels/w4a16_ref.py)


def plane_rows(k: int, device=None) -> torch.Tensor:
    """int64 (K,): the weight row that row i of the plane-packed words holds. Within each
    tile of 128 rows, nibble j of word r (row 8 r + j of the words) holds row 16 j + r; the
    kernels' ``pack_planes_ref`` is the test oracle of the same order."""
    t = torch.arange(k // PLANE_TILE, device=device).view(-1, 1, 1) * PLANE_TILE
    r = torch.arange(PLANE_TILE // PACK, device=device).view(1, -1, 1)
    j = torch.arange(PACK, device=device).view(1, 1, -1)
    return (t + 16 * j + r).reshape(-1)


def pack_planes(qweight: torch.Tensor) -> torch.Tensor:
    """Runtime words (K/8, N) (nibble j of word r holds row 8 r + j) -> plane-packed words
    (``plane_rows``), word by word in int32: no (K, N) temporary, so a 7B layer repacks on
    the GPU in place of its weights. K must be a multiple of 128."""
    k = qweight.shape[0] * PACK
    if qweight.dtype != torch.int32 or k % PLANE_TILE:
        raise ValueError(f"pack_planes: int32 words with K a multiple of {PLANE_TILE}, got "
                         f"{qweight.dtype} K={k}")
    tiles = qweight.contiguous().view(k // PLANE_TILE, PLANE_TILE // PACK, -1)  # (T, 16, N)
    r = torch.arange(PLANE_TILE // PACK, device=qweight.device)
    shift = (4 * (r % PACK)).to(torch.int32).view(1, -1, 1)
    out = torch.zeros_like(tiles)
    for j in range(PACK):  # row 16 j + r sits in word 2 j + r // 8, nibble r % 8
        nib = (tiles[:, 2 * j + r // PACK, :] >> shift) & 0xF
        out |= nib << (4 * j)
    return out.view_as(qweight)
