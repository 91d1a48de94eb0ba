"""Staged reads on a CUDA GPU (``pytest -m gpu``): a sharded random AWQ checkpoint of real
Llama-2-7B layer shapes loaded through pinned buffers (the CUDA default) equals the
memory-mapped load tensor for tensor, keeps no view of the read buffers, and leaves no
buffer memory allocated once loading returns."""

from __future__ import annotations

import gc

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm.model.loader import load_model, staged_enabled  # noqa: E402
from tests.test_fuse_gpu import awq_dirs  # noqa: E402,F401 - the fixture
from tests.test_staged_read import _assert_no_buffer_views, _assert_same_model  # noqa: E402


@pytest.mark.parametrize("merge", [True, False])
def test_staged_load_on_gpu_equals_mapped(awq_dirs, merge):  # noqa: F811
    path = awq_dirs("qwen3-8b-2l")  # two shards (the q/k norms have their own)
    assert staged_enabled(None, torch.device("cuda"), 1 << 30)
    mapped = load_model(str(path), device="cuda", progress=False, staged=False,
                        merge_projections=merge)
    mapped_bytes = torch.cuda.memory_allocated()
    staged = load_model(str(path), device="cuda", progress=False, merge_projections=merge)
    torch.cuda.synchronize()
    _assert_same_model(mapped, staged)
    _assert_no_buffer_views(staged.model)
    del mapped
    gc.collect()
    # the second model alone: no file buffer (hundreds of MB here) is left allocated; the
    # slack covers small one-time allocations (seen: 0.5 MiB on the first staged load)
    assert torch.cuda.memory_allocated() <= mapped_bytes + (4 << 20)
