"""SASS instructions per packed word in the main loop of the 1-2 row W4A16 GEMV, per launch
variant, compiled without a GPU (Triton's bundled ptxas and nvdisasm). One table.

    python benchmarks/gemv_sass.py [--arch 90] [--rows 1]

Why: session 14 inferred that the one-row GEMV was limited by the instructions it issues per
weight (55-72% of a loads-only kernel with the same tiling). Session 20 timed it: 23% fewer
instructions alone did not help, staging the loads through shared memory did, so these
counts explain a variant's arithmetic, not its speed (BENCHMARKS.md, sessions 19-20). This
counts what each variant issues per 32-bit word of eight weights: the loop body between the
label and its backward branch, divided by the words a thread handles per iteration (block_k /
8 x block_n / (32 x num_warps)), by instruction class. Static counts from this machine's
Triton, which may differ from the device image's; they rank variants, the GPU times them.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLASSES = {  # opcode prefix -> class (the first match wins)
    "LDG": "global load", "LDS": "shared load", "LDC": "const load",
    "LOP3": "int logic", "SHF": "int shift", "PRMT": "int permute", "IMAD": "int mad",
    "IADD3": "int add", "LEA": "int add", "ISETP": "compare", "SEL": "int select",
    "HADD2.F32": "f16->f32", "F2F": "f16->f32", "HADD2": "f16x2", "HFMA2": "f16x2",
    "HMUL2": "f16x2", "FFMA": "f32 fma", "FADD": "f32 add", "FMUL": "f32 mul",
    "MOV": "move", "BRA": "branch",
}  # anything else (uniform-datapath ops included) is "other"
OP_RE = re.compile(r"^\S+\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
CLASS_ORDER = ("global load", "f16x2", "int logic", "int shift", "int permute", "f16->f32",
               "f32 fma", "f32 add", "int mad", "int add", "move", "other")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE.parent / "tests" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def loop_body(sass: str) -> list[str]:
    """Instruction lines of the longest loop: a label and the farthest backward BRA to it."""
    lines = sass.splitlines()
    labels = {ln.strip().rstrip(":"): i for i, ln in enumerate(lines) if ln.strip().endswith(":")}
    best = (0, 0)
    for i, ln in enumerate(lines):
        m = re.search(r"BRA (\w+);", ln)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            if i - labels[m.group(1)] > best[1] - best[0]:
                best = (labels[m.group(1)], i)
    return [ln for ln in lines[best[0] + 1:best[1] + 1] if OP_RE.match(ln.strip())]


def classify(op: str) -> str:
    return next((cls for prefix, cls in CLASSES.items() if op.startswith(prefix)), "other")


def count(cfg, arch: int, rows: int) -> tuple[int, collections.Counter]:
    import torch
    from triton.tools.disasm import get_sass

    from edge_llm.kernels import w4a16

    compile_only = _load("test_kernels_compile").compile_only
    k, n, gs = 4096, 4608, 128
    qw = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32)
    s = torch.rand(k // gs, n).half()
    with compile_only(arch) as records:
        w4a16.w4a16_matmul(torch.randn(rows, k).half(), qw, s, s.clone(), gs, config=cfg)
    kern = next(kn for name, _, kn in records if "gemv16" in name)
    body = loop_body(get_sass(kern.asm["cubin"]))
    per = collections.Counter(classify(OP_RE.match(ln.strip()).group(1)) for ln in body)
    per["regs"], per["spills"] = resources(kern.asm["cubin"])
    return len(body), per


def resources(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, bytes of local memory: spills) from cuobjdump -res-usage."""
    import subprocess
    import tempfile

    from triton.tools.disasm import path_to_cuobjdump

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([path_to_cuobjdump(), "-res-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
    reg = re.search(r"REG:(\d+)", out)
    local = re.search(r"LOCAL:(\d+)", out)
    return int(reg.group(1)) if reg else -1, int(local.group(1)) if local else -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="90: H200; 89: RTX 4090; 86: 3090")
    ap.add_argument("--rows", type=int, default=1, choices=(1, 2))
    ap.add_argument("--only", default="", help="comma-separated variant name prefixes")
    a = ap.parse_args()
    sys.path.insert(0, str(HERE))
    from gemv_sweep import variants

    from edge_llm.kernels.w4a16 import pick_config

    cands = {"auto": pick_config(a.rows, 4608, 4096, 128, 132)}
    cands.update(variants(a.rows, 4608))
    if a.only:
        cands = {v: c for v, c in cands.items()
                 if v == "auto" or v.startswith(tuple(a.only.split(",")))}
    print(f"SASS per packed word in the main loop, sm_{a.arch}, {a.rows} row(s), "
          "K 4,096 N 4,608 g128")
    print(f"{'variant':28s} {'total':>6} " + " ".join(f"{c[:11]:>11}" for c in CLASS_ORDER)
          + "  regs local")
    for name, cfg in cands.items():
        words = (cfg.block_k // 8) * cfg.block_n / (32 * cfg.num_warps)
        total, per = count(cfg, a.arch, a.rows)
        print(f"{name:28s} {total / words:6.1f} "
              + " ".join(f"{per.get(c, 0) / words:11.2f}" for c in CLASS_ORDER)
              + f"  {per['regs']:4d} {per['spills']:5d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
