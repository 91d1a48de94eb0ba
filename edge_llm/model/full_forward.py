"""Logits of one whole sequence in one pass, with a scratch paged KV cache (evaluation only)."""

from __future__ import annotations

import torch

from .attention_metadata import AttentionMetadata
from .llama import CausalLM


@torch.inference_mode()
def full_logits(lm: CausalLM, ids: torch.Tensor, block_size: int = 16) -> torch.Tensor:
    """(T,) token ids -> (T, vocab) fp32 logits, as transformers' ``model(ids).logits[0]``."""
    arch = lm.arch
    dev = lm.lm_head.weight.device
    dtype = lm.lm_head.weight.dtype
    t = ids.numel()
    nblk = -(-t // block_size)
    shape = (nblk, block_size, arch.num_kv_heads, arch.head_dim)
    kv = [(torch.empty(shape, dtype=dtype, device=dev), torch.empty(shape, dtype=dtype, device=dev))
          for _ in range(arch.num_layers)]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(t, device=dev),
        query_start_loc=torch.tensor([0, t], dtype=torch.int32),
        seq_lens=torch.tensor([t], dtype=torch.int32, device=dev),
        block_tables=torch.arange(nblk, dtype=torch.int32, device=dev).view(1, -1),
        max_query_len=t,
        max_seq_len=t,
    )
    hidden = lm(ids.to(dev), torch.arange(t, device=dev), kv, meta)
    return lm.compute_logits(hidden)
