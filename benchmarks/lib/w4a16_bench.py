"""The W4A16 part of ``kernels_bench.py``: the dispatched launch (and, without ``quick``, the
candidates of ``w4a16_variants``) against fp16 cuBLAS on the Llama-2-7B / Qwen2.5-7B linear
shapes, each checked against the fp32 reference before it is timed; and the dispatched path
checked in bf16 and fp16 on every shape."""

from __future__ import annotations

import torch

from .kernel_timing import checked_time, rel_err, rotations, time_op

SHAPES = [  # (model, name, K, N)
    ("llama2-7b", "qkv", 4096, 12288), ("llama2-7b", "o", 4096, 4096),
    ("llama2-7b", "gate_up", 4096, 22016), ("llama2-7b", "down", 11008, 4096),
    ("qwen2.5-7b", "qkv", 3584, 4608), ("qwen2.5-7b", "o", 3584, 3584),
    ("qwen2.5-7b", "gate_up", 3584, 37888), ("qwen2.5-7b", "down", 18944, 3584),
]
MS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]
GS = 128


def bench_w4a16(dev, smoke: bool, log, quick: bool = False) -> list[dict]:
    from edge_llm.kernels.w4a16 import dequantize_w4a16_ref, pack_w4_ref, prepare, w4a16_matmul

    from .w4a16_variants import kernels_variants, specials

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
            special = specials(auto, m, dt == torch.float16)
            for cfg in [None, *special] + ([] if quick else kernels_variants(m)):
                conf = special[cfg] if isinstance(cfg, str) else cfg

                def run(i, conf=conf, xs=xs, sets=sets, gs=gs):
                    qw, s, z = sets[i]
                    return w4a16_matmul(xs[i], qw, s, z, gs, config=conf)
                timed = checked_time(run, ref, n_rot_q, smoke, log, f"  {name} m={m} {cfg}")
                if timed is None:
                    continue
                us, err = timed
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
