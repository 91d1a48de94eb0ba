"""GPTQ tensors (AutoGPTQ, GPTQModel; checkpoint_format "gptq" v1, "gptq_v2") <-> QuantizedWeight.

Checked against AutoGPTQ (``auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py`` ``pack``/``forward``,
``quantization/gptq.py`` for ``g_idx``, ``quantization/quantizer.py`` for the symmetric zero
``(maxq + 1) / 2 = 8``) and GPTQModel (``gptqmodel/utils/model.py``
``convert_gptq_v1_to_v2_format_module``, which adds 0x11111111 to every int32 qzeros word):

    qweight int32 (K/8, N)   row k at bits 4*(k % 8) of qweight[k // 8, n]
    qzeros  int32 (G, N/8)   column n at bits 4*(n % 8) of qzeros[g, n // 8]
    scales  fp16  (G, N)     G = ceil(K / group_size)
    g_idx   int32 (K,)       group of input row k; act-order makes it non-monotonic
    W[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]

v1 ("gptq") stores each zero minus one; v2 stores the zero itself. We convert v1 -> v2 the way
GPTQModel does, on whole int32 words modulo 2**32: this is the exact inverse of GPTQModel's v2 -> v1
export (a real zero of 0 borrows from the next nibble and comes back intact) and equals the
per-nibble ``(z + 1) & 15`` of AutoGPTQ for every word AutoGPTQ's packer writes correctly.
"""

from __future__ import annotations

import math

import torch

from .packing import PACK, QuantizedWeight, pack_int4, sequential_g_idx, to_int32, unpack_int4

_V1_OFFSET = 0x11111111  # one added to each of the eight nibbles of a qzeros word


def v1_to_v2_qzeros(qzeros: torch.Tensor) -> torch.Tensor:
    """v1 qzeros words (zero - 1) -> v2 words (zero), modulo 2**32."""
    return to_int32(qzeros.to(torch.int64) + _V1_OFFSET)


def v2_to_v1_qzeros(qzeros: torch.Tensor) -> torch.Tensor:
    """v2 qzeros words (zero) -> v1 words (zero - 1), modulo 2**32."""
    return to_int32(qzeros.to(torch.int64) - _V1_OFFSET)


def pack_gptq(w: QuantizedWeight, checkpoint_format: str = "gptq") -> dict[str, torch.Tensor]:
    """Write ``w`` as GPTQ tensors ``qweight``, ``qzeros``, ``scales`` (fp16), ``g_idx``."""
    w.validate()
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise ValueError(
            f"checkpoint_format must be 'gptq' or 'gptq_v2', got {checkpoint_format!r}."
        )
    qzeros = pack_int4(w.zeros, dim=1)  # (G, N/8) v2 words
    if checkpoint_format == "gptq":
        qzeros = v2_to_v1_qzeros(qzeros)
    return {
        "qweight": pack_int4(w.q, dim=0),  # (K/8, N)
        "qzeros": qzeros,
        "scales": w.scales.to(torch.float16).contiguous(),  # (G, N)
        "g_idx": w.g_idx.to(torch.int32).contiguous(),
    }


def unpack_gptq(
    tensors: dict[str, torch.Tensor],
    in_features: int,
    out_features: int,
    group_size: int,
    checkpoint_format: str,
    sym: bool,
) -> QuantizedWeight:
    """Read GPTQ tensors (shapes and dtypes checked by the caller).

    ``g_idx`` may be absent (sequential groups). For ``sym`` checkpoints the zero is 8 by
    construction; like vLLM's GPTQ-Marlin path (``uint4b8``) we use 8 and do not need ``qzeros``.
    """
    q = unpack_int4(tensors["qweight"], dim=0)  # (K, N)
    scales = tensors["scales"]
    groups = scales.shape[0]
    if sym or "qzeros" not in tensors:
        if not sym:
            raise ValueError("qzeros is required for an asymmetric (sym=false) GPTQ checkpoint.")
        zeros = torch.full((groups, out_features), 8, dtype=torch.int32, device=scales.device)
    else:
        words = tensors["qzeros"]
        if checkpoint_format == "gptq":
            words = v1_to_v2_qzeros(words)
        zeros = unpack_int4(words, dim=1)  # (G, N)
    if "g_idx" in tensors:
        g_idx = tensors["g_idx"].to(torch.int32)
    else:
        g_idx = sequential_g_idx(in_features, group_size, q.device)
    return QuantizedWeight(q, zeros, scales, g_idx, group_size)


def gptq_shapes(in_features: int, out_features: int, group_size: int) -> dict[str, tuple]:
    """Expected checkpoint shapes per tensor name."""
    groups = math.ceil(in_features / group_size)
    return {
        "qweight": (in_features // PACK, out_features),
        "qzeros": (groups, out_features // PACK),
        "scales": (groups, out_features),
        "g_idx": (in_features,),
    }
