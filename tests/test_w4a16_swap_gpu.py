"""The W4A16 kernel with the weights as the dot's left operand (kernels/w4a16_swap.py) on a
CUDA GPU (``pytest -m gpu``): against the fp32 reference at 7B shapes for 8-256 rows, fp16
activations, the joined tile and the plane dots with x split in registers, group sizes 128
and 32, split K."""

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

SHAPES = [(4096, 12288), (4096, 4096), (11008, 4096), (3584, 4608)]


@pytest.mark.parametrize("m", [8, 16, 33, 256])
@pytest.mark.parametrize("k,n", SHAPES)
def test_swap_matches_reference(m, k, n):
    bm = min(64, max(16, 1 << (m - 1).bit_length()))
    for gs, cfg in ((128, wc.Swap(block_m=bm, block_n=64, block_k=128)),
                    (128, wc.Swap(block_m=bm, block_n=128, block_k=128, split_k=3, num_warps=8,
                                  x_split=True)),
                    (32, wc.Swap(block_m=bm, block_n=64, block_k=256, split_k=1))):  # per-row
        x, qw, s, z = _problem(m, k, n, gs, seed=m * 3 + n)
        y = w4a16_matmul(x, qw, s, z, gs, config=cfg)
        assert rel_err(y, w4a16_matmul_ref(x, qw, s, z, gs)) < 1e-2, f"{cfg} gs={gs}"
