"""AutoAWQ GEMM tensors <-> :class:`QuantizedWeight`.

Checked against AutoAWQ 0.2.9 (``awq/modules/linear/gemm.py`` ``WQLinear_GEMM.from_linear`` and
``awq/utils/packing_utils.py`` ``unpack_awq``/``reverse_awq_order``/``dequantize_gemm``) and vLLM's
``AWQLinearMethod`` (``layers/quantization/awq.py``):

    qweight int32 (K, N/8)    column 8c + AWQ_ORDER[j] at bits 4j of qweight[k, c]
    qzeros  int32 (K/G, N/8)  same interleave, the integer zero point itself (no offset)
    scales  fp16  (K/G, N)
    W[k, n] = (q[k, n] - z[k // G, n]) * s[k // G, n]

AWQ groups are always sequential (no act-order). ``zero_point=False`` checkpoints cannot come
from AutoAWQ's GEMM packer (``from_linear`` needs zeros); vLLM still reads ``qzeros`` for them, so
we do the same when present and otherwise use the symmetric zero 8 (AutoAWQ's signed range
[-8, 7] shifted to 0..15).
"""

from __future__ import annotations

import torch

from .packing import PACK, QuantizedWeight, pack_int4, sequential_g_idx, unpack_int4

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble j holds logical column 8c + AWQ_ORDER[j]


def pack_awq(w: QuantizedWeight) -> dict[str, torch.Tensor]:
    """Write ``w`` as AutoAWQ GEMM tensors ``qweight``, ``qzeros``, ``scales`` (fp16)."""
    w.validate()
    if not w.is_sequential():
        raise ValueError("AWQ GEMM cannot store act-order (non-sequential g_idx) weights.")
    return {
        "qweight": pack_int4(w.q, dim=1, order=AWQ_ORDER),  # (K, N/8)
        "qzeros": pack_int4(w.zeros, dim=1, order=AWQ_ORDER),  # (G, N/8)
        "scales": w.scales.to(torch.float16).contiguous(),  # (G, N)
    }


def unpack_awq(
    tensors: dict[str, torch.Tensor], in_features: int, out_features: int, group_size: int
) -> QuantizedWeight:
    """Read AutoAWQ GEMM tensors (shapes and dtypes checked by the caller).

    ``qzeros`` may be absent only for ``zero_point=False`` checkpoints (zero 8 everywhere).
    """
    k, n = in_features, out_features
    q = unpack_int4(tensors["qweight"], dim=1, order=AWQ_ORDER)  # (K, N)
    scales = tensors["scales"]
    if "qzeros" in tensors:
        zeros = unpack_int4(tensors["qzeros"], dim=1, order=AWQ_ORDER)  # (G, N)
    else:
        zeros = torch.full((scales.shape[0], n), 8, dtype=torch.int32, device=scales.device)
    return QuantizedWeight(q, zeros, scales, sequential_g_idx(k, group_size, q.device),
                           group_size)


def awq_shapes(in_features: int, out_features: int, group_size: int) -> dict[str, tuple]:
    """Expected checkpoint shapes per tensor name."""
    groups = in_features // group_size
    return {
        "qweight": (in_features, out_features // PACK),
        "qzeros": (groups, out_features // PACK),
        "scales": (groups, out_features),
    }
