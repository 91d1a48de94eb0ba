"""The long-prompt scenario of the end-to-end benchmark (``e2e.py --scenarios long``): RAG and
long chats on a Llama-3.1-8B shape (128k vocabulary, GQA 8, llama3 rope scaling).

Per context length C (4k, 16k, 32k tokens), batch 1, with the engine's own defaults (chunked
prefill, prefix cache on):
- whole prompt: a fresh C-token prompt, one token: first-token seconds, prefill tok/s, and
  the prefill's flops per second (``e2e_floor.prefill_flops``: linear projections, causal
  attention, lm_head) as a fraction of the fp16 matmul rate of the prefill's own big shapes
  (``e2e_floor.prefill_matmul_tflops`` at the engine's prefill chunk, measured in this run);
- cached prefix: the same C tokens plus a fresh user turn, one token: first-token seconds
  (the C tokens must come from the prefix cache);
- decode: that request again with ``long_tokens`` tokens: step time from the engine's own
  token timestamps, against the decode floor that counts KV reads (``decode_bytes_per_step``:
  every weight + K and V over the context, / measured copy bandwidth), as the decode scenario.
Each KV dtype (fp16 and fp8 unless ``--kv-cache-dtype`` names one) loads its own engine.
"""

from __future__ import annotations

import time
from typing import Any

from .e2e_common import PromptMaker, decode_bytes_per_step, free_device_memory, log
from .e2e_engine import EngineBench, decode_seconds, greedy, kv_elem_bytes
from .e2e_floor import prefill_flops, prefill_matmul_tflops

BLOCK = 16  # the engine's KV block: a cached prefix is whole blocks


def load_long(path, p, kv_dtype: str, max_len: int):
    from edge_llm import LLM

    return LLM(str(path), device=p.device, max_model_len=max_len,
               max_num_batched_tokens=p.long_batched_tokens, kv_cache_memory=p.kv_cache_memory,
               kv_cache_dtype=kv_dtype, swap_space=0.0)


def long_max_len(contexts: tuple[int, ...], user: int, tokens: int) -> int:
    """The engine's context limit: the longest prompt, its user turn and decode, in blocks."""
    need = max(contexts) + user + tokens
    return -(-need // BLOCK) * BLOCK + BLOCK


def at_context(bench: EngineBench, context: int, user: int, tokens: int,
               matmul_tflops: float) -> dict[str, Any]:
    """The three measures of the module doc at one context length."""
    arch, prompts = bench.arch, bench.prompts
    prefix = prompts.ids(context)
    whole_s, outs = bench.generate([prefix], greedy(1))
    if outs[0].num_cached_tokens:
        raise RuntimeError(f"a fresh prompt hit the prefix cache ({outs[0].num_cached_tokens})")
    cached_s, outs = bench.generate([prefix + prompts.ids(user)], greedy(1))
    cached = outs[0].num_cached_tokens
    if cached < context - BLOCK:
        raise RuntimeError(f"{context}-token prefix: only {cached} tokens came from the cache")
    _, outs = bench.generate([prefix + prompts.ids(user)], greedy(tokens))
    step = decode_seconds(outs) / (tokens - 1)
    nbytes = decode_bytes_per_step(bench.engine.runner.model, arch, 1,
                                   context + user + tokens / 2, kv_elem_bytes(bench))
    floor = nbytes["total"] / (bench.copy_gbs * 1e9)
    flops = prefill_flops(arch, context)
    return {
        "context": context, "user": user, "tokens": tokens,
        "ttft_whole_s": whole_s, "prefill_tok_s": context / whole_s,
        "prefill_tflops": flops / whole_s / 1e12,
        "prefill_fraction": flops / whole_s / (matmul_tflops * 1e12),
        "ttft_cached_s": cached_s, "cached_tokens": cached,
        "ttft_whole_over_cached": whole_s / cached_s,
        "decode_step_ms": step * 1e3, "decode_tok_s": 1 / step,
        "decode_bytes_per_step": nbytes, "decode_floor_ms": floor * 1e3,
        "decode_floor_fraction": floor / step,
    }


def scenario_long(path, p, kv_dtypes: tuple[str, ...], copy_gbs: float) -> dict[str, Any]:
    """Every context of ``p.long_contexts`` for each KV dtype, one engine per dtype; the
    matmul rate is measured once, before the first engine takes the memory."""
    import json

    from edge_llm.model.arch import parse_arch_config

    arch = parse_arch_config(json.loads((path / "config.json").read_text()))
    max_len = long_max_len(p.long_contexts, p.long_user, p.long_tokens)
    chunk = min(p.long_batched_tokens, max(p.long_contexts))
    tflops = prefill_matmul_tflops(p.device, arch, chunk)
    free_device_memory(p.device)
    log.info("long: fp16 matmul at the prefill's shapes (%d rows): %.3g TFLOP/s", chunk, tflops)
    res: dict[str, Any] = {"contexts": list(p.long_contexts), "max_model_len": max_len,
                           "prefill_chunk": chunk, "matmul_tflops": tflops,
                           "copy_gbs": copy_gbs, "kv": {}}
    for kv_dtype in kv_dtypes:
        began = time.perf_counter()
        llm = load_long(path, p, kv_dtype, max_len)
        bench = EngineBench(llm, p, p.device, PromptMaker(arch.vocab_size, seed=7), copy_gbs)
        # kernels of a full prefill chunk and a partial one, the cached prefill and batch-1
        # decode, untimed
        warm = bench.prompts.ids(min(max(p.long_contexts), p.long_batched_tokens + 2 * BLOCK))
        bench.generate([warm], greedy(2))
        bench.generate([warm + bench.prompts.ids(p.long_user)], greedy(4))
        out = {"load_s": time.perf_counter() - began}
        for context in p.long_contexts:
            r = at_context(bench, context, p.long_user, p.long_tokens, tflops)
            out[f"c{context}"] = r
            log.info("long %s KV, %d tokens: TTFT %.3f s whole (%.0f tok/s, %.2f of the "
                     "matmul rate), %.3f s cached; decode %.2f ms/step, %.2f of the floor",
                     kv_dtype, context, r["ttft_whole_s"], r["prefill_tok_s"],
                     r["prefill_fraction"], r["ttft_cached_s"], r["decode_step_ms"],
                     r["decode_floor_fraction"])
        res["kv"][kv_dtype] = out
        del bench, llm
        free_device_memory(p.device)
    return res
