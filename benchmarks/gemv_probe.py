"""Where the one-row W4A16 GEMV loses bandwidth, and decode attention at short contexts.

    python benchmarks/gemv_probe.py --out DIR        # GPU; one table, JSON in DIR

Question 1 (#5, #7): at one activation row the dispatched GEMV reads Llama-2-7B's weights at
about 40% of copy bandwidth. Is that the kernel's arithmetic or its memory access? Per shape
the table gives, as a fraction of copy bandwidth (bytes = packed words + scales + zeros):
  * ``auto``: the dispatched kernel (kernels/w4a16.py);
  * ``loads BNxR``: a kernel that only loads the same words ([R word rows, BN columns] tiles,
    the next tile requested before the current one is used, as the GEMV does) and XORs them;
    ``32x64`` is the GEMV's own tiling, the others the same 8 KB tile wider and shorter;
  * ``stream``: each program reads one contiguous run of the words (the layout-free floor);
  * ``cublas``: fp16 cuBLAS on the same shape (fp16 bytes); ``auto x``: the dispatched kernel's
    speed-up over it; ``ceiling x``: the speed-up of a kernel that read all the 4-bit bytes
    (words, scales, zeros) at the best loads-only / stream rate, i.e. with no arithmetic.
If ``loads 32x64`` is near ``stream`` and far above ``auto``, the arithmetic is the limit;
if it sits near ``auto``, the access pattern is.

Question 2 (#7): decode attention at batch 1-4 with a short context under a CUDA graph's
split grid (sized for max_model_len 4,096), as a fraction of copy bandwidth: the default
(splits summed in the kernel, unrolled, up to 16), in the kernel up to 4, by a second launch,
and one split. (Session 14 also tried loading each V tile with its K tile: no change.)
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
from kernel_timing import copy_bandwidth, rotations, time_op

SHAPES = {"qkv": (4096, 12288), "o": (4096, 4096), "gate_up": (4096, 22016),
          "down": (11008, 4096)}


@triton.jit
def _loads_kernel(w_ptr, out_ptr, N, rows_per_split, total_rows,
                  BN: tl.constexpr, R: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    r0 = pid_k * rows_per_split
    r_end = tl.minimum(total_rows, r0 + rows_per_split)
    rows = r0 + tl.arange(0, R)
    acc = tl.zeros((R, BN), dtype=tl.int32)
    mask_n = offs_n[None, :] < N
    nxt = tl.load(w_ptr + rows[:, None] * N + offs_n[None, :],
                  mask=(rows[:, None] < r_end) & mask_n, other=0)
    for _ in range(r0, r_end, R):
        cur = nxt
        rows += R
        nxt = tl.load(w_ptr + rows[:, None] * N + offs_n[None, :],
                      mask=(rows[:, None] < r_end) & mask_n, other=0)
        acc ^= cur
    tl.store(out_ptr + pid_k * N + offs_n, tl.xor_sum(acc, axis=0), mask=offs_n < N)


@triton.jit
def _stream_kernel(w_ptr, out_ptr, per_prog, total, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    start = pid * per_prog
    end = tl.minimum(total, start + per_prog)
    offs = start + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    nxt = tl.load(w_ptr + offs, mask=offs < end, other=0)
    for _ in range(start, end, BLOCK):
        cur = nxt
        offs += BLOCK
        nxt = tl.load(w_ptr + offs, mask=offs < end, other=0)
        acc ^= cur
    tl.store(out_ptr + pid, tl.xor_sum(acc, axis=0))


def _split_for(tiles: int, rows: int, r: int, sms: int, waves: float = 2.5) -> int:
    split = 1
    while tiles * split < waves * sms and rows // (2 * split) >= r:
        split *= 2
    return split


def probe_gemv(dev, copy_bw: float, log) -> list[dict]:
    from edge_llm.kernels.w4a16 import w4a16_matmul

    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = []
    for name, (k, n) in SHAPES.items():
        groups = k // 128
        word_bytes = k // 8 * n * 4
        all_bytes = word_bytes + 2 * groups * n * 2
        n_rot = rotations(all_bytes)
        sets = [(torch.randint(-2**31, 2**31 - 1, (k // 8, n), device=dev, dtype=torch.int32),
                 torch.rand(groups, n, device=dev, dtype=torch.float16) * 0.01,
                 torch.randint(0, 16, (groups, n), device=dev).to(torch.float16))
                for _ in range(n_rot)]
        xs = [torch.randn(1, k, device=dev, dtype=torch.float16) for _ in range(n_rot)]
        row = dict(shape=name, k=k, n=n)
        us = time_op(lambda i, xs=xs, sets=sets: w4a16_matmul(xs[i], *sets[i], 128), n_rot,
                     False)
        row["auto"] = all_bytes / (us * 1e-6) / copy_bw
        auto_us = us
        w_rot = min(rotations(2 * k * n), n_rot)
        ws = [torch.randn(k, n, device=dev, dtype=torch.float16) for _ in range(w_rot)]
        us = time_op(lambda i, xs=xs, ws=ws: xs[i] @ ws[i], w_rot, False)
        row["cublas"] = 2 * k * n / (us * 1e-6) / copy_bw
        row["auto x"] = us / auto_us
        cublas_us = us
        del ws
        rows_total = k // 8
        for bn, r in ((32, 64), (64, 32), (128, 16), (256, 8), (32, 128), (64, 64)):
            tiles = triton.cdiv(n, bn)
            split = _split_for(tiles, rows_total, r, sms)
            per = triton.cdiv(triton.cdiv(rows_total, split), r) * r
            split = triton.cdiv(rows_total, per)
            res = torch.empty(split, n, device=dev, dtype=torch.int32)

            def loads(i, bn=bn, r=r, per=per, split=split, res=res, sets=sets, n=n,
                      rows_total=rows_total):
                _loads_kernel[(triton.cdiv(n, bn), split)](sets[i][0], res, n, per, rows_total,
                                                           BN=bn, R=r, num_warps=4)
            us = time_op(loads, n_rot, False)
            row[f"loads {bn}x{r} s{split}"] = word_bytes / (us * 1e-6) / copy_bw
        total = rows_total * n
        for progs, block in ((int(2.5 * sms), 2048), (4 * sms, 2048), (8 * sms, 1024)):
            per = triton.cdiv(triton.cdiv(total, progs), block) * block
            grid = triton.cdiv(total, per)
            res = torch.empty(grid, device=dev, dtype=torch.int32)

            def stream(i, per=per, grid=grid, block=block, res=res, sets=sets, total=total):
                _stream_kernel[(grid,)](sets[i][0], res, per, total, BLOCK=block, num_warps=4)
            us = time_op(stream, n_rot, False)
            row[f"stream p{grid} b{block}"] = word_bytes / (us * 1e-6) / copy_bw
        # the speed-up over cuBLAS of a kernel reading all the 4-bit bytes at the best rate
        # a loads-only / streaming kernel reached: what no arithmetic on top can beat
        best = max(val for key, val in row.items() if key.startswith(("loads", "stream")))
        row["ceiling x"] = cublas_us / (all_bytes / (best * copy_bw) * 1e6)
        log(" | ".join([f"{name:8s}"] + [f"{key} {val:.2f}" for key, val in row.items()
                                           if isinstance(val, float)]))
        out.append(row)
    return out


def probe_decode(dev, copy_bw: float, log) -> list[dict]:
    from edge_llm.kernels.paged_attention import DecodeConfig, paged_attention_ref, paged_decode

    out = []
    configs = {"default": DecodeConfig(), "fused<=4": DecodeConfig(max_fused_splits=4),
               "2nd launch": DecodeConfig(fused_reduce=False),
               "1 split": DecodeConfig(num_splits=1)}
    for b, ctx, h, hkv, max_len in ((1, 300, 32, 32, 4096), (4, 300, 32, 32, 4096),
                                    (1, 1200, 32, 32, 4096), (16, 300, 32, 32, 4096),
                                    (32, 2048, 32, 4, 2048), (4, 8192, 32, 8, 8192)):
        d, bs = 128, 16
        kv_bytes = 2 * b * ctx * hkv * d * 2
        n_rot = rotations(kv_bytes)
        sets = make_paged(b, ctx, h, hkv, d, bs, torch.float16, dev, n_rot)
        qs = [torch.randn(b, h, d, device=dev, dtype=torch.float16) for _ in range(n_rot)]
        sl = torch.full((b,), ctx, device=dev, dtype=torch.int32)
        qsl = torch.arange(b + 1, dtype=torch.int32)
        ref = paged_attention_ref(qs[0], *sets[0][:2], sets[0][2], qsl, sl, d ** -0.5)
        row = dict(b=b, ctx=ctx, h=h, hkv=hkv, max_len=max_len)
        for key, cfg in configs.items():
            def run(i, cfg=cfg, sets=sets, qs=qs, sl=sl, scale=d ** -0.5, max_len=max_len):
                kc, vc, table = sets[i]
                return paged_decode(qs[i], kc, vc, table, sl, scale, max_len, cfg)
            err = float((run(0).float() - ref.float()).norm() / ref.float().norm())
            assert err < 1e-2, (key, err)
            us = time_op(run, n_rot, False)
            row[key] = kv_bytes / (us * 1e-6) / copy_bw
            row[key + " us"] = us
        log(f"decode B={b} ctx={ctx} H={h}/{hkv} max {max_len} | " + " | ".join(
            f"{key} {row[key]:.2f} ({row[key + ' us']:.1f} us)" for key in configs))
        out.append(row)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    copy_bw = copy_bandwidth(dev, False)
    print(f"{torch.cuda.get_device_name(dev)}: copy {copy_bw / 1e9:.0f} GB/s; fractions of it",
          flush=True)
    res = dict(copy_GBps=copy_bw / 1e9, decode=probe_decode(dev, copy_bw, print),
               gemv=probe_gemv(dev, copy_bw, print))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gemv_probe.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
