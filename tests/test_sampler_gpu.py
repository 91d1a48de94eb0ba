"""The sampler on a CUDA GPU (``pytest -m gpu``): everything before the final host copy is
queued without a host sync (``torch.cuda.set_sync_debug_mode("error")`` raises on any
synchronizing op), and the results equal the CPU sampler's wherever they do not depend on
the device's random numbers."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from edge_llm.engine.sampler import Sampler, SampleRow  # noqa: E402
from edge_llm.sampling_params import SamplingParams  # noqa: E402

VOCAB = 32000


def _rows() -> list[SampleRow]:
    kinds = [
        dict(temperature=0.0),
        dict(temperature=0.0, logprobs=5, repetition_penalty=1.3),
        dict(temperature=0.8, top_k=40),
        dict(temperature=0.9, top_p=0.9, seed=7),
        dict(temperature=1.0, min_p=0.05, logprobs=0),
        dict(temperature=0.7, top_k=50, top_p=0.95, min_p=0.02, frequency_penalty=0.5,
             presence_penalty=0.3, logit_bias={11: 5.0, 12: -100.0}),
        dict(temperature=0.0, min_tokens=4, stop_token_ids=[2, 3], logprobs=3),
        dict(temperature=1.2, seed=11, logprobs=2, logit_bias={5: 2.0}),
    ]
    out = []
    for i, kw in enumerate(kinds * 2):
        prompt = list(range(i, i + 30))
        output = [(7 * i + j) % VOCAB for j in range(i % 5)]
        out.append(SampleRow(SamplingParams(**kw), prompt, output, i, 0))
    return out


@pytest.mark.parametrize("mode", ["penalized_logprobs", "raw_logprobs", "processed_logprobs"])
def test_sampling_queues_without_host_sync(mode):
    rows = _rows()
    logits = torch.randn(len(rows), VOCAB, device="cuda") * 4
    sampler = Sampler(seed=3, logprobs_mode=mode)
    sampler(logits, rows)  # first use: generators, allocator blocks
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        packed = sampler.sample_on_device(logits, rows)
        greedy_only = sampler.sample_on_device(logits[:1], rows[:1])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    out = sampler.unpack(packed.tolist(), rows)
    assert greedy_only.tolist() == [int(logits[0].argmax())]
    cpu = Sampler(seed=3, logprobs_mode=mode)(logits.cpu(), rows)
    for i, r in enumerate(rows):
        assert 0 <= out.token_ids[i] < VOCAB
        if r.params.temperature == 0.0:  # greedy rows: the same token and logprobs
            assert out.token_ids[i] == cpu.token_ids[i], i
            if r.params.logprobs is not None:
                assert out.logprobs[i].keys() == cpu.logprobs[i].keys(), i
                for tok, lp in out.logprobs[i].items():
                    assert abs(lp - cpu.logprobs[i][tok]) < 1e-3, (i, tok)
    assert out.token_ids[6] not in (2, 3)  # min_tokens keeps the stop ids out


def test_seeded_rows_repeat_on_the_gpu():
    rows = _rows()
    logits = torch.randn(len(rows), VOCAB, device="cuda") * 4
    a = Sampler(seed=1)(logits, rows)
    b = Sampler(seed=2)(logits, rows)  # another engine seed: only unseeded rows may change
    for i, r in enumerate(rows):
        if r.params.seed is not None or r.params.temperature == 0.0:
            assert a.token_ids[i] == b.token_ids[i], i


def test_grammar_bitmask_on_the_gpu_equals_the_cpu():
    """The bitmask op on CUDA masks exactly what it masks on the CPU (random bitmasks), and
    greedy picks the same tokens from the masked rows."""
    import numpy as np

    from edge_llm.engine.sampler_logits import apply_token_bitmask

    rng = np.random.default_rng(0)
    masks = rng.integers(-(2**31), 2**31, size=(6, (VOCAB + 31) // 32), dtype=np.int64)
    masks = masks.astype(np.int32)
    masks[:, :4] = 0  # a row may allow few tokens
    x = torch.randn(9, VOCAB)
    rows = [0, 2, 3, 5, 6, 8]
    cpu, gpu = x.clone(), x.cuda()
    apply_token_bitmask(cpu, rows, masks)
    apply_token_bitmask(gpu, rows, masks)
    assert torch.equal(gpu.cpu(), cpu)
    assert torch.equal(cpu.argmax(-1), gpu.argmax(-1).cpu())
