"""silu(gate) * up in the one-row W4A16 GEMV's epilogue on a CUDA GPU (``pytest -m gpu``;
kernels/w4a16_gemv.py SILU; taken at one row, ``GEMV_SILU_MAX_ROWS`` in kernels/dispatch.py;
the tests let it serve 2 rows too, as the kernel can, and set it to 0 for the two-kernel path).

A random Llama-2-7B-shaped AWQ checkpoint cut to 4 layers (tests/test_fuse_gpu.py): its
merged gate/up projection (N = 22,016) is served at 1-2 rows by the GEMV in one split, so
the fused path applies. Checks:

- per layer, at 1 and 2 rows, fp16, plane-packed words (the loader's default) and the
  checkpoint's order: the fused result against the two-kernel path (the GEMV's [M, 2 I]
  output, then ``silu_and_mul``), within one fp16 rounding, and how many are bit-equal;
- greedy 32 tokens through the engine (CUDA graphs) with the epilogue equal the tokens of the
  two-kernel path, or differ first at a near-tie of that run.
"""

from __future__ import annotations

import gc
import importlib

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm import LLM, SamplingParams  # noqa: E402
from edge_llm.model.loader import load_model  # noqa: E402
from tests.helpers import rel_err  # noqa: E402
from tests.test_cuda_graphs_gpu import assert_same_or_near_tie  # noqa: E402
from tests.test_fuse_gpu import VOCAB, awq_dirs  # noqa: E402,F401  (fixture)

kernels = importlib.import_module("edge_llm.kernels.dispatch")
w4 = importlib.import_module("edge_llm.kernels.w4a16")
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=32, logprobs=2)


@pytest.mark.parametrize("plane_packed", [True, False])
def test_fused_equals_two_kernels(awq_dirs, plane_packed, monkeypatch):  # noqa: F811
    lm = load_model(str(awq_dirs("llama2-7b-4l")), device="cuda", dtype="float16",
                    progress=False, plane_packed=plane_packed).model
    gen = torch.Generator(device="cuda").manual_seed(0)
    equal = total = 0
    for layer in lm.model.layers:
        gate_up = layer.mlp.gate_up_proj
        assert gate_up.planes_packed is plane_packed
        for m in (1, 2):
            x = torch.randn(m, gate_up.in_features, device="cuda", generator=gen).half()
            w = (gate_up.qweight, gate_up.scales, gate_up.zeros)
            cfg = w4.prepare(x, *w, 128, gate_up.planes_packed)[1]
            y = w4.launch_gemv16(cfg, x, *w, 128, True, gate_up.planes_packed, silu=True)
            assert y.shape[-1] == gate_up.out_features // 2, cfg  # the fused path is taken
            monkeypatch.setattr(kernels, "GEMV_SILU_MAX_ROWS", 2)
            fused = gate_up.forward_silu_mul(x)
            monkeypatch.setattr(kernels, "GEMV_SILU_MAX_ROWS", 0)  # two kernels
            two = gate_up.forward_silu_mul(x)
            assert fused.shape == two.shape == (m, gate_up.out_features // 2)
            assert rel_err(fused, two) < 2e-3, (m, rel_err(fused, two))
            equal += int((fused == two).sum())
            total += fused.numel()
    print(f"\nplane-packed={plane_packed}: {equal / total:.4f} of the outputs bit-equal")


def _llm(path, monkeypatch, on: bool) -> LLM:
    monkeypatch.setattr(kernels, "GEMV_SILU_MAX_ROWS", 1 if on else 0)
    return LLM(str(path), device="cuda", dtype="float16", max_model_len=512, block_size=16,
               max_num_seqs=4, max_num_batched_tokens=256, kv_cache_memory=1 << 28,
               swap_space=0.0, enable_prefix_caching=False)


def test_greedy_equals_the_two_kernel_engine(awq_dirs, monkeypatch):  # noqa: F811
    path = awq_dirs("llama2-7b-4l")
    gen = torch.Generator().manual_seed(1)
    prompts = [{"prompt_token_ids": torch.randint(3, VOCAB, (n,), generator=gen).tolist()}
               for n in (5, 17, 40)]
    off = _llm(path, monkeypatch, on=False)
    ref = [o.outputs[0] for o in off.generate(prompts, GREEDY, use_tqdm=False)]
    del off
    gc.collect()
    on = _llm(path, monkeypatch, on=True)
    assert on.engine.stats()["num_cuda_graphs"] > 0
    got = [o.outputs[0] for o in on.generate(prompts, GREEDY, use_tqdm=False)]
    assert all(len(o.token_ids) == 32 for o in got)
    assert_same_or_near_tie(ref, got)
