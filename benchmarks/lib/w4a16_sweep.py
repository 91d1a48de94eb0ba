"""``kernels_bench.py sweep``: W4A16 launch candidates against fp16 cuBLAS and the dispatched
choice ("auto"), on the eight Llama-2-7B / Qwen2.5-7B linear shapes (the candidates are
``w4a16_variants.sweep_variants*``).

    python benchmarks/kernels_bench.py sweep --out DIR        # GPU; one table, JSON + log in DIR

Timing and checks as the default section (CUDA-graph replays over rotated input sets, every
variant first compared with the fp32 reference). Prints, per M, the geometric-mean
speed-up over cuBLAS of each variant and of the dispatched choice, the best variant per shape,
then the per-shape table of the dispatched choice.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from edge_llm import envs

from .kernel_timing import checked_time, copy_bandwidth, rotations, time_op
from .w4a16_bench import SHAPES

MS = [1, 2, 8, 16, 32, 64, 128, 256]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernels_bench.py sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=envs.OUT.get() or ".")
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
    args = ap.parse_args(argv)
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

    from .w4a16_variants import sweep_variants, sweep_variants_planes, sweep_variants_pm

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    logf = open(out_dir / "w4a16_sweep.log", "w")

    def log(msg):
        print(msg, file=logf, flush=True)

    dev = torch.device("cuda")
    torch.manual_seed(0)
    copy_bw = copy_bandwidth(dev, False)
    log(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    ms = [int(v) for v in args.ms.split(",")]
    rows = []
    dt = getattr(torch, args.dtype)
    gs = 128
    for model, name, k, n in SHAPES:
        g = k // gs
        n_rot_q = rotations(k * n // 2)
        n_rot_h = rotations(k * n * 2)
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
            us_cublas = time_op(lambda i, xs=xs, w=w_half: torch.matmul(xs[i], w[i]),
                                   n_rot_h, False)
            row = dict(model=model, shape=name, k=k, n=n, m=m, cublas_us=us_cublas,
                       auto=str(prepare(xs[0], *words[0], gs, planes_packed=args.planes)[1]),
                       res={})
            pool = (sweep_variants_pm(m) if args.pm else sweep_variants_planes(m)) \
                if args.planes else sweep_variants(m, n)
            chosen = [(v, c) for v, c in pool.items()
                      if not args.only or v.startswith(tuple(args.only.split(",")))]
            for vname, cfg in [("auto", None)] + chosen:
                def run(i, cfg=cfg, xs=xs, sets=words):
                    qw, s, z = sets[i]
                    return w4a16_matmul(xs[i], qw, s, z, gs, config=cfg,
                                        planes_packed=args.planes)
                timed = checked_time(run, ref, n_rot_q, False, log, f"{name} m={m} {vname}")
                if timed is None:
                    continue
                us, err = timed
                row["res"][vname] = dict(us=us, err=err, speedup=us_cublas / us,
                                         bw=q_bytes / (us * 1e-6) / copy_bw)
                log(f"{model} {name} M={m} {vname}: x{us_cublas / us:.2f} err {err:.1e} "
                    f"bw {q_bytes / (us * 1e-6) / copy_bw:.2f}")
            rows.append(row)
    (out_dir / "w4a16_sweep.json").write_text(json.dumps(dict(copy_bw=copy_bw, rows=rows)))
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
    for model, name, _k, _n in SHAPES:
        cells = []
        for m in ms:
            r = next(r for r in rows if r["shape"] == name and r["model"] == model
                     and r["m"] == m)
            a = r["res"].get("auto")
            cells.append(f"{a['speedup']:.2f}|{a['bw']:.2f}" if a else "fail")
        print(f"{model:10s} {name:7s} " + " ".join(cells))
    return 0


def plot(json_path: Path, png: Path) -> None:
    """Speed-up over fp16 cuBLAS against activation rows, one line per shape: the run's
    dispatched choice ("auto")."""
    from .kernel_report import draw_speedup

    data = json.loads(json_path.read_text())
    lines = {}
    for model, name, _k, _n in SHAPES:
        pts = [(r["m"], r["res"]["auto"]["speedup"])
               for r in data["rows"] if r["model"] == model and r["shape"] == name
               and "auto" in r["res"]]
        if pts:
            lines[f"{model} {name}"] = pts
    draw_speedup(lines, f"W4A16 g128, dispatched path (copy "
                 f"{data['copy_bw'] / 1e12:.2f} TB/s)", png)

