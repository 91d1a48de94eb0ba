"""Per-step attention inputs, passed explicitly through the model's forward."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1
