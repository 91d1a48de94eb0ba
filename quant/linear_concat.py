"""Merging QuantLinears along their output columns (``concat_linears``; used by
edge_llm/model/fuse.py for q/k/v and gate/up): when the parts allow it, and how.

Imports ``linear``; ``linear`` does not import this module."""

from __future__ import annotations

import torch

from .linear import QuantLinear


def concat_mismatch(parts: list[QuantLinear]) -> str | None:
    """Why ``concat_linears(parts)`` would refuse ``parts`` (a sentence), or None.

    Output columns can be concatenated only when every part reads its input the same way:
    one spec, group size, activation dtype, device and in_features, no general ``g_idx`` and
    one row permutation (all None, or all equal: act-order q/k/v share the input Hessian, so
    GPTQ normally gives them the same one), and bias on all parts or none.
    """
    if len(parts) < 2:
        return "fewer than two parts"
    first = parts[0]
    for p in parts[1:]:
        for what, a, b in (("spec", p.spec, first.spec), ("dtype", p.dtype, first.dtype),
                           ("group_size", p.group_size, first.group_size),
                           ("in_features", p.in_features, first.in_features),
                           ("device", p.qweight.device, first.qweight.device),
                           ("bias", p.bias is None, first.bias is None)):
            if a != b:
                return f"{what} differs ({b} vs {a})"
    if any(p.input_permuted for p in parts):
        return "an input already permuted by its caller"
    if any(p.planes_packed for p in parts):
        return "words already plane-packed (merge first)"
    if any(p.g_idx is not None for p in parts):
        return "a general g_idx (groups of unequal sizes)"
    perms = [p.perm for p in parts]
    if any(x is None for x in perms) != all(x is None for x in perms):
        return "act-order on some parts only"
    if perms[0] is not None and not all(torch.equal(perms[0], x) for x in perms[1:]):
        return "different act-order permutations"
    return None


def concat_linears(parts: list[QuantLinear]) -> QuantLinear:
    """One QuantLinear whose output columns are ``parts``' outputs side by side:
    ``concat_linears([a, b])(x) == cat([a(x), b(x)], -1)``. Raises ValueError naming the
    reason when ``concat_mismatch(parts)`` finds one. The parts keep their tensors (the caller
    drops them); the result's are new (``torch.cat`` along N)."""
    reason = concat_mismatch(parts)
    if reason is not None:
        raise ValueError(f"concat_linears: cannot merge these linears: {reason}.")
    first = parts[0]
    n = sum(p.out_features for p in parts)
    with torch.device("meta"):  # buffers replaced below: no allocation here
        merged = QuantLinear(first.in_features, n, first.bias is not None, first.spec, first.dtype)
    merged.qweight = torch.cat([p.qweight for p in parts], dim=1)  # (K/8, N1 + N2 + ...)
    merged.scales = torch.cat([p.scales for p in parts], dim=1)  # (G, N)
    merged.zeros = torch.cat([p.zeros for p in parts], dim=1)
    if first.bias is not None:
        merged.bias = torch.cat([p.bias for p in parts])  # (N,)
    merged.perm = first.perm  # shared by every part (checked above)
    return merged
