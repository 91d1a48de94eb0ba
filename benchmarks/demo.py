"""The demo model against its source: perplexity ratio, greedy answer, CPU decode speed.

    python benchmarks/demo.py [EXTRA_CHECKPOINT_DIR ...]

Prints one table: the dequantized GGUF source (fp32), the cached demo checkpoint and any extra
checkpoint folders, each run through edge-llm's loader and decoder.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from edge_llm import LLM, SamplingParams
from edge_llm.model.demo import DEMO_GGUF, cache_dir, ensure_demo_model, load_gguf_model
from edge_llm.model.full_forward import full_logits
from edge_llm.model.loader import load_model
from edge_llm.quant import load_eval_text, perplexity

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _speed(llm: LLM, batch: int) -> float:
    p = [{"prompt_token_ids": list(range(100, 140))}] * batch
    sp = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    llm.generate(p[:1], sp, use_tqdm=False)
    t = time.perf_counter()
    llm.generate(p, sp, use_tqdm=False)
    return batch * 32 / (time.perf_counter() - t)


def main() -> None:
    demo = ensure_demo_model()
    model, tok = load_gguf_model(cache_dir() / "models" / DEMO_GGUF)
    ids = torch.tensor(tok.encode(load_eval_text(), add_special_tokens=False)[:2048])
    with torch.no_grad():
        base = perplexity(lambda x: model(x).logits, ids, window=512)
    rows = [("source fp32 (dequantized GGUF)", 1.0, base, "-", "-", "-")]
    for path in [demo, *map(Path, sys.argv[1:])]:
        q = load_model(str(path), device="cpu", progress=False)
        ppl = perplexity(lambda x, q=q: full_logits(q.model, x[0]), ids, window=512)
        llm = LLM(str(path), device="cpu")
        answer = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=24),
                          use_tqdm=False)[0].outputs[0].text.strip().replace("\n", " ")
        rows.append((path.name, ppl / base, ppl, answer[:40], f"{_speed(llm, 1):.1f}",
                     f"{_speed(llm, 8):.1f}"))
    print(f"\n{'weights':36} {'ppl ratio':>9} {'ppl':>7}  {'greedy answer':40} "
          f"{'tok/s b1':>8} {'tok/s b8':>8}")
    for name, ratio, ppl, ans, s1, s8 in rows:
        print(f"{name:36} {ratio:9.4f} {ppl:7.3f}  {ans:40} {s1:>8} {s8:>8}")


if __name__ == "__main__":
    main()
