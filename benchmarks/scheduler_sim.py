"""The scheduler alone (no model) on two workloads, by growth reserve and KV cache size:
how many preemptions, recomputed tokens and steps, and how many sequences decode together.

    python benchmarks/scheduler_sim.py [--blocks 2176,5120] [--reserves 0,64,128,256,512]

Workloads (block size 16, token budget 8,192, 256 sequences at most, swap space of 512
blocks): "offline" is e2e.py's 256-request offline run (prompts 128-1,024, outputs 128-512,
``ignore_eos``); "chat" is 256 requests with prompts 128-1,024 and ``max_tokens`` 2,048 that
end at a stop token drawn with probability 1/250 per output token (about 250 tokens each).
5,120 blocks are a 40 GiB Llama-2-7B cache (0.5 MiB per token), 2,176 about what a 24 GB
card keeps beside the 4-bit weights. The fake sampler's tokens depend only on the sequence,
so every row's outcome is the same whatever the policy. One table.
"""

from __future__ import annotations

import argparse
import hashlib
import random

from edge_llm.config import CacheConfig, SchedulerConfig
from edge_llm.engine.scheduler import Scheduler
from edge_llm.sampling_params import SamplingParams

STOP = 7


def _token(seq, stop_every: int) -> int:
    data = f"{seq.request_id}|{seq.num_tokens}".encode()
    h = int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little")
    return STOP if stop_every and h % stop_every == 0 else 100 + h % 1000


def workload(kind: str, seed: int = 1) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    out = []
    for _ in range(256):
        prompt = [rng.randrange(100, 1100) for _ in range(rng.randint(128, 1024))]
        if kind == "offline":
            params = SamplingParams(max_tokens=rng.randint(128, 512), ignore_eos=True)
        else:
            params = SamplingParams(max_tokens=2048, stop_token_ids=[STOP])
        out.append((prompt, params))
    return out


def simulate(kind: str, blocks: int, reserve: int) -> dict:
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=4096,
                        growth_reserve=reserve),
        CacheConfig(block_size=16), blocks, 512)
    work = workload(kind)
    for i, (prompt, params) in enumerate(work):
        sched.add_request(f"r{i}", prompt, params, float(i))
    stop_every = 250 if kind == "chat" else 0
    steps = decode_steps = decode_rows = fed = swapped = outputs = 0
    while sched.has_unfinished():
        out = sched.schedule()
        steps += 1
        fed += out.num_batched_tokens
        swapped += len(out.blocks_to_swap_out)
        rows = [r for r in out.scheduled if r.num_scheduled_tokens == 1
                and r.start_pos >= r.seq.num_prompt_tokens]
        if len(rows) == len(out.scheduled):
            decode_steps += 1
            decode_rows += len(rows)
        sampled = {r.seq.seq_id: _token(r.seq, stop_every) for r in out.scheduled if r.do_sample}
        outputs += len(sampled)
        sched.update_from_output(out, sampled)
    return {"steps": steps, "preemptions": sched.num_preemptions,
            "swapped_blocks": swapped,
            # tokens fed over the least possible (each prompt once, each output but the last)
            "fed_ratio": fed / (sum(len(p) for p, _ in work) + outputs - len(work)),
            "decode_rows_mean": decode_rows / max(1, decode_steps)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="2176,5120")
    ap.add_argument("--reserves", default="0,64,128,256,512")
    args = ap.parse_args()
    print("workload | blocks | reserve | steps | preemptions | swapped blocks | "
          "tokens fed / least | decode rows")
    for kind in ("offline", "chat"):
        for blocks in map(int, args.blocks.split(",")):
            for reserve in map(int, args.reserves.split(",")):
                r = simulate(kind, blocks, reserve)
                print(f"{kind:8s} | {blocks:6d} | {reserve:7d} | {r['steps']:5d} | "
                      f"{r['preemptions']:11d} | {r['swapped_blocks']:14d} | "
                      f"{r['fed_ratio']:.3f} | {r['decode_rows_mean']:5.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
