"""Does serving stay inside the engine's memory plan, and what grows the allocator if not
(GPU only).

    python benchmarks/serving_memory.py --ckpt /tmp/ck-awq [--util 0.18] [--seq-len 2048]
        [--tokens 64] [--out DIR]

Starts the engine with ``gpu_memory_utilization=--util`` (0.18 of an H200 is about a 24 GB
card), then runs as many ``--seq-len``-token sequences at once as its KV cache holds
(``--tokens`` of them generated), as the e2e card scenario does, while the allocator records
its history. Prints one table: the budget (util x card), reserved memory when serving began
and at its peak, the peak against the budget, and every segment the allocator added while
serving, by allocating call and stream, largest first.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

from graph_memory import allocating_call, print_rows

MiB = 1 << 20


def serving_segments(snapshot: dict, since: int) -> list[tuple[int, int, str]]:
    """(bytes, stream, allocating call) of the segments allocated at or after trace index
    ``since`` of device 0's trace, largest first."""
    trace = snapshot.get("device_traces", [[]])[0]
    out = [(ev["size"], ev.get("stream", 0), allocating_call(ev.get("frames", [])))
           for ev in trace[since:] if ev["action"] == "segment_alloc"]
    return sorted(out, reverse=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--util", type=float, default=0.18)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not 0 < args.tokens < args.seq_len:
        ap.error("--tokens must be between 1 and --seq-len - 1")

    import torch

    from edge_llm import LLM, SamplingParams

    llm = LLM(args.ckpt, device="cuda", dtype="float16", max_model_len=args.max_model_len,
              gpu_memory_utilization=args.util, swap_space=4.0)
    runner = llm.engine.runner
    per_seq = -(-args.seq_len // runner.block_size)
    fit = runner.plan.num_gpu_blocks // per_seq
    if fit < 1:
        raise SystemExit(f"no {args.seq_len}-token sequence fits at --util {args.util}")
    rng = random.Random(0)
    vocab = llm.engine.loaded.arch.vocab_size
    prompts = [{"prompt_token_ids": [rng.randrange(100, vocab) for _ in
                                     range(args.seq_len - args.tokens)]} for _ in range(fit)]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    total = torch.cuda.get_device_properties(0).total_memory
    budget = args.util * total
    torch.cuda.synchronize()
    reserved0 = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=400_000, stacks="python")
    since = len(torch.cuda.memory._snapshot().get("device_traces", [[]])[0])
    began = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - began
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    if any(len(o.outputs[0].token_ids) != args.tokens for o in outs):
        raise SystemExit("a request gave fewer tokens than asked for")
    peak = torch.cuda.max_memory_reserved()
    segments = serving_segments(snapshot, since)
    rows = [
        ("budget: util x card, MiB", f"{budget / MiB:.0f}"),
        ("KV blocks / sequences run at once", f"{runner.plan.num_gpu_blocks} / {fit}"),
        ("reserved when serving began, MiB", f"{reserved0 / MiB:.0f}"),
        ("peak reserved while serving, MiB", f"{peak / MiB:.0f}"),
        ("peak allocated while serving, MiB", f"{torch.cuda.max_memory_allocated() / MiB:.0f}"),
        ("peak reserved / budget", f"{peak / budget:.4f}"),
        ("segments added while serving, MiB (count)",
         f"{sum(s for s, _, _ in segments) / MiB:.0f} ({len(segments)})"),
        ("serving, s", f"{seconds:.1f}"),
    ]
    print_rows(rows)
    by_call = Counter()
    for size, stream, where in segments:
        by_call[(where, stream)] += size
    print("\nsegments added while serving, by allocating call and stream (MiB):")
    for (where, stream), size in by_call.most_common(15):
        print(f"  {size / MiB:8.1f}  stream {stream:#x}  {where}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "serving_memory.json").write_text(json.dumps({
            "rows": dict(rows), "segments": segments[:100]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
