"""One whole sequence in one pass over a scratch paged KV cache (evaluation, memory profiling)."""

from __future__ import annotations

import torch

from .attention_metadata import AttentionMetadata
from .llama import CausalLM, KVCache


def scratch_prefill(
    lm: CausalLM, num_tokens: int, block_size: int, dtype: torch.dtype, device: torch.device,
    max_seq_len: int | None = None, num_layers: int | None = None,
) -> tuple[list[KVCache], AttentionMetadata]:
    """KV tensors just large enough for ``num_tokens`` new tokens, and the metadata of their
    prefill in one step: one sequence, or with ``max_seq_len`` as many sequences of at most
    that many tokens as they need (each its own blocks, in order). ``num_layers``: caches
    for that many layers only (default all; see ``CausalLM.first_layers``)."""
    arch = lm.arch
    seq = min(num_tokens, max_seq_len or num_tokens)
    lens = [seq] * (num_tokens // seq) + ([num_tokens % seq] if num_tokens % seq else [])
    per = -(-seq // block_size)  # blocks of each sequence
    nblk = per * len(lens)
    shape = (nblk, block_size, arch.num_kv_heads, arch.head_dim)
    kv = [(torch.empty(shape, dtype=dtype, device=device),
           torch.empty(shape, dtype=dtype, device=device))
          for _ in range(arch.num_layers if num_layers is None else num_layers)]
    slots = torch.cat([i * per * block_size + torch.arange(n) for i, n in enumerate(lens)])
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    meta = AttentionMetadata(
        slot_mapping=slots.to(device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        block_tables=torch.arange(nblk, dtype=torch.int32, device=device).view(len(lens), per),
        max_query_len=seq,
        max_seq_len=seq,
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
