"""Where the offline scenario's time goes (issue #7): the 256-request workload of
``e2e.py``'s full profile on one loaded engine, once per (KV cache size, token budget,
growth reserve, preemption mode), with every step timed and classified.

    python benchmarks/offline_probe.py --ckpt DIR --kv-gib 40,80 --batched 2048,8192 \
        [--reserves 0,128] [--modes default,recompute,swap] [--cuda-graph-sizes 1,2,4,..]
        [--out F]

Per configuration: output tok/s, preemptions, the steps that decoded only (count, mean rows,
share of the time, tokens per second in them) and the mixed / prefill steps (count, prompt
tokens, share of the time), and the mean number of running sequences. A step's time is the
wall time of ``LLMEngine.step`` (the runner returns sampled ids on the host, so it includes
the device work). One table; JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from e2e_common import PROFILES, GiB, offline_workload, shape_config  # noqa: E402
from e2e_engine import greedy, new_scheduler, resize_kv_cache  # noqa: E402


def traced_run(llm, work) -> dict:
    """Run the workload step by step, timing and classifying each step."""
    engine = llm.engine
    for i, (ids, n) in enumerate(work):
        engine.add_request(f"r{i}", {"prompt_token_ids": ids}, greedy(n))
    before = engine.stats()["num_preemptions"]
    schedule = engine.scheduler.schedule
    seen: list = []

    def spy():
        out = schedule()
        seen.append(out)
        return out

    engine.scheduler.schedule = spy
    steps = []
    began = time.perf_counter()
    try:
        while engine.has_unfinished():
            t0 = time.perf_counter()
            engine.step()
            dt = time.perf_counter() - t0
            out = seen[-1]
            rows = out.scheduled
            decodes = sum(1 for r in rows if r.num_scheduled_tokens == 1
                          and r.start_pos >= r.seq.num_prompt_tokens)
            steps.append((dt, len(rows), decodes, out.num_batched_tokens - decodes,
                          len(engine.scheduler.running)))
    finally:
        engine.scheduler.schedule = schedule
    seconds = time.perf_counter() - began
    out_tokens = sum(n for _, n in work)
    dec = [s for s in steps if s[3] == 0]
    mix = [s for s in steps if s[3] > 0]
    t_dec = sum(s[0] for s in dec)
    t_mix = sum(s[0] for s in mix)
    return {
        "seconds": seconds, "output_tok_s": out_tokens / seconds,
        "preemptions": engine.stats()["num_preemptions"] - before,
        "steps": len(steps),
        "decode_steps": len(dec), "decode_share": t_dec / seconds,
        "decode_rows_mean": sum(s[2] for s in dec) / max(1, len(dec)),
        "decode_tok_s": sum(s[2] for s in dec) / max(t_dec, 1e-9),
        "mixed_steps": len(mix), "mixed_share": t_mix / seconds,
        "mixed_prompt_tokens": sum(s[3] for s in mix),
        "mixed_decode_rows": sum(s[2] for s in mix),
        "running_mean": sum(s[4] for s in steps) / max(1, len(steps)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, required=True, help="a checkpoint of --shape")
    ap.add_argument("--kv-gib", default="40,80")
    ap.add_argument("--batched", default="2048,8192")
    ap.add_argument("--reserves", default="256", help="growth_reserve values (tokens)")
    ap.add_argument("--modes", default="default",
                    help="preemption modes: default, recompute, swap (session 15's call 3 "
                         "ran before the modes: its swap 1 / 0 are swap / recompute)")
    ap.add_argument("--requests", type=int, default=None, help="default: the full profile's")
    ap.add_argument("--profile", default="full", choices=sorted(PROFILES))
    ap.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"))
    ap.add_argument("--shape", default="llama2-7b")
    ap.add_argument("--cuda-graph-sizes", default=None,
                    help="comma-separated decode graph sizes (default: the engine's ladder)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from edge_llm import LLM

    p = PROFILES[args.profile]
    if args.requests:
        p = replace(p, offline_requests=args.requests)
    work = offline_workload(p, shape_config(args.shape)["vocab_size"])
    kvs = [float(v) for v in args.kv_gib.split(",")]
    budgets = [int(v) for v in args.batched.split(",")]
    reserves = [int(v) for v in args.reserves.split(",")]
    modes = [v.strip() for v in args.modes.split(",")]
    llm = LLM(str(args.ckpt), device=p.device, max_model_len=p.max_model_len,
              kv_cache_dtype=args.kv_cache_dtype,
              kv_cache_memory=int(kvs[0] * GiB),
              cuda_graph_sizes=None if args.cuda_graph_sizes is None
              else [int(v) for v in args.cuda_graph_sizes.split(",")],
              swap_space=4.0 if p.device == "cuda" else 0.0625)
    llm.generate([{"prompt_token_ids": w[0]} for w in work[:8]], greedy(4), use_tqdm=False)
    results = []
    print("kv GiB | budget | reserve | preemption | out tok/s | preempt | steps | "
          "decode: n, rows, time share, tok/s | mixed: n, prompt tok, time share | running",
          flush=True)
    for kv in kvs:
        if int(kv * GiB) != llm.engine.config.cache.kv_cache_memory:
            resize_kv_cache(llm, int(kv * GiB))
        for b, res, mode in [(b, r, m) for b in budgets for r in reserves for m in modes]:
            new_scheduler(llm, scheduler=dict(  # mode "default": preemption_mode None
                max_num_batched_tokens=b, growth_reserve=res,
                preemption_mode=None if mode == "default" else mode))
            graphs = llm.engine.runner.graphs
            if graphs is not None:
                graphs.replays.clear()
            r = traced_run(llm, work)
            r.update(graph_replays=dict(sorted(graphs.replays.items())) if graphs else {},
                     graph_sizes=llm.engine.runner.graph_sizes,
                     kv_gib=kv, batched=b, reserve=res, preemption_mode=mode,
                     gpu_blocks=llm.engine.runner.plan.num_gpu_blocks)
            results.append(r)
            print(f"{kv:6.1f} | {b:6d} | {res:7d} | {mode:10s} | {r['output_tok_s']:9.0f} | "
                  f"{r['preemptions']:7d} | "
                  f"{r['steps']:5d} | {r['decode_steps']:5d}, {r['decode_rows_mean']:5.1f}, "
                  f"{r['decode_share']:.2f}, {r['decode_tok_s']:6.0f} | {r['mixed_steps']:5d}, "
                  f"{r['mixed_prompt_tokens']:6d}, {r['mixed_share']:.2f} | "
                  f"{r['running_mean']:5.1f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
