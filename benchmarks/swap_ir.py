"""Where the "swap" W4A16 kernel (kernels/w4a16_swap.py) keeps the dequantized weights: prints,
per config, the MMA ops of its TTGIR (warp-group dots on Hopper, with the left operand from
registers (``dot_op``) or shared memory), shared memory, registers and spills, and the same
for the "dot" kernel's joined planes (weights on the right).

    python benchmarks/swap_ir.py          # CUDA GPU; one table
"""

from __future__ import annotations

import re

import torch


def last_compiled(jit_fn):
    """The most recently compiled variant of a @triton.jit function (Triton 3.x caches)."""
    for cache in jit_fn.device_caches.values():
        kernels = cache[0]
        if kernels:
            return list(kernels.values())[-1]
    raise RuntimeError(f"{jit_fn} has not been compiled")


def main() -> int:
    from edge_llm.kernels.w4a16 import W4A16Config as C
    from edge_llm.kernels.w4a16 import w4a16_matmul
    from edge_llm.kernels.w4a16_dot import _w4a16_dot_kernel
    from edge_llm.kernels.w4a16_swap import _w4a16_swap_kernel

    dev = torch.device("cuda")
    m, k, n, gs = 16, 4096, 4096, 128
    x = torch.randn(m, k, device=dev, dtype=torch.float16)
    qw = torch.randint(-2**31, 2**31 - 1, (k // 8, n), device=dev, dtype=torch.int32)
    s = torch.rand(k // gs, n, device=dev, dtype=torch.float16) * 0.01
    z = torch.full((k // gs, n), 8.0, device=dev, dtype=torch.float16)
    cfgs = [C("swap", 16, 64, 128, 1, 4, 3, fp16_planes=True),
            C("swap", 16, 64, 128, 1, 4, 3, nibble_dots=True, fp16_planes=True),
            C("swap", 16, 128, 128, 1, 8, 3, fp16_planes=True),
            C("swap", 16, 64, 128, 1, 4, 3),
            C("dot", 16, 128, 64, 1, 4, 3, fp16_planes=True)]
    for cfg in cfgs:
        w4a16_matmul(x, qw, s, z, gs, config=cfg)
        kern = last_compiled(_w4a16_swap_kernel if cfg.kind == "swap" else _w4a16_dot_kernel)
        ttgir = kern.asm["ttgir"]
        dots = [ln.strip() for ln in ttgir.splitlines()
                if re.search(r"warp_group_dot |tt\.dot ", ln)]
        print(f"{cfg}\n  shared {kern.metadata.shared} B, regs {kern.n_regs}, "
              f"spills {kern.n_spills}, local_alloc {ttgir.count('local_alloc')}, "
              f"wgmma in PTX {'wgmma' in kern.asm['ptx']}")
        for ln in dots[:3]:
            print("  ", ln[:400])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
