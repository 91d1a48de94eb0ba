"""The timing and error measures of the kernel benchmarks (every section of kernels_bench.py).

``time_op(fn, n_rot, smoke)`` is microseconds per call of ``fn(i)``: the median of
triton.testing.do_bench over replays of a CUDA graph that calls ``fn`` on a rotation of
``n_rot`` input sets (``rotations`` sizes it to several times the L2 size), divided by the
calls per replay: no launch gaps, no L2 reuse between calls. With ``smoke`` (CPU, Triton
interpreter) it is one plain call's wall time, which checks the scripts, not the kernels.
``copy_bandwidth`` is the bandwidth reference (device-to-device copy), ``rel_err`` the error
measure every variant is checked with before it is timed; ``checked_time`` does both for one
variant and reports one that fails (to compile, say) instead of stopping the sweep.
"""

from __future__ import annotations

import math
import time

import torch

L2_BYTES = 60 << 20


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    return float((out - ref).norm() / ref.norm())


def rotations(set_bytes: int) -> int:
    """Input sets so that one pass over them is >= 3x the L2 size (at most 48)."""
    return max(2, min(48, math.ceil(3 * L2_BYTES / max(set_bytes, 1))))


def time_op(fn, n_rot: int, smoke: bool) -> float:
    """Microseconds per call of fn(i), i cycling over n_rot input sets."""
    if smoke:
        t = time.perf_counter()
        fn(0)
        return (time.perf_counter() - t) * 1e6
    import triton.testing

    for i in range(n_rot):  # compile and allocate outside the graph
        fn(i)
    torch.cuda.synchronize()
    calls = n_rot * max(1, math.ceil(12 / n_rot))
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn(0)
        with torch.cuda.graph(graph, stream=stream):
            for i in range(calls):
                fn(i % n_rot)
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(graph.replay, warmup=5, rep=25, return_mode="median")
    del graph
    return ms * 1e3 / calls


def checked_time(fn, ref: torch.Tensor, n_rot: int, smoke: bool, log, label: str
                 ) -> tuple[float, float] | None:
    """(microseconds per call as ``time_op`` times it, ``rel_err`` of ``fn(0)`` against ``ref``);
    None, with ``label: FAILED ...`` logged, where the variant raises."""
    try:
        err = rel_err(fn(0), ref)
        return time_op(fn, n_rot, smoke), err
    except Exception as exc:  # a variant that fails to compile is reported, not fatal
        log(f"{label}: FAILED {type(exc).__name__}: {exc}")
        return None


def copy_bandwidth(dev, smoke: bool) -> float:
    """Device-to-device copy, bytes read + written per second: the better of copy_ (a DMA
    memcpy) and an elementwise kernel (a * 1 into another buffer)."""
    n = (1 << 16) if smoke else (1 << 30)
    a = torch.randn(n // 2, device=dev, dtype=torch.float16)
    b = torch.empty_like(a)
    us = min(time_op(lambda i: b.copy_(a), 2, smoke),
             time_op(lambda i: torch.mul(a, 1.0, out=b), 2, smoke))
    return 2 * a.numel() * 2 / (us * 1e-6)
