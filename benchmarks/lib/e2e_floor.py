"""The offline scenario's floor: the least time any engine needs for the workload on this GPU
with the same KV cache, from two ceilings measured in the same run (METHOD.md's "two
numbers"): device copy bandwidth and the rate of one large fp16 matrix product (cuBLAS).

Counted, per request of P prompt tokens and L output tokens:
- KV bytes the decode steps must read: the step that makes output token t (t = 2..L) attends
  over P + t - 1 positions, so (L - 1) P + L (L - 1) / 2 positions, times 2 (K and V) x
  layers x KV heads x head dim x the cache's element size.
- Matmul flops: 2 x the linear layers' weights per token for the P + L - 1 tokens run through
  them, and 2 x hidden x vocab for each of the L tokens sampled (lm_head); the prefill's
  attention, 4 x layers x heads x head dim x P (P + 1) / 2 (QK^T and PV, causal).
Left out, which only lowers the floor: weight reads (each decode step reads every weight
once; at the offline batch sizes the matmuls are compute-bound), K/V writes, activations,
norms, sampling, host work and padding.

Two floors: ``sequential`` = KV bytes / copy bandwidth + flops / matmul rate (attention and
matmuls as separate kernels, as every engine runs them), and ``overlapped`` = the larger
of the two terms (both at full rate at once: a bound no engine approaches).
"""

from __future__ import annotations

import time
from typing import Any


def matmul_tflops(device: str, n: int | None = None, reps: int = 10) -> float:
    """fp16 (fp32 on the CPU) n x n x n matrix product through torch.matmul: TFLOP/s."""
    import torch

    cuda = device.startswith("cuda")
    n = n or (8192 if cuda else 512)
    dtype = torch.float16 if cuda else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    torch.matmul(a, b)
    if cuda:
        torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(reps):
        torch.matmul(a, b)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    return 2 * n ** 3 * reps / seconds / 1e12


def linear_weights(arch) -> int:
    """Weights of one layer's linear projections (q, k, v, o, gate, up, down)."""
    h, hd = arch.hidden_size, arch.head_dim
    attn = h * hd * (2 * arch.num_heads + 2 * arch.num_kv_heads)
    return attn + 3 * h * arch.intermediate_size


def offline_floor(arch, work: list[tuple[int, int]], copy_gbs: float, tflops: float,
                  kv_elem_bytes: int) -> dict[str, Any]:
    """Floors (seconds, output tok/s) of ``work`` = [(prompt tokens, output tokens)], module
    doc. ``copy_gbs``: measured copy bandwidth in GB/s; ``tflops``: matmul rate."""
    if not work or any(p < 1 or n < 1 for p, n in work):
        raise ValueError("offline_floor needs requests with >= 1 prompt and output token")
    if copy_gbs <= 0 or tflops <= 0:
        raise ValueError(f"ceilings must be positive: {copy_gbs} GB/s, {tflops} TFLOP/s")
    per_position = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * kv_elem_bytes
    layer_flops = 2 * arch.num_layers * linear_weights(arch)
    head_flops = 2 * arch.hidden_size * arch.vocab_size
    attn_width = 4 * arch.num_layers * arch.num_heads * arch.head_dim
    kv_positions = sum((n - 1) * p + n * (n - 1) // 2 for p, n in work)
    linear = sum((p + n - 1) * layer_flops + n * head_flops for p, n in work)
    prefill_attn = sum(attn_width * p * (p + 1) // 2 for p, _ in work)
    kv_bytes = kv_positions * per_position
    kv_s = kv_bytes / (copy_gbs * 1e9)
    flops = linear + prefill_attn
    flop_s = flops / (tflops * 1e12)
    out_tokens = sum(n for _, n in work)
    seq, over = kv_s + flop_s, max(kv_s, flop_s)
    return {"kv_bytes": float(kv_bytes), "flops": float(flops), "kv_seconds": kv_s,
            "matmul_seconds": flop_s, "copy_gbs": copy_gbs, "matmul_tflops": tflops,
            "sequential_s": seq, "overlapped_s": over,
            "sequential_tok_s": out_tokens / seq, "overlapped_tok_s": out_tokens / over}


def layer_shapes(arch) -> list[tuple[int, int]]:
    """(K, N) of one layer's linear projections as the engine runs them merged: qkv, o,
    gate_up, down."""
    h, hd = arch.hidden_size, arch.head_dim
    q, kv = arch.num_heads * hd, arch.num_kv_heads * hd
    return [(h, q + 2 * kv), (q, h), (h, 2 * arch.intermediate_size),
            (arch.intermediate_size, h)]


def prefill_matmul_tflops(device: str, arch, rows: int, trials: int = 3,
                          min_seconds: float = 0.05) -> float:
    """The rate of the prefill's big matrix products on this device: ``rows`` activation rows
    (the engine's prefill chunk) times each of a layer's projections (``layer_shapes``),
    fp16 through torch.matmul (fp32 on the CPU): TFLOP/s, the best of ``trials`` timings of
    at least ``min_seconds`` each (noise only slows a timing down, so the best is the
    ceiling)."""
    import torch

    cuda = device.startswith("cuda")
    dtype = torch.float16 if cuda else torch.float32
    pairs = [(torch.randn(rows, k, device=device, dtype=dtype),
              torch.randn(k, n, device=device, dtype=dtype)) for k, n in layer_shapes(arch)]
    per_rep = 2 * rows * sum(k * n for k, n in layer_shapes(arch))

    def timed(reps: int) -> float:
        if cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(reps):
            for a, b in pairs:
                torch.matmul(a, b)
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - began

    reps = 1
    while (seconds := timed(reps)) < min_seconds:  # the first pass also warms up
        reps *= 2
    best = min([seconds] + [timed(reps) for _ in range(trials - 1)])
    return per_rep * reps / best / 1e12


def prefill_flops(arch, prompt: int, cached: int = 0) -> float:
    """Flops of a prefill of ``prompt`` tokens whose first ``cached`` come from the prefix
    cache: the linear projections of every new token, causal attention of each new token
    over the positions up to it (QK^T and PV: 4 x layers x heads x head dim per position),
    and lm_head for the one sampled row."""
    if not 0 <= cached < prompt:
        raise ValueError(f"need 0 <= cached < prompt, got {cached}, {prompt}")
    new = prompt - cached
    linear = 2 * arch.num_layers * linear_weights(arch) * new
    positions = prompt * (prompt + 1) // 2 - cached * (cached + 1) // 2
    attn = 4 * arch.num_layers * arch.num_heads * arch.head_dim * positions
    return float(linear + attn + 2 * arch.hidden_size * arch.vocab_size)
