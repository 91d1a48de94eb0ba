"""On a CUDA GPU: the engine with Triton kernels against the torch-reference path, end to end.

For random-weight checkpoints of real shapes (written in the real formats), greedy decoding of
64 tokens must give the same tokens with kernels as with the references, or first diverge at a
near-tie (the reference's top-2 logprob margin at that step is shown). Also checks KV sizing
from gpu_memory_utilization, and swap / recompute preemption on CUDA (pinned host memory).

    python benchmarks/gpu_engine_check.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPTS = [[1] + [(97 * i + 13 * j) % 30000 + 3 for j in range(n)]
           for i, n in enumerate((16, 45, 128, 7))]


def worker(model: str, mode: str, blocks: int | None, swap: float) -> dict:
    import torch

    from edge_llm import LLM, SamplingParams

    llm = LLM(model, device="cuda", dtype="float16", max_model_len=256,
              num_gpu_blocks_override=blocks, swap_space=swap, max_num_batched_tokens=512,
              max_num_seqs=64)
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, logprobs=2)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    one = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    llm.generate([{"prompt_token_ids": PROMPTS[0]}], one, use_tqdm=False)  # warm
    torch.cuda.synchronize()
    t = time.perf_counter()
    llm.generate([{"prompt_token_ids": PROMPTS[0]}], one, use_tqdm=False)
    torch.cuda.synchronize()
    return {
        "mode": mode,
        "tokens": [o.outputs[0].token_ids for o in outs],
        "margins": [[_margin(lp) for lp in o.outputs[0].logprobs] for o in outs],
        "decode_tok_s": 128 / (time.perf_counter() - t),
        "num_gpu_blocks": llm.engine.runner.plan.num_gpu_blocks,
        "preemptions": llm.engine.stats()["num_preemptions"],
    }


def _margin(lp: dict) -> float:
    vals = sorted(lp.values(), reverse=True)
    return vals[0] - vals[1] if len(vals) > 1 else float("inf")


def run(model: str, kernels: str, blocks: int | None = None, swap: float = 4.0) -> dict:
    env = dict(os.environ, EDGE_LLM_KERNELS=kernels)
    cmd = [sys.executable, __file__, "--worker", model, kernels, str(blocks or 0), str(swap)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        return {"error": res.stderr[-3000:]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def compare(ref: dict, got: dict) -> list[str]:
    lines = []
    for i, (a, b) in enumerate(zip(ref["tokens"], got["tokens"], strict=True)):
        if a == b:
            lines.append(f"prompt {i}: identical over {len(a)} tokens")
            continue
        d = next(j for j, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        lines.append(f"prompt {i}: first divergence at step {d}, reference top-2 margin "
                     f"{ref['margins'][i][d]:.4f} nats")
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        model, mode, blocks, swap = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
        print(json.dumps(worker(model, mode, blocks or None, swap)))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("gpu_engine_check.json"))
    ap.add_argument("--shapes", nargs="+", default=["smollm2-135m:awq", "llama2-7b:awq",
                                                      "qwen2.5-7b:gptq", "llama2-7b:gptq-act"])
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from random_checkpoint import make_random_checkpoint

    report = {}
    for item in args.shapes:
        shape, fmt = item.split(":")
        gs = 64 if shape.startswith("smol") else 128
        path = make_random_checkpoint(shape, fmt, Path(f"/tmp/ckpt-{shape}-{fmt}"), gs, "cuda")
        ref, tri = run(str(path), "torch"), run(str(path), "triton")
        entry = {"torch": ref, "triton": tri}
        if "error" not in ref and "error" not in tri:
            entry["compare"] = compare(ref, tri)
            entry["decode_speedup"] = tri["decode_tok_s"] / ref["decode_tok_s"]
        if shape.startswith("smol"):
            for label, swap in (("swap", 1.0), ("recompute", 0.0)):
                small = run(str(path), "triton", blocks=18, swap=swap)
                entry[f"preempt_{label}"] = small if "error" in small else {
                    "preemptions": small["preemptions"],
                    "same_as_unconstrained": small["tokens"] == tri.get("tokens")}
        report[item] = entry
        print(item, json.dumps({k: v for k, v in entry.items() if k not in ("torch", "triton")},
                               indent=1), flush=True)
        for mode in ("torch", "triton"):
            if "error" in entry[mode]:
                print(mode, "ERROR", entry[mode]["error"][-1500:], flush=True)
            else:
                print(mode, "blocks", entry[mode]["num_gpu_blocks"], "decode tok/s",
                      round(entry[mode]["decode_tok_s"], 1), flush=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
