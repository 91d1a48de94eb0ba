"""Pack/unpack round trips, bit layouts, detection, refusals and QuantLinear for every format."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from edge_llm.quant import (
    AWQ_ORDER,
    QuantizedWeight,
    QuantLinear,
    QuantSpec,
    UnsupportedQuantizationError,
    detect_quant_spec,
    is_quantized_module_name,
    pack_awq,
    pack_compressed,
    pack_gptq,
    unpack_awq,
    unpack_compressed,
    unpack_gptq,
)
from edge_llm.quant.packing import sequential_g_idx


def _rand_weight(k, n, gs, gen, g_idx=None, sym=False) -> QuantizedWeight:
    groups = -(-k // gs)
    q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
    zeros = (torch.full((groups, n), 8, dtype=torch.int32) if sym
             else torch.randint(0, 16, (groups, n), generator=gen, dtype=torch.int32))
    scales = (torch.rand(groups, n, generator=gen) * 0.05 + 1e-3).half().float()
    g_idx = sequential_g_idx(k, gs) if g_idx is None else g_idx
    return QuantizedWeight(q, zeros, scales, g_idx, gs)


def _act_order_g_idx(k, gs, gen) -> torch.Tensor:
    """A random permutation of k // gs: every group has gs rows, order non-monotonic."""
    return sequential_g_idx(k, gs)[torch.randperm(k, generator=gen)]


def _nibbles(words: torch.Tensor) -> np.ndarray:
    """(…, W) int32 -> (…, W, 8) nibbles via unsigned numpy arithmetic (independent of quant)."""
    u = words.numpy().astype(np.int64) & 0xFFFFFFFF
    return np.stack([(u >> (4 * j)) & 0xF for j in range(8)], axis=-1)


