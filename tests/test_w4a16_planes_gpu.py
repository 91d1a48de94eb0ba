"""fp16 weight planes from inline PTX in the W4A16 tl.dot path (kernels/w4a16_planes.py) on a
CUDA GPU (``pytest -m gpu``): against the fp32 reference at 7B shapes for 5-64 rows, per-tile
and per-row scales, splits; bf16 activations keep the fp32 planes."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm.kernels.w4a16 import (  # noqa: E402
    W4A16Config,
    pack_w4_ref,
    w4a16_matmul,
    w4a16_matmul_ref,
)

SHAPES = [(4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096), (18944, 3584)]


def _problem(m, k, n, gs, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    qw = pack_w4_ref(torch.randint(0, 16, (k, n), device="cuda", generator=gen))
    g = k // gs
    s = (torch.rand(g, n, device="cuda", generator=gen) * 0.01 + 0.001).to(dtype)
    z = torch.randint(0, 16, (g, n), device="cuda", generator=gen).to(dtype)
    x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    return x, qw, s, z


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    assert bool(torch.isfinite(a).all())
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("m", [5, 8, 16, 33, 64])
@pytest.mark.parametrize("k,n", SHAPES)
def test_fp16_planes_match_reference(m, k, n):
    bm = min(64, max(16, 1 << (m - 1).bit_length()))
    for gs, cfg in ((128, W4A16Config("dot", bm, 64, 128, nibble_dots=True, fp16_planes=True)),
                    (128, W4A16Config("dot", bm, 128, 256, split_k=3, num_warps=8,
                                      nibble_dots=True, fp16_planes=True)),
                    (64, W4A16Config("dot", bm, 64, 128, split_k=0, nibble_dots=True,
                                     fp16_planes=True))):  # per-row scales
        x, qw, s, z = _problem(m, k, n, gs, torch.float16, seed=m * 7 + n)
        y = w4a16_matmul(x, qw, s, z, gs, config=cfg)
        assert _rel(y, w4a16_matmul_ref(x, qw, s, z, gs)) < 1e-2, f"{cfg} gs={gs}"


def test_bf16_keeps_fp32_planes():
    x, qw, s, z = _problem(16, 4096, 4096, 128, torch.bfloat16, seed=1)
    cfg = W4A16Config("dot", 16, 64, 128, nibble_dots=True, fp16_planes=True)
    y = w4a16_matmul(x, qw, s, z, 128, config=cfg)
    assert y.dtype == torch.bfloat16
    assert _rel(y, w4a16_matmul_ref(x, qw, s, z, 128)) < 1e-2
