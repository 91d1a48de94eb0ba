"""Repack the 4-bit words of every eligible linear into the plane-packed order after loading
(``QuantLinear.pack_planes``; kernels/w4a16.py, ``planes_packed``).

The W4A16 plane-dot kernels multiply each nibble plane of a 128-row K tile by the activations of
that plane's rows. In the checkpoints' word order (row 8 r + j in nibble j of word r) a plane's rows
are every eighth column of x, so the kernels read a copy of x permuted into plane order, a launch of
its own that outweighed the plane dots' gain on the smaller weights. Plane-packed words put row 16 j
+ r in nibble j of word r: a plane's rows are 16 consecutive columns of x, and the plane dots read x
as it is. The one-row GEMV and the dequantize pass read the new order directly; the other kernels
are given x permuted to match.

Packed on CUDA for fp16 activations (the plane kernels' dtype) when K and the group size are
multiples of 128; the CPU reference reads either order. On by default
(``load_model(plane_packed=False)`` keeps the checkpoint order). It speeds up decode at
batches of a few rows and leaves batch 1 as it is (BENCHMARKS.md, "Kernels"): the one-row
GEMV still reads x as int32 words of two rows, staged by cp.async, since eight 2-byte loads
per word are much slower.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


def pack_weight_planes(model: nn.Module) -> int:
    """Plane-pack every QuantLinear of ``model`` on a CUDA device with fp16 activations whose
    shapes allow it; returns how many were packed. The model computes the same function."""
    from edge_llm.quant import QuantLinear

    packed = skipped = 0
    for module in model.modules():
        if not isinstance(module, QuantLinear) or module.planes_packed:
            continue
        if module.qweight.device.type != "cuda" or module.dtype != torch.float16:
            continue
        if not module.planes_packable():
            skipped += 1
            continue
        module.pack_planes()
        packed += 1
    if packed or skipped:
        logger.info("Plane-packed the 4-bit words of %d linears (%d kept: K or group size "
                    "not a multiple of 128, or a general g_idx)", packed, skipped)
    return packed
