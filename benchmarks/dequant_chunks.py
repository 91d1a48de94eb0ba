"""Dequantize + cuBLAS above 64 rows, in chunks that stay in L2 (#5, #7).

    python benchmarks/dequant_chunks.py --out DIR    # GPU; one table, JSON in DIR

Above 64 activation rows W4A16 dequantizes the whole weight to fp16 (one pass writing 2 bytes
a weight to memory) and cuBLAS reads it back: 4.5 bytes of traffic a weight against cuBLAS's
2 on fp16 weights, so 0.5-0.56x fp16 cuBLAS at 128-256 rows, and 16% of an offline decode
step at 160 rows. Dequantized in chunks of a few MB into one reused buffer, each chunk can be
read by its matmul from L2 before it is ever written back: memory traffic about 0.5 bytes a
weight, at the price of more, smaller matmuls. Variants, speed-up over fp16 cuBLAS on the same
shape (geomean of the 8 Llama-2-7B / Qwen2.5-7B shapes and per shape):
  * ``whole``: the dispatched path (one pass into the shared buffer, one matmul);
  * ``n C``: column chunks of C MB of fp16, each matmul into a temporary, copied into the
    output's columns;
  * ``k C``: row (K) chunks of C MB, the matmuls accumulating into the fp16 output (addmm).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch
import triton
from kernel_timing import rel_err, rotations, time_op

SHAPES = {"llama qkv": (4096, 12288), "llama o": (4096, 4096), "llama gate_up": (4096, 22016),
          "llama down": (11008, 4096), "qwen qkv": (3584, 4608), "qwen o": (3584, 3584),
          "qwen gate_up": (3584, 37888), "qwen down": (18944, 3584)}


def dequant_into(w, qw, s, z, gs):
    """The library's dequantize kernel on (possibly column-sliced) words into ``w``."""
    from edge_llm.kernels.w4a16_dequant import _dequant_kernel

    k, n = w.shape
    _dequant_kernel[(triton.cdiv(k, 64), triton.cdiv(n, 128))](
        qw, s, z, w, n, k, gs, qw.stride(0), s.stride(0), z.stride(0), w.stride(0),
        BLOCK_K=64, BLOCK_N=128, num_warps=4)


def n_chunks(x, qw, s, z, gs, scratch, cols, out, tmp):
    n = qw.shape[1]
    for c0 in range(0, n, cols):
        c1 = min(n, c0 + cols)
        w = scratch[: x.shape[1] * (c1 - c0)].view(x.shape[1], c1 - c0)
        dequant_into(w, qw[:, c0:c1], s[:, c0:c1], z[:, c0:c1], gs)
        t = tmp[: x.shape[0] * (c1 - c0)].view(x.shape[0], c1 - c0)
        torch.mm(x, w, out=t)
        out[:, c0:c1].copy_(t)
    return out


def k_chunks(x, qw, s, z, gs, scratch, rows, out):
    k, n = x.shape[1], qw.shape[1]
    for k0 in range(0, k, rows):
        k1 = min(k, k0 + rows)
        w = scratch[: (k1 - k0) * n].view(k1 - k0, n)
        dequant_into(w, qw[k0 // 8: k1 // 8], s[k0 // gs: k1 // gs], z[k0 // gs: k1 // gs], gs)
        if k0 == 0:
            torch.mm(x[:, k0:k1], w, out=out)
        else:
            out.addmm_(x[:, k0:k1], w)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--ms", default="96,128,160,256")
    ap.add_argument("--mbs", default="8,16,24,32", help="chunk sizes, MB of fp16")
    args = ap.parse_args()
    from edge_llm.kernels.w4a16 import w4a16_matmul

    dev = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    print(f"{torch.cuda.get_device_name(dev)}: L2 {l2 >> 20} MB; speed-up over fp16 cuBLAS",
          flush=True)
    gs = 128
    mbs = [int(v) for v in args.mbs.split(",")]
    scratch = torch.empty(max(mbs) << 19, device=dev, dtype=torch.float16)
    results = []
    for m in [int(v) for v in args.ms.split(",")]:
        per_variant: dict[str, list[float]] = {}
        for name, (k, n) in SHAPES.items():
            n_rot = rotations(k * n // 2)
            sets = [(torch.randint(-2**31, 2**31 - 1, (k // 8, n), device=dev,
                                   dtype=torch.int32),
                     (torch.rand(k // gs, n, device=dev) * 0.01 + 0.001).half(),
                     torch.randint(0, 16, (k // gs, n), device=dev).half())
                    for _ in range(n_rot)]
            xs = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(n_rot)]
            out = torch.empty(m, n, device=dev, dtype=torch.float16)
            tmp = torch.empty(m * n, device=dev, dtype=torch.float16)
            w_rot = min(rotations(2 * k * n), n_rot)
            ws = [torch.randn(k, n, device=dev, dtype=torch.float16) for _ in range(w_rot)]
            cublas = time_op(lambda i, xs=xs, ws=ws: xs[i] @ ws[i % len(ws)], w_rot, False)
            del ws
            ref = w4a16_matmul(xs[0], *sets[0], gs)
            variants = {"whole": lambda i, xs=xs, sets=sets: w4a16_matmul(xs[i], *sets[i], gs)}
            for mb in mbs:
                cols = max(128, (mb << 19) // k // 128 * 128)
                rows = max(128, (mb << 19) // n // 128 * 128)
                variants[f"n {mb}"] = (lambda i, xs=xs, sets=sets, cols=cols, out=out, tmp=tmp:
                                       n_chunks(xs[i], *sets[i], gs, scratch, cols, out, tmp))
                variants[f"k {mb}"] = (lambda i, xs=xs, sets=sets, rows=rows, out=out:
                                       k_chunks(xs[i], *sets[i], gs, scratch, rows, out))
            row = dict(m=m, shape=name, cublas_us=cublas)
            for key, fn in variants.items():
                err = rel_err(fn(0), ref)
                assert err < 5e-3, (key, name, m, err)
                us = time_op(fn, n_rot, False)
                row[key] = cublas / us
                per_variant.setdefault(key, []).append(cublas / us)
            results.append(row)
            print(f"M={m} {name:13s} " + " | ".join(
                f"{key} {row[key]:.2f}" for key in variants), flush=True)
            del sets, xs
        geo = {key: math.exp(sum(map(math.log, v)) / len(v)) for key, v in per_variant.items()}
        print(f"M={m} geomean: " + " | ".join(f"{key} {val:.2f}" for key, val in geo.items()),
              flush=True)
        results.append(dict(m=m, shape="geomean", **geo))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "dequant_chunks.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
