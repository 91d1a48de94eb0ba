"""The 4-bit CPU matmul: ``QuantLinear``'s runtime layout repacked once for torch's
weight-packed int4 CPU kernel (``aten._weight_int4pack_mm_for_cpu``), for bf16 activations.

Why this path and not the weights dequantized once at load: a decode step reads every weight
once, so on a CPU it is bound by memory bandwidth, and 4-bit words are 4x fewer bytes than bf16
and 8x fewer than fp32. Measured on the 2-core Xeon (AVX-512, AMX) with the demo's shapes
(BENCHMARKS.md, "CPU decode"): a token's linears took 10 ms of CPU time as int4 against
35 ms as the cached fp32 weights, and the whole engine decoded 2.1x more tokens per CPU second
(batch 1) than with the weights dequantized once to dense bf16. That dense copy is 2.9x faster
on 128-token prompts (AMX), at 4x the int4 weight bytes; decode decided. The kernel is fast
only for bf16 activations (fp16 about 40x, fp32 about 65x slower here: torch has no
vectorized path for them), so fp32 and fp16 models keep the exact fp32 reference
(``QuantLinear``'s dequantized cache).

Packed form (what the kernel takes)::

    packed             uint8 (N, K / 2)       torch's tiled nibble order (opaque to us)
    scales_and_zeros   bf16  (K / gs, N, 2)   W[k, n] = (q[k, n] - 8) * s + z'
                                              with s = scales, z' = (8 - zeros) * scales

so ``z'`` carries our zero point: (q - 8) s + (8 - z) s = (q - z) s, the runtime layout's W.
The kernel accepts N a multiple of 16 and group sizes 32, 64, 128 or 256 dividing K;
``pack_for_cpu`` returns None for anything else (the caller takes the reference path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .packing import unpack_int4

CPU_INT4_GROUP_SIZES = (32, 64, 128, 256)
_N_MULTIPLE = 16  # the packer tiles N by 16


@dataclass(frozen=True)
class CpuInt4Weight:
    """One linear's weight in the kernel's packed form (see the module docstring)."""

    packed: torch.Tensor  # uint8 (N, K / 2)
    scales_and_zeros: torch.Tensor  # bf16 (K / gs, N, 2)
    group_size: int
    out_features: int


def cpu_int4_supported(in_features: int, out_features: int, group_size: int) -> bool:
    """Whether the kernel takes a (in_features -> out_features) linear of ``group_size``."""
    return (group_size in CPU_INT4_GROUP_SIZES and in_features % group_size == 0
            and out_features % _N_MULTIPLE == 0)


def pack_for_cpu(
    qweight: torch.Tensor,  # int32 (K/8, N), runtime layout, standard (not plane-packed) words
    scales: torch.Tensor,  # (G, N)
    zeros: torch.Tensor,  # (G, N), float values of the integer zero points
    group_size: int,
) -> CpuInt4Weight | None:
    """The kernel's packed form of one runtime-layout weight, or None where unsupported."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    if qweight.device.type != "cpu" or not cpu_int4_supported(k, n, group_size):
        return None
    q = unpack_int4(qweight.t(), dim=1)  # (N, K) int32 in 0..15, one pass over the words
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)  # (N, K/2) uint8
    s = scales.float()
    shifted = (8.0 - zeros.float()) * s  # (G, N): the zero point in the kernel's form
    sz = torch.stack([s, shifted], dim=-1).to(torch.bfloat16).contiguous()  # (G, N, 2)
    return CpuInt4Weight(packed, sz, group_size, n)


def cpu_int4_matmul(x2: torch.Tensor, w: CpuInt4Weight) -> torch.Tensor:
    """x2 (M, K) bf16 @ W -> (M, N) bf16 (the kernel accumulates in fp32)."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(
        x2.contiguous(), w.packed, w.group_size, w.scales_and_zeros)
