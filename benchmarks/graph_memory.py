"""How much device memory the CUDA graphs hold, what holds it, and whether the KV plan's
start-up estimate covers it (GPU only).

    python benchmarks/graph_memory.py --ckpt /tmp/ck-awq [--max-num-seqs 256]
        [--max-model-len 4096] [--util 0.3] [--out DIR]

Starts the engine with ``gpu_memory_utilization=--util`` while the allocator records its
history, then prints one table: the graphs' memory as the engine measured it (decode and
prefill graphs), the estimate the KV plan set aside (``ModelRunner._profile_graph_memory``),
the allocator's reserved memory against ``util`` x the card, and the graph pools' largest
segments with the call that allocated each (so a regression can be traced to its source).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

MiB = 1 << 20


def allocating_call(frames: list[dict]) -> str:
    """The innermost frame in edge_llm / kernels / torch.nn code, as file:line function."""
    for f in frames:
        name = f.get("filename", "")
        if "edge_llm" in name or "/kernels/" in name:
            return f"{name.rsplit('/', 2)[-2]}/{name.rsplit('/', 1)[-1]}:{f['line']} {f['name']}"
    return frames[0]["name"] if frames else "?"


def print_rows(rows: list[tuple[str, str]]) -> None:
    """(measure, value) pairs as a two-column table."""
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  value")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def pool_segments(snapshot: dict) -> list[tuple[int, str]]:
    """(bytes, allocating call) of each segment in a private (graph) pool, largest first."""
    seg_frames = {}
    for trace in snapshot.get("device_traces", []):
        for ev in trace:
            if ev["action"] == "segment_alloc":
                seg_frames[ev["addr"]] = ev.get("frames", [])  # the last one: the live segment
    out = []
    for seg in snapshot["segments"]:
        if tuple(seg.get("segment_pool_id", (0, 0))) == (0, 0):
            continue
        out.append((seg["total_size"], allocating_call(seg_frames.get(seg["address"], []))))
    return sorted(out, reverse=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--util", type=float, default=0.3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import torch

    from edge_llm import LLM

    torch.cuda.memory._record_memory_history(max_entries=400_000, stacks="python")
    start = time.perf_counter()
    llm = LLM(args.ckpt, device="cuda", dtype="float16", max_model_len=args.max_model_len,
              max_num_seqs=args.max_num_seqs, gpu_memory_utilization=args.util,
              swap_space=0.0)
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    runner = llm.engine.runner
    total = torch.cuda.get_device_properties(0).total_memory
    decode, prefill = runner.graph_stats, runner.prefill_graph_stats
    held = decode.memory_bytes + prefill.memory_bytes
    segments = pool_segments(snapshot)
    rows = [
        ("decode graphs (sizes)", f"{len(decode.sizes)} ({decode.sizes[0]}..{decode.sizes[-1]})"
         if decode.sizes else "none"),
        ("decode graphs, MiB held / capture s", f"{decode.memory_bytes / MiB:.0f} / "
                                                f"{decode.seconds:.2f}"),
        ("prefill graphs, MiB held / capture s", f"{prefill.memory_bytes / MiB:.0f} / "
                                                 f"{prefill.seconds:.2f}"),
        ("set aside by the KV plan, MiB", f"{runner.graph_memory_estimate / MiB:.0f}"),
        ("held / set aside", f"{held / max(runner.graph_memory_estimate, 1):.3f}"),
        ("graph pool segments, MiB (count)",
         f"{sum(s for s, _ in segments) / MiB:.0f} ({len(segments)})"),
        ("reserved / (util x card)",
         f"{torch.cuda.memory_reserved() / (args.util * total):.3f}"),
        ("engine start-up, s", f"{seconds:.1f}"),
    ]
    print_rows(rows)
    by_call = Counter()
    for size, where in segments:
        by_call[where] += size
    print("\ngraph pool segments by allocating call (MiB):")
    for where, size in by_call.most_common(12):
        print(f"  {size / MiB:8.1f}  {where}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "graph_memory.json").write_text(json.dumps({
            "rows": dict(rows), "segments": segments[:50],
            "by_call_mib": {w: s / MiB for w, s in by_call.most_common(30)}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
