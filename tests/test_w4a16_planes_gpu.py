"""fp16 weight planes from inline PTX in the W4A16 tl.dot path (kernels/w4a16_planes.py) on a
CUDA GPU (``pytest -m gpu``): against the fp32 reference at 7B shapes for 8-256 rows, joined
into one tile in k order, per-tile and per-row scales, splits; bf16 activations keep the
fp32 unpacking."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm.kernels import w4a16_config as wc  # noqa: E402
from edge_llm.kernels.w4a16 import w4a16_matmul, w4a16_matmul_ref  # noqa: E402
from tests.helpers import rel_err  # noqa: E402
from tests.test_splitk_gpu import _problem  # noqa: E402

SHAPES = [(4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096), (18944, 3584)]


@pytest.mark.parametrize("m", [8, 33, 256])
@pytest.mark.parametrize("k,n", SHAPES)
def test_joined_planes_match_reference(m, k, n):
    """The planes joined into one [BK, BN] tile in k order, group sizes 128 and 32 (K tile
    clamped to the group), split K summed in the kernel."""
    bm = min(128, max(16, 1 << (m - 1).bit_length()))
    for gs, cfg in ((128, wc.Dot(block_m=bm, block_n=128, block_k=64, split_k=1,
                                 fp16_planes=True)),
                    (128, wc.Dot(block_m=bm, block_n=128, block_k=128, split_k=3,
                                 fp16_planes=True)),
                    (32, wc.Dot(block_m=bm, block_n=64, block_k=64, num_warps=8,
                                fp16_planes=True))):
        x, qw, s, z = _problem(m, k, n, gs, seed=m * 5 + n)
        y = w4a16_matmul(x, qw, s, z, gs, config=cfg)
        assert rel_err(y, w4a16_matmul_ref(x, qw, s, z, gs)) < 1e-2, f"{cfg} gs={gs}"


def test_bf16_keeps_fp32_planes():
    x, qw, s, z = _problem(16, 4096, 4096, 128, seed=1, dtype=torch.bfloat16)
    cfg = wc.Dot(block_m=16, block_n=64, block_k=64, split_k=1, fp16_planes=True)
    y = w4a16_matmul(x, qw, s, z, 128, config=cfg)
    assert y.dtype == torch.bfloat16
    assert rel_err(y, w4a16_matmul_ref(x, qw, s, z, 128)) < 1e-2
