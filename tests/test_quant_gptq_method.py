"""GPTQ method against RTN, act-order g_idx, and quantize_model -> save -> reload end to end."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from edge_llm.quant import (
    QuantLinear,
    detect_quant_spec,
    gptq_quantize,
    load_calibration_texts,
    load_eval_text,
    perplexity,
    quantization_config_for,
    quantize_model,
    rtn_quantize,
    save_quantized,
)
from edge_llm.quant.calibration import calibration_windows
from edge_llm.quant.gptq_method import HessianAccumulator
from edge_llm.quant.packing import sequential_g_idx
from edge_llm.quant.rtn import fake_quantize


def _correlated_problem(seed: int, n=64, k=128, rows=2048):
    """W (n, k) and inputs X (rows, k) with correlated, unevenly scaled features."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.eye(k) + 2 * torch.randn(k, k, generator=gen) / k**0.5
    x = (torch.randn(rows, k, generator=gen) @ mix) * (torch.rand(k, generator=gen) * 3 + 0.2)
    return torch.randn(n, k, generator=gen) * 0.05, x


def _output_error(w, x, q, scales, zeros, g_idx) -> float:
    return float(((x @ (w - fake_quantize(q, scales, zeros, g_idx)).t()) ** 2).mean())


@pytest.mark.parametrize("gs,act_order", [(32, False), (32, True), (-1, False), (64, True)])
def test_gptq_beats_rtn_on_correlated_inputs(gs, act_order):
    w, x = _correlated_problem(seed=gs + int(act_order))
    acc = HessianAccumulator(w.shape[1])
    for chunk in x.split(500):
        acc.add(chunk[None])  # (1, rows, K) like a hooked linear's input
    q, scales, zeros, g_idx = gptq_quantize(w, acc.hessian(), group_size=gs, act_order=act_order)
    groups = 1 if gs == -1 else w.shape[1] // gs
    assert q.shape == w.shape and q.dtype == torch.int32 and 0 <= int(q.min()) <= int(q.max()) < 16
    assert scales.shape == zeros.shape == (w.shape[0], groups)
    assert torch.equal(zeros, zeros.round())
    assert float(zeros.min()) >= 0 and float(zeros.max()) <= 15
    rq, rs, rz = rtn_quantize(w, group_size=gs)
    rtn_err = _output_error(w, x, rq, rs, rz, sequential_g_idx(w.shape[1], w.shape[1] // groups))
    assert _output_error(w, x, q, scales, zeros, g_idx) < 0.75 * rtn_err


def test_act_order_g_idx_is_autogptq_style():
    w, x = _correlated_problem(seed=11, k=96)
    h = HessianAccumulator(96)
    h.add(x)
    hess = h.hessian()
    _, _, _, g_idx = gptq_quantize(w, hess, group_size=32, act_order=True)
    perm = torch.argsort(torch.diag(hess), descending=True)
    assert torch.equal(g_idx[perm], sequential_g_idx(96, 32))  # i-th processed column -> i // 32
    assert torch.bincount(g_idx).tolist() == [32, 32, 32]
    assert not torch.equal(g_idx, sequential_g_idx(96, 32))  # genuinely non-monotonic
    q, s, z, static = gptq_quantize(w, hess, group_size=32, act_order=True, static_groups=True)
    assert torch.equal(static, sequential_g_idx(96, 32))  # act-order, yet AWQ-storable
    plain = gptq_quantize(w, hess, group_size=32)
    assert _output_error(w, x, q, s, z, static) < 0.85 * _output_error(w, x, *plain)


def test_gptq_with_identity_hessian_is_rtn_and_dead_columns_are_zero():
    gen = torch.Generator().manual_seed(12)
    w = torch.randn(32, 64, generator=gen)
    q, s, z, _ = gptq_quantize(w, torch.eye(64) * 3.0, group_size=16)
    rq, rs, rz = rtn_quantize(w, group_size=16)
    assert torch.equal(q, rq) and torch.equal(s, rs) and torch.equal(z, rz)
    h = torch.eye(64)
    h[5, 5] = 0.0  # an input that is always zero
    q, s, z, g = gptq_quantize(w, h, group_size=16)
    assert torch.equal(fake_quantize(q, s, z, g)[:, 5], torch.zeros(32))


def test_rtn_sym_and_group_edges():
    gen = torch.Generator().manual_seed(13)
    w = torch.randn(16, 40, generator=gen)  # 40 = one full group of 32 and a partial one
    q, s, z = rtn_quantize(w, group_size=32, sym=True)
    assert s.shape == (16, 2) and torch.equal(z, torch.full_like(z, 8))
    err = (fake_quantize(q, s, z, sequential_g_idx(40, 32)) - w).abs()
    # half a step, plus a little: the fp16 scale can be a hair below 2 * max|w| / 15, and +max|w|
    # sits at 7.5 steps, clamped to 7
    assert float((err / s.repeat_interleave(32, 1)[:, :40]).max()) <= 0.51
    with pytest.raises(ValueError, match="2-D"):
        rtn_quantize(w[0])
    with pytest.raises(ValueError, match="H must be"):
        gptq_quantize(w, torch.eye(8))


def test_mse_clipping_never_loses_to_min_max():
    gen = torch.Generator().manual_seed(14)
    w = torch.randn(24, 64, generator=gen) * torch.rand(24, 1, generator=gen)
    w[0, 3] = 8.0  # an outlier that min/max would spend the whole range on
    g_idx = sequential_g_idx(64, 32)
    for sym in (False, True):
        plain = fake_quantize(*rtn_quantize(w, group_size=32, sym=sym), g_idx) - w
        tuned = fake_quantize(*rtn_quantize(w, group_size=32, sym=sym, mse=True), g_idx) - w
        per_group = lambda e: e.abs().pow(2.4).reshape(24, 2, 32).sum(-1)  # noqa: E731
        assert bool((per_group(tuned) <= per_group(plain) * (1 + 1e-5)).all())
        assert float(per_group(tuned).sum()) < 0.97 * float(per_group(plain).sum())


# ---------------------------------------------------------------- end to end


def _byte_tokenizer() -> PreTrainedTokenizerFast:
    """A 256-token byte-level tokenizer built offline (no hub)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tk = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tk)


def _tiny_llama(seed: int, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=128, tie_word_embeddings=True,
                      architectures=["LlamaForCausalLM"])
    return LlamaForCausalLM(cfg).eval()


def _reload_and_compare(out, model, fmt: str) -> None:
    config = json.loads((out / "config.json").read_text())
    spec = detect_quant_spec(out, config)
    assert spec.method == fmt and config.get("dtype", config.get("torch_dtype")) == "float16"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    state = {}
    for file in sorted(set(index["weight_map"].values())):
        state.update(load_file(str(out / file)))
    assert set(state) == set(index["weight_map"]) and "lm_head.weight" not in state
    for i, layer in enumerate(model.model.layers):
        for name, lin in layer.named_modules():
            if not isinstance(lin, torch.nn.Linear):
                continue
            prefix = f"model.layers.{i}.{name}."
            tensors = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
            ql = QuantLinear(lin.in_features, lin.out_features, False, spec, torch.float32)
            ql.load_checkpoint_tensors(tensors, "cpu")
            assert torch.equal(ql.dequantize(), lin.weight.data), prefix  # bit for bit
    last = len(model.model.layers) - 1
    norm = model.model.layers[last].input_layernorm.weight
    assert torch.equal(state[f"model.layers.{last}.input_layernorm.weight"], norm.half())


@pytest.mark.parametrize("fmt,opts", [
    ("awq", dict(group_size=32)),
    ("gptq", dict(group_size=32, desc_act=True, checkpoint_format="gptq")),
    ("gptq", dict(group_size=-1, sym=True, checkpoint_format="gptq_v2", true_sequential=False)),
    ("awq", dict(group_size=32, desc_act=True, static_groups=True, mse=True)),
])
def test_quantize_model_save_and_reload(tmp_path, fmt, opts):
    tok = _byte_tokenizer()
    model = _tiny_llama(seed=len(str(opts)))
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    state = quantize_model(model, tok, fmt=fmt, method="gptq", nsamples=6, seqlen=48,
                           batch_size=4, **opts)
    after = model.model.layers[0].mlp.up_proj.weight.detach()
    assert not torch.equal(before, after)  # replaced in place by the dequantized weight
    assert float((before - after).norm() / before.norm()) < 0.3  # 4-bit close, not garbage
    act_order_groups = opts.get("desc_act", False) and not opts.get("static_groups", False)
    qcfg = quantization_config_for(fmt, group_size=opts["group_size"], sym=opts.get("sym", False),
                                   desc_act=act_order_groups,
                                   checkpoint_format=opts.get("checkpoint_format", "gptq"))
    out = save_quantized(tmp_path / "ckpt", state, model.config.to_dict(), qcfg, tokenizer=tok,
                         max_shard_size=20_000)
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1
    assert (out / "tokenizer.json").is_file()
    assert (out / "quantize_config.json").is_file() == (fmt == "gptq")
    _reload_and_compare(out, model, fmt)


def test_quantize_model_rtn_single_file_and_option_errors(tmp_path):
    tok = _byte_tokenizer()
    model = _tiny_llama(seed=21, layers=1)
    state = quantize_model(model, tok, fmt="awq", method="rtn", group_size=64)
    assert state["model.layers.0.self_attn.q_proj.qweight"].shape == (64, 8)
    assert state["model.embed_tokens.weight"].dtype == torch.float16
    out = save_quantized(tmp_path, state, model.config.to_dict(),
                         quantization_config_for("awq", group_size=64))
    assert (out / "model.safetensors").is_file()
    assert not (out / "model.safetensors.index.json").exists()
    with pytest.raises(ValueError, match="sequential groups"):
        quantize_model(model, tok, fmt="awq", method="gptq", desc_act=True)
    with pytest.raises(ValueError, match="method must be"):
        quantize_model(model, tok, method="hqq")
    with pytest.raises(ValueError, match="desc_act"):
        quantization_config_for("awq", desc_act=True)


def test_awq_method_with_autoawq(tmp_path):
    pytest.importorskip("awq.quantize.quantizer", reason="autoawq is not installed")
    tok = _byte_tokenizer()
    model = _tiny_llama(seed=31, layers=1)
    norm_before = model.model.layers[0].post_attention_layernorm.weight.detach().clone()
    state = quantize_model(model, tok, fmt="gptq", method="awq", group_size=32, nsamples=4,
                           seqlen=32)
    norm_after = model.model.layers[0].post_attention_layernorm.weight
    assert not torch.equal(norm_before, norm_after)  # AWQ folded its scales into the norm
    out = save_quantized(tmp_path, state, model.config.to_dict(),
                         quantization_config_for("gptq", group_size=32), max_shard_size=20_000)
    _reload_and_compare(out, model, "gptq")


# ---------------------------------------------------------------- texts and perplexity


def test_bundled_texts_and_calibration_windows():
    calib, evaluation = load_calibration_texts(), load_eval_text()
    assert sum(len(p.split()) for p in calib) >= 6000 and len(calib) >= 30
    assert len(evaluation.split()) >= 1900
    assert not any(p[:80] in evaluation for p in calib)  # kept apart
    tok = _byte_tokenizer()
    win = calibration_windows(tok, calib, nsamples=5, seqlen=64)
    assert win.shape == (5, 64) and win.dtype == torch.int64
    assert torch.equal(win, calibration_windows(tok, calib, nsamples=5, seqlen=64))
    assert len({tuple(r.tolist()) for r in win}) == 5
    with pytest.raises(ValueError, match="fewer than seqlen"):
        calibration_windows(tok, ["short text"], nsamples=2, seqlen=64)


def test_perplexity_helper():
    gen = torch.Generator().manual_seed(41)
    ids = torch.randint(0, 50, (101,), generator=gen)
    uniform = perplexity(lambda x: torch.zeros(1, x.shape[1], 50), ids, window=32)
    assert abs(uniform - 50.0) < 1e-3

    def oracle(x):  # puts almost all mass on the true next token
        logits = torch.full((1, x.shape[1], 50), -30.0)
        for t in range(x.shape[1] - 1):
            logits[0, t, x[0, t + 1]] = 30.0
        return logits

    assert perplexity(oracle, ids, window=32) < 1.001
    seen = []
    perplexity(lambda x: seen.append(x.shape[1]) or torch.zeros(1, x.shape[1], 50), ids, 40)
    assert seen == [40, 40, 21]
