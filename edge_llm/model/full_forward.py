"""One whole sequence in one pass over a scratch paged KV cache (evaluation, memory profiling)."""

from __future__ import annotations

import torch

from .attention_metadata import AttentionMetadata
from .llama import CausalLM, KVCache


def scratch_prefill(
    lm: CausalLM, num_tokens: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> tuple[list[KVCache], AttentionMetadata]:
    """KV tensors just large enough for one sequence of ``num_tokens``, and the metadata of
    its prefill in one chunk (blocks 0.. in order)."""
    arch = lm.arch
    nblk = -(-num_tokens // block_size)
    shape = (nblk, block_size, arch.num_kv_heads, arch.head_dim)
    kv = [(torch.empty(shape, dtype=dtype, device=device),
           torch.empty(shape, dtype=dtype, device=device)) for _ in range(arch.num_layers)]
    meta = AttentionMetadata(
        slot_mapping=torch.arange(num_tokens, device=device),
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=device),
        block_tables=torch.arange(nblk, dtype=torch.int32, device=device).view(1, -1),
        max_query_len=num_tokens,
        max_seq_len=num_tokens,
    )
    return kv, meta


@torch.inference_mode()
def full_logits(lm: CausalLM, ids: torch.Tensor, block_size: int = 16,
                kv_dtype: torch.dtype | None = None) -> torch.Tensor:
    """(T,) token ids -> (T, vocab) fp32 logits, as transformers' ``model(ids).logits[0]``.
    ``kv_dtype``: the KV cache's dtype (default the weights'; torch.uint8: fp8 codes)."""
    weight = lm.lm_head.weight
    t = ids.numel()
    kv, meta = scratch_prefill(lm, t, block_size, kv_dtype or weight.dtype, weight.device)
    hidden = lm(ids.to(weight.device), torch.arange(t, device=weight.device), kv, meta)
    return lm.compute_logits(hidden)
