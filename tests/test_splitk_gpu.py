"""Split-K summed inside the W4A16 kernels on a CUDA GPU (``pytest -m gpu``).

The in-kernel sum depends on memory ordering between programs (kernels/splitk.py), which the
interpreter cannot show, so here at full 7B shapes: the fused result equals the separate
reduce launch bit for bit over many launches and inside a replayed CUDA graph, and every
counter is back at zero afterwards."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm.kernels import splitk  # noqa: E402
from edge_llm.kernels import w4a16_config as wc  # noqa: E402
from edge_llm.kernels.w4a16 import (  # noqa: E402
    pack_w4_ref,
    prepare,
    w4a16_matmul,
    w4a16_matmul_ref,
)

SHAPES = [(4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096), (3584, 37888)]


def _problem(m: int, k: int, n: int, gs: int = 128, seed: int = 0,
             dtype: torch.dtype = torch.float16):
    """Random x [M, K] and packed weights with integer zero points, in ``dtype``."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randint(0, 16, (k, n), device="cuda", generator=gen)
    qw = pack_w4_ref(q)
    g = k // gs
    s = (torch.rand(g, n, device="cuda", generator=gen) * 0.01 + 0.001).to(dtype)
    z = torch.randint(0, 16, (g, n), device="cuda", generator=gen).to(dtype)
    x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    return x, qw, s, z


def _configs(x, qw, s, z) -> list[wc.W4A16Config]:
    m = x.shape[0]
    return [prepare(x, qw, s, z, 128)[1],  # this GPU's table row
            wc.Gemv16(block_n=64, block_k=128, split_k=7, rows=min(m, 4)),
            wc.Dot(block_m=16, block_n=64, block_k=128, split_k=5)]


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("k,n", SHAPES)
def test_fused_splitk_equals_reduce_launch(m, k, n):
    x, qw, s, z = _problem(m, k, n, seed=m + n)
    for cfg in _configs(x, qw, s, z):
        separate = w4a16_matmul(x, qw, s, z, 128, dataclasses.replace(cfg, fused_reduce=False))
        for _ in range(20):
            fused = w4a16_matmul(x, qw, s, z, 128, cfg)
            assert torch.equal(fused, separate), f"{cfg}"
    ref = w4a16_matmul_ref(x, qw, s, z, 128)
    assert float((fused.float() - ref.float()).norm() / ref.float().norm()) < 1e-2
    torch.cuda.synchronize()
    assert int(splitk.counters(x.device, 1).abs().sum()) == 0


def test_fused_splitk_in_cuda_graph():
    x, qw, s, z = _problem(1, 4096, 22016)
    cfg = wc.Gemv16(block_n=32, block_k=256, split_k=8, rows=1)
    w4a16_matmul(x, qw, s, z, 128, cfg)  # compile, allocate the counters outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = w4a16_matmul(x, qw, s, z, 128, cfg)
    for seed in range(10):
        x.copy_(torch.randn_like(x, dtype=torch.float32).half())
        graph.replay()
        want = w4a16_matmul(x, qw, s, z, 128, dataclasses.replace(cfg, fused_reduce=False))
        assert torch.equal(out, want), f"replay {seed}"
    torch.cuda.synchronize()
    assert int(splitk.counters(x.device, 1).abs().sum()) == 0

