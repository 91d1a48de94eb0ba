"""Where a decode step's GPU time goes: CUDA kernel time per step, by kernel, at several batch
sizes, against the step time of CUDA-graph replay (GPU only).

    python benchmarks/profile_kernels.py --out DIR [--ckpt /tmp/ckpt-llama2-7b-awq]
        [--batches 1,16,64] [--prompt 128] [--steps 16]

For each batch B (B prompts of ``--prompt`` tokens): an eager engine (``enforce_eager``) runs
``generate(max_tokens=1)`` and ``generate(max_tokens=1 + steps)`` under ``torch.profiler``; the
difference of the two kernel tallies, over ``steps``, is one decode step's kernels (prefill and
the first sample cancel). A second engine with CUDA graphs times the same decode (two lengths,
difference) for the real step time. The gap between the two is what the GPU does not spend in
kernels during a replayed step (launch gaps, host waits). Prints one table per batch, writes
profile_kernels.json under --out.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _short(name: str) -> str:
    """Kernel names without template arguments and launch decorations."""
    name = re.sub(r"<.*>", "", name)
    name = re.sub(r"\(.*\)", "", name)
    return name.strip()[:48] or "?"


def kernel_tally(fn) -> dict[str, list[float]]:
    """{kernel: [count, microseconds]} of the CUDA kernels ``fn()`` runs."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    tally: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            t = tally[_short(e.name)]
            t[0] += 1
            t[1] += e.time_range.elapsed_us()
    return dict(tally)


def _prompts(batch: int, length: int) -> list[dict]:
    return [{"prompt_token_ids": [1] + [(131 * i + 17 * j) % 31000 + 3 for j in range(length - 1)]}
            for i in range(batch)]


def _engine(ckpt: Path, eager: bool, max_seqs: int, max_len: int, kv_gib: float):
    from edge_llm import LLM

    return LLM(str(ckpt), device="cuda", dtype="float16", max_model_len=max_len,
               max_num_seqs=max_seqs, max_num_batched_tokens=max(2048, max_len),
               kv_cache_memory=int(kv_gib * (1 << 30)), swap_space=0.0, enable_prefix_caching=False,
               enforce_eager=eager)


def _kv_bytes_per_token(ckpt: Path) -> int:
    """fp16 K and V of every layer for one token (the engine's own block arithmetic)."""
    import torch

    from edge_llm.engine.kv_cache import bytes_per_block
    from edge_llm.model.arch import parse_arch_config

    arch = parse_arch_config(json.loads((ckpt / "config.json").read_text()))
    return bytes_per_block(arch, 1, torch.float16)


def decode_kernels(llm, batch: int, prompt: int, steps: int) -> dict[str, list[float]]:
    from edge_llm import SamplingParams

    def gen(n: int):
        return lambda: llm.generate(_prompts(batch, prompt), SamplingParams(
            temperature=0.0, max_tokens=n, ignore_eos=True), use_tqdm=False)

    gen(1 + steps)()  # compile and settle
    short, long = kernel_tally(gen(1)), kernel_tally(gen(1 + steps))
    per_step = {}
    for name, (count, us) in long.items():
        c0, u0 = short.get(name, (0, 0.0))
        if count > c0:
            per_step[name] = [(count - c0) / steps, (us - u0) / steps]
    return per_step


def graph_step_us(llm, batch: int, prompt: int, steps: int, reps: int = 3) -> float:
    import torch

    from edge_llm import SamplingParams

    def timed(n: int) -> float:
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate(_prompts(batch, prompt), params, use_tqdm=False)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    timed(1 + steps)
    short = min(timed(1) for _ in range(reps))
    long = min(timed(1 + steps) for _ in range(reps))
    return (long - short) / steps * 1e6


def table(batch: int, kernels: dict[str, list[float]], graph_us: float, top: int) -> str:
    total = sum(us for _, us in kernels.values())
    launches = sum(c for c, _ in kernels.values())
    lines = [f"batch {batch}: kernels {total:.0f} us/step in {launches:.0f} launches; graph "
             f"replay step {graph_us:.0f} us (kernels / step {total / graph_us:.2f})",
             f"{'kernel':<48} | {'per step':>8} | {'us/step':>8} | {'share':>5} | us/launch"]
    for name, (count, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]:
        lines.append(f"{name:<48} | {count:>8.1f} | {us:>8.1f} | {us / total:>5.2f} | "
                     f"{us / count:.2f}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, default=Path("/tmp/ckpt-llama2-7b-awq"))
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--kv-gib", type=float, default=16.0,
                    help="KV cache; must hold batch x (prompt + steps) tokens, or preemptions "
                         "leave prefill in the difference (session 15's 96 x 700 run did)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    if not (a.ckpt / "config.json").is_file():
        from random_checkpoint import make_random_checkpoint

        make_random_checkpoint("llama2-7b", "awq", a.ckpt, 128, "cuda")
    a.out.mkdir(parents=True, exist_ok=True)
    max_len = a.prompt + a.steps + 8
    need = max(batches) * max_len * _kv_bytes_per_token(a.ckpt)
    if need > a.kv_gib * (1 << 30):
        raise SystemExit(f"error: {max(batches)} x {max_len} tokens need "
                         f"{need / (1 << 30):.1f} GiB of KV cache; raise --kv-gib")
    results: dict = {"ckpt": str(a.ckpt), "prompt": a.prompt, "steps": a.steps, "batches": {}}
    eager = _engine(a.ckpt, True, max(batches), max_len, a.kv_gib)
    kernels = {b: decode_kernels(eager, b, a.prompt, a.steps) for b in batches}
    del eager
    import gc

    import torch

    gc.collect()
    torch.cuda.empty_cache()
    graphs = _engine(a.ckpt, False, max(batches), max_len, a.kv_gib)
    for b in batches:
        g = graph_step_us(graphs, b, a.prompt, a.steps)
        results["batches"][b] = {"graph_step_us": g, "kernels": kernels[b]}
        print(table(b, kernels[b], g, a.top), flush=True)
        print()
    (a.out / "profile_kernels.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
