"""The KV tensors' swap copies (edge_llm/engine/kv_cache.py) on CPU tensors: runs of
consecutive host slots, and a swap out then in through fragmented slots that must bring
every block back bit for bit (fp32 and fp8 codes)."""

from __future__ import annotations

import types

import pytest
import torch

from edge_llm.engine.kv_cache import KVCache, KVCachePlan, slot_runs


def test_slot_runs():
    assert slot_runs([]) == []
    assert slot_runs([5, 6, 7, 2, 3, 9]) == [(0, 5, 3), (3, 2, 2), (5, 9, 1)]
    assert slot_runs([3, 2, 1]) == [(0, 3, 1), (1, 2, 1), (2, 1, 1)]
    assert slot_runs([0, 1, 2, 3]) == [(0, 0, 4)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.uint8])
def test_swap_out_and_in_through_fragmented_slots(dtype):
    arch = types.SimpleNamespace(num_layers=3, num_kv_heads=2, head_dim=8)
    plan = KVCachePlan(num_gpu_blocks=12, num_cpu_blocks=10, block_bytes=0, budget_bytes=0)
    kv = KVCache(arch, plan, 4, dtype, torch.device("cpu"))
    for k, v in kv.layers:
        k.copy_(torch.randint(0, 200, k.shape).to(dtype))
        v.copy_(torch.randint(0, 200, v.shape).to(dtype))
    before = [(k.clone(), v.clone()) for k, v in kv.layers]
    blocks, slots = [7, 1, 4, 9, 10], [6, 7, 2, 3, 8]  # runs 6-7, 2-3, 8
    kv.swap_out(list(zip(blocks, slots, strict=True)))
    for layer, (ck, cv) in enumerate(kv.cpu_layers):
        k0, v0 = before[layer]
        assert torch.equal(ck[slots], k0[blocks]) and torch.equal(cv[slots], v0[blocks])
    for k, v in kv.layers:
        k.zero_()
        v.zero_()
    back = [0, 11, 3, 5, 2]  # other device blocks
    kv.swap_in(list(zip(slots, back, strict=True)))
    for layer, (k, v) in enumerate(kv.layers):
        k0, v0 = before[layer]
        assert torch.equal(k[back], k0[blocks]) and torch.equal(v[back], v0[blocks])
        untouched = [b for b in range(12) if b not in back]
        assert not k[untouched].any() and not v[untouched].any()
