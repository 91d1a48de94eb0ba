"""QuantLinear: act-order layouts, the kernel seam, the CPU cache, load-time validation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edge_llm.quant import (
    QuantLinear,
    QuantSpec,
    concat_linears,
    is_quantized_module_name,
    make_linear,
    pack_awq,
    pack_compressed,
    pack_gptq,
)
from edge_llm.quant import linear as linear_mod
from edge_llm.quant.linear import dequantize_runtime
from tests.test_quant_formats import FORMAT_CASES, _act_order_g_idx, _pack, _rand_weight


def _through(monkeypatch, matmul, silu_mul=None) -> None:
    """QuantLinear's CUDA path on CPU tensors: ``matmul`` / ``silu_mul`` stand in for
    edge_llm.kernels.w4a16_matmul / w4a16_silu_mul (the calls forward makes on CUDA)."""
    monkeypatch.setattr(linear_mod, "_cuda_kernels", lambda x: (matmul, silu_mul))


def test_unequal_groups_keep_general_g_idx():
    gen = torch.Generator().manual_seed(4)
    k, n = 64, 16
    g_idx = torch.randint(0, 2, (k,), generator=gen, dtype=torch.int32)  # 2 groups, unequal
    g_idx[0], g_idx[1] = 0, 1
    w = _rand_weight(k, n, 32, gen, g_idx)
    spec = QuantSpec("gptq", group_size=32, sym=False, desc_act=True)
    lin = QuantLinear(k, n, False, spec, torch.float32)
    lin.load_checkpoint_tensors(pack_gptq(w), "cpu")
    assert lin.perm is None and lin.g_idx is not None
    assert torch.equal(lin.dequantize(), w.dequantize().t())
    x = torch.randn(4, k, generator=gen)
    torch.testing.assert_close(lin(x), x @ w.dequantize())


def test_kernel_seam_gets_runtime_layout_and_permuted_input(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    k, n, gs = 128, 32, 32
    w = _rand_weight(k, n, gs, gen, _act_order_g_idx(k, gs, gen))
    lin = QuantLinear(k, n, False, QuantSpec("gptq", group_size=gs, sym=False), torch.float32)
    lin.load_checkpoint_tensors(pack_gptq(w), "cpu")
    calls = []

    def fake_kernel(x2, qweight, scales, zeros, group_size, integer_zeros=False,
                    planes_packed=False):
        assert torch.equal(zeros, zeros.round())  # what integer_zeros vouches for
        calls.append((x2.shape, group_size, integer_zeros, planes_packed))
        return x2 @ dequantize_runtime(qweight, scales, zeros, group_size,
                                       planes_packed=planes_packed)

    x = torch.randn(2, 3, k, generator=gen)
    _through(monkeypatch, fake_kernel)
    y = lin(x)
    assert calls == [((6, k), gs, True, False)]
    torch.testing.assert_close(y, x @ w.dequantize())


def test_forward_silu_mul_only_where_the_kernel_path_applies(monkeypatch):
    """A merged [gate | up] linear: on the CPU (and with a bias, or no kernels package) it
    gives None and the model multiplies ``forward``'s halves itself; on CUDA it hands the
    runtime tensors through the kernel seam to ``edge_llm.kernels.w4a16_silu_mul`` (here a
    stand-in computing the same function), which returns (..., I)."""
    gen = torch.Generator().manual_seed(6)
    k, n, gs = 128, 64, 32
    w = _rand_weight(k, n, gs, gen)
    lin = QuantLinear(k, n, False, QuantSpec("gptq", group_size=gs, sym=False), torch.float32)
    lin.load_checkpoint_tensors(pack_gptq(w), "cpu")
    x = torch.randn(2, 3, k, generator=gen)
    assert lin.forward_silu_mul(x) is None  # CPU
    calls = []

    def fake_silu(x2, qweight, scales, zeros, group_size, integer_zeros=False,
                  planes_packed=False):
        calls.append((x2.shape, integer_zeros))
        gate, up = (x2 @ dequantize_runtime(qweight, scales, zeros, group_size)).chunk(2, -1)
        return torch.nn.functional.silu(gate) * up

    _through(monkeypatch, None, fake_silu)  # what forward_silu_mul runs on CUDA
    y = lin.forward_silu_mul(x)
    gate, up = (x @ w.dequantize()).chunk(2, -1)
    torch.testing.assert_close(y, torch.nn.functional.silu(gate) * up)
    assert y.shape == (2, 3, n // 2) and calls == [((6, k), True)]


@pytest.mark.parametrize("kind,fields", [c for c in FORMAT_CASES if c[0] != "ct"])
def test_plane_packed_words_compute_the_same_function(kind, fields, monkeypatch):
    """pack_planes repacks the words (the kernels' oracle agrees on the order); forward,
    dequantize and the kernel seam give the same results; packed words refuse to merge."""
    from edge_llm.kernels import pack_planes_ref, w4a16_matmul_ref

    gen = torch.Generator().manual_seed(11)
    k, n = 256, 64
    spec = QuantSpec(**{**fields, "group_size": 128})
    g_idx = _act_order_g_idx(k, 128, gen) if kind.endswith("act") else None
    w = _rand_weight(k, n, 128, gen, g_idx, sym=spec.sym)
    lin = QuantLinear(k, n, False, spec, torch.float32)
    lin.load_checkpoint_tensors(_pack(spec, w), "cpu")
    x = torch.randn(3, k, generator=gen)
    before, words = lin(x), lin.qweight.clone()
    assert lin.planes_packable()
    lin.pack_planes()
    assert lin.planes_packed and torch.equal(lin.qweight, pack_planes_ref(words))
    torch.testing.assert_close(lin(x), before)
    torch.testing.assert_close(lin.dequantize(), w.dequantize().t())
    with monkeypatch.context() as patch:
        _through(patch, w4a16_matmul_ref)
        torch.testing.assert_close(lin(x), before)
    lin.pack_planes()  # a second call changes nothing
    assert torch.equal(lin.qweight, pack_planes_ref(words))
    other = QuantLinear(k, n, False, spec, torch.float32)
    other.load_checkpoint_tensors(_pack(spec, w), "cpu")
    with pytest.raises(ValueError, match="plane-packed"):
        concat_linears([lin, other])


def test_pack_planes_refuses_small_groups_and_counts_on_cuda_only(monkeypatch):
    from edge_llm.model.plane_pack import pack_weight_planes

    gen = torch.Generator().manual_seed(12)
    lin = QuantLinear(256, 16, False, QuantSpec("awq", group_size=64), torch.float16)
    lin.load_checkpoint_tensors(pack_awq(_rand_weight(256, 16, 64, gen)), "cpu")
    assert not lin.planes_packable()
    with pytest.raises(ValueError, match="multiples of 128"):
        lin.pack_planes()
    ok = QuantLinear(256, 16, False, QuantSpec("awq", group_size=128), torch.float16)
    ok.load_checkpoint_tensors(pack_awq(_rand_weight(256, 16, 128, gen)), "cpu")
    assert pack_weight_planes(nn.Sequential(lin, ok)) == 0  # CPU: the reference path
    assert not ok.planes_packed


@pytest.mark.parametrize("kind,fields", [c for c in FORMAT_CASES if c[0] != "ct"])
def test_runtime_layout_matches_the_kernels_reference(kind, fields, monkeypatch):
    """The kernels package's own oracle reads our runtime tensors to the same product."""
    kernels = pytest.importorskip("edge_llm.kernels")
    gen = torch.Generator().manual_seed(9)
    k, n = 256, 64
    spec = QuantSpec(**fields)
    gs = spec.group_size_for(k)
    g_idx = _act_order_g_idx(k, gs, gen) if kind.endswith("act") else None
    w = _rand_weight(k, n, gs, gen, g_idx, sym=spec.sym)
    lin = QuantLinear(k, n, False, spec, torch.float32)
    lin.load_checkpoint_tensors(_pack(spec, w), "cpu")
    x = torch.randn(2, 7, k, generator=gen)
    before = lin(x)
    _through(monkeypatch, kernels.w4a16_matmul_ref)
    y = lin(x)
    torch.testing.assert_close(y, x @ w.dequantize())
    torch.testing.assert_close(y, before)


def test_cpu_cache_is_dropped_on_reload():
    gen = torch.Generator().manual_seed(6)
    spec = QuantSpec("awq", group_size=32)
    lin = QuantLinear(64, 16, False, spec, torch.float32)
    a, b = _rand_weight(64, 16, 32, gen), _rand_weight(64, 16, 32, gen)
    x = torch.randn(2, 64, generator=gen)
    lin.load_checkpoint_tensors(pack_awq(a), "cpu")
    torch.testing.assert_close(lin(x), x @ a.dequantize())
    lin.load_checkpoint_tensors(pack_awq(b), "cpu")
    torch.testing.assert_close(lin(x), x @ b.dequantize())


def _gptq_tensors(gen, k=64, n=16, gs=32):
    return pack_gptq(_rand_weight(k, n, gs, gen))


@pytest.mark.parametrize("mutate,needle", [
    (lambda t: t.update(qweight=t["qweight"][:4]), "'qweight': expected shape (8, 16)"),
    (lambda t: t.update(qweight=t["qweight"].long()), "'qweight': expected dtype torch.int32"),
    (lambda t: t.update(scales=t["scales"].int()), "'scales': expected a float dtype"),
    (lambda t: t.update(qzeros=t["qzeros"][:, :1]), "'qzeros': expected shape (2, 2)"),
    (lambda t: t.pop("qzeros"), "missing tensors ['qzeros']"),
    (lambda t: t.update(weight=torch.zeros(1)), "unexpected tensors ['weight']"),
    (lambda t: t.update(g_idx=t["g_idx"] + 5), "g_idx values must lie in [0, 2)"),
    (lambda t: t.update(g_idx=t["g_idx"].float()), "'g_idx': expected an integer dtype"),
])
def test_load_validation_errors_name_the_tensor(mutate, needle):
    gen = torch.Generator().manual_seed(7)
    t = _gptq_tensors(gen)
    mutate(t)
    lin = QuantLinear(64, 16, False, QuantSpec("gptq", group_size=32, sym=False), torch.float16)
    with pytest.raises(ValueError) as err:
        lin.load_checkpoint_tensors(t, "cpu")
    assert needle in str(err.value)


def test_compressed_weight_shape_mismatch_and_bad_dims():
    gen = torch.Generator().manual_seed(8)
    t = pack_compressed(_rand_weight(64, 16, 32, gen), sym=False)
    t["weight_shape"] = torch.tensor([16, 72])
    lin = QuantLinear(64, 16, False, QuantSpec("compressed-tensors", group_size=32), torch.float32)
    with pytest.raises(ValueError, match="weight_shape"):
        lin.load_checkpoint_tensors(t, "cpu")
    with pytest.raises(ValueError, match="divisible by 8"):
        QuantLinear(60, 16, False, QuantSpec("gptq", group_size=32), torch.float32)
    with pytest.raises(ValueError, match="AWQ needs in_features"):
        QuantLinear(96, 16, False, QuantSpec("awq", group_size=64), torch.float32)


def test_make_linear_and_module_names():
    assert type(make_linear(16, 8, True, None, torch.float32)) is nn.Linear
    spec = QuantSpec("awq", group_size=16, skip_modules=("mlp.down_proj", "re:.*\\.0\\.self_attn"))
    assert isinstance(make_linear(16, 8, False, spec, torch.float16), QuantLinear)
    assert is_quantized_module_name("model.layers.3.self_attn.q_proj", spec)
    assert not is_quantized_module_name("model.layers.3.mlp.down_proj", spec)
    assert not is_quantized_module_name("model.layers.0.self_attn.q_proj", spec)
    assert not is_quantized_module_name("lm_head", spec)
    assert not is_quantized_module_name("model.embed_tokens", spec)
    assert not is_quantized_module_name("model.layers.3.mlp.up_proj", None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind,fields", [c for c in FORMAT_CASES if c[0] != "ct"])
@pytest.mark.parametrize("rows", [1, 3, 40, 300])
@pytest.mark.parametrize("packed", [False, True])
def test_cuda_forward_goes_through_the_kernel(kind, fields, rows, packed):
    from edge_llm.quant.linear import _w4a16_kernel

    assert _w4a16_kernel() is not None, "edge_llm.kernels.w4a16_matmul is missing"
    gen = torch.Generator().manual_seed(rows)
    k, n = 1024, 512
    spec = QuantSpec(**fields)
    gs = spec.group_size_for(k)
    g_idx = _act_order_g_idx(k, gs, gen) if kind.endswith("act") else None
    w = _rand_weight(k, n, gs, gen, g_idx, sym=spec.sym)
    lin = QuantLinear(k, n, True, spec, torch.float16)
    bias = torch.randn(n, generator=gen).half()
    lin.load_checkpoint_tensors({**_pack(spec, w), "bias": bias}, "cuda")
    if packed:
        if not lin.planes_packable():
            pytest.skip(f"group size {gs} cannot be plane-packed")
        lin.pack_planes()
    x = torch.randn(rows, k, generator=gen).half().cuda()
    ref = x.double() @ w.dequantize(torch.float64).cuda() + bias.double().cuda()
    y = lin(x)
    assert y.dtype == torch.float16 and y.shape == (rows, n)
    torch.testing.assert_close(y.double(), ref, rtol=2e-2, atol=2e-2)
