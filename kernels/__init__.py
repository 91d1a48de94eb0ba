"""Compute kernels: Triton on CUDA, plain-torch references everywhere else.

Callers use the dispatch functions below; each picks the Triton kernel when the tensors live on
a CUDA device and the kernel is available, and the reference otherwise.
"""

from __future__ import annotations

import torch

from .paged_attention import paged_attention_ref, write_kv_ref

__all__ = ["paged_attention", "write_kv", "paged_attention_ref", "write_kv_ref"]


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    write_kv_ref(k, v, k_cache, v_cache, slot_mapping)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    return paged_attention_ref(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale)
