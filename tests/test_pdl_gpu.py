"""Programmatic dependent launch on a Hopper-class GPU (``pytest -m gpu``; skipped below sm_90): in
forwards of at most ``AUTO_MAX_TOKENS`` tokens every kernel may start while the one before it
finishes and waits on the device for its inputs (kernels/pdl.py). The arithmetic is unchanged,
so the engine's outputs (CUDA graphs for decode and short steps, eager steps, W4A16 and
attention kernels) must equal the outputs without it (``AUTO_MAX_TOKENS`` set to 0) exactly: a
kernel reading an input before the kernel writing it had finished would show as a difference."""

from __future__ import annotations

import gc
import importlib

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if torch.cuda.get_device_capability() < (9, 0):
    pytest.skip("programmatic dependent launch needs sm_90 or later",
                allow_module_level=True)

from edge_llm import SamplingParams  # noqa: E402
from tests import test_cuda_graphs_gpu as decode_gpu  # noqa: E402
from tests.test_cuda_graphs import random_prompts, run_traffic  # noqa: E402

pdl = importlib.import_module("edge_llm.kernels.pdl")
VOCAB = decode_gpu.VOCAB
make_llm = decode_gpu.make_llm
fp16_dir, awq_dir, model_dir = decode_gpu.fp16_dir, decode_gpu.awq_dir, decode_gpu.model_dir
PARAMS = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=24, logprobs=3)


def _run(path, on: bool, monkeypatch) -> dict:
    monkeypatch.setattr(pdl, "AUTO_MAX_TOKENS", 4 if on else 0)
    llm = make_llm(path)
    device = llm.engine.runner.device
    with pdl.forward_tokens(1):
        assert pdl.pdl_on(device) is on
    with pdl.forward_tokens(16):
        assert not pdl.pdl_on(device)
    prompts = random_prompts(10, VOCAB, 2, 300, seed=21)
    arrivals = [(4 * i, p) for i, p in enumerate(prompts)]  # prompts join decodes
    got = run_traffic(llm, arrivals, PARAMS)
    replays = (sum(llm.engine.runner.graphs.replays.values()),
               sum(llm.engine.runner.prefill_graphs.replays.values()))
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return {"outputs": got, "replays": replays}


def test_outputs_equal_without_pdl(model_dir, monkeypatch):
    on = _run(model_dir, True, monkeypatch)
    off = _run(model_dir, False, monkeypatch)
    assert min(on["replays"]) > 0, on["replays"]  # both graph kinds replayed
    assert sorted(on["outputs"]) == sorted(off["outputs"])
    for key, a in on["outputs"].items():
        b = off["outputs"][key]
        assert a.token_ids == b.token_ids, key
        assert [sorted(d.items()) for d in a.logprobs] == [sorted(d.items()) for d in b.logprobs]
