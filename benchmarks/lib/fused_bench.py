"""``kernels_bench.py fused``: the fused elementwise kernels against the torch ops they
replace; prints one table.

    python benchmarks/kernels_bench.py fused [--dtype bfloat16]

At decode sizes (1..256 rows) of Llama-2-7B and Qwen2.5-7B, per op: speed-up of the Triton
kernel over the plain-torch reference (exactly the ops the model ran before: RMSNorm's pow /
mean / rsqrt / mul / casts, the residual add, rotary's gathers / casts / mul / cat, SiLU and
mul), and the fraction of device copy bandwidth each reaches (bytes the op must read and write
per second over the copy's). "layer" sums one decoder layer's calls: two add_rms_norm, one
rotary, one silu_and_mul. Each time is ``time_op`` of lib/kernel_timing.py: median over
replays of a CUDA graph calling the op on a rotation of input sets, per call. Every op is
checked against its reference before it is timed. JSON (with microseconds) under $OUT.

``--smoke`` runs tiny shapes on the CPU under TRITON_INTERPRET=1 (checks the script only).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from edge_llm import envs

from .kernel_timing import copy_bandwidth, rel_err, rotations, time_op

MODELS = [  # (name, hidden, intermediate, heads, kv heads, head dim)
    ("llama2-7b", 4096, 11008, 32, 32, 128),
    ("qwen2.5-7b", 3584, 18944, 28, 4, 128),
]
ROWS = [1, 8, 32, 128, 256]
OPS = ["rms_norm", "add_rms_norm", "rotary", "silu_and_mul"]
LAYER_CALLS = {"add_rms_norm": 2, "rotary": 1, "silu_and_mul": 1}  # per decoder layer
MAX_POSITIONS = 4096


def make_sets(op: str, model: tuple, rows: int, dt, dev, n_sets: int) -> list[tuple]:
    """n_sets fresh argument tuples for ``op`` (random, never zeros)."""
    _, hidden, inter, h, hkv, d = model
    w = torch.rand(hidden, device=dev).to(dt) + 0.5
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, d, 2, device=dev).float() / d))
    freqs = torch.outer(torch.arange(MAX_POSITIONS, device=dev, dtype=torch.float32), inv_freq)
    cos, sin = freqs.cos(), freqs.sin()
    sets = []
    for _ in range(n_sets):
        rnd = lambda *shape: torch.randn(*shape, device=dev).to(dt)  # noqa: E731
        if op == "rms_norm":
            sets.append((rnd(rows, hidden), w, 1e-6))
        elif op == "add_rms_norm":
            sets.append((rnd(rows, hidden), rnd(rows, hidden), w, 1e-6))
        elif op == "rotary":
            sets.append((rnd(rows, h, d), rnd(rows, hkv, d), cos, sin,
                         torch.randint(0, MAX_POSITIONS, (rows,), device=dev)))
        else:
            sets.append((rnd(rows, inter), rnd(rows, inter)))
    return sets


def op_bytes(op: str, model: tuple, rows: int, elem: int) -> int:
    """Bytes the op must move: its inputs read once, its outputs written once."""
    _, hidden, inter, h, hkv, d = model
    if op == "rms_norm":
        return 2 * rows * hidden * elem + hidden * elem
    if op == "add_rms_norm":
        return 4 * rows * hidden * elem + hidden * elem
    if op == "rotary":  # q and k in and out, a cos and a sin row (fp32) and a position per token
        return 2 * rows * (h + hkv) * d * elem + rows * (d * 4 + 8)
    return 3 * rows * inter * elem


def as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def bench(dev, dt, smoke: bool, log) -> list[dict]:
    import importlib

    from edge_llm.kernels import fused

    # the module (edge_llm.kernels.rotary is also the name of a dispatcher)
    rotary = importlib.import_module("edge_llm.kernels.rotary")

    copy_bw = copy_bandwidth(dev, smoke)
    log(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s")
    models = [("tiny", 96, 160, 4, 2, 32)] if smoke else MODELS
    rows_list = [1, 5] if smoke else ROWS
    elem = torch.tensor([], dtype=dt).element_size()
    out = []
    for model in models:
        for rows in rows_list:
            for op in OPS:
                mod = rotary if op == "rotary" else fused  # rotary: kernels/rotary.py
                ref_fn, fused_fn = getattr(mod, f"{op}_ref"), getattr(mod, op)
                n_bytes = op_bytes(op, model, rows, elem)
                n_rot = rotations(n_bytes)
                sets = make_sets(op, model, rows, dt, dev, n_rot)
                for got, want in zip(as_tuple(fused_fn(*sets[0])), as_tuple(ref_fn(*sets[0])),
                                     strict=True):
                    err = rel_err(got, want)
                    if not err < 1e-2:
                        raise SystemExit(f"{model[0]} rows={rows} {op}: rel err {err:.2e}")
                us_torch = time_op(lambda i, f=ref_fn, s=sets: f(*s[i]), n_rot, smoke)
                us_fused = time_op(lambda i, f=fused_fn, s=sets: f(*s[i]), n_rot, smoke)
                row = dict(model=model[0], rows=rows, op=op, bytes=n_bytes, torch_us=us_torch,
                           fused_us=us_fused, speedup=us_torch / us_fused,
                           torch_bw=n_bytes / (us_torch * 1e-6) / copy_bw,
                           fused_bw=n_bytes / (us_fused * 1e-6) / copy_bw)
                out.append(row)
                log(f"{model[0]} rows={rows} {op}: torch {us_torch:.2f} us, fused "
                    f"{us_fused:.2f} us, x{row['speedup']:.2f}")
            per_op = {r["op"]: r for r in out if r["model"] == model[0] and r["rows"] == rows}
            t_us = sum(n * per_op[op]["torch_us"] for op, n in LAYER_CALLS.items())
            f_us = sum(n * per_op[op]["fused_us"] for op, n in LAYER_CALLS.items())
            n_bytes = sum(n * per_op[op]["bytes"] for op, n in LAYER_CALLS.items())
            out.append(dict(model=model[0], rows=rows, op="layer", bytes=n_bytes, torch_us=t_us,
                            fused_us=f_us, speedup=t_us / f_us,
                            torch_bw=n_bytes / (t_us * 1e-6) / copy_bw,
                            fused_bw=n_bytes / (f_us * 1e-6) / copy_bw))
    return out


def print_table(rows: list[dict]) -> None:
    print("\n==== fused kernels vs the torch ops they replace (speed-up = torch / fused; "
          "bw = fraction of copy bandwidth)")
    print(f"{'model':11s} {'rows':>4s} {'op':13s} {'speed-up':>8s} {'torch bw':>8s} "
          f"{'fused bw':>8s}")
    for r in rows:
        print(f"{r['model']:11s} {r['rows']:4d} {r['op']:13s} {r['speedup']:8.2f} "
              f"{r['torch_bw']:8.3f} {r['fused_bw']:8.3f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kernels_bench.py fused",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, CPU, Triton interpreter")
    ap.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16")
    args = ap.parse_args(argv)
    if args.smoke:
        envs.set_default(envs.TRITON_INTERPRET, "1")  # before anything imports triton
    dev = torch.device("cpu" if args.smoke else "cuda")
    dt = torch.float32 if args.smoke else getattr(torch, args.dtype)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    info = dict(torch=torch.__version__, device=str(dev), dtype=str(dt))
    if dev.type == "cuda":
        info["name"] = torch.cuda.get_device_name(dev)
        a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
        t_end = time.time() + 1.5  # raise the clocks from idle before the first measurement
        while time.time() < t_end:
            a @ a
            torch.cuda.synchronize()
    print(info, flush=True)
    rows = bench(dev, dt, args.smoke, lambda s: print(s, flush=True))
    out_dir = envs.OUT.get() or Path("/tmp")
    (out_dir / "fused_bench.json").write_text(json.dumps(dict(info=info, rows=rows), indent=1))
    print_table(rows)
    return 0

