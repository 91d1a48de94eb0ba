"""Check and time the Triton kernels on one GPU; print one table, write JSON under $OUT.

    pip install --no-deps -e . >/dev/null; python benchmarks/kernels.py

Every timing is kernel_timing.time_op: the median of triton.testing.do_bench over replays of a
CUDA graph that calls the op on a rotation of input sets (together several times the L2 size),
divided by the calls per replay: no launch gaps, no L2 reuse between calls. References:
device-to-device copy bandwidth, fp16 torch.matmul (cuBLAS) on the same shapes, torch SDPA on
contiguous K/V. This file holds the shapes, the launch-config variants and the checks;
kernel_report prints the summary. fused.py and gemv_sweep.py load this file by path and use
its SHAPES and the timing helpers it re-exports.
``--smoke`` runs tiny shapes under TRITON_INTERPRET=1 on the CPU to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
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
    from edge_llm.kernels.w4a16 import W4A16Config as C

    if m == 1:
        gemv = [C("gemv", block_n=bn, block_k=bk, split_k=0, num_warps=w)
                for bn, bk, w in ((64, 128, 4), (128, 128, 4), (128, 256, 4), (64, 256, 4),
                                  (256, 128, 8), (64, 64, 2))]
        return gemv + [C("dot", 16, 64, 128, 0), C("dot", 16, 64, 128, 0, nibble_dots=True)]
    if m <= 16:
        nib = [C("dot", 16, bn, bk, 0, w, st, nibble_dots=True)
               for bn, bk, w, st in ((64, 128, 4, 3), (128, 128, 8, 3), (64, 256, 4, 3))]
        nat = [C("dot", 16, bn, bk, 0, w, st) for bn, bk, w, st in (
            (64, 128, 4, 3), (128, 128, 8, 3), (64, 64, 4, 4), (128, 64, 4, 3), (32, 128, 2, 3))]
        return nib + nat
    if m <= 128:
        bm, bm2 = min(m, 64), min(m, 128)
        return [C("dot", bm, 64, 128, 0, 4, 3), C("dot", bm, 128, 64, 0, 4, 3),
                C("dot", bm, 128, 128, 0, 8, 3), C("dot", bm2, 128, 64, 0, 8, 3),
                C("dot", bm2, 64, 64, 0, 4, 4), C("dot", bm, 128, 128, 0, 8, 3, nibble_dots=True),
                C("dequant")]
    return [C("dot", bm, bn, bk, 0, w, st) for bm, bn, bk, w, st in (
        (64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 64, 64, 4, 3), (128, 128, 64, 4, 4),
        (64, 256, 64, 8, 3))] + [C("dequant")]


def bench_w4a16(dev, smoke: bool, log, quick: bool = False) -> list[dict]:
    import dataclasses

    from edge_llm.kernels.device import num_sms
    from edge_llm.kernels.w4a16 import (
        W4A16Config,
        dequantize_w4a16_ref,
        pack_w4_ref,
        pick_config,
        w4a16_matmul,
    )

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
            row = dict(model=model, shape=name, k=k, n=n, m=m, cublas_us=us_cublas,
                       auto=str(pick_config(m, n, k, gs, 132)), variants=[])
            # "separate reduce": the dispatched config with split K summed by a second
            # launch instead of inside the kernel, in the same run
            auto = pick_config(m, n, k, gs, num_sms(xs[0].device), half=dt != torch.float32)
            special = {"separate reduce": dataclasses.replace(auto, fused_reduce=False)}
            if m > 4 and dt == torch.float16:  # the fp16-planes dot path (w4a16_planes.py)
                bm = min(64, max(16, 1 << (m - 1).bit_length()))
                for bn, bk, warps in ((64, 128, 4), (128, 128, 8), (64, 256, 4)):
                    special[f"planes bn{bn} bk{bk} w{warps}"] = W4A16Config(
                        "dot", bm, bn, bk, split_k=0, num_warps=warps, nibble_dots=True,
                        fp16_planes=True)
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


# ------------------------------------------------------------------------------- attention


def make_paged(b, ctx, h, hkv, d, bs, dt, dev, n_sets):
    """n_sets independent (k_cache, v_cache, block_tables) with randomly permuted blocks."""
    nblk = b * triton_cdiv(ctx, bs)
    sets = []
    for _ in range(n_sets):
        kc = torch.randn(nblk, bs, hkv, d, device=dev, dtype=dt)
        vc = torch.randn(nblk, bs, hkv, d, device=dev, dtype=dt)
        table = torch.randperm(nblk, device=dev).to(torch.int32).view(b, -1)
        sets.append((kc, vc, table))
    return sets


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def bench_decode(dev, smoke: bool, copy_bw: float, log, quick: bool = False) -> list[dict]:
    import torch.nn.functional as F

    from edge_llm.kernels.paged_attention import DecodeConfig, paged_attention_ref, paged_decode

    dt = torch.float32 if smoke else torch.float16
    cases = [(2, 40, 4, 2, 32, 8)] if smoke else [
        (32, 2048, 32, 8, 128, 16), (32, 2048, 32, 4, 128, 16), (4, 8192, 32, 8, 128, 16),
        (64, 1024, 28, 4, 128, 16)]
    # the default first; then the splits summed by a second launch, and fixed split counts
    quick_set = [DecodeConfig(), DecodeConfig(fused_reduce=False), DecodeConfig(num_splits=2),
                 DecodeConfig(num_splits=4)]
    variants = [DecodeConfig()] if smoke else quick_set if quick else quick_set + [
        DecodeConfig(bn, sp, w, st) for bn, sp, w, st in (
            (64, 0, 4, 3), (64, 1, 4, 3), (32, 0, 4, 3), (128, 0, 4, 3), (128, 0, 8, 3),
            (64, 0, 4, 4), (64, 0, 4, 2), (64, 2, 4, 3), (64, 4, 4, 3), (128, 1, 8, 2),
            (32, 1, 2, 4))]
    rows = []
    for b, ctx, h, hkv, d, bs in cases:
        g = h // hkv
        kv_bytes = 2 * b * ctx * hkv * d * 2
        n_rot = rotations(kv_bytes)
        sets = make_paged(b, ctx, h, hkv, d, bs, dt, dev, n_rot)
        qs = [torch.randn(b, h, d, device=dev, dtype=dt) for _ in range(n_rot)]
        seq_lens = torch.full((b,), ctx, device=dev, dtype=torch.int32)
        seq_lens[0] = ctx - 5  # a partial last block
        qsl = torch.arange(b + 1, dtype=torch.int32)
        scale = d ** -0.5
        ref = paged_attention_ref(qs[0], *sets[0][:2], sets[0][2], qsl, seq_lens, scale)
        # SDPA on the same K/V held contiguously: (B, Hkv, L, D), the G heads as G queries
        contig = []
        for kc, vc, table in sets:
            kk = kc[table.long()].reshape(b, ctx, hkv, d).transpose(1, 2).contiguous()
            vv = vc[table.long()].reshape(b, ctx, hkv, d).transpose(1, 2).contiguous()
            contig.append((kk, vv))

        def sdpa(i, contig=contig, qs=qs, shape=(b, hkv, g, d), scale=scale):
            kk, vv = contig[i]
            return F.scaled_dot_product_attention(qs[i].view(shape), kk, vv, scale=scale)
        us_sdpa = time_op(sdpa, n_rot, smoke)
        row = dict(b=b, ctx=ctx, h=h, hkv=hkv, d=d, bs=bs, kv_bytes=kv_bytes, sdpa_us=us_sdpa,
                   variants=[])
        for cfg in variants:
            def run(i, cfg=cfg, sets=sets, qs=qs, sl=seq_lens, scale=scale, ctx=ctx):
                kc, vc, table = sets[i]
                return paged_decode(qs[i], kc, vc, table, sl, scale, ctx, cfg)
            try:
                err = rel_err(run(0), ref)
                us = time_op(run, n_rot, smoke)
            except Exception as exc:
                log(f"  decode {cfg}: FAILED {type(exc).__name__}: {exc}")
                continue
            row["variants"].append(dict(cfg=str(cfg), us=us, err=err, vs_sdpa=us_sdpa / us,
                                        bw_frac=kv_bytes / (us * 1e-6) / copy_bw))
        ok = [v for v in row["variants"] if v["err"] < 1e-2]
        row["default"] = row["variants"][0] if row["variants"] else None
        row["fp8"] = _decode_fp8(sets, qs, seq_lens, qsl, scale, ctx, n_rot, kv_bytes // 2,
                                 copy_bw, smoke, row["default"])
        row["best"] = min(ok, key=lambda v: v["us"]) if ok else None
        rows.append(row)
        for v in row["variants"]:
            log(f"decode B={b} ctx={ctx} G={g}: {v['cfg']} {v['us']:.1f}us err {v['err']:.1e} "
                f"bw {v['bw_frac']:.2f} vs sdpa x{v['vs_sdpa']:.2f}")
        f8 = row["fp8"]
        vs = "-" if f8["vs_fp16"] is None else f"x{f8['vs_fp16']:.2f}"
        log(f"decode B={b} ctx={ctx} G={g}: fp8 KV (default config) {f8['us']:.1f}us err "
            f"{f8['err']:.1e} bw {f8['bw_frac']:.2f} (of its fp8 bytes), vs the fp16 cache {vs}")
    return rows


def _decode_fp8(sets, qs, seq_lens, qsl, scale, ctx, n_rot, nbytes, copy_bw, smoke,
                fp16_default) -> dict:
    """The default decode config over the same K/V as fp8 codes (kernels/kv_fp8.py): time,
    error against the reference on the same codes, fraction of copy bandwidth of the fp8
    bytes, speed-up over the fp16 cache."""
    from edge_llm.kernels.kv_fp8 import fp8_encode_ref
    from edge_llm.kernels.paged_attention import paged_attention_ref, paged_decode

    sets8 = [(fp8_encode_ref(kc), fp8_encode_ref(vc), table) for kc, vc, table in sets]

    def run(i):
        kc, vc, table = sets8[i]
        return paged_decode(qs[i], kc, vc, table, seq_lens, scale, ctx)
    ref = paged_attention_ref(qs[0], *sets8[0][:2], sets8[0][2], qsl, seq_lens, scale)
    err = rel_err(run(0), ref)
    us = time_op(run, n_rot, smoke)
    return dict(us=us, err=err, bw_frac=nbytes / (us * 1e-6) / copy_bw,
                vs_fp16=fp16_default["us"] / us if fp16_default else None)


def check_prefill(dev, smoke: bool, log) -> list[dict]:
    """Chunked prefill (prefix + chunk), mixed decode, bf16 and fp16; time one fp16 case."""
    from edge_llm.kernels.paged_attention import paged_attention_ref, paged_prefill, write_kv

    out = []
    dts = [torch.float32] if smoke else [torch.float16, torch.bfloat16]
    cases = [([5, 1], [20, 9], 4, 2, 32, 8)] if smoke else [
        ([512, 512, 512, 512], [2048, 1536, 512, 1024], 32, 8, 128, 16),
        ([300, 1, 1, 77, 1024], [900, 50, 3000, 77, 1024], 28, 4, 128, 16),
        ([256, 128], [1280, 128], 32, 4, 64, 32)]
    for dt in dts:
        for nq, ctx, h, hkv, d, bs in cases:
            b = len(nq)
            nblk = sum(triton_cdiv(c, bs) for c in ctx) + 4
            kc = torch.randn(nblk, bs, hkv, d, device=dev, dtype=dt)
            vc = torch.randn_like(kc)
            perm = torch.randperm(nblk, device=dev).to(torch.int32)
            width = max(triton_cdiv(c, bs) for c in ctx)
            table = torch.full((b, width), int(perm[-1]), device=dev, dtype=torch.int32)
            start = 0
            for i, c in enumerate(ctx):
                used = triton_cdiv(c, bs)
                table[i, :used] = perm[start:start + used]
                start += used
            # the chunk's own K/V arrive through write_kv, as in the model
            slots = torch.cat([
                (table[i].long().repeat_interleave(bs) * bs
                 + torch.arange(bs, device=dev).repeat(width))[c - q:c]
                for i, (q, c) in enumerate(zip(nq, ctx, strict=True))])
            t = sum(nq)
            write_kv(torch.randn(t, hkv, d, device=dev, dtype=dt),
                     torch.randn(t, hkv, d, device=dev, dtype=dt), kc, vc, slots)
            q = torch.randn(t, h, d, device=dev, dtype=dt)
            qsl = torch.tensor([0] + nq, dtype=torch.int32).cumsum(0).to(torch.int32)
            sl = torch.tensor(ctx, device=dev, dtype=torch.int32)
            ref = paged_attention_ref(q, kc, vc, table, qsl, sl, d ** -0.5)
            o = paged_prefill(q, kc, vc, table, qsl, sl, d ** -0.5)
            entry = dict(dtype=str(dt), nq=nq, ctx=ctx, h=h, hkv=hkv, d=d, bs=bs,
                         err=rel_err(o, ref))
            if dt == torch.float16 and nq == cases[0][0]:
                qsl_dev = qsl.to(dev)  # a host tensor would mean a copy inside graph capture
                args = (q, kc, vc, table, qsl_dev, sl, d ** -0.5)
                us = time_op(lambda i, args=args: paged_prefill(*args), 1, smoke)
                flops = sum(4 * q_ * (c - q_ / 2) * h * d for q_, c in zip(nq, ctx, strict=True))
                entry.update(us=us, tflops=flops / (us * 1e-6) / 1e12)
            out.append(entry)
            if entry["err"] >= 1e-2:
                log(f"  PREFILL CHECK FAILED {entry}")
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
