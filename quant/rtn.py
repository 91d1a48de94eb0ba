"""Round-to-nearest group quantization (pure functions, ``nn.Linear`` orientation).

Per group of ``group_size`` input columns and per output row, min/max quantization whose range
always includes 0 (as AutoGPTQ's ``Quantizer.find_params``):

    asym: scale = (max(w, 0) - min(w, 0)) / 15, zero = round(-min(w, 0) / scale) in 0..15
    sym:  scale = 2 * max|w| / 15,              zero = 8
    q = clamp(round(w / scale) + zero, 0, 15),  w ~ (q - zero) * scale

Scales are rounded to fp16 before use, so the integers match what a fp16 checkpoint dequantizes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MIN_SCALE = 1e-6  # keeps w / scale finite for all-zero or tiny groups; fp16 can hold it


def _range_params(xmin, xmax, maxq: int, sym: bool):
    scale = ((xmax - xmin) / maxq).clamp(min=_MIN_SCALE).to(torch.float16).to(torch.float32)
    if sym:
        return scale, torch.full_like(scale, (maxq + 1) / 2)
    return scale, torch.round(-xmin / scale).clamp(0, maxq)


def group_params(
    w: torch.Tensor, bits: int = 4, sym: bool = False, mse: bool = False,
    grid: int = 100, max_shrink: float = 0.8, norm: float = 2.4,
):
    """Scale and zero (float32, shape ``w.shape[:-1]``); each last-dim row of ``w`` is a group.

    ``mse``: shrink the range by p = 1, 0.99, ... (``max_shrink * grid`` steps, AutoGPTQ's
    ``Quantizer`` grid) and keep, per group, the p with the least sum |w - deq(q(w))|^norm.
    """
    maxq = 2**bits - 1
    w = w.to(torch.float32)
    xmin = w.amin(dim=-1).clamp(max=0.0)
    xmax = w.amax(dim=-1).clamp(min=0.0)
    if sym:
        xmax = torch.maximum(-xmin, xmax)
        xmin = -xmax
    flat = (xmin == 0) & (xmax == 0)
    xmin = torch.where(flat, torch.full_like(xmin, -1.0), xmin)
    xmax = torch.where(flat, torch.full_like(xmax, 1.0), xmax)
    scale, zero = _range_params(xmin, xmax, maxq, sym)
    if not mse:
        return scale, zero
    best = torch.full_like(scale, float("inf"))
    for i in range(int(max_shrink * grid)):
        p = 1.0 - i / grid
        s1, z1 = _range_params(p * xmin, p * xmax, maxq, sym)
        s1_, z1_ = s1[..., None], z1[..., None]
        err = ((quantize_to_int(w, s1_, z1_, bits) - z1_) * s1_ - w).abs_().pow_(norm).sum(dim=-1)
        better = err < best
        best = torch.where(better, err, best)
        scale = torch.where(better, s1, scale)
        zero = torch.where(better, z1, zero)
    return scale, zero


def quantize_to_int(
    w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int = 4
) -> torch.Tensor:
    """q = clamp(round(w / scale) + zero, 0, 2**bits - 1) as float32 (broadcasting)."""
    return torch.clamp(torch.round(w / scale) + zero, 0, 2**bits - 1)


def check_quant_args(w: torch.Tensor, bits: int, group_size: int) -> int:
    if w.dim() != 2:
        raise ValueError(f"W must be 2-D (out_features, in_features), got shape {tuple(w.shape)}.")
    if bits != 4:
        raise ValueError(f"bits must be 4, got {bits}.")
    k = w.shape[1]
    if group_size == -1:
        return k
    if group_size < 1:
        raise ValueError(f"group_size must be -1 or >= 1, got {group_size}.")
    return group_size


def rtn_quantize(
    w: torch.Tensor, bits: int = 4, group_size: int = 128, sym: bool = False, mse: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize W (N, K) by round-to-nearest.

    Returns q int32 (N, K) in 0..15, scales float32 (N, G), zeros float32 (N, G) holding
    integers, G = ceil(K / group_size) (group_size -1: one group over all of K). ``mse``: search
    each group's clipping range (see :func:`group_params`) instead of plain min/max.
    """
    gs = check_quant_args(w, bits, group_size)
    n, k = w.shape
    groups = -(-k // gs)
    # zero padding leaves every group's (min(w, 0), max(w, 0)) range unchanged
    w = F.pad(w.detach().to(torch.float32), (0, groups * gs - k))
    w = w.reshape(n, groups, gs)  # (N, G, gs)
    scales, zeros = group_params(w, bits, sym, mse)  # (N, G) each
    q = quantize_to_int(w, scales[..., None], zeros[..., None], bits)
    return q.reshape(n, groups * gs)[:, :k].to(torch.int32).contiguous(), scales, zeros


def fake_quantize(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor
) -> torch.Tensor:
    """Dequantized W (N, K) float32 from q (N, K), scales/zeros (N, G) and g_idx (K,)."""
    idx = g_idx.long()
    return (q.to(torch.float32) - zeros[:, idx]) * scales[:, idx]