def _ref_dequant(spec: QuantSpec, t: dict, k: int, n: int, gs: int) -> torch.Tensor:
    """Float64 W (N, K) computed straight from format tensors with numpy bit arithmetic."""
    if spec.method == "awq":
        nib = _nibbles(t["qweight"])  # (K, N/8, 8): nibble j is column 8c + AWQ_ORDER[j]
        q = np.zeros((k, n), np.int64)
        z = np.zeros((k // gs, n), np.int64)
        zn = _nibbles(t["qzeros"])
        for j, col in enumerate(AWQ_ORDER):
            q[:, col::8] = nib[..., j]
            z[:, col::8] = zn[..., j]
        g = np.arange(k) // gs
    elif spec.method == "gptq":
        q = _nibbles(t["qweight"].t().contiguous()).reshape(n, k).T  # row k at nibble k % 8
        zw = t["qzeros"].numpy().astype(np.int64)
        if spec.checkpoint_format == "gptq":
            zw = (zw + 0x11111111) & 0xFFFFFFFF
        z = _nibbles(torch.from_numpy(zw.astype(np.uint32).view(np.int32))).reshape(len(zw), n)
        z = np.full_like(z, 8) if spec.sym else z
        g = t.get("g_idx", sequential_g_idx(k, gs)).numpy()
    else:
        q = _nibbles(t["weight_packed"]).reshape(n, k).T  # column 8c + j at nibble j
        groups = t["weight_scale"].shape[1]
        if spec.sym:
            z = np.full((groups, n), 8)
        else:  # (ceil(N/8), G, 8): row 8r + i at nibble i of word [r, g]
            zn = _nibbles(t["weight_zero_point"]).transpose(0, 2, 1)
            z = zn.reshape(-1, groups)[:n].T
        g = t.get("weight_g_idx", sequential_g_idx(k, gs)).numpy()
        t = dict(t, scales=t["weight_scale"].t())
    s = t["scales"].double().numpy()
    w = (q - z[g]).astype(np.float64) * s[g]  # (K, N)
    return torch.from_numpy(np.ascontiguousarray(w.T))


FORMAT_CASES = [
    ("awq", dict(method="awq", group_size=32)),
    ("awq", dict(method="awq", group_size=128)),
    ("gptq", dict(method="gptq", group_size=-1, sym=False)),
    ("gptq", dict(method="gptq", group_size=32, sym=True)),
    ("gptq", dict(method="gptq", group_size=64, sym=False, checkpoint_format="gptq_v2")),
    ("gptq", dict(method="gptq", group_size=128, sym=True, checkpoint_format="gptq_v2")),
    ("gptq-act", dict(method="gptq", group_size=32, sym=False, desc_act=True)),
    ("ct", dict(method="compressed-tensors", group_size=64, sym=True)),
    ("ct", dict(method="compressed-tensors", group_size=32, sym=False)),
    ("ct", dict(method="compressed-tensors", group_size=-1, sym=False)),
    ("ct-act", dict(method="compressed-tensors", group_size=32, sym=False, desc_act=True)),
]


def _pack(spec: QuantSpec, w: QuantizedWeight) -> dict:
    if spec.method == "awq":
        return pack_awq(w)
    if spec.method == "gptq":
        return pack_gptq(w, spec.checkpoint_format)
    return pack_compressed(w, spec.sym)


@pytest.mark.parametrize("kind,fields", FORMAT_CASES)
def test_round_trip_and_quant_linear(kind, fields):
    gen = torch.Generator().manual_seed(hash(str(fields)) % 2**31)
    k, n = 256, 48
    spec = QuantSpec(**fields)
    gs = spec.group_size_for(k)
    g_idx = _act_order_g_idx(k, gs, gen) if kind.endswith("act") else None
    w = _rand_weight(k, n, gs, gen, g_idx, sym=spec.sym)
    tensors = _pack(spec, w)
    if spec.method == "awq":
        back = unpack_awq(tensors, k, n, gs)
    elif spec.method == "gptq":
        back = unpack_gptq(tensors, k, n, gs, spec.checkpoint_format, spec.sym)
    else:
        back = unpack_compressed(tensors, k, n, gs, spec.sym)
    for field in ("q", "zeros", "g_idx"):
        assert torch.equal(getattr(back, field), getattr(w, field)), field
    assert torch.equal(back.scales.float(), w.scales)

    lin = QuantLinear(k, n, True, spec, torch.float32)
    bias = torch.randn(n, generator=gen)
    lin.load_checkpoint_tensors({**tensors, "bias": bias.half()}, "cpu")
    assert (lin.perm is not None) == kind.endswith("act")
    ref64 = _ref_dequant(spec, tensors, k, n, gs)
    assert torch.equal(lin.dequantize(torch.float64), ref64)
    assert torch.equal(lin.dequantize(), w.dequantize().t())
    x = torch.randn(3, 5, k, generator=gen)
    y = lin(x)
    assert y.shape == (3, 5, n)
    torch.testing.assert_close(y, x @ lin.dequantize().t() + bias.half().float())
    torch.testing.assert_close(y.double(), x.double() @ ref64.t() + bias.half().double(),
                               rtol=1e-5, atol=1e-5)


def test_awq_bit_layout_matches_awq_order():
    k, n = 8, 16
    q = torch.zeros(k, n, dtype=torch.int32)
    q[3, 8 + 2] = 5  # column 10 = word 1, logical index 2 -> nibble j with AWQ_ORDER[j] == 2
    w = QuantizedWeight(q, torch.zeros(1, n, dtype=torch.int32), torch.ones(1, n),
                        sequential_g_idx(k, 8), 8)
    words = pack_awq(w)["qweight"]
    assert words.shape == (8, 2)
    assert int(words[3, 1]) == 5 << (4 * AWQ_ORDER.index(2))
    assert int(words.abs().sum()) == int(words[3, 1])


def test_gptq_and_ct_bit_layouts():
    k, n = 16, 8
    q = torch.zeros(k, n, dtype=torch.int32)
    q[11, 6] = 9  # row 11 -> qweight[1, 6] bits 12..15
    z = torch.full((1, n), 8, dtype=torch.int32)
    z[0, 3] = 2
    w = QuantizedWeight(q, z, torch.ones(1, n), sequential_g_idx(k, 16), 16)
    t = pack_gptq(w, "gptq_v2")
    assert int(t["qweight"][1, 6]) == 9 << 12 and int(t["qweight"].count_nonzero()) == 1
    assert int(t["qzeros"][0, 0]) == (0x88888888 - (6 << 12)) - (1 << 32)  # nibble 3 = 2
    ct = pack_compressed(w, sym=False)
    assert int(ct["weight_packed"][6, 1]) == 9 << 12  # (N, K/8): column 11 of row 6
    assert int(ct["weight_zero_point"][0, 0]) == int(t["qzeros"][0, 0])  # N packed along dim 0
    assert ct["weight_shape"].tolist() == [n, k]


def test_gptq_v1_stores_zero_minus_one_and_sym_stores_seven():
    gen = torch.Generator().manual_seed(1)
    w = _rand_weight(64, 16, 32, gen)
    w.zeros = torch.randint(1, 16, w.zeros.shape, generator=gen, dtype=torch.int32)
    v1, v2 = pack_gptq(w, "gptq")["qzeros"], pack_gptq(w, "gptq_v2")["qzeros"]
    assert np.array_equal(_nibbles(v1), _nibbles(v2) - 1)  # per nibble, no borrow when z >= 1
    sym = _rand_weight(64, 16, 32, gen, sym=True)
    assert (pack_gptq(sym, "gptq")["qzeros"] == 0x77777777).all()
    assert (pack_gptq(sym, "gptq_v2")["qzeros"] == (0x88888888 - (1 << 32))).all()


def test_gptq_v1_zero_of_zero_survives_the_borrow():
    gen = torch.Generator().manual_seed(2)
    w = _rand_weight(64, 16, 32, gen)
    w.zeros[0, :8] = torch.tensor([0, 15, 0, 3, 0, 0, 7, 0], dtype=torch.int32)
    t = pack_gptq(w, "gptq")
    back = unpack_gptq(t, 64, 16, 32, "gptq", sym=False)
    assert torch.equal(back.zeros, w.zeros)


def test_compressed_zero_point_padding_and_legacy_int8():
    gen = torch.Generator().manual_seed(3)
    w = _rand_weight(32, 12, 16, gen)  # N=12 pads the packed zero points to 16 rows
    t = pack_compressed(w, sym=False)
    assert t["weight_zero_point"].shape == (2, 2)
    assert torch.equal(unpack_compressed(t, 32, 12, 16, sym=False).zeros, w.zeros)
    legacy = dict(t, weight_zero_point=(w.zeros.t() - 8).to(torch.int8))
    assert torch.equal(unpack_compressed(legacy, 32, 12, 16, sym=False).zeros, w.zeros)


# ---------------------------------------------------------------- detection and refusals


def _write(tmp_path, name, data):
    (tmp_path / name).write_text(json.dumps(data))


def test_detect_from_each_source(tmp_path):
    assert detect_quant_spec(tmp_path, {"model_type": "llama"}) is None
    awq_qc = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
              "version": "GEMM", "modules_to_not_convert": ["visual"]}
    spec = detect_quant_spec(tmp_path, {"quantization_config": awq_qc})
    assert (spec.method, spec.group_size, spec.sym, spec.skip_modules) == ("awq", 128, False,
                                                                           ("visual",))
    _write(tmp_path, "quant_config.json",
           {"zero_point": True, "q_group_size": 64, "w_bit": 4, "version": "GEMM"})
    spec = detect_quant_spec(tmp_path, {})
    assert (spec.method, spec.group_size, spec.source) == ("awq", 64, "quant_config.json")
    _write(tmp_path, "quantize_config.json",  # old AutoGPTQ: no quant_method, no format
           {"bits": 4, "group_size": 32, "desc_act": True, "sym": False, "damp_percent": 0.01})
    spec = detect_quant_spec(tmp_path, {})
    assert (spec.method, spec.group_size, spec.desc_act, spec.sym, spec.checkpoint_format) == (
        "gptq", 32, True, False, "gptq")
    gptqmodel = {"bits": 4, "group_size": -1, "desc_act": False, "sym": True, "lm_head": False,
                 "quant_method": "gptq", "checkpoint_format": "gptq_v2", "pack_dtype": "int32",
                 "dynamic": {"-:model\\.layers\\.0\\..*": {}}, "meta": {"damp_percent": 0.01}}
    spec = detect_quant_spec(tmp_path, {"quantization_config": gptqmodel})
    assert (spec.group_size, spec.checkpoint_format, spec.sym) == (-1, "gptq_v2", True)
    assert not is_quantized_module_name("model.layers.0.mlp.up_proj", spec)
    assert is_quantized_module_name("model.layers.10.mlp.up_proj", spec)


def _ct_config(**weights):
    w = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
         "group_size": 128, "actorder": None, "dynamic": False, **weights}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                          "input_activations": None}},
            "ignore": ["lm_head", "re:.*mlp.gate$"], "quantization_status": "compressed"}


