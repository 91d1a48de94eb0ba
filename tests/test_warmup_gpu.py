"""After start-up, serving compiles no Triton kernel (``pytest -m gpu``; issue #6's warm-up).

The engine's start-up (kernel warm-up prefills, decode graph capture) must leave nothing for
the first requests to compile: a mix of prompt lengths 1-200, batches of 1-9 sequences,
prefix-cache hits, n=2, stop strings and eager decode steps (prompt logprobs) runs while every
Triton compile is counted.
"""

from __future__ import annotations

import random

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from triton.runtime.jit import JITFunction  # noqa: E402

from edge_llm import LLM, SamplingParams  # noqa: E402
from tests.test_cuda_graphs_gpu import awq_dir  # noqa: E402,F401  (fixture)


def test_first_requests_compile_nothing(awq_dir):  # noqa: F811
    llm = LLM(str(awq_dir), device="cuda", max_model_len=1024, max_num_seqs=16,
              kv_cache_memory=256 << 20)
    compiled: list[str] = []
    original = getattr(JITFunction, "_do_compile", None)
    if original is None:
        pytest.skip("this Triton has no JITFunction._do_compile to count compiles with")

    def counting(self, *args, **kwargs):
        compiled.append(self.__name__)
        return original(self, *args, **kwargs)

    JITFunction._do_compile = counting
    try:
        rng = random.Random(0)
        vocab = llm.engine.loaded.arch.vocab_size
        shared = [rng.randrange(5, vocab) for _ in range(96)]
        for batch in (1, 3, 9, 2, 5):
            prompts = []
            for _ in range(batch):
                n = rng.choice([1, 2, 3, 7, 16, 17, 40, 64, 65, 130, 200])
                ids = [rng.randrange(5, vocab) for _ in range(n)]
                prompts.append({"prompt_token_ids": shared + ids if rng.random() < 0.3 else ids})
            params = SamplingParams(max_tokens=rng.randint(2, 12), ignore_eos=True,
                                    temperature=0.8, seed=1, n=2 if batch == 2 else 1)
            llm.generate(prompts, params, use_tqdm=False)
        plp = SamplingParams(max_tokens=3, ignore_eos=True, prompt_logprobs=2, temperature=0.0)
        llm.generate([{"prompt_token_ids": [5, 6, 7, 8, 9]}], plp, use_tqdm=False)
    finally:
        JITFunction._do_compile = original
    assert not compiled, f"kernels compiled while serving: {sorted(set(compiled))}"
