"""Column gather ``out[..., j] = x[..., perm[j]]`` in one launch: the input permutation of an
act-order linear whose gather could not be folded away (o_proj; see model/fuse.py).

torch's ``index_select`` on the last axis is slow for one short row, and an act-order 7B
decode step calls it 32 times. The reference is ``x.index_select(-1, perm)``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grid import cdiv
from .pdl import pdl_enter, pdl_kwargs

BLOCK = 1024


@triton.jit(do_not_specialize=["n_rows"])
def _gather_cols_kernel(x_ptr, perm_ptr, out_ptr, n_rows, n_cols, stride_x, stride_o,
                        BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """Grid (rows, column blocks)."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    src = tl.load(perm_ptr + cols, mask=mask, other=0)
    tl.store(out_ptr + row * stride_o + cols,
             tl.load(x_ptr + row * stride_x + src, mask=mask), mask=mask)


def gather_columns_ref(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    return x.index_select(-1, perm)


def gather_columns(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``x[..., perm]`` (perm: int64 (n,), a permutation of x's last axis, on x's device)."""
    n = x.shape[-1]
    if perm.shape != (n,) or perm.dtype != torch.int64 or perm.device != x.device:
        raise ValueError(f"perm: expected int64 of shape ({n},) on {x.device}, got "
                         f"{perm.dtype} {tuple(perm.shape)} on {perm.device}")
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty_like(x2)
    if x2.shape[0]:
        _gather_cols_kernel[(x2.shape[0], cdiv(n, BLOCK))](
            x2, perm, out, x2.shape[0], n, x2.stride(0), out.stride(0), BLOCK=BLOCK,
            num_warps=4, **pdl_kwargs(x2.device))
    return out.reshape(x.shape)
