"""W4A16 launch variants against fp16 cuBLAS and the table's choice ("auto"), on the eight
Llama-2-7B / Qwen2.5-7B linear shapes (``variants`` holds the current question's candidates).

    python benchmarks/gemv_sweep.py --out DIR        # GPU; one table, JSON + log in DIR

Timing and checks as benchmarks/kernels_bench.py (CUDA-graph replays over rotated input sets,
every variant first compared with the fp32 reference). Prints, per M, the geometric-mean
speed-up over cuBLAS of each variant and of the dispatched choice, the best variant per shape,
then the per-shape table of the dispatched choice.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location(
    "bench_kernels", Path(__file__).with_name("kernels_bench.py"))
bk = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bk)

MS = [1, 2, 8, 16, 32, 64, 128, 256]


def variants(m: int, n: int):
    """The candidate launch configurations per row count, against the dispatched choice:
    at 1-2 rows the one-row GEMV's split-K choices (in-kernel sum, second launch, fixed
    splits, waves); at 3-16 rows the eight plane dots with x split in registers (the mma.sync
    choice) over tiles, stages, warps and splits; at 64 rows and above the plane dots
    against dequantize + cuBLAS; in between the "dot" kernel, the joined swap tile and the
    plane dots with x split or copied into plane order."""
    from edge_llm.kernels.w4a16_config import Dot, Gemv16, Swap

    out = {}
    if m <= 2:  # the dispatched tile with its split K summed in the kernel at every width,
        # by a second launch, or with a fixed split
        def g(bn, bkk, pipe, warps=4, waves=2.5, fused=n <= 8192, split=0):
            return Gemv16(block_n=bn, block_k=bkk, split_k=split, num_warps=warps,
                          fold_zero=True, flat_scales=True, waves=waves, min_k_tiles=1,
                          fused_reduce=fused, pipe_stages=pipe)
        out["g16 bn64 bk128 flat fold p4"] = g(64, 128, 4)
        out["g16 p4 fused"] = g(64, 128, 4, fused=True)
        out["g16 p4 reduce launch"] = g(64, 128, 4, fused=False)
        for split in (1, 2, 3, 4):
            out[f"g16 p4 fused split{split}"] = g(64, 128, 4, fused=True, split=split)
        for waves in (1.5, 4):
            out[f"g16 p4 fused v{waves}"] = g(64, 128, 4, waves=waves, fused=True)
        return out

    def pl(bm, bn, warps, stages, waves=2, min_k=4, mode="split"):
        return Swap(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages,
                    fused_reduce=m <= 16, waves=waves, min_k_tiles=min_k,
                    x_planes=mode == "planes", x_split=mode == "split")
    if m <= 16:  # mma.sync: the split plane dots' tile, stages, warps and split
        for bn, warps, st, waves, min_k in ((64, 4, 2, 2.5, 1), (64, 4, 4, 2.5, 1),
                                            (64, 4, 5, 2.5, 1), (64, 4, 3, 1.5, 1),
                                            (64, 4, 3, 4, 1), (64, 4, 3, 8, 1),
                                            (32, 2, 3, 2.5, 1), (128, 8, 3, 2.5, 1),
                                            (64, 4, 3, 2, 4)):
            out[f"split bn{bn} w{warps} st{st} v{waves}"] = pl(16, bn, warps, st, waves, min_k)
        out["split bn64 w4 st3 v2.5 bk256"] = Swap(
            block_m=16, block_k=256, waves=2.5, min_k_tiles=1, x_split=True)
        return out
    if m >= 64:  # the plane dots at 64-256 rows against dequantize + cuBLAS
        # ("planes": x copied into plane order, for wgmma; "split": x split in registers,
        # for mma.sync); tiles of 64/128 rows x 64/128 weight columns within 99 KB
        for mode in ("planes", "split"):
            for bm, bn, warps, st, waves in ((64, 64, 4, 3, 2), (64, 128, 8, 3, 2),
                                             (64, 128, 4, 3, 2), (128, 64, 4, 2, 2),
                                             (128, 128, 8, 2, 2), (128, 128, 8, 2, 1),
                                             (128, 128, 8, 2, 4)):
                out[f"{mode} bm{bm} bn{bn} w{warps} st{st} v{waves}"] = Swap(
                    block_m=bm, block_n=bn, num_warps=warps, num_stages=st, waves=waves,
                    x_planes=mode == "planes", x_split=mode == "split")
        return out
    bm = min(64, max(16, 1 << (m - 1).bit_length()))
    out[f"dot bm{bm} bn128 bk64 planes"] = Dot(block_m=bm, fused_reduce=m <= 16,
                                               fp16_planes=True)
    out[f"split bm{min(bm, 32)} bn64 w4 st3"] = pl(min(bm, 32), 64, 4, 3)
    out[f"joined bm{bm} bn64 bk128"] = Swap(block_m=bm, fused_reduce=m <= 16)
    if m > 16:
        out[f"split bm{bm} bn128 w4 st3"] = pl(bm, 128, 4, 3)
        # x copied into plane order wins at 64 rows under mma.sync: where between 17 and 64
        # does it start to win?
        for bn, warps in ((64, 4), (128, 8)):
            out[f"planes bm{bm} bn{bn} w{warps} st3 v2"] = pl(bm, bn, warps, 3, mode="planes")
    return out


def variants_planes(m: int):
    """Plane-packed words (``--planes``): the plane dots reading x as it is
    against the joined swap tile fed x permuted to match (a copy), or with its columns in
    plane order (``plane_major``: no copy), at 3-64 rows."""
    from edge_llm.kernels.w4a16_config import Swap

    out = {}
    if m <= 2:  # the one-row GEMV: "auto" only
        return out
    bm = min(64, max(16, 1 << (m - 1).bit_length()))
    for tile in sorted({16 if m <= 16 else 32 if m <= 32 else 64, bm}):
        fused = m <= 16
        out[f"planes bm{tile}"] = Swap(block_m=tile, x_planes=True,
                                       waves=2.5 if fused else 2,
                                       min_k_tiles=1 if fused else 4, fused_reduce=fused)
    out[f"joined bm{bm} + copy"] = Swap(block_m=bm, fused_reduce=m <= 16)
    # the joined tile with its columns in plane order: x as it is
    out[f"joined pm bm{bm}"] = Swap(block_m=bm, fused_reduce=m <= 16, plane_major=True)
    return out


def variants_pm(m: int):
    """Plane-packed words (``--pm``): launch choices of the joined swap tile with
    its columns in plane order around the one dispatched on wgmma at 33-64 rows (BN 64, 4
    warps, 3 stages, 2 waves), and at 65-256 rows, where dequantize + cuBLAS serves."""
    from edge_llm.kernels.w4a16_config import Swap

    out = {}
    if m > 128:  # row tiles of 128 or 256 (the MMA's widest N), 4 / 8 warps
        grid = [(bm, bn, w, st, v, 4) for bm in (128, 256) for bn in (32, 64)
                for w in (4, 8) for st in (2, 3) for v in (1, 2)
                if not (bm == 256 and w == 4)]
    else:
        bm = min(128, max(16, 1 << (m - 1).bit_length()))
        grid = [(bm, bn, w, st, v, k) for bn, w, st, v, k in (
            (64, 4, 3, 2, 4), (64, 4, 4, 2, 4), (64, 4, 2, 2, 4), (128, 8, 3, 2, 4),
            (128, 4, 3, 2, 4), (64, 4, 3, 1, 4), (64, 4, 3, 4, 4), (64, 4, 3, 2, 8),
            (64, 8, 3, 2, 4), (32, 4, 3, 2, 4), (32, 4, 3, 1, 4), (64, 4, 3, 1, 1))]
    for bm, bn, warps, st, waves, min_k in grid:
        out[f"pm bm{bm} bn{bn} w{warps} st{st} v{waves} k{min_k}"] = Swap(
            block_m=bm, block_n=bn, num_warps=warps, num_stages=st, fused_reduce=m <= 16,
            plane_major=True, waves=waves, min_k_tiles=min_k)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--only", default="",
                    help="comma-separated name prefixes: time only those variants (and auto)")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                    help="activations (the cuBLAS reference runs in the same dtype)")
    ap.add_argument("--planes", action="store_true",
                    help="plane-packed words (pack_planes_ref; planes_packed=True), the "
                         "reference on the standard words; variants_planes")
    ap.add_argument("--pm", action="store_true",
                    help="with --planes: variants_pm instead of variants_planes")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"),
                    help="no GPU: draw the dispatched speed-ups of a saved run and exit")
    args = ap.parse_args()
    if args.plot:
        plot(Path(args.plot[0]), Path(args.plot[1]))
        return 0
    from edge_llm.kernels.w4a16 import (
        dequantize_w4a16_ref,
        pack_planes_ref,
        pack_w4_ref,
        prepare,
        w4a16_matmul,
    )

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    logf = open(out_dir / "gemv_sweep.log", "w")

    def log(msg):
        print(msg, file=logf, flush=True)

    dev = torch.device("cuda")
    torch.manual_seed(0)
    copy_bw = bk.copy_bandwidth(dev, False)
    log(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    ms = [int(v) for v in args.ms.split(",")]
    rows = []
    dt = getattr(torch, args.dtype)
    gs = 128
    for model, name, k, n in bk.SHAPES:
        g = k // gs
        n_rot_q = bk.rotations(k * n // 2)
        n_rot_h = bk.rotations(k * n * 2)
        sets = []
        for _ in range(n_rot_q):
            sets.append((pack_w4_ref(torch.randint(0, 16, (k, n), device=dev)),
                         (torch.rand(g, n, device=dev) * 0.02 + 0.002).to(dt),
                         torch.randint(0, 16, (g, n), device=dev).to(dt)))
        words = [(pack_planes_ref(q), s, z) for q, s, z in sets] if args.planes else sets
        w_ref = dequantize_w4a16_ref(*sets[0], gs)
        w_half = [w_ref.to(dt) if i == 0 else torch.randn_like(w_ref, dtype=dt) * 0.02
                  for i in range(n_rot_h)]
        q_bytes = k * n // 2 + 2 * 2 * g * n
        for m in ms:
            xs = [torch.randn(m, k, device=dev, dtype=dt) for _ in range(max(n_rot_q, n_rot_h))]
            ref = xs[0].float() @ w_ref
            us_cublas = bk.time_op(lambda i, xs=xs, w=w_half: torch.matmul(xs[i], w[i]),
                                   n_rot_h, False)
            row = dict(model=model, shape=name, k=k, n=n, m=m, cublas_us=us_cublas,
                       auto=str(prepare(xs[0], *words[0], gs, planes_packed=args.planes)[1]),
                       res={})
            pool = (variants_pm(m) if args.pm else variants_planes(m)) if args.planes \
                else variants(m, n)
            chosen = [(v, c) for v, c in pool.items()
                      if not args.only or v.startswith(tuple(args.only.split(",")))]
            for vname, cfg in [("auto", None)] + chosen:
                def run(i, cfg=cfg, xs=xs, sets=words):
                    qw, s, z = sets[i]
                    return w4a16_matmul(xs[i], qw, s, z, gs, config=cfg,
                                        planes_packed=args.planes)
                try:
                    err = bk.rel_err(run(0), ref)
                    us = bk.time_op(run, n_rot_q, False)
                except Exception as exc:
                    log(f"{name} m={m} {vname}: FAILED {type(exc).__name__}: {exc}")
                    continue
                row["res"][vname] = dict(us=us, err=err, speedup=us_cublas / us,
                                         bw=q_bytes / (us * 1e-6) / copy_bw)
                log(f"{model} {name} M={m} {vname}: x{us_cublas / us:.2f} err {err:.1e} "
                    f"bw {q_bytes / (us * 1e-6) / copy_bw:.2f}")
            rows.append(row)
    (out_dir / "gemv_sweep.json").write_text(json.dumps(dict(copy_bw=copy_bw, rows=rows)))
    # geometric means per M and variant (only variants with err < 1e-2 everywhere)
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s; speed-up vs {args.dtype} cuBLAS, geomean of 8 "
          "shapes (max rel err)")
    for m in ms:
        sub = [r for r in rows if r["m"] == m]
        names = sorted({v for r in sub for v in r["res"]})
        stats = []
        for v in names:
            vals = [r["res"][v] for r in sub if v in r["res"]]
            if len(vals) != len(sub):
                continue
            gm = math.exp(sum(math.log(x["speedup"]) for x in vals) / len(vals))
            stats.append((gm, v, max(x["err"] for x in vals)))
        stats.sort(reverse=True)
        print(f"M={m}: " + "; ".join(f"{v} x{gm:.2f} ({e:.0e})" for gm, v, e in stats[:6])
              + f" | auto x{next((gm for gm, v, _ in stats if v == 'auto'), 0):.2f}")
    print("best variant per shape and M (speed-up over cuBLAS; auto's in brackets):")
    for r in rows:
        ok = {v: x for v, x in r["res"].items() if x["err"] < 1e-2}
        if ok:
            v, x = max(ok.items(), key=lambda kv: kv[1]["speedup"])
            a = r["res"].get("auto", {}).get("speedup", 0)
            print(f"  {r['model']:10s} {r['shape']:7s} M={r['m']:4d} {v:28s} "
                  f"x{x['speedup']:.2f} (x{a:.2f})")
    print("dispatched (auto) per shape, speed-up | fraction of copy bandwidth:")
    for model, name, _k, _n in bk.SHAPES:
        cells = []
        for m in ms:
            r = next(r for r in rows if r["shape"] == name and r["model"] == model
                     and r["m"] == m)
            a = r["res"].get("auto")
            cells.append(f"{a['speedup']:.2f}|{a['bw']:.2f}" if a else "fail")
        print(f"{model:10s} {name:7s} " + " ".join(cells))
    return 0


# the variants of run 2 that the table dispatches now (it chose them from that run)
DISPATCHED = {1: "g16 bn32 bk512 w4 v8", 2: "g16 bn32 bk512 w4 v8", 4: "g16 bn32 bk256 w4 v2",
              8: "old dot"}


def plot(json_path: Path, png: Path) -> None:
    """Speed-up over fp16 cuBLAS against activation rows, one line per shape: per M the
    ``DISPATCHED`` variant, else the run's own dispatched choice ("auto")."""
    from kernel_report import draw_speedup

    data = json.loads(json_path.read_text())
    lines = {}
    for model, name, _k, _n in bk.SHAPES:
        pts = [(r["m"], r["res"][DISPATCHED.get(r["m"], "auto")]["speedup"])
               for r in data["rows"] if r["model"] == model and r["shape"] == name
               and DISPATCHED.get(r["m"], "auto") in r["res"]]
        if pts:
            lines[f"{model} {name}"] = pts
    draw_speedup(lines, f"W4A16 g128, dispatched path, H200 (copy "
                 f"{data['copy_bw'] / 1e12:.2f} TB/s)", png)


if __name__ == "__main__":
    sys.exit(main())
