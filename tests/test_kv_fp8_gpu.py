"""The fp8 KV cache on a CUDA GPU at full size (``pytest -m gpu``): the K/V writes bit for bit
against their references, decode and prefill attention over uint8 caches against the
reference on the same codes (the hardware e4m3 conversion and the integer one), and the
engine with graphs against itself without them."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import importlib  # noqa: E402

from edge_llm.kernels.kv_fp8 import fp8_decode_ref, fp8_encode_ref  # noqa: E402
from tests.test_kernels_gpu import _paged  # noqa: E402

pa = importlib.import_module("edge_llm.kernels.paged_attention")
pc = importlib.import_module("edge_llm.kernels.paged_common")
rkv = importlib.import_module("edge_llm.kernels.rotary_kv")
rot = importlib.import_module("edge_llm.kernels.rotary")
DEV = torch.device("cuda")


def _rel(out, ref) -> float:
    assert bool(torch.isfinite(out).all()), "non-finite output"
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_writes_match_reference_codes(dtype):
    blocks, bs, hkv, d, t = 512, 16, 8, 128, 300
    kc = torch.randint(0, 120, (blocks, bs, hkv, d), dtype=torch.uint8, device=DEV)
    vc = torch.randint(0, 120, (blocks, bs, hkv, d), dtype=torch.uint8, device=DEV)
    slots = torch.randperm(blocks * bs, device=DEV)[:t]
    slots[7] = -1
    k = (torch.randn(t, hkv, d, device=DEV) * 3).to(dtype)
    v = torch.randn(t, hkv, d, device=DEV).to(dtype)
    kr, vr = kc.clone(), vc.clone()
    pa.write_kv(k, v, kc, vc, slots)
    pa.write_kv_ref(k, v, kr, vr, slots)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    # rotary + write in one launch: k rotated in fp32 and rounded to the activations' dtype
    # first, as the reference does; a one-ulp difference there can move a code by one step
    h, pos = 32, torch.randint(0, 4096, (t,), device=DEV)
    freqs = torch.outer(torch.arange(4096.0), 1e4 ** -(torch.arange(0, d, 2) / d)).to(DEV)
    q = torch.randn(t, h, d, device=DEV).to(dtype)
    kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(kc)
    kr2, vr2 = kc2.clone(), vc2.clone()
    rkv.rotary_write_kv(q, k, v, freqs.cos(), freqs.sin(), pos, kc2, vc2, slots)
    _, k_rot = rot.rotary_ref(q, k, freqs.cos(), freqs.sin(), pos)
    pa.write_kv_ref(k_rot, v, kr2, vr2, slots)
    assert torch.equal(vc2, vr2)
    assert float((kc2 != kr2).float().mean()) < 0.01
    assert _rel(fp8_decode_ref(kc2), fp8_decode_ref(kr2)) < 1e-2


@pytest.mark.parametrize("cvt", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("nq,ctx,h,hkv", [
    ([1] * 32, [2048] * 32, 32, 8),  # decode, GQA 8
    ([1] * 5, [1, 17, 300, 4000, 900], 32, 32),  # decode, MHA, ragged
    ([512, 1, 77, 300], [2048, 50, 77, 1324], 28, 4),  # prefill and mixed, Qwen heads
])
def test_attention_over_fp8_cache(dtype, nq, ctx, h, hkv, cvt, monkeypatch):
    """Both decodings of the codes: the hardware conversion (``cvt``, where the GPU has it)
    and the integer one that sm_86 runs."""
    if cvt and not pc.has_fp8_cvt(DEV):
        pytest.skip("this GPU has no e4m3 conversion (sm_89 or later)")
    monkeypatch.setattr(pc, "has_fp8_cvt", lambda device: cvt)
    d, bs = 128, 16
    kc, vc, table = _paged(len(ctx), ctx, hkv, d, bs, torch.float32)
    kc, vc = fp8_encode_ref(kc * 2), fp8_encode_ref(vc)
    qsl = torch.tensor([0] + nq).cumsum(0).to(torch.int32)
    sl = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    q = torch.randn(int(qsl[-1]), h, d, device=DEV).to(dtype)
    ref = pa.paged_attention_ref(q, kc, vc, table, qsl, sl, d ** -0.5)
    out = pa.paged_attention_triton(q, kc, vc, table, qsl.to(DEV), sl, d ** -0.5,
                                    max_query_len=max(nq), max_seq_len=max(ctx))
    assert _rel(out, ref) < (2e-3 if dtype == torch.float16 else 1e-2)


def test_engine_fp8_graphs_equal_eager(tmp_path):
    """Greedy output of a small random model with an fp8 cache: CUDA graphs against eager."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from random_checkpoint import make_random_checkpoint

    from edge_llm import LLM, SamplingParams

    ckpt = make_random_checkpoint("tiny-llama", "awq", tmp_path / "ck", 128, "cuda")
    kw = dict(device="cuda", dtype="float16", max_model_len=512, kv_cache_memory=1 << 28,
              kv_cache_dtype="fp8", swap_space=0.0)
    prompts = [{"prompt_token_ids": list(range(3 + i, 40 + 7 * i))} for i in range(6)]
    sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    graphs = LLM(str(ckpt), **kw).generate(prompts, sp, use_tqdm=False)
    eager = LLM(str(ckpt), enforce_eager=True, **kw).generate(prompts, sp, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in graphs] == [o.outputs[0].token_ids for o in eager]
