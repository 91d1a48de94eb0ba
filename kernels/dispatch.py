"""The dispatchers: each op runs its Triton kernel when the tensors live on a CUDA device in
fp16/bf16, and its plain-torch reference otherwise (CPU, fp32). Re-exported by the package."""


from __future__ import annotations

import torch

from edge_llm import envs

from . import fused as _fused
from . import gather as _gather
from . import paged_attention as _pa
from . import rotary as _rot
from . import rotary_kv as _rkv
from . import w4a16 as _w4
from .fused import add_rms_norm_ref, gelu_tanh_and_mul_ref, rms_norm_ref, silu_and_mul_ref
from .gather import gather_columns_ref
from .paged_attention import paged_attention_ref, write_kv_ref
from .rotary import rotary_ref
from .w4a16 import dequantize_w4a16_ref, pack_planes_ref, pack_w4_ref, w4a16_matmul_ref
from .w4a16_dequant import acquire_dequant_scratch, release_dequant_scratch

__all__ = [
    "triton_enabled",
    "paged_attention",
    "write_kv",
    "w4a16_matmul",
    "w4a16_silu_mul",
    "rms_norm",
    "add_rms_norm",
    "silu_and_mul",
    "gelu_tanh_and_mul",
    "rotary",
    "rotary_write_kv",
    "gather_columns",
    "acquire_dequant_scratch",
    "release_dequant_scratch",
    "paged_attention_ref",
    "write_kv_ref",
    "w4a16_matmul_ref",
    "dequantize_w4a16_ref",
    "pack_w4_ref",
    "pack_planes_ref",
    "rms_norm_ref",
    "add_rms_norm_ref",
    "silu_and_mul_ref",
    "gelu_tanh_and_mul_ref",
    "rotary_ref",
    "gather_columns_ref",
]

_HALF = (torch.float16, torch.bfloat16)
# most rows for which silu(gate) * up runs in the one-row GEMV's epilogue (w4a16_silu_mul);
# the kernel serves two rows too, but there the second kernel is faster (BENCHMARKS.md)
GEMV_SILU_MAX_ROWS = 1


def _triton() -> bool:
    """False under ``EDGE_LLM_KERNELS=torch``: the references on CUDA too (comparisons)."""
    return envs.KERNELS.get() == "triton"


def triton_enabled(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the dispatchers below run the Triton kernels for tensors on ``device`` in
    ``dtype``. Only then is a decode forward free of host syncs (the references read sequence
    lengths on the host), so only then can it be captured in a CUDA graph."""
    return device.type == "cuda" and dtype in _HALF and _triton()


def write_kv(
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,
    k_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64, < 0 = skip
) -> None:
    """Store new K/V at their cache slots (see ``paged_attention`` for the layout)."""
    if k_cache.is_cuda and _triton():
        _pa.write_kv(k, v, k_cache, v_cache, slot_mapping)
    else:
        write_kv_ref(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    scratch: dict | None = None,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new queries over its paged context, (T, H, D).
    ``window``: a query at position p sees keys at p - window + 1 .. p only (sliding-window
    layers); ``softcap``: scores become softcap * tanh(scores / softcap) (Gemma 2).

    ``max_query_len`` / ``max_seq_len`` (host ints, e.g. from AttentionMetadata) are optional
    hints for the CUDA path: the first picks decode vs prefill without reading
    ``query_start_loc``, the second sizes the decode context split and the prefill key
    split. ``scratch`` (``AttentionMetadata.scratch``, one forward's): where the prefill
    kernel keeps its tile table for the next layers.
    """
    if q.is_cuda and q.dtype in _HALF and _triton():
        return _pa.paged_attention_triton(q, k_cache, v_cache, block_tables, query_start_loc,
                                          seq_lens, scale, max_query_len, max_seq_len,
                                          scratch, window=window, softcap=softcap)
    return paged_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale,
                               window=window, softcap=softcap, scratch=scratch)


