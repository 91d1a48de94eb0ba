"""Perplexity of any next-token model given as a callable returning logits."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F


@torch.no_grad()
def perplexity(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    token_ids: torch.Tensor | Sequence[int],
    window: int,
) -> float:
    """exp(mean NLL) over ``token_ids`` cut into consecutive non-overlapping windows.

    ``logits_fn`` takes ids (1, T) int64 and returns logits (1, T, V) or (T, V). Each window is
    scored independently (its first token has no context and is not scored), so the result
    depends on ``window``; compare models with the same one.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.int64).reshape(-1)
    if window < 2:
        raise ValueError(f"window must be >= 2, got {window}.")
    if ids.numel() < 2:
        raise ValueError("perplexity needs at least 2 tokens.")
    total_nll, count = 0.0, 0
    for start in range(0, ids.numel() - 1, window):
        chunk = ids[start : start + window]
        if chunk.numel() < 2:
            break
        logits = logits_fn(chunk[None])
        logits = logits.reshape(chunk.numel(), -1).float()  # (T, V)
        nll = F.cross_entropy(logits[:-1], chunk[1:].to(logits.device), reduction="sum")
        total_nll += float(nll)
        count += chunk.numel() - 1
    return math.exp(total_nll / count)
