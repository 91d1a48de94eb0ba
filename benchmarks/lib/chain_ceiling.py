"""``kernels_bench.py ceiling``: how close to the bandwidth floor can a decode step of separate
kernels come, and one persistent kernel? Kernels that only stream bytes, chained with PDL in a
CUDA graph as a decode step's are, against the copy bandwidth; prints one table.

    python benchmarks/kernels_bench.py ceiling

* an empty kernel's cost in such a chain (1 and one-per-multiprocessor programs, with and
  without PDL): what a launch boundary costs alone;
* a pure stream of each Llama-2-7B linear's bytes (g128 words, scales and zero points as
  ``profile`` counts them, ``layer_linear_bytes``; each program sums its contiguous part,
  the best of a few grids, warps and tiles read before the PDL wait, sizes within 10% of the
  target): what a GEMV could reach if its arithmetic were free;
* the ideal step: the 32 layers' eight kernels (norm, qkv, rotary, attention's K/V reads, o,
  norm, gate/up, down) and the lm_head as those streams, the norm and rotary kernels empty
  or the real add + RMSNorm: the fraction of the floor that a step of as many kernels
  reaches at best;
* the same bytes as one persistent kernel (lib/persistent_stream.py): five phases a layer
  (qkv, attention's K / V, o, gate/up, down) and the lm_head, a grid barrier after each, the
  next phase's first chunk read before the barrier or after it: what a persistent layer kernel
  could reach at best.

Every time is ``time_op``'s (lib/kernel_timing.py: a CUDA graph of many calls, replayed).
``--smoke`` checks both stream kernels' sums on the CPU under TRITON_INTERPRET=1 (no timing).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from edge_llm import envs
from edge_llm.kernels.pdl import pdl_enter

from .kernel_timing import copy_bandwidth, time_op

BLOCK = 1024  # int32 words a program reads per tile (4 KB)
LAYERS = 32
ATTENTION_BYTES = 2.3e6  # K and V of one layer at the decode benchmark's 140-260 tokens


def layer_streams() -> tuple[dict[str, int], int, int]:
    """What each kernel of a Llama-2-7B layer reads (g128 linears as ``kernels_bench.py
    profile`` counts them, ``layer_linear_bytes``), and its hidden size and vocabulary."""
    from random_checkpoint import SHAPES

    from edge_llm.model.arch import parse_arch_config

    from .profile_kernels import LAYER_LINEARS, layer_linear_bytes

    arch = parse_arch_config(SHAPES["llama2-7b"])
    streams = dict(zip(LAYER_LINEARS, layer_linear_bytes(arch, 128), strict=True))
    streams["attention"] = int(ATTENTION_BYTES)
    return streams, arch.hidden_size, arch.vocab_size


LAYER = ["norm", "qkv", "rotary", "attention", "o", "norm", "gate_up", "down"]
# a persistent layer kernel's phases, each ending at a grid barrier: the norms computed by
# every program from the row it reads, rotary inside attention
PERSISTENT_LAYER = ["qkv", "attention", "o", "gate_up", "down"]


@triton.jit
def _stream_kernel(src, out, tiles, BLOCK: tl.constexpr, EARLY: tl.constexpr,
                   PDL: tl.constexpr):
    """Program p sums its ``tiles`` tiles of BLOCK int32 words (contiguous) into out[p];
    EARLY (0-2) of them read before the PDL wait, as the one-row GEMV reads weights."""
    pid = tl.program_id(0).to(tl.int64)
    base = src + pid * tiles * BLOCK
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.int32)
    if EARLY >= 1:
        acc += tl.load(base + offs)
    if EARLY >= 2:
        acc += tl.load(base + BLOCK + offs)
    pdl_enter(PDL)
    for t in range(EARLY, tiles):
        acc += tl.load(base + t * BLOCK + offs)
    tl.store(out + pid, tl.sum(acc, 0))


@triton.jit
def _empty_kernel(PDL: tl.constexpr):
    pdl_enter(PDL)


def _grids(nbytes: int, sms: int) -> list[tuple[int, int]]:
    """(programs, tiles) of streams within 10% of ``nbytes``, at least 3 tiles a program."""
    found = []
    for programs in (sms, 2 * sms, 4 * sms):
        tiles = round(nbytes / 4 / BLOCK / programs)
        if tiles >= 3 and abs(programs * tiles * BLOCK * 4 - nbytes) <= 0.1 * nbytes:
            found.append((programs, tiles))
    return found


def _timed_persistent(launch, cnt: torch.Tensor) -> tuple[float, int]:
    """(``time_op``'s us a launch, barrier time-outs over its launches) of a persistent launch
    whose counters are ``cnt``."""
    cnt.zero_()
    us = time_op(launch, 1, False)
    torch.cuda.synchronize()
    return us, int(cnt[1])


def persistent_ceiling(pool: torch.Tensor, streams: dict[str, int], head_bytes: int, sms: int,
                       bw: float) -> list[dict]:
    """The step as one persistent kernel (lib/persistent_stream.py): a phase per layer linear
    and attention's K / V, each ending at a grid barrier, then the lm_head; one or two
    programs a multiprocessor, the barrier by one counter, the next phase's first chunk read
    before the barrier or after; and each launch with every phase empty (what a barrier costs
    alone)."""
    from .persistent_stream import UNROLL, persistent_step

    phase_bytes = [streams[k] for _ in range(LAYERS) for k in PERSISTENT_LAYER] + [head_bytes]
    dev = pool.device
    rows = []
    for programs in (sms, 2 * sms):
        tiles = [max(1, round(b / 4 / BLOCK / programs)) for b in phase_bytes]
        bases, at = [], 0
        for t in tiles:
            words = programs * t * BLOCK
            at = 0 if at + words > pool.numel() else at
            bases.append(at)
            at += words
        floor_us = sum(programs * t * BLOCK * 4 for t in tiles) / bw * 1e6
        args = (torch.tensor(bases, dtype=torch.int64, device=dev),
                torch.tensor(tiles, dtype=torch.int32, device=dev),
                torch.zeros(2 * programs, dtype=torch.int32, device=dev),
                torch.zeros(2, dtype=torch.int32, device=dev),
                torch.zeros(programs, dtype=torch.int32, device=dev))
        empty = torch.zeros_like(args[1])

        def barriers_only(i, programs=programs, empty=empty, args=args):
            persistent_step(pool, args[0], empty, *args[2:], programs, BLOCK, UNROLL, False)
        us, timeouts = _timed_persistent(barriers_only, args[3])
        rows.append(dict(programs=programs, barrier_us=us / len(tiles),
                         barrier_timeouts=timeouts))
        print(f"persistent kernel of {len(tiles)} empty phases, {programs} programs: "
              f"{us / len(tiles):.2f} us a barrier"
              + (f" ({timeouts} BARRIER TIME-OUTS)" if timeouts else ""), flush=True)
        for prefetch in (False, True):
            def launch(i, programs=programs, prefetch=prefetch, args=args):
                persistent_step(pool, *args, programs, BLOCK, UNROLL, prefetch)
            us, timeouts = _timed_persistent(launch, args[3])
            rows.append(dict(programs=programs, prefetch=prefetch, us=us, floor_us=floor_us,
                             fraction=floor_us / us, barriers=len(tiles),
                             barrier_timeouts=timeouts))
            print(f"persistent step, {programs} programs, next chunk "
                  f"{'before' if prefetch else 'after'} the barrier: {us:.0f} us for a floor "
                  f"of {floor_us:.0f} us: {floor_us / us:.3f} of the floor, "
                  f"{len(tiles)} barriers"
                  + (f" ({timeouts} BARRIER TIME-OUTS: not all programs resident)"
                     if timeouts else ""), flush=True)
    return rows


def _smoke() -> int:
    words = torch.randint(-1000, 1000, (6 * 3 * BLOCK,), dtype=torch.int32)
    out = torch.zeros(6, dtype=torch.int32)
    for early in (0, 1, 2):
        _stream_kernel[(6,)](words, out, 3, BLOCK=BLOCK, EARLY=early, PDL=False)
        want = words.view(6, -1).sum(1).to(torch.int32)
        assert torch.equal(out, want), (early, out, want)
    print("stream kernel sums: ok")
    from .persistent_stream import smoke

    smoke(BLOCK)
    print("persistent stream kernel sums (one program): ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernels_bench.py ceiling", description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="CPU, interpreter: sums only")
    args = ap.parse_args(argv)
    if args.smoke:
        return _smoke()
    from edge_llm.kernels.fused import add_rms_norm
    from edge_llm.kernels.pdl import forward_tokens

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    bw = copy_bandwidth(dev, False)
    res: dict = dict(gpu=torch.cuda.get_device_name(dev), copy_GBps=bw / 1e9)
    print(f"{res['gpu']}: copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)
    n = 256
    for pdl in (False, True):
        for programs in (1, sms):
            us = time_op(lambda i, programs=programs, pdl=pdl: _empty_kernel[(programs,)](
                PDL=pdl, launch_pdl=pdl), n, False)
            res[f"empty_us_pdl{int(pdl)}_programs{programs}"] = us
            print(f"empty kernel, PDL {'on' if pdl else 'off'}, {programs} programs: "
                  f"{us:.2f} us a kernel", flush=True)
    streams, hidden, vocab = layer_streams()
    pool = torch.randint(0, 1 << 30, (int(400e6) // 4,), dtype=torch.int32, device=dev)
    out = torch.zeros(4 * sms, dtype=torch.int32, device=dev)
    best: dict[str, tuple] = {}
    for name, nbytes in streams.items():
        rows = []
        for programs, tiles in _grids(nbytes, sms):
            real = programs * tiles * BLOCK * 4
            for warps in (4, 8):
                for early in (0, 2):
                    reps = max(4, int(300e6 // real))  # together past L2
                    offsets = [(i * real // 4) % (pool.numel() - real // 4) for i in range(reps)]

                    def stream_at(i, programs=programs, tiles=tiles, warps=warps, early=early,
                                  offsets=offsets):
                        _stream_kernel[(programs,)](pool[offsets[i]:], out, tiles, BLOCK=BLOCK,
                                                    EARLY=early, PDL=True, num_warps=warps,
                                                    launch_pdl=True)
                    us = time_op(stream_at, reps, False)
                    rows.append((real / (us * 1e-6) / bw, us, programs, tiles, warps, early))
        rows.sort(reverse=True)
        best[name] = rows[0]
        frac, us, programs, tiles, warps, early = rows[0]
        res[f"stream_{name}"] = dict(bytes=nbytes, fraction=frac, us=us, programs=programs,
                                     warps=warps, early=early)
        print(f"{name:9s} {nbytes / 1e6:6.1f} MB: {frac:.2f} of copy bandwidth, {us:.2f} us "
              f"({programs} programs, {warps} warps, {early} tiles before the wait)", flush=True)
    head_tiles = int(vocab * hidden * 2 // 4 // BLOCK // (2 * sms))
    x = torch.randn(1, hidden, device=dev, dtype=torch.float16)
    r, w = torch.randn_like(x), torch.randn(hidden, device=dev, dtype=torch.float16)
    at = [0]  # the next stream starts where the last ended: the pool is 8x L2 and more

    def stream(name):
        _, _, programs, tiles, warps, early = best[name]
        words = programs * tiles * BLOCK
        at[0] = 0 if at[0] + words > pool.numel() else at[0]
        _stream_kernel[(programs,)](pool[at[0]:], out, tiles, BLOCK=BLOCK, EARLY=early,
                                    PDL=True, num_warps=warps, launch_pdl=True)
        at[0] += words

    def step(real_norms: bool):
        for _ in range(LAYERS):
            for kind in LAYER:
                if kind == "norm" and real_norms:
                    add_rms_norm(x, r, w, 1e-6)
                elif kind in ("norm", "rotary"):
                    _empty_kernel[(1,)](PDL=True, launch_pdl=True)
                else:
                    stream(kind)
        _stream_kernel[(2 * sms,)](pool, out, head_tiles, BLOCK=BLOCK, EARLY=2, PDL=True,
                                   num_warps=8, launch_pdl=True)

    floor_bytes = LAYERS * sum(streams.values()) + vocab * hidden * 2
    floor_us = floor_bytes / bw * 1e6
    with forward_tokens(1):
        for real_norms in (False, True):
            us = time_op(lambda i, real_norms=real_norms: step(real_norms), 1, False)
            key = "ideal_step_real_norms" if real_norms else "ideal_step"
            res[key] = dict(us=us, floor_us=floor_us, fraction=floor_us / us,
                            kernels=LAYERS * len(LAYER) + 1)
            print(f"ideal step, {'real add + RMSNorm' if real_norms else 'empty norms'}: "
                  f"{us:.0f} us for a floor of {floor_us:.0f} us ({floor_bytes / 1e9:.2f} GB): "
                  f"{floor_us / us:.3f} of the floor, {LAYERS * len(LAYER) + 1} kernels",
                  flush=True)
        us = time_op(lambda i: add_rms_norm(x, r, w, 1e-6), n, False)
        res["norm_chain_us"] = us
        print(f"add + RMSNorm of one row, chained: {us:.2f} us a kernel", flush=True)
    res["persistent"] = persistent_ceiling(pool, streams, vocab * hidden * 2, sms, bw)
    with open(os.path.join(str(envs.OUT.get() or "/tmp"), "ceiling.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0
