"""Our readers and writers against the producers' own code (AutoAWQ 0.2.9).

AutoAWQ writes AWQ GEMM tensors (``WQLinear_GEMM.from_linear``) and converts them to the GPTQ
layout (``awq.utils.packing_utils``); we must read all of them to the same fp32 weights, bit for
bit, and write byte-identical tensors back.
"""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

awq_gemm = pytest.importorskip(
    "awq.modules.linear.gemm", reason="autoawq is not installed (pip install autoawq==0.2.9)"
)
from awq.quantize.quantizer import AwqQuantizer  # noqa: E402
from awq.utils import packing_utils  # noqa: E402

from edge_llm.quant import (  # noqa: E402
    QuantLinear,
    QuantSpec,
    pack_awq,
    pack_gptq,
    unpack_awq,
    unpack_gptq,
)


def _awq_linear(k: int, n: int, gs: int, seed: int):
    """A random fp16 linear quantized by AutoAWQ's own code; returns (linear, WQLinear_GEMM)."""
    gen = torch.Generator().manual_seed(seed)
    linear = nn.Linear(k, n, bias=True).half()
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=gen) * 0.05)
        linear.bias.copy_(torch.randn(n, generator=gen) * 0.1)
    fake_self = types.SimpleNamespace(group_size=gs, zero_point=True, w_bit=4)
    _, scales, zeros = AwqQuantizer.pseudo_quantize_tensor(fake_self, linear.weight.data)
    wq = awq_gemm.WQLinear_GEMM.from_linear(
        linear, w_bit=4, group_size=gs, init_only=False,
        scales=scales.t().contiguous(), zeros=zeros.t().contiguous(),
    )
    return linear, wq


def _load(spec: QuantSpec, k: int, n: int, tensors: dict) -> QuantLinear:
    lin = QuantLinear(k, n, "bias" in tensors, spec, torch.float32)
    lin.load_checkpoint_tensors(tensors, "cpu")
    return lin


@pytest.mark.parametrize("gs,seed", [(32, 0), (64, 1), (128, 2)])
def test_awq_gemm_tensors_read_bit_exact(gs, seed):
    k, n = 256, 128
    _, wq = _awq_linear(k, n, gs, seed)
    tensors = {"qweight": wq.qweight, "qzeros": wq.qzeros, "scales": wq.scales, "bias": wq.bias}
    ours = _load(QuantSpec("awq", group_size=gs), k, n, tensors)
    theirs = packing_utils.dequantize_gemm(wq.qweight, wq.qzeros, wq.scales.float(), 4, gs)
    assert torch.equal(ours.dequantize(), theirs.t())  # (N, K) fp32, bit for bit
    # our writer reproduces AutoAWQ's bytes exactly
    back = pack_awq(unpack_awq({"qweight": wq.qweight, "qzeros": wq.qzeros,
                                "scales": wq.scales}, k, n, gs))
    assert torch.equal(back["qweight"], wq.qweight) and torch.equal(back["qzeros"], wq.qzeros)
    assert torch.equal(back["scales"], wq.scales)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(ours(x), x @ theirs + wq.bias.float())


@pytest.mark.parametrize("gs,seed", [(32, 3), (128, 4)])
def test_awq_repacked_to_gptq_reads_bit_exact(gs, seed):
    k, n = 256, 64
    _, wq = _awq_linear(k, n, gs, seed)
    theirs = packing_utils.dequantize_gemm(wq.qweight, wq.qzeros, wq.scales.float(), 4, gs)
    # AutoAWQ's AWQ -> GPTQ/ExLlama repack: rows packed along K, zeros stored minus one (v1)
    qweight_v1, qzeros_v1 = packing_utils.unpack_reorder_pack(wq.qweight, wq.qzeros, 4)
    v1 = {"qweight": qweight_v1, "qzeros": qzeros_v1, "scales": wq.scales}
    ours_v1 = _load(QuantSpec("gptq", group_size=gs, sym=False, checkpoint_format="gptq"), k, n,
                    v1)
    assert torch.equal(ours_v1.dequantize(), theirs.t())
    # the same integers packed without the minus one are GPTQModel's v2
    iweight, izeros = packing_utils.unpack_awq(wq.qweight, wq.qzeros, 4)
    iweight, izeros = packing_utils.reverse_awq_order(iweight, izeros, 4)
    qweight_v2, qzeros_v2 = packing_utils.pack_exllama(iweight & 15, izeros & 15, 4)
    v2 = {"qweight": qweight_v2, "qzeros": qzeros_v2, "scales": wq.scales}
    ours_v2 = _load(QuantSpec("gptq", group_size=gs, sym=False, checkpoint_format="gptq_v2"),
                    k, n, v2)
    assert torch.equal(ours_v2.dequantize(), theirs.t())
    # and our GPTQ writer emits the same words AutoAWQ's repack does
    w = unpack_gptq(v1, k, n, gs, "gptq", sym=False)
    ours_words = pack_gptq(w, "gptq")
    assert torch.equal(ours_words["qweight"], qweight_v1)
    assert torch.equal(ours_words["qzeros"], qzeros_v1)
    assert torch.equal(pack_gptq(w, "gptq_v2")["qzeros"], qzeros_v2)


def test_autoawq_reads_what_we_write():
    gen = torch.Generator().manual_seed(5)
    k, n, gs = 128, 64, 32
    _, wq = _awq_linear(k, n, gs, 5)
    w = unpack_awq({"qweight": wq.qweight, "qzeros": wq.qzeros, "scales": wq.scales}, k, n, gs)
    w.q = torch.randint(0, 16, w.q.shape, generator=gen, dtype=torch.int32)  # fresh integers
    ours = pack_awq(w)
    theirs = packing_utils.dequantize_gemm(ours["qweight"], ours["qzeros"],
                                           ours["scales"].float(), 4, gs)
    assert torch.equal(theirs, w.dequantize())
