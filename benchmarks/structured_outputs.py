"""What constrained decoding costs: decode step rate of a batch with and without constrained
rows, and the compile time of the tool sets chat front ends send.

A batch of ``--batch`` prompts decodes ``--tokens`` tokens each (greedy); in the constrained
run ``--constrained`` of the rows follow a JSON schema that never ends early (an array of up
at least 1,000 short strings), the others are free. Then ``tool_choice: "required"`` schemas for
``--tools`` tools (Open WebUI attaches 36) are compiled from scratch ``--compiles`` times.
Prints one table.

    python benchmarks/structured_outputs.py [--model PATH] [--batch 16] [--constrained 8]
"""

from __future__ import annotations

import argparse
import time

from edge_llm import LLM, SamplingParams, StructuredOutputsParams
from edge_llm.server.chat_tools import tool_plan
from edge_llm.server.protocol import ChatCompletionRequest

LONG = {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1000}


def step_rate(llm: LLM, batch: int, constrained: int, tokens: int) -> float:
    """Generated tokens per second for the whole batch (prefill included, the same in both)."""
    prompts = [{"prompt_token_ids": [1, 100 + i, 200 + i, 300 + i]} for i in range(batch)]
    params = [SamplingParams(max_tokens=tokens, min_tokens=tokens, temperature=0.0,
                             structured_outputs=StructuredOutputsParams(json=LONG)
                             if i < constrained else None) for i in range(batch)]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return sum(len(o.outputs[0].token_ids) for o in outs) / elapsed


def compile_ms(llm: LLM, num_tools: int, compiles: int) -> list[float]:
    out = []
    for k in range(compiles):
        tools = [{"type": "function", "function": {
            "name": f"tool_{i}_{k}", "description": f"Tool {i}.",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1},
                "tags": {"type": "array", "items": {"type": "string"}}},
                "required": ["query"]}}} for i in range(num_tools)]
        req = ChatCompletionRequest(messages=[], tools=tools, tool_choice="required")
        _, spec = tool_plan(req, None)
        start = time.perf_counter()
        llm.engine.grammars.compile(spec).matcher()
        out.append((time.perf_counter() - start) * 1e3)
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model folder or hub id (default: the demo)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--constrained", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--tools", type=int, default=36)
    ap.add_argument("--compiles", type=int, default=50)
    a = ap.parse_args()
    llm = LLM(a.model, max_num_seqs=max(a.batch, 2))
    _ = llm.engine.grammars.ll_tokenizer  # built once, before anything is timed
    free = step_rate(llm, a.batch, 0, a.tokens)
    mixed = step_rate(llm, a.batch, a.constrained, a.tokens)
    ms = compile_ms(llm, a.tools, a.compiles)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(f"| batch | constrained rows | tokens/s free | tokens/s mixed | ratio | "
          f"{a.tools}-tool compile p50 / p99 ms |")
    print("|---|---|---|---|---|---|")
    print(f"| {a.batch} | {a.constrained} | {free:.1f} | {mixed:.1f} | {mixed / free:.3f} | "
          f"{ms[len(ms) // 2]:.1f} / {p99:.1f} |")


if __name__ == "__main__":
    main()
