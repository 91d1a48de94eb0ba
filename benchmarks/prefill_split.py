"""Prefill attention with its keys split per q tile (kernels/paged_prefill.py, SPLIT) against
one program per q tile and kv head: a few new queries over a long cached context (a cached
prefix's first token, a chunk of a long prompt), Llama-2-7B heads (32 / 32) and Qwen2.5-7B
heads (28 / 4), head_dim 128, block size 16, fp16. Each variant is checked against the
torch reference, then timed (kernel_timing.time_op: CUDA-graph replays over rotated input
sets). Prints one table: microseconds, the speed-up over one partition, and the key/value
bytes read as a fraction of copy bandwidth. Under ``DISABLE_MMA_V3=1`` an H200 compiles the
dots for mma.sync, as a 3090 / 4090 does (BENCHMARKS.md, session 21).

    python benchmarks/prefill_split.py [--variants]   # on a GPU
    python benchmarks/prefill_split.py --smoke    # CPU, TRITON_INTERPRET=1, tiny shapes
"""

from __future__ import annotations

import argparse
import os
import sys

if "--smoke" in sys.argv:  # before Triton is imported
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_timing import copy_bandwidth, rel_err, rotations, time_op  # noqa: E402


def problem(nq: int, ctx: int, h: int, hkv: int, d: int, bs: int, dt, dev, n_sets: int):
    nblk = -(-ctx // bs)
    sets = []
    for _ in range(n_sets):
        kc = torch.randn(nblk, bs, hkv, d, device=dev, dtype=dt)
        vc = torch.randn(nblk, bs, hkv, d, device=dev, dtype=dt)
        table = torch.randperm(nblk, device=dev).to(torch.int32).view(1, -1)
        q = torch.randn(nq, h, d, device=dev, dtype=dt)
        sets.append((q, kc, vc, table))
    qsl = torch.tensor([0, nq], dtype=torch.int32, device=dev)
    sl = torch.tensor([ctx], dtype=torch.int32, device=dev)
    return sets, qsl, sl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--variants", action="store_true",
                    help="also time the pipelining knobs (3 stages, 32-key tiles, 8 warps) and "
                         "power-of-two rows per token")
    args = ap.parse_args()
    from edge_llm.kernels.paged_attention import PrefillConfig, paged_attention_ref, paged_prefill
    from edge_llm.kernels.paged_common import num_sms
    from edge_llm.kernels.paged_prefill import prefill_splits

    dev = "cpu" if args.smoke else "cuda"
    dt = torch.float32 if args.smoke else torch.float16
    heads = [("llama2", 4, 4, 16)] if args.smoke else [("llama2", 32, 32, 128),
                                                         ("qwen2.5", 28, 4, 128)]
    # few new tokens over a long context, then whole fresh prompts (compute-bound)
    shapes = [(3, 100)] if args.smoke else [(n, c) for c in (1000, 4000)
                                             for n in (8, 24, 64, 128, 256, 512)] + [
        (512, 512), (2048, 2048)]
    variants = [("one partition", PrefillConfig(num_splits=1)),
                ("dispatched", PrefillConfig())]
    if args.variants:
        variants += [("one, 3 stages", PrefillConfig(num_splits=1, num_stages=3)),
                     ("dispatched, 3 stages", PrefillConfig(num_stages=3)),
                     ("dispatched, 32-key tiles", PrefillConfig(block_n=32, num_stages=3)),
                     ("dispatched, 8 warps", PrefillConfig(num_warps=8, num_stages=3)),
                     ("pow2 rows", PrefillConfig(pow2_rows=True))]
    bw = copy_bandwidth(dev, args.smoke)
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s; us per launch, speed-up against one partition,"
          " and the key/value bytes over copy bandwidth")
    labels = [label for label, _ in variants]
    print("| heads | new | keys | partitions | " + " | ".join(labels) + " |")
    print("| --- " * (4 + len(labels)) + "|")
    for name, h, hkv, d in heads:
        for nq, ctx in shapes:
            kv_bytes = 2 * ctx * hkv * d * (4 if args.smoke else 2)
            sets, qsl, sl = problem(nq, ctx, h, hkv, d, 16, dt, dev,
                                    1 if args.smoke else rotations(kv_bytes))
            q, kc, vc, table = sets[0]
            ref = paged_attention_ref(q, kc, vc, table, qsl.cpu(), sl, d ** -0.5)
            tiles = nq // (64 // (h // hkv)) + 1  # as paged_prefill sizes its grid (default)
            planned = prefill_splits(tiles * hkv, ctx, num_sms(torch.device(dev)), 64,
                                     rows=nq * h)
            cells, base = [], None
            for label, cfg in variants:
                def fn(i, cfg=cfg, sets=sets, qsl=qsl, sl=sl, d=d, ctx=ctx):
                    q, kc, vc, table = sets[i % len(sets)]
                    return paged_prefill(q, kc, vc, table, qsl, sl, d ** -0.5, cfg,
                                         max_seq_len=ctx)
                err = rel_err(fn(0), ref)
                if err > 2e-2:
                    raise SystemExit(f"{name} {nq}x{ctx} {label}: rel err {err:.2e}")
                us = time_op(fn, len(sets), args.smoke)
                base = base or us
                frac = kv_bytes / (us * 1e-6) / bw
                cells.append(f"{us:.1f} ({base / us:.2f}x, {frac:.2f})")
            print(f"| {name} {h}/{hkv} | {nq} | {ctx} | {planned} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
