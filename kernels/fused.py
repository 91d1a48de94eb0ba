"""Fused elementwise and per-row kernels of the decoder: RMSNorm (alone and with the residual
add) and SiLU-and-multiply (the neox rotary embedding: kernels/rotary.py).

Each op has a plain-torch reference ``<op>_ref`` — exactly the math the model layers ran before
they called the dispatchers in ``edge_llm.kernels`` (the CPU path and the oracle) — and a Triton
wrapper ``<op>`` (CUDA, or CPU under TRITON_INTERPRET=1) with the same contract. The kernels
round where the reference rounds, so on fp16/bf16 they differ from it only by the last bit of
an occasional element (rsqrt/exp approximations, summation order, fused multiply-adds):

    rms_norm:      y = weight * dtype(x_f32 * rsqrt(mean(x_f32^2) + eps))   product rounded once
    add_rms_norm:  r' = dtype(r_f32 + x_f32);  y = rms_norm(r')             returns (y, r')
                   both with ``perm``: y[..., j] = y[..., perm[j]] (the residual r' is not
                   permuted): the input order of an act-order linear that reads y, so that
                   linear needs no gather of its own
    silu_and_mul:  y = dtype(dtype(silu(g_f32)) * u_f32)
    gelu_tanh_and_mul: the same with GeLU's tanh approximation (Gemma's MLP) for silu

The wrappers read no tensor on the host and size their grids from shapes only, so they can be
captured in CUDA graphs. Outputs are new tensors (nothing is updated in place).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grid import cdiv, next_pow2
from .pdl import pdl_enter, pdl_kwargs

__all__ = [
    "add_rms_norm", "add_rms_norm_ref", "gelu_tanh_and_mul", "gelu_tanh_and_mul_ref", "rms_norm",
    "rms_norm_ref", "silu_and_mul", "silu_and_mul_ref",
]

MAX_ROW_BLOCK = 8192  # row elements held in registers at once; longer rows go in chunks
ROW_TILE = 2048  # elements per program when several short rows (e.g. qk-norm heads) share one
SILU_BLOCK = 1024


# ------------------------------------------------------------------------------ references


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float,
                 perm: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last axis: normalise in fp32 as transformers does, then scale by
    ``weight`` in the input dtype (result dtype: torch's promotion of weight and x).
    ``perm`` (int64 (n,)): the result's columns in that order. ``torch.rms_norm`` upcasts,
    normalises and rounds back to x's dtype in one op, with the bits of the composite
    ``(xf * rsqrt(mean(xf ** 2) + eps)).to(x.dtype)`` (checked in fp32, fp16 and bf16); the
    CPU decode step calls this once per norm, where the composite was six ops."""
    y = weight * torch.rms_norm(x, (x.shape[-1],), eps=eps)
    return y if perm is None else y.index_select(-1, perm)


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    perm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual + x`` (in the activation dtype), then RMSNorm of that sum; returns
    (normed, new residual). ``perm``: as ``rms_norm_ref`` (normed only)."""
    residual = residual + x
    return rms_norm_ref(residual, weight, eps, perm), residual


def silu_and_mul_ref(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up``; with ``up`` None, ``gate`` is the concatenation [gate | up] along
    the last axis (a merged gate_up projection)."""
    if up is None:
        gate, up = _split_gate_up(gate)
    return torch.nn.functional.silu(gate) * up


