"""What the fp8 KV cache (``kv_cache_dtype="fp8"``) costs in quality (``quality.py
kv-cache``), on the demo model by default (CPU).

One row per KV dtype: perplexity on ``tokens`` tokens of each bundled evaluation text in
``window``-token windows (``eval``: edge_llm/data/eval.txt, ``heldout``:
edge_llm/data/heldout.txt) as a ratio to the fp32 KV cache, and how many of the first
``greedy`` greedy tokens of the demo's question (and of four prompts from the held-out text)
equal the fp32 cache's.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from edge_llm import LLM, SamplingParams
from edge_llm.model.demo import ensure_demo_model
from edge_llm.model.full_forward import full_logits
from edge_llm.model.loader import load_model
from edge_llm.quant import evaluation_token_ids, perplexity

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def greedy_tokens(llm: LLM, prompts: list[list[int]], n: int) -> list[list[int]]:
    """``n`` greedy tokens of the demo question (chat template), then of each prompt."""
    sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    outs = llm.chat(QUESTION, sp, use_tqdm=False)
    outs += llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def run(model: Path | None, tokens: int = 2048, window: int = 512, greedy: int = 24) -> dict:
    """The table's rows by KV dtype: perplexity ratios, greedy tokens equal, seconds."""
    path = model or ensure_demo_model()
    lm = load_model(str(path), device="cpu", progress=False).model
    tok = LLM(str(path), device="cpu").get_tokenizer()
    texts = evaluation_token_ids(tok, tokens)
    held = texts["heldout"]
    step = max(1, (len(held) - 64) // 4)
    prompts = [held[i:i + 64].tolist() for i in range(0, 4 * step, step)]
    rows = {}
    for name, kv in (("fp32 (auto)", None), ("fp8 e4m3", torch.uint8)):
        began = time.perf_counter()
        ppl = {k: perplexity(lambda x, kv=kv: full_logits(lm, x[0], kv_dtype=kv), t, window)
               for k, t in texts.items()}
        llm = LLM(str(path), device="cpu", kv_cache_dtype="auto" if kv is None else "fp8")
        rows[name] = (ppl, greedy_tokens(llm, prompts, greedy), time.perf_counter() - began)
    base_ppl, base_tok, _ = rows["fp32 (auto)"]
    print(f"KV cache    | eval ppl ratio | heldout ppl ratio | greedy tokens equal (of {greedy}), "
          "5 prompts | seconds")
    table = {}
    for name, (ppl, toks, secs) in rows.items():
        same = [same_prefix(a, b) for a, b in zip(toks, base_tok, strict=True)]
        ratio = {k: ppl[k] / base_ppl[k] for k in ppl}
        table[name] = {"ppl": ppl, "ppl_ratio": ratio, "greedy_equal": same, "seconds": secs}
        print(f"{name:11s} | {ratio['eval']:14.4f} | {ratio['heldout']:17.4f} | "
              f"{', '.join(map(str, same)):38s} | {secs:.0f}")
    print(f"(fp32 perplexity: eval {base_ppl['eval']:.3f}, heldout {base_ppl['heldout']:.3f})")
    return table
