"""W4A16: 4-bit weights (runtime GPTQ-style layout) times fp16/bf16 activations, fp32 accumulation.

Public API (no repacking: the kernels read QuantLinear's runtime layout as it is)::

    w4a16_matmul(x [..., K], qweight [K/8, N] int32, scales [G, N], zeros [G, N], group_size,
                 config=None) -> [..., N] in x's dtype          (Triton; CUDA or TRITON_INTERPRET)
    prepare(x, qweight, scales, zeros, group_size) -> (x [M, K], config); LAUNCH[type(config)]
    w4a16_matmul_ref(x, qweight, scales, zeros, group_size) -> same, plain torch (the oracle;
        the references live in kernels/w4a16_ref.py and are re-exported here)
    dequantize_w4a16(qweight, scales, zeros, group_size) -> W [K, N] in scales' dtype (Triton)
    dequantize_w4a16_ref(qweight, scales, zeros, group_size) -> W [K, N] fp32 (plain torch)
    pack_w4_ref(q [K, N] ints in 0..15) -> qweight [K/8, N] int32 (for tests and benchmarks)
    lookup(family, act, m, n, k, group_size, packed) -> config   (w4a16_config.py)

Runtime layout, G = ceil(K / group_size)::

    q[k, n] = (qweight[k // 8, n] >> (4 * (k % 8))) & 0xF            unsigned 0..15
    W[k, n] = (q[k, n] - zeros[k // gs, n]) * scales[k // gs, n]      y = x @ W

    qweight rows:  | k 0..7 | k 8..15 | ...      one int32 word holds 8 consecutive k of one n
    every word lies in one group (group_size % 8 == 0, else the dequant path serves it).

Which kernel serves a problem is one row of a table per GPU family (w4a16_config.py
``TABLES``: Hopper's wgmma, and mma.sync on sm_8x / sm_12x), looked up by the row count M,
the activation dtype, N, K, the group size and the word order; each kernel kind has its own
config type and launcher:

  * ``Gemv16`` (w4a16_gemv.py): words turned into fp16 pairs by inline PTX, up to four
    activation rows per program: fp16/bf16 at 1-2 rows, bf16 at 3-4.
  * ``Swap`` (w4a16_swap.py): out^T = W^T x^T, the dequantized planes as the MMA's left
    operand, joined into one tile or as eight plane dots: fp16 at 3-64 rows (and, on
    Hopper with plane-packed words, 65-128).
  * ``Dot`` (w4a16_dot.py): x @ W by tl.dot, the tile unpacked in k order or eight nibble
    plane dots: bf16 and fp32 at 5-64 rows, fp32 at 2-4, fp16 on mma.sync at 17-64 where K
    or the group size is not a multiple of 128.
  * ``Gemv`` (w4a16_dot.py): fp32 at one row (the interpreter's tests), no tensor cores.
  * ``Dequant`` (w4a16_dequant.py): W dequantized in one Triton pass, then torch.matmul
    (cuBLAS): above 64 rows, and for groups whose words straddle two groups.

Every launcher splits K over a third grid axis when the (M, N) tiles alone cannot fill the
GPU (splitk.py): fp32 partials summed by the last program of each tile or a second launch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .device import dots_from_registers
from .fused import silu_and_mul
from .w4a16_config import Dequant, Dot, Gemv, Gemv16, Swap, W4A16Config, lookup
from .w4a16_dequant import dequantize_w4a16, launch_dequant  # noqa: F401 - API
from .w4a16_dot import launch_dot, launch_gemv
from .w4a16_gemv import launch_gemv16
from .w4a16_ref import (  # noqa: F401 - the references are part of this module's API
    PACK,
    PLANE_TILE,
    check_inputs,
    check_planes,
    dequantize_w4a16_ref,
    pack_planes_ref,
    pack_w4_ref,
    unplane_order,
    w4a16_matmul_ref,
)
from .w4a16_swap import launch_swap, plane_order  # noqa: F401 - API

# one typed launcher per kind: (config, x2 [M, K], qweight, scales, zeros, group_size,
# integer_zeros, planes_packed) -> [M, N]
LAUNCH: dict[type, Callable[..., torch.Tensor]] = {
    Gemv16: launch_gemv16, Gemv: launch_gemv, Dot: launch_dot, Swap: launch_swap,
    Dequant: launch_dequant}
_ACT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def prepare(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
            group_size: int, planes_packed: bool = False, config: W4A16Config | None = None
            ) -> tuple[torch.Tensor, W4A16Config]:
    """Check the inputs; x as [M, K] and the launch configuration: ``config`` or the table's
    (w4a16_config.lookup, by x's GPU family). Groups whose words straddle two groups
    (group_size not a multiple of 8) take the dequantize pass whatever ``config`` says."""
    k, n = check_inputs(x, qweight, scales, zeros, group_size)
    if planes_packed:
        check_planes(k, group_size)
    x2 = x.reshape(-1, k)  # (M, K)
    if group_size % PACK:
        return x2, Dequant()
    if config is None:
        family = "mma_sync" if dots_from_registers(x.device) else "wgmma"
        config = lookup(family, _ACT[x.dtype], max(x2.shape[0], 1), n, k, group_size,
                        planes_packed)  # no rows: any config (the callers launch nothing)
    return x2, config


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    config: W4A16Config | None = None,
    integer_zeros: bool = False,
    planes_packed: bool = False,
    silu_mul: bool = False,
) -> torch.Tensor:
    """y = x @ W for the runtime 4-bit layout; x [..., K] fp16/bf16 (fp32 in the interpreter),
    by Triton whatever the device (edge_llm.kernels.w4a16_matmul picks Triton or the torch
    reference by device).

    fp32 accumulation; returns x's dtype, shape [..., N]. ``config`` overrides the table's
    choice (tests and benchmarks). ``integer_zeros``: every zero point is an integer, as in
    every checkpoint format (the GEMV may then fold them into its constants).

    ``planes_packed``: qweight from ``pack_planes_ref`` (within each 128-row tile, plane j of
    the words covers 16 consecutive rows; K and group_size multiples of 128). The plane dots
    then read x as it is, where standard words need x copied into plane order; the one-row
    GEMV and the dequantize pass read the new order; every other kernel gets x permuted to
    match (``unplane_order``, a copy).

    ``silu_mul``: W is a merged [gate | up] projection and the result is silu(gate) * up,
    [..., N / 2] (``fused.silu_and_mul`` of y): computed in the GEMV's epilogue when that
    kernel serves the shape in one split (``launch_gemv16``), else by that second kernel.
    """
    x2, cfg = prepare(x, qweight, scales, zeros, group_size, planes_packed, config)
    n = qweight.shape[1]
    if silu_mul and n % 2:
        raise ValueError(f"silu_mul: W must have an even number of columns (gate | up), got {n}")
    if x2.shape[0] == 0:
        return x.new_empty((*x.shape[:-1], n // 2 if silu_mul else n))
    if silu_mul and isinstance(cfg, Gemv16):
        y = launch_gemv16(cfg, x2, qweight, scales, zeros, group_size, integer_zeros,
                          planes_packed, silu=True)
    else:
        y = LAUNCH[type(cfg)](cfg, x2, qweight, scales, zeros, group_size, integer_zeros,
                              planes_packed)
    if silu_mul and y.shape[-1] == n:
        y = silu_and_mul(y)
    return y.reshape(*x.shape[:-1], y.shape[-1])
