"""Per-step attention inputs, passed explicitly through the model's forward."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class AttentionMetadata:
    """Where each new token's K/V goes and what each sequence attends to.

    See ``edge_llm.kernels.paged_attention`` for the layout diagram.
    """

    slot_mapping: torch.Tensor  # (T,) int64: cache slot of each new token
    query_start_loc: torch.Tensor  # (B + 1,) int32
    seq_lens: torch.Tensor  # (B,) int32: context length after this step
    block_tables: torch.Tensor  # (B, max_blocks) int32
    max_query_len: int
    max_seq_len: int
    # what the kernels derive from these once and every layer reuses (the prefill kernel's
    # tile table): lives as long as this object, one forward; never shared between two
    # forwards (a CUDA graph capture would read a tensor computed outside it)
    scratch: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
