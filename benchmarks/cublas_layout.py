"""fp16 cuBLAS on the dequantized weight: [K, N] (x @ W, what the dequant path runs) against
[N, K] (F.linear, nn.Linear's layout), launched eagerly and replayed from a CUDA graph.

Session 17 saw the matmuls after dequantization take 5.9 ms of a 160-row decode step inside
the CUDA graphs against 4.7 ms eager, with other cuBLAS kernels picked under capture. This
times the four Llama-2-7B linear shapes at the dequant path's row counts (65-256, decode) and
at prefill sizes (512-8,192), each weight in several copies so that no call reads another's
weight from L2. Prints one table: microseconds per call and the ratios against x @ W in a
graph (the dequant path as the engine's decode graphs run it); writes JSON with --out.

    python benchmarks/cublas_layout.py [--ms 65,96,128,160,192,256,512,2048,8192] [--out F]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_timing import rotations, time_op  # noqa: E402

SHAPES = {"qkv": (4096, 12288), "o": (4096, 4096), "gate_up": (4096, 22016),
          "down": (11008, 4096)}


def eager_us(fn, n_rot: int) -> float:
    import triton.testing

    count = itertools.count()
    ms = triton.testing.do_bench(lambda: fn(next(count) % n_rot), warmup=5, rep=25,
                                 return_mode="median")
    return ms * 1e3


def kernel_names(fn, graph: bool) -> list[str]:
    """Names of the CUDA kernels one call of fn(0) runs (eager, or replayed from a graph)."""
    from torch.profiler import ProfilerActivity, profile

    run = lambda: fn(0)  # noqa: E731
    if graph:
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            fn(0)
            with torch.cuda.graph(g, stream=s):
                fn(0)
        run = g.replay
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="65,96,128,160,192,256,512,2048,8192")
    ap.add_argument("--names-m", type=int, default=160, help="M whose kernel names are listed")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for name, (k, n) in SHAPES.items():
        n_rot = rotations(k * n * 2)
        ws = [torch.randn(k, n, device=dev, dtype=torch.float16) * 0.02 for _ in range(n_rot)]
        wts = [w.t().contiguous() for w in ws]
        for m in (int(v) for v in args.ms.split(",")):
            xs = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(n_rot)]
            kn = lambda i, xs=xs, ws=ws: torch.matmul(xs[i], ws[i])  # noqa: E731
            nk = lambda i, xs=xs, wts=wts: F.linear(xs[i], wts[i])  # noqa: E731
            err = float((kn(0).float() - nk(0).float()).norm() / kn(0).float().norm())
            row = dict(shape=name, k=k, n=n, m=m, err=err,
                       kn_eager=eager_us(kn, n_rot), kn_graph=time_op(kn, n_rot, False),
                       nk_eager=eager_us(nk, n_rot), nk_graph=time_op(nk, n_rot, False))
            if m == args.names_m:
                try:
                    row["names"] = {f"{lay}_{mode}": kernel_names(fn, mode == "graph")
                                    for lay, fn in (("kn", kn), ("nk", nk))
                                    for mode in ("eager", "graph")}
                except Exception as e:  # the names are a side note: keep the timings
                    print(f"kernel names at M={m}: {e!r}")
            rows.append(row)
            print(f"{name:8s} M={m:5d} x@W eager {row['kn_eager']:8.1f} graph "
                  f"{row['kn_graph']:8.1f} | linear eager {row['nk_eager']:8.1f} graph "
                  f"{row['nk_graph']:8.1f} us  (err {err:.1e})", flush=True)
            del xs
        del ws, wts
        torch.cuda.empty_cache()
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    print("\nspeed-up against x @ W [K, N] replayed from a graph (the engine's decode path);"
          " TFLOP/s of the best")
    print("| shape | M | x@W eager | linear eager | linear graph | best TFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        base = r["kn_graph"]
        best = min(r["kn_eager"], r["kn_graph"], r["nk_eager"], r["nk_graph"])
        tflops = 2 * r["m"] * r["k"] * r["n"] / (best * 1e-6) / 1e12
        print(f"| {r['shape']} | {r['m']} | {base / r['kn_eager']:.2f} | "
              f"{base / r['nk_eager']:.2f} | {base / r['nk_graph']:.2f} | {tflops:.0f} |")
    for r in rows:
        for key, names in r.get("names", {}).items():
            print(f"{r['shape']} M={r['m']} {key}: {' '.join(names)}")


if __name__ == "__main__":
    main()
