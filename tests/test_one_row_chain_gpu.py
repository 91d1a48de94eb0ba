"""The one-row decode chain on a CUDA GPU (``pytest -m gpu``; edge_llm/model/one_row.py, the
RMSNorm and residual add inside the W4A16 GEMVs: kernels/w4a16_gemv.py NORM, RESIDUAL).

- The kernels at Llama-2-7B's shapes (PTX path) against the separate ops: the norm on read
  of a row with Llama-like outliers (thousands: the row must be scaled before the fp16
  products, which would overflow), with and without the SiLU epilogue; the residual add and
  its sums of squares.
- A random Llama-2-7B-shaped AWQ checkpoint cut to 4 layers (tests/test_fuse_gpu.py): the
  chain's hidden state against the layer-by-layer path (``CausalLM.one_row_fits`` False),
  and greedy 32 tokens through the engine (CUDA graphs) equal to an engine whose model
  declines the chain, or first differing at a near-tie.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm import LLM, SamplingParams  # noqa: E402
from edge_llm.kernels.fused import add_rms_norm, rms_norm  # noqa: E402
from edge_llm.kernels.w4a16_gemv import RowNorm, launch_gemv16, launch_gemv16_add  # noqa: E402
from edge_llm.model.loader import load_model  # noqa: E402
from edge_llm.model.one_row import one_row_chain_fits  # noqa: E402
from tests.helpers import rel_err  # noqa: E402
from tests.test_cuda_graphs_gpu import assert_same_or_near_tie  # noqa: E402
from tests.test_fuse_gpu import VOCAB, awq_dirs  # noqa: E402,F401  (fixture)

w4 = importlib.import_module("edge_llm.kernels.w4a16")
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=32, logprobs=2)


def _weights(k: int, n: int, gen: torch.Generator):
    q = torch.randint(0, 16, (k, n), device="cuda", generator=gen)
    words = w4.pack_planes_ref(w4.pack_w4_ref(q))
    s = (torch.rand(k // 128, n, device="cuda", generator=gen) * 0.02 + 0.002).half()
    z = torch.randint(0, 16, (k // 128, n), device="cuda", generator=gen).half()
    return words, s, z


def _outlier_row(k: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(1, k, device="cuda", generator=gen) * 3
    x[0, 17], x[0, 1415], x[0, 2533] = 2600.0, -1900.0, 1200.0
    return x.half()


@pytest.mark.parametrize("n,silu", [(12288, False), (22016, True)])
def test_norm_on_read_matches_the_norm_kernel(n, silu):
    gen = torch.Generator(device="cuda").manual_seed(n)
    k = 4096
    words, s, z = _weights(k, n, gen)
    x = _outlier_row(k, gen)
    w = (torch.rand(k, device="cuda", generator=gen) * 2).half()
    parts = x.float().square().view(64, -1).sum(1)
    cfg = w4.prepare(x, words, s, z, 128, True)[1]
    fused = launch_gemv16(cfg, x, words, s, z, 128, True, True, silu=silu,
                          norm=RowNorm(w, 1e-5, parts))
    plain = launch_gemv16(cfg, rms_norm(x, w, 1e-5), words, s, z, 128, True, True, silu=silu)
    assert fused.shape == plain.shape == (1, n // 2 if silu else n)
    assert bool(torch.isfinite(fused).all())
    assert rel_err(fused, plain) < 2e-3, rel_err(fused, plain)


@pytest.mark.parametrize("k", [4096, 11008])
def test_residual_add_matches_add_rms_norm(k):
    gen = torch.Generator(device="cuda").manual_seed(k)
    n = 4096
    words, s, z = _weights(k, n, gen)
    x = torch.randn(1, k, device="cuda", generator=gen).half()
    residual = _outlier_row(n, gen)
    cfg = w4.prepare(x, words, s, z, 128, True)[1]
    new, squares = launch_gemv16_add(cfg, x, words, s, z, 128, residual, True, True)
    y = launch_gemv16(cfg, x, words, s, z, 128, True, True)
    _, want = add_rms_norm(y, residual, torch.ones(n, device="cuda").half(), 1e-5)
    assert torch.equal(new, want)
    assert squares.shape == (n // cfg.block_n,)
    torch.testing.assert_close(squares, new.float().square().view(squares.numel(), -1).sum(1),
                               rtol=1e-5, atol=0)


def test_chain_equals_layer_by_layer(awq_dirs, monkeypatch):  # noqa: F811
    lm = load_model(str(awq_dirs("llama2-7b-4l")), device="cuda", dtype="float16",
                    progress=False).model
    assert one_row_chain_fits(lm)
    from tests.test_one_row_chain import _prefill

    ids = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(3))
    kv, meta = _prefill(lm, ids[:-1])
    pos = torch.tensor([ids.numel() - 1], device="cuda")
    out = {}
    for on in (True, False):
        lm.one_row_fits = on
        with torch.no_grad():
            out[on] = lm(ids[-1:].cuda(), pos, kv, dataclasses.replace(meta, scratch={}))
    assert rel_err(out[True], out[False]) < 5e-3, rel_err(out[True], out[False])


def _llm(path, monkeypatch, on: bool) -> LLM:
    llama = importlib.import_module("edge_llm.model.llama")
    monkeypatch.setattr(llama, "one_row_chain_fits", one_row_chain_fits if on else
                        (lambda lm: False))
    return LLM(str(path), device="cuda", dtype="float16", max_model_len=512, block_size=16,
               max_num_seqs=4, max_num_batched_tokens=256, kv_cache_memory=1 << 28,
               swap_space=0.0, enable_prefix_caching=False)


def test_greedy_equals_the_layer_by_layer_engine(awq_dirs, monkeypatch):  # noqa: F811
    path = awq_dirs("llama2-7b-4l")
    gen = torch.Generator().manual_seed(1)
    prompts = [{"prompt_token_ids": torch.randint(3, VOCAB, (n,), generator=gen).tolist()}
               for n in (5, 17, 40)]
    off = _llm(path, monkeypatch, on=False)
    assert _model(off).one_row_fits is False
    ref = [o.outputs[0] for o in off.generate(prompts[:1], GREEDY, use_tqdm=False)]
    ref += [o.outputs[0] for o in off.generate(prompts[1:], GREEDY, use_tqdm=False)]
    del off
    gc.collect()
    on = _llm(path, monkeypatch, on=True)
    assert on.engine.stats()["num_cuda_graphs"] > 0
    assert _model(on).one_row_fits  # decided at the start-up's one-row forwards
    # the first prompt alone: its steps are one row, the chain's
    got = [o.outputs[0] for o in on.generate(prompts[:1], GREEDY, use_tqdm=False)]
    got += [o.outputs[0] for o in on.generate(prompts[1:], GREEDY, use_tqdm=False)]
    assert all(len(o.token_ids) == 32 for o in got)
    assert_same_or_near_tie(ref, got)


def _model(llm: LLM):
    """The engine's CausalLM."""
    return llm.engine.runner.model
