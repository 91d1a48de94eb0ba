"""The swap copies on a CUDA GPU (``pytest -m gpu``): asynchronous copies between the device
blocks and the pinned swap space, run by run, then device work on the same stream that
overwrites the swapped-out blocks; everything must come back bit for bit."""

from __future__ import annotations

import types

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm.engine.kv_cache import KVCache, KVCachePlan  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float16, torch.uint8])
def test_swap_round_trip_with_stream_ordered_reuse(dtype):
    arch = types.SimpleNamespace(num_layers=4, num_kv_heads=8, head_dim=128)
    plan = KVCachePlan(num_gpu_blocks=4096, num_cpu_blocks=2048, block_bytes=0, budget_bytes=0)
    kv = KVCache(arch, plan, 16, dtype, torch.device("cuda"))
    assert kv.cpu_layers[0][0].is_pinned()
    for k, v in kv.layers:
        k.copy_(torch.randint(0, 120, k.shape, device="cuda").to(dtype))
        v.copy_(torch.randint(0, 120, v.shape, device="cuda").to(dtype))
    before = [(k.clone(), v.clone()) for k, v in kv.layers]
    g = torch.Generator().manual_seed(0)
    blocks = torch.randperm(4096, generator=g)[:1500].tolist()
    slots = torch.randperm(2048, generator=g)[:1500].tolist()
    slots[:700] = sorted(slots[:700])  # long runs and short ones
    kv.swap_out(list(zip(blocks, slots, strict=True)))
    for k, v in kv.layers:  # queued after the copies: must not reach the host copies
        k.fill_(0)
        v.fill_(0)
    back = torch.randperm(4096, generator=g)[:1500].tolist()
    kv.swap_in(list(zip(slots, back, strict=True)))
    torch.cuda.synchronize()
    for (k, v), (k0, v0) in zip(kv.layers, before, strict=True):
        assert torch.equal(k[back], k0[blocks]) and torch.equal(v[back], v0[blocks])
