"""compressed-tensors ``pack-quantized`` int4 tensors (llm-compressor W4A16) <-> QuantizedWeight.

Checked against compressed-tensors (``compressors/quantized_compressors/pack_quantized.py``
``pack_to_int32``/``unpack_from_int32``/``compression_param_info``, and
``quantization/utils/helpers.py`` ``calculate_qparams``):

    weight_packed     int32 (N, K/8)     signed q in [-8, 7] stored as q + 8; column 8c + i at
                                         bits 4i of word c (sequential along K, nn.Linear rows)
    weight_scale      float (N, G)       G = 1 for strategy "channel"
    weight_zero_point int32 (ceil(N/8), G)  asymmetric only: signed zp + 8, packed along N
                                         (row 8r + i at bits 4i of word r; packed_dim=0)
    weight_g_idx      int32 (K,)         optional (actorder "group")
    weight_shape      int   (2,)         [N, K]
    W[n, k] = (q[n, k] - zp[n, g]) * s[n, g]  with g = g_idx[k] (or k // G)

Since both q and zp carry the same +8 offset, the stored nibbles are our unsigned q and zero;
symmetric checkpoints have zp 0, i.e. our zero 8. Checkpoints written before compressed-tensors
packed zero points (PR #296, 2025) stored ``weight_zero_point`` as signed int8 (N, G); we read
those too.
"""

from __future__ import annotations

import math

import torch

from .packing import PACK, QuantizedWeight, pack_int4, sequential_g_idx, unpack_int4


def pack_compressed(w: QuantizedWeight, sym: bool) -> dict[str, torch.Tensor]:
    """Write ``w`` as compressed-tensors pack-quantized tensors (scales keep their dtype)."""
    w.validate()
    if sym and not bool((w.zeros == 8).all()):
        raise ValueError("A symmetric compressed-tensors weight needs every zero point = 8.")
    out = {
        "weight_packed": pack_int4(w.q.t(), dim=1),  # (N, K/8)
        "weight_scale": w.scales.t().contiguous(),  # (N, G)
        "weight_shape": torch.tensor([w.out_features, w.in_features], dtype=torch.int64),
    }
    if not sym:
        zeros = w.zeros.t()  # (N, G)
        pad = (-zeros.shape[0]) % PACK  # compressed-tensors pads N up to a multiple of 8
        if pad:
            zeros = torch.cat([zeros, torch.full((pad, zeros.shape[1]), 8, dtype=zeros.dtype)])
        out["weight_zero_point"] = pack_int4(zeros, dim=0)  # (ceil(N/8), G)
    if not w.is_sequential():
        out["weight_g_idx"] = w.g_idx.to(torch.int32).contiguous()
    return out


def unpack_compressed(
    tensors: dict[str, torch.Tensor], in_features: int, out_features: int, group_size: int,
    sym: bool,
) -> QuantizedWeight:
    """Read compressed-tensors tensors (shapes and dtypes checked by the caller)."""
    n = out_features
    q = unpack_int4(tensors["weight_packed"], dim=1).t()  # (K, N)
    scales = tensors["weight_scale"].t()  # (G, N)
    groups = scales.shape[0]
    zp = tensors.get("weight_zero_point")
    if sym or zp is None:
        if not sym:
            raise ValueError("weight_zero_point is required for an asymmetric checkpoint.")
        zeros = torch.full((groups, n), 8, dtype=torch.int32, device=scales.device)
    elif zp.dtype == torch.int8:  # legacy unpacked signed (N, G)
        zeros = (zp.to(torch.int32) + 8).t()
    else:
        zeros = unpack_int4(zp, dim=0)[:n].t()  # (G, N), drop the row padding
    g_idx = tensors.get("weight_g_idx")
    g_idx = (sequential_g_idx(in_features, group_size, q.device) if g_idx is None
             else g_idx.to(torch.int32))
    return QuantizedWeight(q.contiguous(), zeros.contiguous(), scales.contiguous(), g_idx,
                           group_size)


def compressed_shapes(
    in_features: int, out_features: int, group_size: int, zero_point_dtype: torch.dtype
) -> dict[str, tuple]:
    """Expected checkpoint shapes per tensor name (zero point shape depends on packed/legacy)."""
    groups = math.ceil(in_features / group_size)
    packed_zp = zero_point_dtype != torch.int8
    return {
        "weight_packed": (out_features, in_features // PACK),
        "weight_scale": (out_features, groups),
        "weight_zero_point": (math.ceil(out_features / PACK), groups) if packed_zp
        else (out_features, groups),
        "weight_g_idx": (in_features,),
        "weight_shape": (2,),
    }
