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
    # keys and values token-major for every dtype, on the device and in the swap space alike
    for k, v in kv.layers + kv.cpu_layers:
        assert k.is_contiguous() and v.is_contiguous() and k.shape == v.shape
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


def _arch():
    return types.SimpleNamespace(num_layers=2, num_kv_heads=2, head_dim=16)  # what KV sizes read


def test_plan_sets_cuda_graph_memory_aside(monkeypatch):
    from edge_llm.config import CacheConfig
    from edge_llm.engine.kv_cache import (
        SERVING_SLACK_BYTES,
        GiB,
        KVBudgetError,
        bytes_per_block,
        plan_kv_cache,
    )

    # the card's size is the one device query the plan makes: a 24 GiB card
    props = types.SimpleNamespace(total_memory=24 * GiB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    arch, cuda = _arch(), torch.device("cuda", 0)
    block = bytes_per_block(arch, 16, torch.float16)
    cache = CacheConfig(block_size=16, gpu_memory_utilization=0.5, swap_space=0.0)
    plain = plan_kv_cache(arch, cache, torch.float16, cuda, 256, 4 * GiB)
    aside = plan_kv_cache(arch, cache, torch.float16, cuda, 256, 4 * GiB, GiB)
    assert plain.budget_bytes == 8 * GiB - SERVING_SLACK_BYTES and plain.graph_bytes == 0
    assert aside.budget_bytes == 7 * GiB - SERVING_SLACK_BYTES and aside.graph_bytes == GiB
    assert (plain.num_gpu_blocks - aside.num_gpu_blocks) * block == GiB
    # an explicit KV size is the KV cache alone: nothing comes off it
    explicit = plan_kv_cache(arch, CacheConfig(block_size=16, kv_cache_memory=GiB,
                                               swap_space=0.0),
                             torch.float16, cuda, 256, 4 * GiB, GiB)
    assert explicit.budget_bytes == GiB and explicit.graph_bytes == 0
    with pytest.raises(KVBudgetError, match="for CUDA graphs"):
        plan_kv_cache(arch, cache, torch.float16, cuda, 256, 4 * GiB, 8 * GiB)


def test_scratch_prefill_splits_a_step_into_sequences_of_max_seq_len():
    from edge_llm.model.full_forward import scratch_prefill

    lm = types.SimpleNamespace(arch=types.SimpleNamespace(num_layers=1, num_kv_heads=2,
                                                          head_dim=8))
    kv, meta = scratch_prefill(lm, 10, 4, torch.float16, torch.device("cpu"), max_seq_len=6)
    assert meta.seq_lens.tolist() == [6, 4] and meta.query_start_loc.tolist() == [0, 6, 10]
    assert meta.block_tables.tolist() == [[0, 1], [2, 3]] and kv[0][0].shape[0] == 4
    assert meta.slot_mapping.tolist() == [0, 1, 2, 3, 4, 5, 8, 9, 10, 11]
    assert meta.max_query_len == meta.max_seq_len == 6
    _, one = scratch_prefill(lm, 10, 4, torch.float16, torch.device("cpu"))
    assert one.seq_lens.tolist() == [10] and one.block_tables.tolist() == [[0, 1, 2]]
    # an fp8 scratch cache holds its values as the engine's does (token-major), so that the
    # start-up warm-ups compile the attention variants serving will launch
    (k8, v8), = scratch_prefill(lm, 10, 4, torch.uint8, torch.device("cpu"))[0]
    assert k8.is_contiguous() and v8.is_contiguous() and v8.dtype == torch.uint8


def test_dequant_buffer_released_on_sleep_comes_back_at_its_size(monkeypatch):
    from edge_llm.kernels import w4a16_dequant as dq

    monkeypatch.setattr(dq, "_SCRATCH", {})
    monkeypatch.setattr(dq, "_RETIRED", [])
    monkeypatch.setattr(dq, "_CAPTURED", [False])
    monkeypatch.setattr(dq, "_USERS", [0])
    cpu = torch.device("cpu")
    dq.acquire_dequant_scratch()  # two engines
    dq.acquire_dequant_scratch()
    first = dq.dequant_scratch(cpu, torch.float16, 8, 16)
    assert first.shape == (8, 16)
    assert dq.dequant_scratch(cpu, torch.float16, 4, 4).data_ptr() == first.data_ptr()
    dq._CAPTURED[0] = True  # as after a CUDA graph captured the buffer
    grown = dq.dequant_scratch(cpu, torch.float16, 16, 16)
    assert grown.data_ptr() != first.data_ptr()
    assert [t.data_ptr() for t in dq._RETIRED] == [first.data_ptr()], \
        "a captured buffer was freed while a graph may still write to it"
    assert dq.release_dequant_scratch() == [] and dq._SCRATCH, \
        "one engine's sleep dropped the buffer the other engine's graphs use"
    sizes = dq.release_dequant_scratch()
    assert sizes == [(cpu, torch.float16, 256)] and not dq._SCRATCH and not dq._RETIRED
    dq.acquire_dequant_scratch(sizes)
    assert dq._SCRATCH[(cpu, torch.float16)].numel() == 256 and dq._USERS == [1]


def test_expandable_segments_unless_the_allocator_is_configured(monkeypatch):
    from edge_llm.engine import kv_cache
    from edge_llm.engine.kv_cache import plain_segments, use_expandable_segments

    monkeypatch.setattr(kv_cache, "_expandable_on", False)
    calls: list[str] = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", calls.append,
                        raising=False)
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(var, raising=False)
    cuda = torch.device("cuda", 0)
    assert not use_expandable_segments(torch.device("cpu")) and calls == []
    assert use_expandable_segments(cuda) and calls == ["expandable_segments:True"]
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):  # the user's own settings
        monkeypatch.setenv(var, "max_split_size_mb:128")
        assert not use_expandable_segments(cuda)
        monkeypatch.delenv(var)
    assert calls == ["expandable_segments:True"]
    # the KV tensors are allocated with them off, and they are back on after
    with plain_segments():
        assert calls[-1] == "expandable_segments:False"
    assert calls[1:] == ["expandable_segments:False", "expandable_segments:True"]
    monkeypatch.setattr(kv_cache, "_expandable_on", False)  # not switched on: left alone
    with plain_segments():
        pass
    assert len(calls) == 3
