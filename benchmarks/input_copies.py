"""Host cost of a decode step's input copies before the graph replay, one table (GPU).

    python benchmarks/input_copies.py [--rows 1,4,16,64,160] [--width 256]

Why: at batch 1 the graph engine's "launch" phase took 267 us of a 2,940 us step (BENCHMARKS.md,
session 17), and the GPU waits through the part of it before ``graph.replay()``. That part is
``cuda_graphs.decode_inputs`` (host tensors from the scheduled rows) and five copies from
pageable memory into the static buffers. Timed here, host microseconds per step (the GPU
otherwise idle, as between two steps):

    current   decode_inputs, then the five pageable copies (cuda_graphs.DecodeGraphs.run)
    inputs    decode_inputs alone
    pinned2   the same values written into two pinned staging buffers (int64 ids, positions,
              slots; int32 seq_lens and the tables' full rows), then two copies
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np
import torch


def rows_of(b: int, width: int, block: int = 16):
    rng = np.random.default_rng(0)
    out = []
    for i in range(b):
        table = rng.permutation(b * width)[:width].tolist()
        pos = width * block - 1 - i
        out.append(SimpleNamespace(num_scheduled_tokens=1, start_pos=pos, block_table=table,
                                   token_ids=[int(rng.integers(0, 32000))]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="1,4,16,64,160")
    ap.add_argument("--width", type=int, default=256, help="blocks per table (4,096 tokens)")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    from edge_llm.engine.cuda_graphs import decode_inputs

    dev = torch.device("cuda")
    w, bsz = args.width, 16
    max_bs = 512
    d64 = torch.zeros(3, max_bs, dtype=torch.int64, device=dev)
    d32 = torch.zeros(max_bs * (1 + w), dtype=torch.int32, device=dev)
    h64 = torch.zeros(3, max_bs, dtype=torch.int64).pin_memory()
    h32 = torch.zeros(max_bs * (1 + w), dtype=torch.int32).pin_memory()
    n64, n32 = h64.numpy(), h32.numpy()
    ids_d, pos_d, slot_d = d64[0], d64[1], d64[2]
    lens_d = d32[:max_bs]
    tab_d = d32[max_bs:].view(max_bs, w)

    def current(rows, bs):
        host = decode_inputs(rows, bs, bsz)
        ww = host.block_tables.shape[1]
        ids_d[:bs].copy_(host.input_ids, non_blocking=True)
        pos_d[:bs].copy_(host.positions, non_blocking=True)
        slot_d[:bs].copy_(host.slot_mapping, non_blocking=True)
        lens_d[:bs].copy_(host.seq_lens, non_blocking=True)
        tab_d[:bs, :ww].copy_(host.block_tables, non_blocking=True)

    def inputs_only(rows, bs):
        decode_inputs(rows, bs, bsz)

    def pinned2(rows, bs):
        b = len(rows)
        n64[:, :bs] = 0
        n64[2, b:bs] = -1
        tabs = n32[max_bs:].reshape(max_bs, w)
        for i, s in enumerate(rows):
            p = s.start_pos
            t = s.block_table
            n64[0, i] = s.token_ids[0]
            n64[1, i] = p
            n64[2, i] = t[p // bsz] * bsz + p % bsz
            n32[i] = p + 1
            tabs[i, : len(t)] = t
        n32[b:bs] = 1
        d64[:, :bs].copy_(h64[:, :bs], non_blocking=True)
        d32[: max_bs + bs * w].copy_(h32[: max_bs + bs * w], non_blocking=True)

    print(f"{torch.cuda.get_device_name(dev)}; host us per step (median of 5 x {args.steps})")
    print("rows | current | inputs | pinned2")
    for b in [int(v) for v in args.rows.split(",")]:
        rows = rows_of(b, w)
        cells = []
        for fn in (current, inputs_only, pinned2):
            res = []
            for _ in range(5):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(args.steps):
                    fn(rows, b)
                    torch.cuda.synchronize()  # between steps the copies have landed
                res.append((time.perf_counter() - t) / args.steps * 1e6)
            cells.append(sorted(res)[2])
        print(f"{b} | " + " | ".join(f"{c:.1f}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