def test_detect_compressed_tensors():
    spec = detect_quant_spec(".", {"quantization_config": _ct_config(actorder="group")})
    assert (spec.method, spec.group_size, spec.sym, spec.desc_act) == (
        "compressed-tensors", 128, True, True)
    assert not is_quantized_module_name("model.layers.1.mlp.gate", spec)
    assert is_quantized_module_name("model.layers.1.mlp.gate_proj", spec)
    spec = detect_quant_spec(".", {"quantization_config": _ct_config(
        strategy="channel", symmetric=False, group_size=None)})
    assert (spec.group_size, spec.sym) == (-1, False)


REFUSED = [
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits=3"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "bits=8"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "'gemv'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv_fast"},
     "'gemv_fast'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "marlin"}, "'marlin'"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "exllama"}, "'exllama'"),
    ({"quant_method": "awq", "w_bit": 8, "group_size": 128}, "w_bit=8"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}, "'marlin'"),
    ({"quant_method": "gptq", "bits": 4, "is_marlin_format": True}, "'marlin'"),
    ({"quant_method": "gptq", "bits": 4, "pack_dtype": "int16"}, "'int16'"),
    ({"quant_method": "gptq", "bits": 4, "lm_head": True}, "lm_head"),
    ({"quant_method": "gptq", "bits": 4, "dynamic": {"+:.*down": {"bits": 8}}}, "dynamic"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "'fp8'"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "'bitsandbytes'"),
    ({"quant_method": "exl2", "bits": 4.5}, "'exl2'"),
    ({**_ct_config(), "format": "int-quantized"}, "'int-quantized'"),
    (_ct_config(num_bits=8), "num_bits=8"),
    (_ct_config(type="float"), "type='float'"),
    (_ct_config(strategy="tensor"), "'tensor'"),
    ({**_ct_config(), "config_groups": {"g": {**_ct_config()["config_groups"]["group_0"],
                                              "input_activations": {"num_bits": 8}}}},
     "activation quantization"),
]


@pytest.mark.parametrize("qc,needle", REFUSED)
def test_refusals_say_what_and_list_supported(qc, needle):
    with pytest.raises(UnsupportedQuantizationError) as err:
        detect_quant_spec(".", {"quantization_config": qc})
    message = str(err.value)
    assert needle in message and "Supported:" in message and "AWQ GEMM" in message
    assert isinstance(err.value, ValueError)


def test_bad_config_values_raise_value_errors(tmp_path):
    with pytest.raises(ValueError, match="group_size"):
        detect_quant_spec(".", {"quantization_config": {"quant_method": "awq", "bits": 4,
                                                        "group_size": 0}})
    (tmp_path / "quantize_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="quantize_config.json"):
        detect_quant_spec(tmp_path, {})
