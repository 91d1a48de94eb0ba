"""Check and time the Triton kernels on one GPU; print one table, write JSON under $OUT.

    pip install --no-deps -e . >/dev/null; python benchmarks/kernels_bench.py

Every timing is kernel_timing.time_op: the median of triton.testing.do_bench over replays of a
CUDA graph that calls the op on a rotation of input sets (together several times the L2 size),
divided by the calls per replay: no launch gaps, no L2 reuse between calls. References:
device-to-device copy bandwidth, fp16 torch.matmul (cuBLAS) on the same shapes, torch SDPA on
contiguous K/V. This file holds the W4A16 shapes, launch-config variants and checks;
attention_bench the attention ones; kernel_report prints the summary. fused.py and
gemv_sweep.py load this file by path and use its SHAPES and the timing helpers it re-exports.
``--smoke`` runs tiny shapes under TRITON_INTERPRET=1 on the CPU to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from attention_bench import bench_decode, check_prefill
from kernel_report import print_table
from kernel_timing import copy_bandwidth, rel_err, rotations, time_op

SHAPES = [  # (model, name, K, N)
    ("llama2-7b", "qkv", 4096, 12288), ("llama2-7b", "o", 4096, 4096),
    ("llama2-7b", "gate_up", 4096, 22016), ("llama2-7b", "down", 11008, 4096),
    ("qwen2.5-7b", "qkv", 3584, 4608), ("qwen2.5-7b", "o", 3584, 3584),
    ("qwen2.5-7b", "gate_up", 3584, 37888), ("qwen2.5-7b", "down", 18944, 3584),
]
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]
GS = 128


# ------------------------------------------------------------------------------------ W4A16


def w4_variants(m: int):
    """Candidate launch configs per M (all fit 99 KB of shared memory on sm_86/89)."""
    from edge_llm.kernels.w4a16_config import Dequant, Dot, Gemv

    def dot(bm, bn, bk, w=4, st=3, nibble=False):
        return Dot(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=st,
                   nibble_dots=nibble)

    if m == 1:
        gemv = [Gemv(block_n=bn, block_k=bk, num_warps=w)
                for bn, bk, w in ((64, 128, 4), (128, 128, 4), (128, 256, 4), (64, 256, 4),
                                  (256, 128, 8), (64, 64, 2))]
        return gemv + [dot(16, 64, 128), dot(16, 64, 128, nibble=True)]
    if m <= 16:
        nib = [dot(16, bn, bk, w, st, nibble=True)
               for bn, bk, w, st in ((64, 128, 4, 3), (128, 128, 8, 3), (64, 256, 4, 3))]
        nat = [dot(16, bn, bk, w, st) for bn, bk, w, st in (
            (64, 128, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4), (128, 64, 4, 3), (32, 128, 2, 3))]
        return nib + nat
    if m <= 128:
        bm, bm2 = min(m, 64), min(m, 128)
        return [dot(bm, 64, 128), dot(bm, 128, 64), dot(bm, 128, 128, 8), dot(bm2, 128, 64, 8),
                dot(bm2, 64, 64, 4, 4), dot(bm, 128, 128, 8, nibble=True), Dequant()]
    return [dot(bm, bn, bk, w, st) for bm, bn, bk, w, st in (
        (64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 64, 64, 4, 3), (128, 128, 64, 4, 4),
        (64, 256, 64, 8, 3))] + [Dequant()]


def bench_w4a16(dev, smoke: bool, log, quick: bool = False) -> list[dict]:
    import dataclasses

    from edge_llm.kernels.w4a16 import dequantize_w4a16_ref, pack_w4_ref, prepare, w4a16_matmul
    from edge_llm.kernels.w4a16_config import Dot

    rows = []
    shapes = [("tiny", "t", 256, 192)] if smoke else SHAPES
    ms = [1, 3, 33] if smoke else MS
    dt = torch.float32 if smoke else torch.float16
    for model, name, k, n in shapes:
        g = k // GS if k >= GS else 1
        gs = GS if k >= GS else k
        n_rot_q = rotations(k * n // 2)
        n_rot_h = rotations(k * n * 2)
        sets = []
        for _ in range(n_rot_q):
            q = torch.randint(0, 16, (k, n), device=dev)
            sets.append((pack_w4_ref(q),
                         (torch.rand(g, n, device=dev) * 0.02 + 0.002).to(dt),
                         torch.randint(0, 16, (g, n), device=dev).to(dt)))
        w_ref = dequantize_w4a16_ref(*sets[0], gs)  # (K, N) fp32
        w_half = [w_ref.to(dt) if i == 0 else torch.randn_like(w_ref, dtype=dt) * 0.02
                  for i in range(n_rot_h)]
        for m in ms:
            xs = [torch.randn(m, k, device=dev, dtype=dt) for _ in range(max(n_rot_q, n_rot_h))]
            ref = xs[0].float() @ w_ref
            us_cublas = time_op(lambda i, xs=xs, w=w_half: torch.matmul(xs[i], w[i]), n_rot_h,
                                smoke)
            auto = prepare(xs[0], *sets[0], gs)[1]  # the table's choice on this GPU
            row = dict(model=model, shape=name, k=k, n=n, m=m, cublas_us=us_cublas,
                       auto=str(auto), variants=[])
            # "separate reduce": the dispatched config with split K summed by a second
            # launch instead of inside the kernel, in the same run
            special = ({"separate reduce": dataclasses.replace(auto, fused_reduce=False)}
                       if hasattr(auto, "fused_reduce") else {})
            if m > 4 and dt == torch.float16:  # the fp16-planes dot path (w4a16_planes.py)
                bm = min(64, max(16, 1 << (m - 1).bit_length()))
                for bn, bk, warps in ((64, 128, 4), (128, 128, 8), (64, 256, 4)):
                    special[f"planes bn{bn} bk{bk} w{warps}"] = Dot(
                        block_m=bm, block_n=bn, block_k=bk, num_warps=warps, fp16_planes=True)
            for cfg in [None, *special] + ([] if quick else w4_variants(m)):
                conf = special[cfg] if isinstance(cfg, str) else cfg

                def run(i, conf=conf, xs=xs, sets=sets, gs=gs):
                    qw, s, z = sets[i]
                    return w4a16_matmul(xs[i], qw, s, z, gs, config=conf)
                try:
                    err = rel_err(run(0), ref)
                    us = time_op(run, n_rot_q, smoke)
                except Exception as exc:  # a variant that fails to compile is reported
                    log(f"  {name} m={m} {cfg}: FAILED {type(exc).__name__}: {exc}")
                    continue
                entry = dict(cfg=str(cfg) if cfg else "auto", us=us, err=err,
                             speedup=us_cublas / us)
                if isinstance(cfg, str):
                    row[cfg.replace(" ", "_")] = entry
                    continue
                (row.__setitem__("auto_res", entry) if cfg is None else
                 row["variants"].append(entry))
            ok = [v for v in row["variants"] if v["err"] < 1e-2]
            row["best"] = min(ok, key=lambda v: v["us"]) if ok else None
            rows.append(row)
            a = row.get("auto_res", {})
            sr = row.get("separate_reduce", {})
            planes = {k: v for k, v in row.items() if k.startswith("planes")}
            best_planes = max(planes.items(), key=lambda kv: kv[1]["speedup"], default=None)
            log(f"{model:10s} {name:7s} M={m:5d} cublas {us_cublas:8.1f}us auto "
                f"{a.get('us', float('nan')):8.1f}us x{a.get('speedup', 0):.2f} "
                f"(separate reduce x{sr.get('speedup', 0):.2f}"
                + (f", {best_planes[0]} x{best_planes[1]['speedup']:.2f}" if best_planes else "")
                + ") "
                f"err {a.get('err', float('nan')):.1e} | best x"
                f"{(row['best'] or {}).get('speedup', 0):.2f} {(row['best'] or {}).get('cfg')}")
    return rows


def check_w4a16_bf16(dev, smoke: bool, log) -> list[dict]:
    """The dispatched path in bf16 (and fp16) on every shape, a few M."""
    from edge_llm.kernels.w4a16 import dequantize_w4a16_ref, pack_w4_ref, w4a16_matmul

    out = []
    shapes = [("tiny", "t", 256, 192)] if smoke else SHAPES
    dts = [torch.float32] if smoke else [torch.bfloat16, torch.float16]
    for model, name, k, n in shapes:
        gs = min(GS, k)
        q = torch.randint(0, 16, (k, n), device=dev)
        for dt in dts:
            s = (torch.rand(k // gs, n, device=dev) * 0.02 + 0.002).to(dt)
            z = torch.randint(0, 16, (k // gs, n), device=dev).to(dt)
            qw = pack_w4_ref(q)
            w = dequantize_w4a16_ref(qw, s, z, gs)
            for m in ([1, 3] if smoke else [1, 7, 16, 100, 256, 1024]):
                x = torch.randn(m, k, device=dev, dtype=dt)
                err = rel_err(w4a16_matmul(x, qw, s, z, gs), x.float() @ w)
                out.append(dict(model=model, shape=name, dtype=str(dt), m=m, err=err))
                if err >= 1e-2:
                    log(f"  CHECK FAILED {model} {name} {dt} M={m}: rel err {err:.2e}")
    return out


def kernel_shared_bytes() -> list[dict]:
    """Shared memory of every compiled Triton kernel, from the JIT caches' metadata."""
    import importlib

    res = []
    for path in ("edge_llm.kernels.w4a16", "edge_llm.kernels.paged_attention"):
        mod = importlib.import_module(path)
        for name in dir(mod):
            fn = getattr(mod, name)
            caches = getattr(fn, "device_caches", None)
            if not caches:
                continue
            for cache in caches.values():
                for kern in cache[0].values():
                    res.append(dict(kernel=name, shared=int(kern.metadata.shared),
                                    num_warps=kern.metadata.num_warps))
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--skip-w4", action="store_true")
    ap.add_argument("--quick", action="store_true", help="dispatched configs only, no sweep")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"),
                    help="no GPU: draw the W4A16 speed-ups of a saved kernels_bench.json")
    args = ap.parse_args()
    if args.plot:
        from kernel_report import plot_speedup

        with open(args.plot[0]) as f:
            plot_speedup(json.load(f), args.plot[1])
        return 0
    dev = torch.device("cpu" if args.smoke else "cuda")
    out_dir = os.environ.get("OUT", "/tmp")
    lines: list[str] = []

    def log(s: str) -> None:
        lines.append(s)
        print(s, flush=True)

    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    info = dict(torch=torch.__version__, device=str(dev))
    if dev.type == "cuda":
        import triton

        p = torch.cuda.get_device_properties(dev)
        info.update(name=p.name, sms=p.multi_processor_count, triton=triton.__version__)
    if dev.type == "cuda":  # raise the clocks from idle before the first measurement
        a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
        t_end = time.time() + 1.5
        while time.time() < t_end:
            a @ a
            torch.cuda.synchronize()
    bw = copy_bandwidth(dev, args.smoke)
    info["copy_GBps"] = bw / 1e9
    log(f"{info}")
    res = dict(info=info)
    res["prefill"] = check_prefill(dev, args.smoke, log)
    res["decode"] = bench_decode(dev, args.smoke, bw, log, args.quick)
    if not args.skip_w4:
        res["w4a16_checks"] = check_w4a16_bf16(dev, args.smoke, log)
        res["w4a16"] = bench_w4a16(dev, args.smoke, log, args.quick)
    if dev.type == "cuda":
        res["shared"] = kernel_shared_bytes()
        info["copy_GBps_end"] = copy_bandwidth(dev, args.smoke) / 1e9
    with open(os.path.join(out_dir, "kernels_bench.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    with open(os.path.join(out_dir, "kernels_bench.log"), "w") as f:
        f.write("\n".join(lines))
    print_table(res, MS)
    return 0


if __name__ == "__main__":
    if "--smoke" in sys.argv:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.exit(main())
