"""Paged decode attention, one table: every case against its launch variants and its K/V
storage (fp16; fp8 codes decoded with integer math, as on sm_86; fp8 codes decoded by the
hardware e4m3 conversion, sm_89 and later). Times are kernel_timing.time_op (CUDA-graph
replays over rotating inputs, no L2 reuse); "bw" is the fraction of copy bandwidth of the
bytes the storage holds (fp8 reads half the bytes of fp16); "x fp16" is the speed-up over
the fp16 cache's default launch in the same run.

    python benchmarks/decode_probe.py [--out probe.json] [--cases 0,1,2,5] [--fp8 0]

"..., token-minor" rows store the values as the engine does for fp8 since session 32
(paged_common.value_cache: each block's tokens contiguous; for fp16 with
EDGE_LLM_V_TOKEN_MINOR=1); the other rows token-major.

Session 16 asked two questions with it: why the default launch at 32 x 2,048 with GQA 4 fell
from 0.89 of copy bandwidth (session 13) to 0.67 (session 16, call 1), and whether the
fp8 cache pays with the hardware conversion (it lost 0-34% with the integer one). Answers
in BENCHMARKS.md, session 16: a register cap for the in-kernel split sum, and 1.05-1.19x.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_bench import make_paged  # noqa: E402
from kernel_timing import copy_bandwidth, rel_err, rotations, time_op  # noqa: E402

# (batch, context, heads, kv heads): #5's 32 x 2,048 at GQA 4 and 8, Qwen2.5's heads, a long
# context, and the offline scenario's decode steps on Llama-2-7B (MHA, ~800 tokens)
CASES = [(32, 2048, 32, 8), (32, 2048, 32, 4), (64, 1024, 28, 4), (4, 8192, 32, 8),
         (128, 800, 32, 32), (160, 800, 32, 32),
         # the e2e decode scenario's steps (128-token prompts, 256 new tokens) on Llama-2-7B:
         # 11 us per layer at batch 1 inside the graphs (session 17), about 5 MB read
         (1, 256, 32, 32), (4, 256, 32, 32), (16, 256, 32, 32)]


def compiled_regs(fn) -> dict:
    """{id: (registers, spills)} of every kernel ``fn`` has compiled so far (Triton's
    per-device cache; an empty dict where this Triton keeps it elsewhere)."""
    out = {}
    for entry in getattr(fn, "device_caches", {}).values():
        cache = entry[0] if isinstance(entry, tuple) else entry
        for kern in getattr(cache, "values", lambda: [])():
            if hasattr(kern, "n_regs"):
                out[id(kern)] = (kern.n_regs, kern.n_spills)
    return out


def variants():
    from edge_llm.kernels.paged_attention import DecodeConfig as C
    return [("auto", C()), ("auto, 2nd launch", C(fused_reduce=False)),
            ("1 split", C(num_splits=1)), ("2 fused", C(num_splits=2)),
            ("2, 2nd launch", C(num_splits=2, fused_reduce=False)),
            ("4 fused", C(num_splits=4)), ("4, 2nd launch", C(num_splits=4, fused_reduce=False)),
            ("auto, no register cap", C(max_registers=None)),
            ("2nd launch, no register cap", C(fused_reduce=False, max_registers=None)),
            ("auto bn32", C(block_n=32)), ("auto bn128 w8", C(block_n=128, num_warps=8)),
            ("auto stages 2", C(num_stages=2)),
            # session 22, short contexts: smaller partitions, fewer warps, no pipelining
            ("auto bn16", C(block_n=16)), ("8 fused bn32", C(num_splits=8, block_n=32)),
            ("16 fused bn16", C(num_splits=16, block_n=16)), ("auto w2", C(num_warps=2)),
            ("4 fused w2", C(num_splits=4, num_warps=2)), ("auto stages 1", C(num_stages=1)),
            ("8 fused bn32 w2", C(num_splits=8, block_n=32, num_warps=2))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--cases", default=None,
                    help="comma-separated indices into CASES (default: all)")
    ap.add_argument("--fp8", type=int, default=1, help="0: fp16 storage only")
    ap.add_argument("--max-len", type=int, default=0,
                    help="the launch's max_seq_len (a CUDA graph passes max_model_len, which "
                         "sizes the split grid); default: each case's context")
    args = ap.parse_args()
    cases = CASES if args.cases is None else [CASES[int(i)] for i in args.cases.split(",")]
    import importlib

    from edge_llm.kernels.kv_fp8 import fp8_encode_ref
    from edge_llm.kernels.paged_attention import DecodeConfig, paged_attention_ref, paged_decode
    pc = importlib.import_module("edge_llm.kernels.paged_common")

    def token_minor(v):  # value_cache's token-minor layout, whatever the switch says
        n, bs, hkv, d = v.shape
        out = torch.zeros((n, hkv, d, bs), dtype=v.dtype, device=v.device).permute(0, 3, 1, 2)
        assert pc.values_token_minor(out)
        return out.copy_(v)
    kernel = importlib.import_module("edge_llm.kernels.paged_decode")._paged_decode_kernel
    has_cvt = pc.has_fp8_cvt

    dev = torch.device("cuda")
    bw = copy_bandwidth(dev, False)
    results = []
    print(f"copy bandwidth {bw / 1e9:.0f} GB/s; {torch.cuda.get_device_name(dev)}")
    print("case | storage | variant | us | bw | x fp16 default | err | registers, spills")
    for b, ctx, h, hkv in cases:
        d, bs = 128, 16
        fp16_bytes = 2 * b * ctx * hkv * d * 2
        n_rot = rotations(fp16_bytes)
        sets = make_paged(b, ctx, h, hkv, d, bs, torch.float16, dev, n_rot)
        sets8 = [(fp8_encode_ref(k), fp8_encode_ref(v), t) for k, v, t in sets]
        sets8tm = [(k, token_minor(v), t) for k, v, t in sets8]
        qs = [torch.randn(b, h, d, device=dev, dtype=torch.float16) for _ in range(n_rot)]
        sl = torch.full((b,), ctx, device=dev, dtype=torch.int32)
        qsl = torch.arange(b + 1, dtype=torch.int32)
        scale = d ** -0.5
        base_us = None
        runs = [("fp16", sets, None, v) for v in variants()]
        sets_tm = [(k, token_minor(v), t) for k, v, t in sets]
        runs += [("fp16, token-minor", sets_tm, None, v) for v in variants()[:3]]
        runs += [(f"fp8 {mode}", sets8, cvt, v) for mode, cvt in (("int", False), ("cvt", True))
                 for v in variants()[:3]] if args.fp8 else []
        picked = [variants()[i] for i in (0, 1, 2, 9, 10, 11)]
        runs += [(f"fp8 {mode}, token-minor", sets8tm, cvt, v)
                 for mode, cvt in (("int", False), ("cvt", True))
                 for v in picked] if args.fp8 else []
        for storage, kv, cvt, (vname, cfg) in runs:
            if cvt and not has_cvt(dev):
                continue
            pc.has_fp8_cvt = has_cvt if cvt is None else (lambda _d, c=cvt: c)

            def run(i, kv=kv, cfg=cfg, qs=qs, sl=sl, scale=scale, ctx=ctx):
                kc, vc, table = kv[i]
                return paged_decode(qs[i], kc, vc, table, sl, scale,
                                    max(ctx, args.max_len), cfg)
            ref = paged_attention_ref(qs[0], *kv[0][:2], kv[0][2], qsl, sl, scale)
            seen = compiled_regs(kernel)
            err = rel_err(run(0), ref)
            regs = [v for k, v in compiled_regs(kernel).items() if k not in seen]
            us = time_op(run, n_rot, False)
            nbytes = fp16_bytes if storage.startswith("fp16") else fp16_bytes // 2
            if storage == "fp16" and base_us is None:
                base_us = us
            row = dict(b=b, ctx=ctx, h=h, hkv=hkv, storage=storage, variant=vname,
                       cfg=str(cfg if isinstance(cfg, DecodeConfig) else cfg), us=us, err=err,
                       bw_frac=nbytes / (us * 1e-6) / bw, vs_fp16=base_us / us, regs=regs)
            results.append(row)
            print(f"{b}x{ctx} H{h}/{hkv} | {storage} | {vname} | {us:.1f} | "
                  f"{row['bw_frac']:.2f} | {row['vs_fp16']:.2f} | {err:.1e} | "
                  f"{regs or 'cached'}", flush=True)
        pc.has_fp8_cvt = has_cvt
        del sets, sets8, sets8tm, sets_tm
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(dict(copy_bw=bw, rows=results), indent=1))


if __name__ == "__main__":
    main()