def w4a16_matmul(
    x: torch.Tensor,  # (..., K)
    qweight: torch.Tensor,  # (K/8, N) int32
    scales: torch.Tensor,  # (G, N)
    zeros: torch.Tensor,  # (G, N)
    group_size: int,
    integer_zeros: bool = False,
    planes_packed: bool = False,
) -> torch.Tensor:
    """y = x @ W for the runtime 4-bit layout (kernels/w4a16.py), (..., N) in x's dtype.
    ``integer_zeros``: the caller vouches that every zero point is an integer.
    ``planes_packed``: qweight in the plane-packed word order (``pack_planes_ref``).
    On CUDA: the table's kernel for the problem (kernels/w4a16_config.py), launched here."""
    if not (x.is_cuda and x.dtype in _HALF and _triton()):
        return w4a16_matmul_ref(x, qweight, scales, zeros, group_size,
                                planes_packed=planes_packed)
    x2, cfg = _w4.prepare(x, qweight, scales, zeros, group_size, planes_packed)
    if x2.shape[0] == 0:
        return x.new_empty((*x.shape[:-1], qweight.shape[1]))
    y = _w4.LAUNCH[type(cfg)](cfg, x2, qweight, scales, zeros, group_size, integer_zeros,
                              planes_packed)  # (M, N)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def w4a16_silu_mul(
    x: torch.Tensor,  # (..., K)
    qweight: torch.Tensor,  # (K/8, 2 I) int32: a merged [gate | up] projection
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    integer_zeros: bool = False,
    planes_packed: bool = False,
) -> torch.Tensor:
    """``silu_and_mul(w4a16_matmul(x, ...))``, (..., I). On CUDA, for one row, the one-row
    GEMV computes it in its epilogue where it serves the shape in one split
    (kernels/w4a16_gemv.py ``launch_gemv16``: a 7B-sized MLP): one kernel and no (..., 2 I)
    intermediate."""
    if (x.is_cuda and x.dtype in _HALF and x.numel() <= GEMV_SILU_MAX_ROWS * x.shape[-1]
            and _triton()):
        return _w4.w4a16_matmul(x, qweight, scales, zeros, group_size,
                                integer_zeros=integer_zeros, planes_packed=planes_packed,
                                silu_mul=True)
    return silu_and_mul(w4a16_matmul(x, qweight, scales, zeros, group_size,
                                     integer_zeros=integer_zeros, planes_packed=planes_packed))


def gather_columns(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """x[..., perm] (perm int64 on x's device): kernels/gather.py on CUDA fp16/bf16."""
    if x.is_cuda and x.dtype in _HALF and _triton():
        return _gather.gather_columns(x, perm)
    return gather_columns_ref(x, perm)


def _fused_ok(*tensors: torch.Tensor) -> bool:
    """Triton for the fused ops: CUDA tensors of one fp16/bf16 dtype (anything else, e.g. an
    fp32 norm weight beside fp16 activations, keeps the reference's type promotion)."""
    first = tensors[0]
    return (first.is_cuda and _triton() and first.dtype in _HALF
            and all(t.dtype == first.dtype for t in tensors))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             perm: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm over the last axis of x (kernels/fused.py for the exact rounding); ``perm``
    (int64): the result's columns in that order."""
    if _fused_ok(x, weight):
        return _fused.rms_norm(x, weight, eps, perm)
    return rms_norm_ref(x, weight, eps, perm)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    perm: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(residual + x), residual + x), the sum in the activation dtype; ``perm``
    permutes the columns of the first only."""
    if _fused_ok(x, residual, weight):
        return _fused.add_rms_norm(x, residual, weight, eps, perm)
    return add_rms_norm_ref(x, residual, weight, eps, perm)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up; ``up`` None: gate holds [gate | up] along its last axis."""
    if _fused_ok(*((gate,) if up is None else (gate, up))):
        return _fused.silu_and_mul(gate, up)
    return silu_and_mul_ref(gate, up)


def gelu_tanh_and_mul(gate: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
    """gelu_tanh(gate) * up (Gemma's MLP); ``up`` None: gate holds [gate | up]."""
    if _fused_ok(*((gate,) if up is None else (gate, up))):
        return _fused.gelu_tanh_and_mul(gate, up)
    return gelu_tanh_and_mul_ref(gate, up)


def rotary(
    q: torch.Tensor,  # (T, H, D)
    k: torch.Tensor,  # (T, Hkv, D)
    cos: torch.Tensor,  # (max_positions, D/2)
    sin: torch.Tensor,
    positions: torch.Tensor,  # (T,)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox rotary embedding of q and k at ``positions`` (new tensors, q's dtype)."""
    if _fused_ok(q, k):
        return _rot.rotary(q, k, cos, sin, positions)
    return rotary_ref(q, k, cos, sin, positions)


def rotary_write_kv(
    q: torch.Tensor,  # (T, H, D)
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    cos: torch.Tensor,  # (max_positions, D/2)
    sin: torch.Tensor,
    positions: torch.Tensor,  # (T,)
    k_cache: torch.Tensor,  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # (T,) int64, < 0 = skip
    scratch: dict | None = None,
) -> torch.Tensor:
    """``rotary`` of q and k, then ``write_kv`` of the rotated k and v; returns the rotated q.
    One Triton launch on CUDA fp16/bf16 (kernels/rotary_kv.py). ``scratch``
    (``AttentionMetadata.scratch``, one forward's): where the CPU path keeps the cos / sin
    rows at ``positions`` for the next layers."""
    if _fused_ok(q, k, v) and k_cache.is_cuda:
        return _rkv.rotary_write_kv(q, k, v, cos, sin, positions, k_cache, v_cache,
                                    slot_mapping)
    if not q.is_cuda:
        rows = scratch.get("rotary_rows") if scratch is not None else None
        if rows is None or rows[0] is not cos:
            rows = (cos, _rot.rotary_rows_ref(cos, sin, positions))
            if scratch is not None:
                scratch["rotary_rows"] = rows
        q, k = _rot.rotate_ref(q, k, *rows[1])
        write_kv_ref(k, v, k_cache, v_cache, slot_mapping)
        return q
    q, k = rotary(q, k, cos, sin, positions)
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    return q
