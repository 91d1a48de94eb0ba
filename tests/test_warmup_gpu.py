"""After start-up, serving compiles no Triton kernel (``pytest -m gpu``; issue #6's warm-up).

The engine's start-up (kernel warm-up prefills, decode graph capture) must leave nothing for
the first requests to compile: a mix of prompt lengths 1-200, batches of 1-9 sequences,
prefix-cache hits, n=2, stop strings and eager decode steps (prompt logprobs) runs while every
Triton compile is counted.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # collected on CPU machines only with -m gpu
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from triton.runtime.jit import JITFunction  # noqa: E402

from edge_llm import LLM, SamplingParams  # noqa: E402
from tests.test_cuda_graphs_gpu import awq_dir  # noqa: E402,F401  (fixture)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_first_requests_compile_nothing(awq_dir, kv_cache_dtype):  # noqa: F811
    """Also with the fp8 cache, whose attention and K/V-write kernels are variants of their
    own: the warm-ups' scratch caches take its dtype, or serving compiles them."""
    llm = LLM(str(awq_dir), device="cuda", max_model_len=1024, max_num_seqs=16,
              kv_cache_memory=256 << 20, kv_cache_dtype=kv_cache_dtype)
    compiled = compiles_while_serving(llm)
    assert not compiled, f"kernels compiled while serving: {sorted(set(compiled))}"


def test_nothing_compiles_either_after_a_start_that_reused_its_probes(awq_dir,  # noqa: F811
                                                                       tmp_path):
    """With the memory probes' results from the probe cache (engine/probe_cache.py) the
    whole-step profile forward does not run; the kernel warm-up alone must still load every
    variant. Each start in a fresh process (Triton's in-memory cache empty; its disk cache
    and the probe cache under the same EDGE_LLM_CACHE_DIR)."""
    env = {**os.environ, "EDGE_LLM_CACHE_DIR": str(tmp_path),
           "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    code = ("import json, sys; from tests.test_warmup_gpu import fresh_start; "
            "print(json.dumps(fresh_start(sys.argv[1])))")
    runs = []
    for _ in range(2):
        res = subprocess.run([sys.executable, "-c", code, str(awq_dir)], env=env,
                             cwd=Path(__file__).resolve().parents[1], capture_output=True,
                             text=True, timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        runs.append(json.loads(res.stdout.strip().splitlines()[-1]))
    assert [r["reused"] for r in runs] == [False, True]
    assert runs[0]["blocks"] == runs[1]["blocks"]  # the same plan from the stored values
    assert runs[1]["compiled"] == [], runs[1]["compiled"]


def fresh_start(path: str) -> dict:
    llm = LLM(path, device="cuda", max_model_len=1024, max_num_seqs=16,
              gpu_memory_utilization=0.2)
    runner = llm.engine.runner
    compiled = compiles_while_serving(llm)
    return {"reused": runner.probes_reused, "blocks": runner.plan.num_gpu_blocks,
            "compiled": sorted(set(compiled))}


def compiles_while_serving(llm) -> list[str]:
    """The names of the Triton kernels compiled (or loaded from the disk cache) while a mix
    of requests runs."""
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
    return compiled