def gelu_tanh_and_mul_ref(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu_tanh(gate) * up`` (transformers' ``gelu_pytorch_tanh``); ``up`` None: as
    ``silu_and_mul_ref``."""
    if up is None:
        gate, up = _split_gate_up(gate)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


def _split_gate_up(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up: the last axis must be even (gate | up), got "
                         f"{tuple(gate_up.shape)}")
    return gate_up.chunk(2, dim=-1)


# ----------------------------------------------------------------------------- Triton kernels


@triton.jit
def _residual_sum(x_ptr, res_ptr, res_out_ptr, offs_x, offs_r, offs_ro, mask,
                  HAS_RESIDUAL: tl.constexpr, STORE: tl.constexpr):
    """The rows to normalise, rounded to the activation dtype, as fp32: x, or x + residual
    (stored to ``res_out`` when STORE)."""
    s = tl.load(x_ptr + offs_x, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + offs_r, mask=mask, other=0.0)
        s = (r.to(tl.float32) + s.to(tl.float32)).to(s.dtype)
        if STORE:
            tl.store(res_out_ptr + offs_ro, s, mask=mask)
    return s.to(tl.float32)


# the row count changes from step to step: not specialised on (Triton would compile a variant
# per divisibility class while serving instead of at the start-up warm-up)
@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, perm_ptr,
    n_rows, n_cols, stride_x, stride_xi, stride_r, stride_o, stride_ro, eps,
    HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_CHUNKS: tl.constexpr, INNER_ROWS: tl.constexpr, PERM: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """ROWS rows per program. One chunk: the rows stay in registers between the sum of
    squares and the scaling. Several chunks: pass 1 sums (and stores the new residual), pass 2
    reloads the inputs and recomputes the same rounded sum (no read-after-write of res_out).

    x rows: row r at ``r * stride_x`` (INNER_ROWS == 1), or at ``(r // INNER_ROWS) * stride_x
    + (r % INNER_ROWS) * stride_xi``: the heads of a (T, H, D) view into a merged qkv output.

    PERM: output column j is column perm[j]; the scaling pass reads its inputs (and weight) at
    the permuted columns and recomputes the same rounded sum, as the chunked pass 2 does.
    tl.gather of the row in registers hangs on Hopper (Triton 3.6).

    One chunk: the weight (and the permutation) are read before the PDL wait, as no kernel of
    a forward writes them (kernels/pdl.py), so after it the inputs' round trip is the only
    one before the store (a one-row decode step's norm: 1.3 us against 2.8 on an H100, though
    the GEMV after it takes most of that back; 1.005x on an H200: BENCHMARKS.md)."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    row_ok = rows < n_rows
    cols = tl.arange(0, BLOCK_N)
    if NUM_CHUNKS == 1:  # the weight (no kernel of a forward writes it) before the wait
        if PERM:
            src = tl.load(perm_ptr + cols, mask=cols < n_cols, other=0)
            w = tl.load(w_ptr + src, mask=cols < n_cols, other=0.0).to(tl.float32)
        else:
            w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    pdl_enter(PDL)
    if INNER_ROWS == 1:
        x_rows = rows * stride_x
    else:
        x_rows = (rows // INNER_ROWS) * stride_x + (rows % INNER_ROWS) * stride_xi
    if NUM_CHUNKS == 1:
        mask = row_ok[:, None] & (cols[None, :] < n_cols)
        s = _residual_sum(x_ptr, res_ptr, res_out_ptr, x_rows[:, None] + cols[None, :],
                          rows[:, None] * stride_r + cols[None, :],
                          rows[:, None] * stride_ro + cols[None, :], mask, HAS_RESIDUAL, True)
        inv = tl.math.rsqrt(tl.sum(s * s, axis=1) / n_cols + eps)  # (ROWS,)
        if PERM:
            s = _residual_sum(x_ptr, res_ptr, res_out_ptr, x_rows[:, None] + src[None, :],
                              rows[:, None] * stride_r + src[None, :], rows[:, None], mask,
                              HAS_RESIDUAL, False)
        normed = (s * inv[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + rows[:, None] * stride_o + cols[None, :],
                 (normed * w[None, :]).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
        for c in range(NUM_CHUNKS):
            cc = c * BLOCK_N + cols
            mask = row_ok[:, None] & (cc[None, :] < n_cols)
            s = _residual_sum(x_ptr, res_ptr, res_out_ptr, x_rows[:, None] + cc[None, :],
                              rows[:, None] * stride_r + cc[None, :],
                              rows[:, None] * stride_ro + cc[None, :], mask, HAS_RESIDUAL, True)
            acc += s * s
        inv = tl.math.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)
        for c in range(NUM_CHUNKS):
            cc = c * BLOCK_N + cols
            mask = row_ok[:, None] & (cc[None, :] < n_cols)
            src = cc
            if PERM:
                src = tl.load(perm_ptr + cc, mask=cc < n_cols, other=0)
            s = _residual_sum(x_ptr, res_ptr, res_out_ptr, x_rows[:, None] + src[None, :],
                              rows[:, None] * stride_r + src[None, :],
                              rows[:, None] * stride_ro + src[None, :], mask, HAS_RESIDUAL,
                              False)
            normed = (s * inv[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
            w = tl.load(w_ptr + src, mask=cc < n_cols, other=0.0).to(tl.float32)
            tl.store(out_ptr + rows[:, None] * stride_o + cc[None, :],
                     (normed * w[None, :]).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, n_cols, stride_g, stride_u, stride_o,
                     BLOCK: tl.constexpr, PDL: tl.constexpr = False, GELU: tl.constexpr = False):
    """Grid (rows, column blocks): one BLOCK of one row per program. ``GELU``: GeLU's tanh
    form, 0.5 g (1 + tanh(y)) = g sigmoid(2 y), y = sqrt(2 / pi) (g + 0.044715 g^3)."""
    pdl_enter(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(g_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU:  # g sigmoid(2 y): no cancellation in 1 + tanh(y) where g is far negative
        y = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        act = g / (1.0 + tl.exp(-2.0 * y))
    else:
        act = g / (1.0 + tl.exp(-g))
    act = act.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + cols, (act * u).to(out_ptr.dtype.element_ty), mask=mask)


# ------------------------------------------------------------------------------- wrappers


def _rows(x: torch.Tensor, name: str) -> torch.Tensor:
    """x as (rows, n) with a contiguous last axis (a view when the strides allow it)."""
    if x.dim() == 0:
        raise ValueError(f"{name}: expected at least one axis, got a scalar")
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _head_rows(x: torch.Tensor) -> bool:
    """x is (T, H, D) with unit-stride rows that cannot be flattened to (T*H, D) as a view
    (q or k split from a merged qkv output: token stride (H + 2 Hkv) D, head stride D)."""
    return (x.dim() == 3 and x.shape[1] > 1 and x.stride(2) == 1
            and x.stride(0) != x.shape[1] * x.stride(1))


def _row_launch(n_cols: int) -> tuple[int, int, int, int]:
    """(ROWS, BLOCK_N, NUM_CHUNKS, num_warps) for rows of n_cols elements."""
    block_n = min(next_pow2(n_cols), MAX_ROW_BLOCK)
    rows = max(1, ROW_TILE // block_n)
    warps = max(1, min(8, rows * block_n // 512))
    return rows, block_n, cdiv(n_cols, block_n), warps


def _norm(x, residual, weight, eps, perm=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    n = x.shape[-1] if x.dim() else 0
    if weight.shape != (n,):
        raise ValueError(f"weight: expected shape ({n},) for rows of {n}, got "
                         f"{tuple(weight.shape)}")
    if perm is not None and (perm.shape != (n,) or perm.dtype != torch.int64
                             or perm.device != x.device):
        raise ValueError(f"perm: expected int64 of shape ({n},) on {x.device}, got "
                         f"{perm.dtype} {tuple(perm.shape)} on {perm.device}")
    if weight.dtype != x.dtype or (residual is not None and residual.dtype != x.dtype):
        raise ValueError(f"x, residual, weight: one dtype expected, got {x.dtype}, "
                         f"{None if residual is None else residual.dtype}, {weight.dtype}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual: shape {tuple(residual.shape)} != x {tuple(x.shape)}")
    if residual is None and perm is None and _head_rows(x):
        # (T, H, D) heads of a wider row (a merged qkv projection): two strides, no copy
        x2, stride_x, stride_xi, inner = x, x.stride(0), x.stride(1), x.shape[1]
        m = x.shape[0] * x.shape[1]
    else:
        x2 = _rows(x, "x")
        stride_x, stride_xi, inner, m = x2.stride(0), 0, 1, x2.shape[0]
    r2 = _rows(residual, "residual") if residual is not None else x2  # unread without one
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else out
    if m == 0 or n == 0:
        return out, (res_out if residual is not None else None)
    rows, block_n, chunks, warps = _row_launch(n)
    o2, ro2 = out.view(-1, n), res_out.view(-1, n)
    _rms_norm_kernel[(cdiv(m, rows),)](
        x2, r2, weight.contiguous(), o2, ro2, o2 if perm is None else perm.contiguous(), m, n,
        stride_x, stride_xi, r2.stride(0) if residual is not None else 0,
        o2.stride(0), ro2.stride(0), float(eps), HAS_RESIDUAL=residual is not None, ROWS=rows,
        BLOCK_N=block_n, NUM_CHUNKS=chunks, INNER_ROWS=inner, PERM=perm is not None,
        num_warps=warps, **pdl_kwargs(o2.device))
    return out, (res_out if residual is not None else None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             perm: torch.Tensor | None = None) -> torch.Tensor:
    """Triton ``rms_norm_ref`` over the last axis of x (any leading shape); weight in x's
    dtype. Returns a new tensor shaped like x."""
    return _norm(x, None, weight, eps, perm)[0]


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    perm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton ``add_rms_norm_ref``: one pass reads x and residual, writes (normed, new
    residual), both new tensors shaped like x."""
    out, res_out = _norm(x, residual, weight, eps, perm)
    assert res_out is not None
    return out, res_out


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor | None = None,
                 gelu: bool = False) -> torch.Tensor:
    """Triton ``silu_and_mul_ref`` (same arguments); a new tensor shaped like ``gate`` (half
    of its last axis when ``up`` is None). ``gelu``: ``gelu_tanh_and_mul_ref`` instead."""
    if up is None:
        gate, up = _split_gate_up(gate)
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"gate, up: shapes/dtypes {tuple(gate.shape)} {gate.dtype}, "
                         f"{tuple(up.shape)} {up.dtype} do not agree")
    g2, u2 = _rows(gate, "gate"), _rows(up, "up")
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    m, n = g2.shape
    if m == 0 or n == 0:
        return out
    o2 = out.view(-1, n)
    _silu_mul_kernel[(m, cdiv(n, SILU_BLOCK))](
        g2, u2, o2, n, g2.stride(0), u2.stride(0), o2.stride(0), BLOCK=SILU_BLOCK, num_warps=4,
        GELU=gelu, **pdl_kwargs(g2.device))
    return out


def gelu_tanh_and_mul(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """Triton ``gelu_tanh_and_mul_ref`` (same arguments and result shape)."""
    return silu_and_mul(gate, up, gelu=True)
