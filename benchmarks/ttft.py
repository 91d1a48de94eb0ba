"""Time to the first token of one prompt alone, by prompt length, with the one-sequence
prefill graphs (engine/prefill_graphs.py) and without them, in one loaded engine.

    python benchmarks/ttft.py --ckpt DIR [--lengths 16,64,128,256,384,512,1024] [--trials 5]
        [--out F]

Each trial is ``LLM.generate`` of a fresh random prompt with ``max_tokens=1`` (greedy): the
prefill, the sample and the output, as the first token of a request that arrives alone. The
eager column runs the same engine with its prefill graphs set aside. One table (median ms);
JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path


def first_token_ms(llm, length: int, trials: int, rng: random.Random) -> float:
    from edge_llm import SamplingParams

    vocab = llm.engine.loaded.arch.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    times = []
    for _ in range(trials + 1):  # the first compiles or warms what this length needs
        ids = [rng.randrange(100, vocab) for _ in range(length)]
        began = time.perf_counter()
        llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times[1:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--lengths", default="16,64,128,256,384,512,1024")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    lengths = [int(v) for v in args.lengths.split(",")]
    from edge_llm import LLM

    llm = LLM(args.ckpt, max_model_len=args.max_model_len, max_num_batched_tokens=2048,
              enable_prefix_caching=False)
    runner = llm.engine.runner
    graphs = runner.prefill_graphs
    rng = random.Random(0)
    rows = []
    print("prompt tokens | graphs, ms | eager, ms | eager / graphs")
    for n in lengths:
        with_graphs = first_token_ms(llm, n, args.trials, rng)
        runner.prefill_graphs = None
        try:
            eager = first_token_ms(llm, n, args.trials, rng)
        finally:
            runner.prefill_graphs = graphs
        rows.append({"tokens": n, "graphs_ms": with_graphs, "eager_ms": eager})
        print(f"{n:13d} | {with_graphs:10.1f} | {eager:9.1f} | {eager / with_graphs:6.2f}",
              flush=True)
    if args.out:
        args.out.write_text(json.dumps({"sizes": list(graphs.sizes) if graphs else [],
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
