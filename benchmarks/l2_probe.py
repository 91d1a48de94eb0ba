"""Would reading the next weights into L2 ahead of time speed up batch-1 decode? (#7)

    python benchmarks/l2_probe.py --out DIR    # GPU; one table, JSON in DIR

At one activation row the W4A16 GEMVs read Llama-2-7B's weights at 0.26-0.49 of copy bandwidth
(gemv_probe.py), and the norms, rotary and attention between them leave the memory system
nearly idle. Two questions:
  * per shape, the dispatched one-row GEMV with its weights cold (rotated through several
    times the L2) and hot (the same weights every call): what an L2-resident weight gains at
    most;
  * one layer's chain at one row, ``q/k/v GEMV -> decode attention (256 tokens) -> o GEMV ->
    gate/up GEMV -> down GEMV`` over rotating layers, as it is and with a prefetch kernel on a
    second stream (forked and joined inside the same CUDA graph, as a captured decode step
    would do) reading a later matrix's words into L2 (``evict_last``) while the chain runs.
    ``pf o@qkv P``: the o projection's words, started beside the q/k/v GEMV, by P programs.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import triton
import triton.language as tl
from attention_bench import make_paged
from kernel_timing import copy_bandwidth, time_op

SHAPES = {"qkv": (4096, 12288), "o": (4096, 4096), "gate_up": (4096, 22016),
          "down": (11008, 4096)}
CHAIN = ("qkv", "attn", "o", "gate_up", "down")


@triton.jit
def _prefetch_kernel(w_ptr, out_ptr, total, per_prog, BLOCK: tl.constexpr):
    """Reads words [pid * per_prog, +per_prog) with evict_last and keeps one xor per program
    (so the loads stay)."""
    pid = tl.program_id(0)
    start = pid * per_prog
    end = tl.minimum(total, start + per_prog)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for off in range(start, end, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        acc ^= tl.load(w_ptr + offs, mask=offs < end, other=0, eviction_policy="evict_last")
    tl.store(out_ptr + pid, tl.xor_sum(acc, axis=0))


def prefetch(words: torch.Tensor, progs: int, scratch: torch.Tensor) -> None:
    total = words.numel()
    block = 4096
    per = triton.cdiv(triton.cdiv(total, progs), block) * block
    _prefetch_kernel[(triton.cdiv(total, per),)](words, scratch, total, per, BLOCK=block,
                                                num_warps=4)


def make_layer(dev, n_layers: int):
    layers = []
    for _ in range(n_layers):
        layer = {}
        for name, (k, n) in SHAPES.items():
            g = k // 128
            layer[name] = (torch.randint(-2**31, 2**31 - 1, (k // 8, n), device=dev,
                                         dtype=torch.int32),
                           (torch.rand(g, n, device=dev) * 0.01).half(),
                           torch.randint(0, 16, (g, n), device=dev).half())
        layers.append(layer)
    return layers


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--layers", type=int, default=8, help="rotating layers (> L2 in all)")
    args = ap.parse_args()
    from edge_llm.kernels.paged_decode import paged_decode
    from edge_llm.kernels.w4a16 import w4a16_matmul

    dev = torch.device("cuda")
    copy_bw = copy_bandwidth(dev, False)
    print(f"{torch.cuda.get_device_name(dev)}: copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    n = args.layers
    layers = make_layer(dev, n)
    xs = {name: torch.randn(1, k, device=dev, dtype=torch.float16)
          for name, (k, _n) in SHAPES.items()}
    res: dict = {"copy_GBps": copy_bw / 1e9, "shapes": {}, "chain": {}}

    def mm(name, i):
        qw, s, z = layers[i][name]
        return w4a16_matmul(xs[name], qw, s, z, 128, integer_zeros=True)

    for name, (k, nn) in SHAPES.items():
        nbytes = k // 8 * nn * 4 + 2 * (k // 128) * nn * 2
        cold = time_op(lambda i, name=name: mm(name, i), n, False)
        hot = time_op(lambda i, name=name: mm(name, 0), n, False)
        res["shapes"][name] = dict(cold_us=cold, hot_us=hot,
                                   cold_bw=nbytes / (cold * 1e-6) / copy_bw)
        print(f"{name:8s} cold {cold:6.1f} us ({nbytes / (cold * 1e-6) / copy_bw:.2f} of copy "
              f"BW) | hot {hot:6.1f} us | hot / cold {cold / hot:.2f}x", flush=True)

    ctx = 256
    kv = make_paged(1, ctx, 32, 32, 128, 16, torch.float16, dev, n)
    q = torch.randn(1, 32, 128, device=dev, dtype=torch.float16)
    sl = torch.full((1,), ctx, device=dev, dtype=torch.int32)
    scratch = torch.empty(4096, device=dev, dtype=torch.int32)
    side = torch.cuda.Stream()

    def attn(i):
        kc, vc, table = kv[i]
        return paged_decode(q, kc, vc, table, sl, 128 ** -0.5, 4096)

    def chain(i, plan):
        """plan: (target matrix, layer offset, start beside CHAIN[a], joined before CHAIN[b],
        programs)."""
        main = torch.cuda.current_stream()
        joins = {}
        for step in CHAIN:
            for target, off, start, end, progs in plan:
                if end == step:
                    main.wait_event(joins.pop((target, off)))
                if start == step:
                    fork = torch.cuda.Event()
                    fork.record(main)
                    side.wait_event(fork)
                    with torch.cuda.stream(side):
                        prefetch(layers[(i + off) % n][target][0], progs, scratch)
                        done = torch.cuda.Event()
                        done.record(side)
                    joins[(target, off)] = done
            if step == "attn":
                attn(i)
            else:
                mm(step, i)
        for done in joins.values():  # joined into the next layer's first kernel's stream
            main.wait_event(done)

    plans = {"as is": []}
    for progs in (16, 32, 64):
        plans[f"pf o@qkv {progs}"] = [("o", 0, "qkv", "o", progs)]
    plans["pf o@qkv 32 + down@o 32"] = [("o", 0, "qkv", "o", 32),
                                        ("down", 0, "o", "down", 32)]
    plans["pf o@qkv 32 + down@gate_up 32"] = [("o", 0, "qkv", "o", 32),
                                              ("down", 0, "gate_up", "down", 32)]
    plans["pf o@attn 32"] = [("o", 0, "attn", "o", 32)]
    base = None
    for key, plan in plans.items():
        us = time_op(lambda i, plan=plan: chain(i, plan), n, False)
        base = base or us
        res["chain"][key] = us
        print(f"chain {key:32s} {us:7.1f} us per layer | {base / us:.3f}x as is", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "l2_probe.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
