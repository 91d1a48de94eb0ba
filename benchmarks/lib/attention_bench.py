"""Attention benchmarks of benchmarks/kernels_bench.py: paged decode (every launch variant, the
fp8 cache, torch SDPA on the same K/V held contiguously) and a chunked-prefill check, timed
as kernels_bench.py times everything (kernel_timing.time_op).
"""

from __future__ import annotations

import torch

from .kernel_timing import checked_time, rel_err, rotations, time_op


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
    # (batch, context, heads, kv heads, head dim, block size, the launch's longest context):
    # full batches, and one sequence of a short context in a CUDA graph sized for 4,096 (a
    # batch-1 decode step of the engine: most context splits empty)
    cases = [(2, 40, 4, 2, 32, 8, 40), (1, 40, 4, 4, 32, 8, 256)] if smoke else [
        (32, 2048, 32, 8, 128, 16, 2048), (32, 2048, 32, 4, 128, 16, 2048),
        (4, 8192, 32, 8, 128, 16, 8192), (64, 1024, 28, 4, 128, 16, 1024),
        (1, 128, 32, 32, 128, 16, 4096), (1, 512, 32, 32, 128, 16, 4096),
        (1, 2048, 32, 32, 128, 16, 4096), (1, 512, 32, 8, 128, 16, 8192)]
    # the default first; then the splits summed by a second launch, and fixed split counts
    quick_set = [DecodeConfig(), DecodeConfig(fused_reduce=False), DecodeConfig(num_splits=2),
                 DecodeConfig(num_splits=4)]
    variants = [DecodeConfig()] if smoke else quick_set if quick else quick_set + [
        DecodeConfig(bn, sp, w, st) for bn, sp, w, st in (
            (64, 0, 4, 3), (64, 1, 4, 3), (32, 0, 4, 3), (128, 0, 4, 3), (128, 0, 8, 3),
            (64, 0, 4, 4), (64, 0, 4, 2), (64, 2, 4, 3), (64, 4, 4, 3), (128, 1, 8, 2),
            (32, 1, 2, 4))]
    rows = []
    for b, ctx, h, hkv, d, bs, max_ctx in cases:
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
        row = dict(b=b, ctx=ctx, max_ctx=max_ctx, h=h, hkv=hkv, d=d, bs=bs, kv_bytes=kv_bytes,
                   sdpa_us=us_sdpa, variants=[])
        for cfg in variants:
            def run(i, cfg=cfg, sets=sets, qs=qs, sl=seq_lens, scale=scale, mx=max_ctx):
                kc, vc, table = sets[i]
                return paged_decode(qs[i], kc, vc, table, sl, scale, mx, cfg)
            timed = checked_time(run, ref, n_rot, smoke, log, f"  decode {cfg}")
            if timed is None:
                continue
            us, err = timed
            row["variants"].append(dict(cfg=str(cfg), us=us, err=err, vs_sdpa=us_sdpa / us,
                                        bw_frac=kv_bytes / (us * 1e-6) / copy_bw))
        ok = [v for v in row["variants"] if v["err"] < 1e-2]
        row["default"] = row["variants"][0] if row["variants"] else None
        row["fp8"] = _decode_fp8(sets, qs, seq_lens, qsl, scale, max_ctx, n_rot, kv_bytes // 2,
                                 copy_bw, smoke, row["default"])
        row["best"] = min(ok, key=lambda v: v["us"]) if ok else None
        rows.append(row)
        for v in row["variants"]:
            log(f"decode B={b} ctx={ctx}/{max_ctx} G={g}: {v['cfg']} {v['us']:.1f}us "
                f"err {v['err']:.1e} bw {v['bw_frac']:.2f} vs sdpa x{v['vs_sdpa']:.2f}")
        f8 = row["fp8"]
        vs = "-" if f8["vs_fp16"] is None else f"x{f8['vs_fp16']:.2f}"
        log(f"decode B={b} ctx={ctx}/{max_ctx} G={g}: fp8 KV (default config) {f8['us']:.1f}us "
            f"err {f8['err']:.1e} bw {f8['bw_frac']:.2f} (of its fp8 bytes), vs the fp16 cache "
            f"{vs}")
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
