"""GPTQ (Frantar et al., 2022): quantize columns in order, pushing each column's rounding error
onto the not-yet-quantized columns through the Cholesky factor of the inverse Hessian.

Follows AutoGPTQ ``quantization/gptq.py`` ``fasterquant`` (dead columns, act-order permutation by
descending ``diag(H)``, relative damping, lazy block updates, ``g_idx`` as AutoGPTQ writes it) with
two deliberate differences: the factorization runs in float64, and a group's scale/zero is
computed from the columns *after* the in-block error updates (AutoGPTQ reads the block's
not-yet-updated copy when a group starts inside a block). Blocks are a multiple of the group
size so no group straddles a block.
"""

from __future__ import annotations

import torch

from .rtn import check_quant_args, group_params, quantize_to_int


class HessianAccumulator:
    """Running ``H = 2/n * sum x x^T`` over the rows of a linear's inputs (float64, (K, K))."""

    def __init__(self, in_features: int) -> None:
        self.in_features = in_features
        self.h: torch.Tensor | None = None  # allocated on the device of the first inputs
        self.rows = 0

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).to(torch.float32)  # (rows, K)
        if x.shape[1] != self.in_features:
            raise ValueError(f"inputs have {x.shape[1]} features, expected {self.in_features}.")
        if self.h is None:
            self.h = torch.zeros(self.in_features, self.in_features, dtype=torch.float64,
                                 device=x.device)
        self.h += (x.t() @ x).to(torch.float64)
        self.rows += x.shape[0]

    def hessian(self) -> torch.Tensor:
        if self.h is None or self.rows == 0:
            raise ValueError("HessianAccumulator saw no inputs; run calibration data first.")
        return self.h * (2.0 / self.rows)


def _inverse_cholesky(h: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of (H + damp * mean(diag H) * I)^-1, float64."""
    k = h.shape[0]
    h = h + damp * torch.mean(torch.diag(h)) * torch.eye(k, dtype=h.dtype, device=h.device)
    lower = torch.linalg.cholesky(h)
    return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True)


def gptq_quantize(
    w: torch.Tensor,
    h: torch.Tensor,
    bits: int = 4,
    group_size: int = 128,
    sym: bool = False,
    act_order: bool = False,
    damp: float = 0.01,
    block_size: int = 128,
    static_groups: bool = False,
    mse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize W (N, K) against the Hessian H (K, K) of its inputs.

    Returns q int32 (N, K) in 0..15, scales float32 (N, G), zeros float32 (N, G),
    g_idx int32 (K,) (group of each input column; non-monotonic with ``act_order`` unless
    ``static_groups``), G = ceil(K / group_size). ``mse`` searches each group's clipping range
    (:func:`edge_llm.quant.rtn.group_params`) instead of using plain min/max.
    """
    gs = check_quant_args(w, bits, group_size)
    n, k = w.shape
    if h.shape != (k, k):
        raise ValueError(f"H must be ({k}, {k}) for W of shape {(n, k)}, got {tuple(h.shape)}.")
    if not 0.0 <= damp < 1.0:
        raise ValueError(f"damp must be in [0, 1), got {damp}.")
    w = w.detach().to(torch.float32).clone()
    h = h.detach().to(device=w.device, dtype=torch.float64).clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    groups = -(-k // gs)
    scales = torch.zeros(n, groups, device=w.device)
    zeros = torch.zeros(n, groups, device=w.device)
    perm = (torch.argsort(torch.diag(h), descending=True) if act_order
            else torch.arange(k, device=w.device))
    w, h = w[:, perm], h[perm][:, perm]
    hinv = _inverse_cholesky(h, damp).to(torch.float32)
    # the column loop is thousands of tiny ops: extra threads only add synchronisation (6-15x
    # slower on a busy 2-core machine), so it runs on one
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        q = _quantize_columns(w, hinv, scales, zeros, gs, bits, sym, mse,
                              perm if static_groups else None, block_size)
    finally:
        torch.set_num_threads(threads)
    if static_groups:
        g_perm = torch.div(perm, gs, rounding_mode="floor")
    else:
        g_perm = torch.div(torch.arange(k, device=w.device), gs, rounding_mode="floor")
    invperm = torch.argsort(perm)
    return q[:, invperm].contiguous(), scales, zeros, g_perm[invperm].to(torch.int32)


def _quantize_columns(
    w: torch.Tensor,  # (N, K) in processing order, updated in place
    hinv: torch.Tensor,  # (K, K) upper Cholesky factor of H^-1 in processing order
    scales: torch.Tensor,  # (N, G) filled here
    zeros: torch.Tensor,
    gs: int,
    bits: int,
    sym: bool,
    mse: bool,
    static_perm: torch.Tensor | None,  # original column of each processed one (static groups)
    block_size: int,
) -> torch.Tensor:
    """The GPTQ column loop; returns q int32 (N, K) in processing order.

    Dynamic groups (the default) take their scale/zero when the loop reaches a group's first
    column. Static groups (sequential groups of original columns, processed in act-order) take
    theirs when the loop first touches any of their columns, from those columns' current,
    error-updated values (AutoGPTQ uses the original weights, before any update).
    """
    n, k = w.shape
    q = torch.zeros(n, k, dtype=torch.int32, device=w.device)
    if static_perm is not None:
        positions = torch.argsort(static_perm)  # processing position of each original column
        ready = [False] * scales.shape[1]
    bs = block_size if gs >= k else max(gs, -(-block_size // gs) * gs)
    for i1 in range(0, k, bs):
        i2 = min(i1 + bs, k)
        w1 = w[:, i1:i2].clone()  # (N, B) this block, receives in-block updates
        err1 = torch.zeros_like(w1)
        h1 = hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if static_perm is not None:
                g = int(static_perm[col]) // gs
                if not ready[g]:
                    pos = positions[g * gs : (g + 1) * gs]
                    cols = _current_columns(w, w1, err1, hinv, i1, i2, pos)
                    scales[:, g], zeros[:, g] = group_params(cols, bits, sym, mse)
                    ready[g] = True
            else:
                g = col // gs
                if col % gs == 0:
                    # in-block columns carry their updates; later blocks only matter when one
                    # group spans all of K, and then col == 0 where nothing is pending yet
                    cols = torch.cat([w1[:, i:], w[:, i2:]], dim=1)[:, :gs]
                    scales[:, g], zeros[:, g] = group_params(cols, bits, sym, mse)
            s, z = scales[:, g], zeros[:, g]
            col_w = w1[:, i]
            qi = quantize_to_int(col_w, s, z, bits)
            q[:, col] = qi.to(torch.int32)
            err = (col_w - (qi - z) * s) / h1[i, i]
            w1[:, i:] -= err[:, None] * h1[i, i:][None, :]  # rank-1 update of the block
            err1[:, i] = err
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]  # lazy batch update of later columns
    return q


def _current_columns(w, w1, err1, hinv, i1: int, i2: int, pos: torch.Tensor) -> torch.Tensor:
    """Current values (N, len(pos)) of not-yet-quantized columns at processing positions ``pos``:
    in-block ones from the block copy, later ones minus the block's pending (lazy) updates."""
    out = torch.empty(w.shape[0], pos.numel(), dtype=w.dtype, device=w.device)
    inside = pos < i2
    out[:, inside] = w1[:, pos[inside] - i1]
    later = pos[~inside]
    if later.numel():
        out[:, ~inside] = w[:, later] - err1 @ hinv[i1:i2, later]
    return out
